"""Exact fingerprints with plain torch ops, for devices without Triton: no int64 copy of the whole tensor.

The bytes are processed in chunks of ``CHUNK`` bytes viewed as rows of ``ROW`` bytes; per row the work is int32
(``W_row <= 255 * 4095 * 4096 / 2 < 2**31``) and the rows are folded into int64 sums that wrap mod 2**64 like
upstream's. Temporary memory is bounded by ~8 x ``CHUNK`` whatever the tensor size. Everything stays on the tensor's
device and nothing is read back: the result is a device int64 tensor ``[S0, S1, nz, 0]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ROW = 4096
CHUNK = 1 << 22


def sums(b: torch.Tensor) -> torch.Tensor:
    """Device int64 tensor ``[S0, S1, nz, 0]`` of the 1-D uint8 tensor ``b`` (length >= 1); no host sync."""
    import torch

    dev = b.device
    n = b.numel()
    acc = torch.zeros(4, dtype=torch.int64, device=dev)
    j = torch.arange(ROW, dtype=torch.int32, device=dev)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        full = start + ((stop - start) // ROW) * ROW
        if full > start:
            rows = b[start:full].view(-1, ROW).to(torch.int32)
            s0 = rows.sum(dim=1, dtype=torch.int64)
            w = (rows * j).sum(dim=1, dtype=torch.int64)
            offs = torch.arange(start + 1, full + 1, ROW, dtype=torch.int64, device=dev)
            acc[0] += s0.sum()
            acc[1] += (offs * s0 + w).sum()
            acc[2] += (rows != 0).sum()
        if full < stop:
            tail = b[full:stop].to(torch.int32)
            s0 = tail.sum(dtype=torch.int64)
            w = (tail * j[: stop - full]).sum(dtype=torch.int64)
            acc[0] += s0
            acc[1] += (full + 1) * s0 + w
            acc[2] += (tail != 0).sum()
    return acc
