"""Fast exact fingerprints of host (CPU) tensors and numpy byte buffers.

With the C speedups built (the default install with a compiler: ``cptrace_otel._speedups._fingerprint``), ``khash``,
``knz`` and ``rng`` read the bytes in place (a contiguous tensor's ``data_ptr()``, a numpy array's buffer) in one pass
at memory speed, with the GIL released for large buffers; see ``fingerprint.c`` for the blocked form of the exact
formula. Without them an exact numpy path does the same tiling with uint32 row reductions, and ``rng`` takes one
``aminmax`` pass.

The functions take torch CPU tensors and follow upstream's ``t.detach().contiguous().view(torch.uint8)``: a
non-contiguous tensor is copied to contiguous first (as upstream does), and an input whose byte view upstream rejects
or that is a lazily-resolved view goes to :mod:`.reference`, so the same value or sentinel arises.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from .._speedups import twin_off
from .._speedups.fingerprint import load as _load_c
from . import formula

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

# numpy fallback: uint32 row sums are exact for rows <= 5804 bytes; chunks bound the temporaries.
NP_ROW = 4096
NP_CHUNK = 1 << 22

# The C module, or None without a compiler (loading it imports nothing but the module itself).
_c = _load_c()


def numpy_sums(a: npt.NDArray[np.uint8], start: int = 0) -> tuple[int, int]:
    """Exact ``(S0, S1) mod 2**64`` of a 1-D uint8 numpy array with numpy alone (no C module).

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


def numpy_fallback() -> AbstractContextManager[None]:
    """A block in which the CPU fingerprints run the numpy path, the C kernel's twin (a benchmark measures both;
    :func:`cptrace_otel._speedups.twin_off`)."""
    return twin_off(globals(), "_c")


def backend() -> str:
    """Which CPU fingerprint backend is in use: ``c-avx2``, ``c-portable`` (the C module's kernel) or ``numpy``."""
    return "c-" + _c.kernel() if _c is not None else "numpy"


def array_sums(a: npt.NDArray[np.uint8], start: int = 0) -> tuple[int, int]:
    """``(S0, S1) mod 2**64`` of a contiguous 1-D uint8 numpy array whose first byte sits at logical offset
    ``start`` (0 for a whole tensor; tests use large values to push S1 through 2**63 with a small input)."""
    if _c is not None:
        s0, s1, _ = _c.sums(a, -1, start)
        return s0, s1
    return numpy_sums(a, start)


class _Unsupported(Exception):
    """Raised for inputs the fast path leaves to the reference implementation."""


def _region(t: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    """``(address, nbytes, owner)`` of the bytes upstream's ``t.detach().contiguous().view(torch.uint8)`` reads, in
    place for a contiguous tensor, else in the contiguous copy upstream makes too (``owner`` keeps it alive while
    the caller reads). Raises :class:`_Unsupported` for inputs whose byte view upstream rejects (multi-byte elements
    in a 0-dim tensor or with a last stride other than 1, which ``contiguous()`` keeps on a size-1 dimension) or that
    are not plain dense memory (sparse, quantized, nested, lazily conjugated or negated): the reference decides
    those."""
    import torch

    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.is_conj() or t.is_neg():
        raise _Unsupported
    c = t if t.is_contiguous() else t.detach().contiguous()
    if c.element_size() != 1 and (c.dim() == 0 or c.stride(-1) != 1):
        raise _Unsupported
    return c.data_ptr(), c.numel() * c.element_size(), c


def _numpy_bytes(c: torch.Tensor) -> npt.NDArray[np.uint8]:
    """The bytes of the contiguous tensor ``c`` as a 1-D uint8 numpy array (a view; the path without C)."""
    import torch

    return c.detach().reshape(-1).view(torch.uint8).numpy()


def khash_knz(t: torch.Tensor) -> tuple[int, int]:
    """Upstream ``(khash(t), knz(t))`` of a CPU tensor from one pass over its bytes: ``(0, 0)`` when empty, the
    reference's values for inputs the fast path leaves to it, ``(-1, -1)`` on failure (upstream's sentinel)."""
    try:
        if t is None or t.numel() == 0:
            return 0, 0
        addr, nbytes, owner = _region(t)
        if _c is not None:
            return _c.khash_knz(addr, nbytes)
        a = _numpy_bytes(owner)
    except _Unsupported:
        from . import reference

        return reference.khash(t), reference.knz(t)
    except Exception:
        return -1, -1
    import numpy as np

    s0, s1 = numpy_sums(a)
    return formula.finish(s0, s1, a.size), int(np.count_nonzero(a))


def khash(t: torch.Tensor) -> int:
    """Upstream ``khash`` of a CPU tensor (exact), or the reference's result for inputs the fast path skips."""
    return khash_knz(t)[0]


def knz(t: torch.Tensor) -> int:
    """Upstream ``knz`` of a CPU tensor: number of nonzero bytes."""
    return khash_knz(t)[1]


# Integer dtypes whose upstream min()/max()/indexing the C reader reproduces, by struct code (built on first use).
_RNG_CODES: dict[torch.dtype, str] = {}


def _rng_code(dtype: torch.dtype) -> str | None:
    if not _RNG_CODES:
        import torch

        _RNG_CODES.update({torch.int64: "q", torch.int32: "i", torch.int16: "h", torch.int8: "b", torch.uint8: "B"})
    return _RNG_CODES.get(dtype)


def rng(t: torch.Tensor) -> str:
    """Upstream ``rng`` of a CPU tensor: integer tensors in one min/max pass (C in place when contiguous, else
    ``aminmax``), other dtypes through the reference."""
    from . import reference

    try:
        code = _rng_code(t.dtype)
        if code is None:
            return reference.rng(t)
        n = t.numel()
        if n == 0:
            return "(0)"
        if _c is not None and t.is_contiguous() and not t.is_quantized and not t.is_nested:
            lo, hi, first, last = _c.minmax(t.data_ptr(), code, n)
        else:
            flat = t.detach().reshape(-1)
            lo, hi = flat.aminmax()
            first, last = flat[0], flat[-1]
        return f"(cnt={n},min={int(lo)},max={int(hi)},first={int(first)},last={int(last)})"
    except Exception:
        return reference.rng(t)


def khash_bytes(a: npt.NDArray[np.uint8]) -> int:
    """Upstream ``khash`` of a numpy byte buffer (any shape, C order; e.g. the simulator's KV pages), read in place
    when it is a C-contiguous uint8 array. Exact on either path."""
    import numpy as np

    flat = a if a.dtype == np.uint8 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.uint8)
    if flat.size == 0:
        return 0
    if _c is not None:
        return _c.khash(flat)
    s0, s1 = numpy_sums(flat.reshape(-1))
    return formula.finish(s0, s1, flat.size)
