"""Exact KV fingerprints: upstream ``khash``/``knz``/``rng`` values, computed without int64 copies or host syncs.

Dispatch per call (nothing heavy is imported until a tensor arrives; importing this package loads no torch, numpy
or triton):

* CUDA tensor: fused Triton kernels on the current stream (or an exact chunked torch path without Triton); the
  result is a :class:`~.deferred.Deferred` (``int()``/``str()`` force it; the pipeline resolves it off-thread).
* CPU tensor: :mod:`.cpu` (the C speedups' kernel, read in place at memory speed; numpy without a compiler), plain
  ints/strings.
* Other devices and inputs the fast paths skip: :mod:`.reference` (upstream semantics, same exceptions).
* Non-tensors: upstream's sentinels (``khash``/``knz``: 0 for None, -1 otherwise; ``rng``: Python min/max on
  sequences, ``(none)``, ``(0)``, ``(err:...)``).

Nothing here raises into the caller.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .deferred import Deferred, is_deferred, resolve

if TYPE_CHECKING:
    import torch

__all__ = [
    "Deferred",
    "cuda_warmup",
    "fingerprint_many",
    "forward_fingerprint",
    "gather_fingerprint",
    "is_deferred",
    "khash",
    "khash_knz",
    "knz",
    "resolve",
    "rng",
]

_torch_available: bool | None = None


def _tensor_type() -> type[torch.Tensor] | None:
    # A tensor can only exist if torch was already imported by someone; never import it here.
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _torch_importable() -> bool:
    global _torch_available
    if _torch_available is None:
        import importlib.util

        _torch_available = importlib.util.find_spec("torch") is not None
    return _torch_available


def _non_tensor_fingerprint(t: object) -> int:
    # Upstream: ``import torch``; ``t is None or t.numel() == 0`` -> 0; anything failing -> -1.
    if t is None:
        return 0 if _torch_importable() else -1
    if not hasattr(t, "numel"):
        return -1
    return -3  # tensor-like object: let the reference decide


def _device_impl(t: object) -> ModuleType | None:
    """The module that fingerprints ``t`` (``gpu`` for CUDA tensors, ``cpu`` for CPU tensors, ``reference`` for
    tensors elsewhere), or None when ``t`` is not a tensor."""
    T = _tensor_type()
    if T is None or not isinstance(t, T):
        return None
    dev = t.device.type
    if dev == "cuda":
        from . import gpu

        return gpu
    if dev == "cpu":
        from . import cpu

        return cpu
    from . import reference

    return reference


def _dispatch(name: str, t: object) -> Any:
    """Run fingerprint ``name`` (``"khash"`` or ``"knz"``) on the path for ``t``'s device; -1 on any failure."""
    try:
        impl = _device_impl(t)
        if impl is not None:
            return getattr(impl, name)(t)
        v = _non_tensor_fingerprint(t)
        if v != -3:
            return v
        from . import reference

        return getattr(reference, name)(t)
    except Exception:
        return -1


def khash(t: object) -> Any:
    """Upstream ``khash(t)``: an int (CPU, non-tensors) or a Deferred int (CUDA)."""
    return _dispatch("khash", t)


def knz(t: object) -> Any:
    """Upstream ``knz(t)``: count of nonzero bytes; an int or a Deferred int (CUDA)."""
    return _dispatch("knz", t)


def khash_knz(t: object) -> tuple[Any, Any]:
    """``(khash(t), knz(t))`` from one pass over the bytes."""
    try:
        impl = _device_impl(t)
        if impl is not None and hasattr(impl, "khash_knz"):
            return impl.khash_knz(t)
        return khash(t), knz(t)
    except Exception:
        return -1, -1


def rng(t: object) -> Any:
    """Upstream ``rng(t)``: ``(cnt=..,min=..,max=..,first=..,last=..)``; a Deferred string on CUDA tensors."""
    try:
        if t is None:
            return "(none)"
        impl = _device_impl(t)
        if impl is None:
            from . import reference

            impl = reference
        return impl.rng(t)
    except Exception as e:  # pragma: no cover - reference.rng already catches
        try:
            return f"(err:{e})"
        except Exception:
            return "(err:?)"


def forward_fingerprint(t: object) -> tuple[Any, Any, int]:
    """``(h, nz, rows)`` for upstream ``fwd_hash``: tensors -> (khash, knz, first-dim size or 0), None -> zeros,
    anything else -> -2s. Under CUDA-graph capture nothing is launched and h, nz are -1."""
    try:
        T = _tensor_type()
        if T is not None and isinstance(t, T):
            rows = int(t.shape[0]) if t.dim() else 0
            h, nz = khash_knz(t)
            return h, nz, rows
        if t is None:
            return 0, 0, 0
        return -2, -2, -2
    except Exception:
        return -1, -1, -1


def fingerprint_many(tensors: Iterable[object]) -> list[tuple[Any, Any]]:
    """``[(khash(t), knz(t)) for t in tensors]``; the CUDA tensors of one device are hashed in a single launch."""
    tensors = list(tensors)
    try:
        T = _tensor_type()
        # Keyed by position, the CUDA tensors themselves (typed as tensors for the launch below).
        cuda = {i: t for i, t in enumerate(tensors) if T is not None and isinstance(t, T) and t.device.type == "cuda"}
        out: list[Any] = [None] * len(tensors)
        if cuda:
            from . import gpu

            by_dev: dict[torch.device, list[int]] = {}
            for i, ct in cuda.items():
                by_dev.setdefault(ct.device, []).append(i)
            for idxs in by_dev.values():
                for i, r in zip(idxs, gpu.many([cuda[i] for i in idxs]), strict=False):
                    out[i] = r
        for i, t in enumerate(tensors):
            if out[i] is None:
                out[i] = khash_knz(t)
        return out
    except Exception:
        return [(-1, -1)] * len(tensors)


def gather_fingerprint(pool: torch.Tensor, indices: torch.Tensor) -> tuple[Any, Any]:
    """``(khash(pool[indices]), knz(pool[indices]))``; on CUDA the gathered copy is never materialized (rows are read
    through the indices in token order). -1s when the indexing itself fails."""
    try:
        T = _tensor_type()
        if T is not None and isinstance(pool, T) and pool.device.type == "cuda":
            from . import gpu

            return gpu.gather(pool, indices)
        return khash_knz(pool[indices])
    except Exception:
        return -1, -1


def cuda_warmup(device: torch.device | int | str | None = None) -> bool:
    """Optional, at startup: compile the CUDA kernels and allocate the result ring for ``device`` so the first traced
    fingerprint pays no compile time. False (and nothing done) without torch/CUDA. Syncs the device."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        from . import gpu

        gpu.warmup(device)
        return True
    except Exception:
        return False
