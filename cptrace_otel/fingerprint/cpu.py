"""Fast exact fingerprints of host (CPU) tensors.

``khash`` runs a blocked loop whose per-byte work is 32-bit lane arithmetic, folded once per block into 64-bit sums
(exact mod 2**64 under any split; see :mod:`.formula`). With numba installed (optional
dependency ``cptrace-otel[cpu]``) the loop is compiled (``cache=True``, compiled on the first call, never on
import); without it an exact numpy path does the same tiling with uint32 row reductions.
``knz`` is ``np.count_nonzero`` on the bytes, ``rng`` a single min/max pass.

The functions take torch CPU tensors and go through the same ``contiguous().view(uint8)`` chain as upstream, so an
input upstream rejects raises the same exception (callers turn it into the upstream sentinel).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from . import formula

# numba kernel shape: the bytes are read as rows of COLS bytes, in blocks of at most BLOCK_ROWS rows. Per block the
# loop keeps two uint32 lane vectors, cs[j] = sum_r b[r, j] and cw[j] = sum_r r * b[r, j] (exact: 255 * 4096**2 / 2
# < 2**32), which LLVM vectorizes (no horizontal reduction per byte); the block is folded into the 64-bit sums once:
#   S1 += (B + 1) * S0_block + sum_j (j * cs[j] + COLS * cw[j]),  B = the block's byte offset.
# Both are module constants so numba compiles them in (a fixed trip count vectorizes ~2x better).
COLS = 256
BLOCK_ROWS = 4096
# numpy fallback: uint32 row sums are exact for rows <= 5804 bytes; chunks bound the temporaries.
NP_ROW = 4096
NP_CHUNK = 1 << 22
# khash_bytes hashes buffers under this size on the numpy path: the numba kernel would first cost its import (about
# a second and 100 MB per process), which small buffers never pay back (the simulator hashes only such buffers).
SMALL_BYTES = NP_ROW

_kernel_lock = threading.Lock()
_kernel: Callable | None = None
_kernel_state = "unloaded"  # "unloaded" | "numba" | "numpy"


def _build_numba_kernel() -> Callable:
    import numba
    import numpy as np

    cols = COLS
    block_rows = BLOCK_ROWS

    @numba.njit(cache=True, nogil=True, boundscheck=False)
    def sums(a, start):  # pragma: no cover - compiled
        n = a.size
        st = np.uint64(start)
        nrows = n // cols
        cs = np.zeros(cols, np.uint32)
        cw = np.zeros(cols, np.uint32)
        s0 = np.uint64(0)
        s1 = np.uint64(0)
        r = 0
        while r < nrows:
            rb = min(block_rows, nrows - r)
            cs[:] = 0
            cw[:] = 0
            base = r * cols
            for rr in range(rb):
                row = a[base + rr * cols : base + rr * cols + cols]
                w = np.uint32(rr)
                for j in range(cols):
                    v = np.uint32(row[j])
                    cs[j] += v
                    cw[j] += w * v
            bs0 = np.uint64(0)
            bs1 = np.uint64(0)
            for j in range(cols):
                c = np.uint64(cs[j])
                bs0 += c
                bs1 += np.uint64(j) * c + np.uint64(cols) * np.uint64(cw[j])
            s0 += bs0
            s1 += (st + np.uint64(base + 1)) * bs0 + bs1
            r += rb
        for i in range(nrows * cols, n):
            v = np.uint64(a[i])
            s0 += v
            s1 += (st + np.uint64(i + 1)) * v
        return s0, s1

    return sums


def numpy_sums(a: Any, start: int = 0) -> tuple[int, int]:
    """Exact ``(S0, S1) mod 2**64`` of a 1-D uint8 numpy array without numba.

    Rows of NP_ROW bytes: ``S0_row`` by an integer row sum and ``W_row = sum_j b[j] * j`` by an integer einsum, both
    exact in uint32 (``255 * 4095 * 4096 / 2 < 2**32``; no BLAS, whose threads would fight the traced process), then
    folded per row in uint64, which wraps mod 2**64 like the formula."""
    import numpy as np

    origin = start & formula.MASK64
    n = a.size
    s0 = 0
    s1 = 0
    j = np.arange(NP_ROW, dtype=np.uint32)
    full = (n // NP_ROW) * NP_ROW
    for lo in range(0, full, NP_CHUNK):
        stop = min(lo + NP_CHUNK, full)
        rows = a[lo:stop].reshape(-1, NP_ROW)
        r0 = rows.sum(axis=1, dtype=np.uint32).astype(np.uint64)
        w = np.einsum("ij,j->i", rows, j).astype(np.uint64)
        offs = np.arange(lo + 1, stop + 1, NP_ROW, dtype=np.uint64) + np.uint64(origin)
        with np.errstate(over="ignore"):
            s1 += int((offs * r0 + w).sum(dtype=np.uint64))
        s0 += int(r0.sum(dtype=np.uint64))
    if full < n:
        tail = a[full:].astype(np.uint64)
        ts0 = int(tail.sum())
        tw = int((tail * np.arange(n - full, dtype=np.uint64)).sum())
        s1 += (origin + full + 1) * ts0 + tw
        s0 += ts0
    return s0 & formula.MASK64, s1 & formula.MASK64


def _get_kernel() -> Callable:
    global _kernel, _kernel_state
    if _kernel is None:
        with _kernel_lock:
            if _kernel is None:
                try:
                    _kernel = _build_numba_kernel()
                    _kernel_state = "numba"
                except Exception:  # numba missing or unusable: the numpy path is exact too
                    _kernel = None
                    _kernel_state = "numpy"
                    return numpy_sums
    return _kernel


def backend() -> str:
    """Which CPU hash backend is in use: ``numba``, ``numpy`` or ``unloaded`` (before the first hash)."""
    return _kernel_state


def array_sums(a: Any, start: int = 0) -> tuple[int, int]:
    """``(S0, S1) mod 2**64`` of a contiguous 1-D uint8 numpy array whose first byte sits at logical offset
    ``start`` (0 for a whole tensor; tests use large values to push S1 through 2**63 with a small input)."""
    k = _get_kernel()
    if k is numpy_sums:
        return numpy_sums(a, start)
    try:
        import numpy as np

        s0, s1 = k(a, np.uint64(start & formula.MASK64))
        return int(s0), int(s1)
    except Exception:
        return numpy_sums(a, start)


def _bytes_of(t: Any) -> Any:
    """``t``'s bytes as a 1-D uint8 numpy array, through upstream's own view chain (same exceptions)."""
    import torch

    b = t.detach().contiguous().view(torch.uint8).reshape(-1)
    if b.is_conj() or b.is_neg():  # lazily-resolved views: let the reference decide what upstream does
        raise _Unsupported
    return b.numpy()


class _Unsupported(Exception):
    """Raised for inputs the fast path leaves to the reference implementation."""


def _on_bytes(name: str, t: Any, fast: Any) -> int:
    """``fast(bytes_array)`` for a CPU tensor; 0 when empty, the reference's ``name`` for inputs the fast path
    leaves to it, -1 on failure (upstream's sentinel)."""
    try:
        if t is None or t.numel() == 0:
            return 0
        a = _bytes_of(t)
    except _Unsupported:
        from . import reference

        return getattr(reference, name)(t)
    except Exception:
        return -1
    return fast(a)


def _khash_of(a: Any) -> int:
    s0, s1 = array_sums(a)
    return formula.finish(s0, s1, a.size)


def _knz_of(a: Any) -> int:
    import numpy as np

    return int(np.count_nonzero(a))


def khash(t: Any) -> int:
    """Upstream ``khash`` of a CPU tensor (exact), or the reference's result for inputs the fast path skips."""
    return _on_bytes("khash", t, _khash_of)


def knz(t: Any) -> int:
    """Upstream ``knz`` of a CPU tensor: number of nonzero bytes."""
    return _on_bytes("knz", t, _knz_of)


def khash_knz(t: Any) -> tuple[int, int]:
    """Both fingerprints with one view of the bytes."""
    try:
        if t is None or t.numel() == 0:
            return 0, 0
        a = _bytes_of(t)
    except _Unsupported:
        from . import reference

        return reference.khash(t), reference.knz(t)
    except Exception:
        return -1, -1
    import numpy as np

    s0, s1 = array_sums(a)
    return formula.finish(s0, s1, a.size), int(np.count_nonzero(a))


# Dtypes whose min/max/indexing go through ``aminmax`` with results identical to upstream's min()/max().
_RNG_FAST = frozenset({"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8"})


def rng(t: Any) -> str:
    """Upstream ``rng`` of a CPU tensor; integer index tensors take one ``aminmax`` pass, others the reference."""
    from . import reference

    try:
        if str(t.dtype) not in _RNG_FAST:
            return reference.rng(t)
        n = t.numel()
        if n == 0:
            return "(0)"
        flat = t.detach().reshape(-1)
        lo, hi = flat.aminmax()
        return f"(cnt={n},min={int(lo)},max={int(hi)},first={int(flat[0])},last={int(flat[-1])})"
    except Exception:
        return reference.rng(t)


def khash_bytes(a: Any) -> int:
    """Upstream ``khash`` of a numpy byte buffer (any shape, C order; e.g. the simulator's KV pages). Exact on
    either path; a buffer under :data:`SMALL_BYTES` never loads numba."""
    import numpy as np

    flat = np.ascontiguousarray(a, dtype=np.uint8).reshape(-1)
    if flat.size == 0:
        return 0
    s0, s1 = numpy_sums(flat) if flat.size < SMALL_BYTES else array_sums(flat)
    return formula.finish(s0, s1, flat.size)
