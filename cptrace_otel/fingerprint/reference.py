"""The specification: upstream's fingerprint formulas written out in plain torch.

This is our own transcription of SGLang ``cp_hicache_trace`` semantics (int64 copies of the data, ``.item()``
syncs), kept only as the oracle for tests and as the fallback for inputs the fast paths do not handle, so that the
exact upstream value or exception message arises. Never use it on a hot path: it costs ~24x the tensor's size in
temporary memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    import torch


def khash(t: torch.Tensor | None) -> int:
    """Position-weighted fingerprint of ``t``'s bytes; 0 for None/empty, -1 when anything fails."""
    try:
        import torch

        if t is None or t.numel() == 0:
            return 0
        b = t.detach().contiguous().view(torch.uint8).reshape(-1).to(torch.int64)
        n = b.numel()
        weights = torch.arange(1, n + 1, device=b.device, dtype=torch.int64)
        s1 = (b * weights).sum()
        s0 = b.sum()
        return int(((s1 ^ (s0 * 1000003) ^ n) & 0x7FFFFFFFFFFFFFFF).item())
    except Exception:
        return -1


def knz(t: torch.Tensor | None) -> int:
    """Number of nonzero bytes of ``t``; 0 for None/empty, -1 when anything fails."""
    try:
        import torch

        if t is None or t.numel() == 0:
            return 0
        b = t.detach().contiguous().view(torch.uint8).reshape(-1)
        return int((b != 0).sum().item())
    except Exception:
        return -1


def _tensor_like(t: object) -> TypeGuard[torch.Tensor]:
    # Upstream tells tensors from plain sequences by their ``numel`` attribute.
    return hasattr(t, "numel")


def rng(t: torch.Tensor | Sequence[int] | None) -> str:
    """``(cnt=..,min=..,max=..,first=..,last=..)`` of a tensor or sequence; ``(none)``, ``(0)`` or ``(err:msg)``."""
    if t is None:
        return "(none)"
    try:
        n = t.numel() if _tensor_like(t) else len(t)
        if n == 0:
            return "(0)"
        if _tensor_like(t):
            flat = t.flatten()
            lo = int(flat.min().item())
            hi = int(flat.max().item())
            first = int(flat[0].item())
            last = int(flat[-1].item())
            return f"(cnt={n},min={lo},max={hi},first={first},last={last})"
        return f"(cnt={n},min={min(t)},max={max(t)},first={t[0]},last={t[-1]})"
    except Exception as e:
        return f"(err:{e})"


def forward_fingerprint(t: object) -> tuple[int, int, int]:
    """``(khash, knz, rows)`` as upstream ``fwd_hash`` computes them: zeros for None, -2s for non-tensors."""
    import torch

    if isinstance(t, torch.Tensor):
        return khash(t), knz(t), (int(t.shape[0]) if t.dim() else 0)
    if t is None:
        return 0, 0, 0
    return -2, -2, -2
