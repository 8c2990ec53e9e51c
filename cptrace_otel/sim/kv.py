"""KV bytes for the simulator: the content pattern, the upstream fingerprints on uint8 bytes, exact-set text.

``khash``/``knz`` follow the upstream formulas bit for bit on the bytes of a slice in token order:
``khash = ((sum(b_i * i) ^ (sum(b_i) * 1000003) ^ n) & (2**63 - 1))`` with ``i`` counting from 1, ``0`` for an empty
slice; ``knz`` = number of nonzero bytes. Sums wrap mod 2**64 as torch int64 does.
"""

from __future__ import annotations

import numpy as np

_MASK63 = (1 << 63) - 1
_M64 = (1 << 64) - 1


def khash(b: np.ndarray) -> int:
    """Upstream ``khash`` of the bytes of ``b`` (any shape, uint8, flattened in C order)."""
    flat = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1)
    n = int(flat.size)
    if n == 0:
        return 0
    v = flat.astype(np.uint64)
    idx = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        weighted = int(np.sum(v * idx, dtype=np.uint64)) & _M64
        total = int(np.sum(v, dtype=np.uint64)) & _M64
    return (weighted ^ ((total * 1000003) & _M64) ^ n) & _MASK63


def knz(b: np.ndarray) -> int:
    """Upstream ``knz``: count of nonzero bytes."""
    return int(np.count_nonzero(b))


def page_hashes(b: np.ndarray, page_size: int) -> list[int]:
    """``hp``: khash of each page (``page_size`` consecutive tokens) of a token-ordered slice ``[tokens, ...]``."""
    return [khash(b[i:i + page_size]) for i in range(0, b.shape[0], page_size)]


def content(tokens: np.ndarray, positions: np.ndarray, layers: np.ndarray, width: int, shard: int) -> np.ndarray:
    """The KV a forward stores: ``uint8[len(tokens), len(layers), width]``, never zero, deterministic.

    It depends on the token, its position in the prompt, the (global) layer index and the shard (the CP coordinate
    in sharded/layersplit modes, 0 where ranks hold identical KV)."""
    t = np.asarray(tokens, dtype=np.uint64)[:, None, None]
    p = np.asarray(positions, dtype=np.uint64)[:, None, None]
    lay = np.asarray(layers, dtype=np.uint64)[None, :, None]
    j = np.arange(width, dtype=np.uint64)[None, None, :]
    with np.errstate(over="ignore"):
        x = t * np.uint64(2654435761) + p * np.uint64(40503) + lay * np.uint64(97) + np.uint64(shard * 7919) + j * np.uint64(31)
        x ^= x >> np.uint64(13)
        x *= np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(29)
    return ((x % np.uint64(255)) + np.uint64(1)).astype(np.uint8)


def runs(idx: np.ndarray) -> str:
    """Exact set in run-length form ``a-b:c-d`` (inclusive runs, in the order given), ``(0)`` when empty."""
    a = np.asarray(idx).reshape(-1).tolist()
    if not a:
        return "(0)"
    out = []
    start = prev = a[0]
    for x in a[1:]:
        if x != prev + 1:
            out.append(f"{start}-{prev}")
            start = x
        prev = x
    out.append(f"{start}-{prev}")
    return ":".join(out)


def rng(idx: np.ndarray | None) -> str:
    """Upstream ``rng`` summary of an index array: ``(cnt=N,min=a,max=b,first=c,last=d)``, ``(0)``, ``(none)``."""
    if idx is None:
        return "(none)"
    a = np.asarray(idx).reshape(-1)
    if a.size == 0:
        return "(0)"
    return f"(cnt={a.size},min={int(a.min())},max={int(a.max())},first={int(a[0])},last={int(a[-1])})"
