"""Fingerprints of CUDA tensors without host syncs: enqueue on the current stream, return :class:`.Deferred`.

Per call: take a result slot from a preallocated per-device ring (device state rows, result rows, pinned host
mirror), launch the fused Triton kernel on the *current* stream (so it runs after the producer's work that was
enqueued before the call, and before anything enqueued after it), and record a pooled CUDA event. The kernel's last
program writes the result row straight into the pinned host ring through its UVA mapping; where a one-time probe
(first fingerprint of the process: one small launch and one stream sync) finds that unavailable, a ``non_blocking``
32-byte device-to-host copy follows the kernel instead. Nothing else on this path waits for the device. The slot and
the event return to their pools when the result is read (or, for a result dropped unread, once its event has
completed). Without Triton the exact chunked torch path (:mod:`.torch_path`)
replaces the kernel. Under CUDA-graph capture nothing is launched: fingerprints give -1, ``rng`` an error string,
as upstream's ``.item()`` would have failed there.

``khash(t)`` followed by ``knz(t)`` on the same, unmodified tensor from the same thread (the usual call pattern)
shares one launch.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import formula
from .deferred import Deferred, Pending

if TYPE_CHECKING:
    import torch

SLOTS_PER_CHUNK = 256
CAPTURE_ERROR = "(err:operation not permitted when stream is capturing)"
RNG_TIMEOUT = "(err:fingerprint result not ready)"

_tk: ModuleType | None = None
_triton_state = "unknown"  # "unknown" | "ok" | "off"
# Result delivery: True = kernels write into the pinned host ring through its UVA mapping (no copy launch per call);
# False = device ring + one non_blocking 32-byte copy per call; None = decide by a probe on first use.
UVA: bool | None = None
_rings: dict = {}
_rings_lock = threading.Lock()
_memo = threading.local()


def _kernels() -> ModuleType | None:
    """The Triton launchers, or None when Triton is unavailable (or a launch failed once)."""
    global _tk, _triton_state
    if _triton_state == "unknown":
        try:
            from . import triton_kernels

            _tk = triton_kernels
            _triton_state = "ok"
        except Exception:
            _triton_state = "off"
    return _tk if _triton_state == "ok" else None


def _triton_failed(exc: BaseException) -> None:
    global _triton_state
    _triton_state = "off"
    warnings.warn(f"cptrace_otel: Triton fingerprint kernel failed ({exc!r}); using the torch path", RuntimeWarning,
                  stacklevel=3)


def backend() -> str:
    """``triton`` or ``torch``: which path CUDA fingerprints take now."""
    return "triton" if _kernels() is not None else "torch"


class _Chunk:
    __slots__ = ("state", "out", "host", "out_rows", "host_rows", "init_event", "init_done")

    def __init__(self, device: torch.device, tk: ModuleType):
        import torch

        self.state = tk.new_state(SLOTS_PER_CHUNK, device)
        self.out = torch.zeros((SLOTS_PER_CHUNK, 4), dtype=torch.int64, device=device)
        self.host = torch.zeros((SLOTS_PER_CHUNK, 4), dtype=torch.int64, pin_memory=_pinned(device))
        # Views made once: slicing per call would cost a few microseconds of Python on the hot path.
        self.out_rows = list(self.out.unbind(0))
        self.host_rows = list(self.host.unbind(0))
        # The resting state was written on the stream current at creation; a launch on another stream waits for it
        # on the device (no host sync) until the event is seen complete once.
        self.init_event = _new_event()
        self.init_event.record()
        self.init_done = False

    def ensure_initialized(self) -> None:
        if not self.init_done:
            if self.init_event.query():
                self.init_done = True
            else:
                import torch

                torch.cuda.current_stream().wait_event(self.init_event)


class _Ring:
    """Result slots and CUDA events of one device. Grows by a chunk when every slot is in flight."""

    def __init__(self, device: torch.device):
        self.device = device
        self.chunks: list[_Chunk] = []
        self.free: list[tuple[_Chunk, int]] = []
        self.events: list[torch.cuda.Event] = []
        # Slots whose Deferreds were dropped unread: reusable once their event has completed.
        self.quarantine: list[tuple[_Chunk | None, int, torch.cuda.Event]] = []

    def _reclaim(self) -> None:
        # Swap the list out first: Pending.__del__ may append from any thread while this runs.
        items, self.quarantine = self.quarantine, []
        keep = []
        for item in items:
            chunk, slot, ev = item
            try:
                done = ev.query()
            except Exception:
                done = False
            if done:
                if chunk is not None:
                    self.free.append((chunk, slot))
                self.events.append(ev)
            else:
                keep.append(item)
        self.quarantine.extend(keep)

    def acquire(self, tk: ModuleType) -> tuple[_Chunk, int]:
        try:
            chunk, slot = self.free.pop()  # list.pop is atomic under the GIL
        except IndexError:
            with _rings_lock:
                if self.quarantine:
                    self._reclaim()
                if self.free:
                    chunk, slot = self.free.pop()
                else:
                    chunk, slot = _Chunk(self.device, tk), 0
                    self.chunks.append(chunk)
                    self.free.extend((chunk, i) for i in range(SLOTS_PER_CHUNK - 1, 0, -1))
        if not chunk.init_done:
            chunk.ensure_initialized()
        return chunk, slot

    def event(self) -> torch.cuda.Event:
        try:
            return self.events.pop()
        except IndexError:
            return _new_event()

    def releaser(self, chunk: _Chunk | None, slot: int, ev: torch.cuda.Event) -> Callable[[bool], None]:
        def release(dropped: bool) -> None:
            if dropped:
                self.quarantine.append((chunk, slot, ev))
                # Bound the list even where no slot allocation ever reclaims it (the torch path). Never block here:
                # this may run inside a garbage collection triggered while the lock is held.
                if len(self.quarantine) > 4 * SLOTS_PER_CHUNK and _rings_lock.acquire(blocking=False):
                    try:
                        self._reclaim()
                    finally:
                        _rings_lock.release()
                return
            if chunk is not None:
                self.free.append((chunk, slot))
            self.events.append(ev)

        return release

    def device_bytes(self) -> int:
        return sum(c.state.numel() * 8 + c.out.numel() * 8 for c in self.chunks)


def _ring(device: torch.device) -> _Ring:
    key = device.index if device.index is not None else 0
    r = _rings.get(key)
    if r is None:
        with _rings_lock:
            r = _rings.get(key)
            if r is None:
                r = _rings[key] = _Ring(device)
    return r


def ring_device_bytes() -> int:
    """Device memory held by all result rings (for the memory figure)."""
    return sum(r.device_bytes() for r in list(_rings.values()))


def _capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


def _new_event() -> torch.cuda.Event:
    import torch

    # Blocking: a waiting resolver sleeps in the driver instead of spinning on its lock.
    return torch.cuda.Event(blocking=True)


def _pinned(device: torch.device) -> bool:
    # Host mirrors are pinned so device-to-host copies can be non_blocking. (The unit tests drive this module with
    # CPU tensors under the Triton interpreter; there nothing is pinned.)
    return device.type == "cuda"


class _NoGuard:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_GUARD = _NoGuard()


def _on(device: torch.device) -> _NoGuard | torch.cuda.device:
    """Make ``device`` current for the launch (Triton and events use the current device's current stream)."""
    if device.type != "cuda":
        return _NO_GUARD
    import torch

    if device.index is None or device.index == torch.cuda.current_device():
        return _NO_GUARD
    return torch.cuda.device(device)


def _finish_hash(n: int):
    def f(v: tuple) -> int:
        if v[3]:  # out-of-range gather indices: upstream's indexing would have raised
            return -1
        return formula.finish(v[0], v[1], n)

    return f


def _finish_nz(v: tuple) -> int:
    return -1 if v[3] else formula.to_signed64(v[2])


def _probe_uva(device: torch.device, tk: ModuleType) -> bool:
    """Can kernels write results straight into pinned host memory (UVA-mapped)? One small launch and one stream
    sync, once per process, on the first fingerprint; any failure selects the copy mode, which is always correct."""
    if device.type != "cuda":
        return False
    try:
        import torch

        x = torch.arange(4099, device=device, dtype=torch.int32).view(torch.uint8)
        state = tk.new_state(1, device)
        host = torch.full((1, 4), -7, dtype=torch.int64, pin_memory=True)
        tk.hash_nz(x, state, host, 0)
        torch.cuda.current_stream(device).synchronize()
        b = x.cpu().tolist()
        want = [sum(b) & formula.MASK64, sum(v * (i + 1) for i, v in enumerate(b)), sum(1 for v in b if v), 0]
        got = host[0].tolist()
        return [got[0] & formula.MASK64, got[1] & formula.MASK64, got[2], got[3]] == want
    except Exception:
        return False


def _uva(ring: _Ring, tk: ModuleType) -> bool:
    global UVA
    if UVA is None:
        with _rings_lock:
            if UVA is None:
                UVA = _probe_uva(ring.device, tk)
    return UVA


def _enqueue(ring: _Ring, tk: ModuleType, launch: Callable[[torch.Tensor, torch.Tensor, int], None],
             keep: object) -> Pending | None:
    """Run ``launch(state, out, slot)`` on the current stream for one ring slot and return its Pending; None (and
    Triton switched off) when the launch raised."""
    chunk, slot = ring.acquire(tk)
    uva = UVA if UVA is not None else _uva(ring, tk)
    try:
        launch(chunk.state, chunk.host if uva else chunk.out, slot)
    except Exception as e:
        ring.free.append((chunk, slot))
        _triton_failed(e)
        return None
    host = chunk.host_rows[slot]
    if not uva:
        host.copy_(chunk.out_rows[slot], non_blocking=True)
    ev = ring.event()
    ev.record()
    return Pending(ev, host, keep, ring.releaser(chunk, slot, ev))


def _launch_hash(b: torch.Tensor, keep: object) -> Pending:
    """Enqueue S0/S1/nz of the uint8 CUDA tensor ``b`` (contiguous, numel >= 1; its shape does not matter)."""
    import torch

    ring = _ring(b.device)
    tk = _kernels()
    if tk is not None:
        pending = _enqueue(ring, tk, lambda state, out, slot: tk.hash_nz(b, state, out, slot), keep)
        if pending is not None:
            return pending
    from . import torch_path

    acc = torch_path.sums(b.reshape(-1))
    host = torch.empty(4, dtype=torch.int64, pin_memory=_pinned(b.device))
    host.copy_(acc, non_blocking=True)
    ev = ring.event()
    ev.record()
    return Pending(ev, host, (keep, acc), ring.releaser(None, 0, ev))


def _pair(t: torch.Tensor) -> tuple[Any, Any]:
    """(khash, knz) of a CUDA tensor: Deferreds, or plain upstream values for empty/failing/capturing cases."""
    try:
        if t.numel() == 0:
            return 0, 0
        if _capturing():
            return -1, -1
        import torch

        if t.dim() and t.is_contiguous():
            b = t.view(torch.uint8)  # the same bytes as upstream's chain, one torch call instead of four
        else:
            b = t.detach().contiguous().view(torch.uint8).reshape(-1)
        with _on(b.device):
            pending = _launch_hash(b, (t, b))
    except Exception:
        return -1, -1
    n = b.numel()
    return Deferred("khash", pending, _finish_hash(n), -1), Deferred("knz", pending, _finish_nz, -1)


def khash_knz(t: torch.Tensor) -> tuple[Any, Any]:
    """Both fingerprints from one fused launch."""
    return _pair(t)


def _memo_pair(t: torch.Tensor, want: int) -> Any:
    # The usual call site evaluates khash(t) and knz(t) back to back: the second call takes the other half of the
    # first call's launch when it is the same tensor object, unmodified (same version counter), on the same thread.
    # The memo holds the tensor weakly: it must not keep a KV slice alive.
    last = getattr(_memo, "last", None)
    if last is not None:
        _memo.last = None
        ref, ver, pair, got = last
        if got != want and ref() is t and getattr(t, "_version", None) == ver:
            return pair[want]
    pair = _pair(t)
    if is_deferred_pair(pair):
        try:
            _memo.last = (weakref.ref(t), getattr(t, "_version", None), pair, want)
        except TypeError:
            pass
    return pair[want]


def is_deferred_pair(pair: tuple) -> bool:
    return type(pair[0]) is Deferred


def khash(t: torch.Tensor) -> Any:
    return _memo_pair(t, 0)


def knz(t: torch.Tensor) -> Any:
    return _memo_pair(t, 1)


_RNG_TRITON_DTYPES = frozenset({"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8"})


def _rng_text(n: int):
    def f(v: tuple) -> str:
        try:
            # Same conversions, in the same order, as upstream's int(x.item()) on each summary element.
            lo, hi, first, last = (int(x) for x in v)
        except Exception as e:
            return f"(err:{e})"
        return f"(cnt={n},min={lo},max={hi},first={first},last={last})"

    return f


def rng(t: torch.Tensor) -> Any:
    """``rng`` of a CUDA tensor as a Deferred string (one launch for integer tensors, no sync)."""
    try:
        guard = _on(t.device)
    except Exception as e:
        return f"(err:{e})"
    with guard:
        return _rng(t)


def _rng(t: torch.Tensor) -> Any:
    import torch

    try:
        n = t.numel()
        if n == 0:
            return "(0)"
        if _capturing():
            return CAPTURE_ERROR
        flat = t.detach().reshape(-1)
        ring = _ring(t.device)
        tk = _kernels()
        if tk is not None and str(t.dtype) in _RNG_TRITON_DTYPES:
            x = flat.contiguous()
            pending = _enqueue(ring, tk, lambda state, out, slot: tk.rng_summary(x, state, out, slot), (t, x))
            if pending is not None:
                return Deferred("rng", pending, _rng_text(n), RNG_TIMEOUT)
        # Any dtype: the same torch reductions upstream runs (same errors), read back later instead of .item().
        vals = torch.stack([flat.min(), flat.max(), flat[0], flat[-1]])
        host = torch.empty(4, dtype=vals.dtype, pin_memory=_pinned(t.device))
        host.copy_(vals, non_blocking=True)
        ev = ring.event()
        ev.record()
        return Deferred("rng", Pending(ev, host, (t, vals), ring.releaser(None, 0, ev)), _rng_text(n), RNG_TIMEOUT)
    except Exception as e:
        return f"(err:{e})"


def many(tensors: list[torch.Tensor]) -> list[tuple[Any, Any]]:
    """(khash, knz) for each CUDA tensor of one device, all nonempty ones in a single launch."""
    if not tensors:
        return []
    with _on(tensors[0].device):
        return _many(tensors)


def _is_empty(t: torch.Tensor) -> bool:
    try:
        return t.numel() == 0
    except Exception:
        return False


def _many(tensors: list[torch.Tensor]) -> list[tuple[Any, Any]]:
    import torch

    results: list[Any] = [None] * len(tensors)
    if _capturing():  # before any copy: nothing may be enqueued into a graph being captured
        return [(0, 0) if _is_empty(t) else (-1, -1) for t in tensors]
    tk = _kernels()
    if tk is None:
        return [_pair(t) for t in tensors]
    ptrs: list[int] = []
    lens: list[int] = []
    where: list[int] = []
    copies: list[Any] = []
    dev = None
    base: Any = None
    for i, t in enumerate(tensors):
        try:
            n = t.numel()
            if n == 0:
                results[i] = (0, 0)
                continue
            if dev is None:
                dev = t.device
            elif t.device != dev:
                results[i] = _pair(t)
                continue
            if t.dim() and t.is_contiguous():
                # Upstream's byte view of a contiguous tensor with dims is the tensor's own memory: no view needed.
                if not where:
                    base = t.view(torch.uint8)
                ptrs.append(t.data_ptr())
                lens.append(n * t.element_size())
            else:
                b = t.detach().contiguous().view(torch.uint8).reshape(-1)
                copies.append(b)
                if not where:
                    base = b
                ptrs.append(b.data_ptr())
                lens.append(b.numel())
            where.append(i)
        except Exception:
            results[i] = (-1, -1)
    if not where:
        return results
    assert dev is not None  # set by the first segment
    segs = copies  # kept alive with the launch
    bp = ptrs[0]  # == base.data_ptr(): every segment is addressed relative to the first one
    offs = [p - bp for p in ptrs]
    nseg = len(where)
    aligned = bp % 16 == 0 and all(o % 16 == 0 for o in offs)
    if aligned:
        offs = [o // 16 for o in offs]
    desc_host = torch.tensor([offs, lens, list(range(nseg))], dtype=torch.int64)
    if _pinned(dev):
        desc_host = desc_host.pin_memory()
    desc = desc_host.to(dev, non_blocking=True)
    state = torch.zeros((nseg, tk.STATE_COLS), dtype=torch.int64, device=dev)
    out = torch.empty((nseg, tk.OUT_COLS), dtype=torch.int64, device=dev)
    try:
        tk.hash_nz_batch(base, desc[0], desc[1], desc[2], max(lens), state, out, aligned)
    except Exception as e:
        _triton_failed(e)
        for i in where:
            results[i] = _pair(tensors[i])
        return results
    host = torch.empty((nseg, tk.OUT_COLS), dtype=torch.int64, pin_memory=_pinned(dev))
    host.copy_(out, non_blocking=True)
    ring = _ring(dev)
    ev = ring.event()
    ev.record()
    pending = Pending(ev, host, (tensors, segs, base, desc_host, desc, state, out), ring.releaser(None, 0, ev))
    for k, (i, n) in enumerate(zip(where, lens, strict=False)):
        row = _row(k)
        results[i] = (Deferred("khash", pending, _compose(_finish_hash(n), row), -1),
                      Deferred("knz", pending, _compose(_finish_nz, row), -1))
    return results


def _row(k: int):
    return lambda v: v[k]


def _compose(f, g):
    return lambda v: f(g(v))


def gather(pool: torch.Tensor, indices: torch.Tensor) -> tuple[Any, Any]:
    """(khash, knz) of ``pool[indices]`` without materializing it (falls back to materializing for index forms the
    kernel does not cover: masks, multi-dim or CPU indices, rows that are not contiguous)."""
    with _on(pool.device):
        return _gather(pool, indices)


def _gather(pool: torch.Tensor, indices: torch.Tensor) -> tuple[Any, Any]:
    import torch

    tk = _kernels()
    try:
        simple = (
            tk is not None
            and isinstance(indices, torch.Tensor)
            and indices.dim() == 1
            and indices.device == pool.device
            and indices.dtype in (torch.int64, torch.int32)
            and pool.dim() >= 1
        )
        if tk is None or not simple:  # (simple implies tk; spelled out for the type checker)
            return _pair(pool[indices])
        if indices.numel() == 0 or pool.numel() == 0:
            return _pair(pool[indices])
        if _capturing():
            return -1, -1
        npool = pool.shape[0]
        try:
            u8 = pool.detach()
            if u8.dim() == 1:
                u8 = u8.unsqueeze(1)
            p2 = u8.view(torch.uint8).reshape(npool, -1)
            if p2.stride(1) != 1 and p2.shape[1] > 1:
                p2 = p2.contiguous()
        except Exception:  # e.g. a last dim that is not contiguous: byte views need it
            return _pair(pool[indices])
        idx = indices.contiguous()
        ring = _ring(pool.device)
        pending = _enqueue(ring, tk, lambda state, out, slot: tk.hash_nz_gather(p2, idx, state, out, slot),
                           (pool, p2, idx))
        if pending is None:
            return _pair(pool[indices])
        n = idx.numel() * p2.shape[1]
        return Deferred("khash", pending, _finish_hash(n), -1), Deferred("knz", pending, _finish_nz, -1)
    except Exception:
        return -1, -1


def warmup(device: torch.device | int | str | None = None) -> None:
    """Compile the kernels and set up the ring, events and delivery mode for ``device`` (default: current), so that
    the first traced call does not pay for it. Syncs the device; call it at startup, not on a hot path."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    with torch.cuda.device(dev):
        x = torch.arange(40000, device=dev, dtype=torch.int32)
        vals = [*khash_knz(x), *khash_knz(x.view(torch.uint8)[1:]), rng(x), rng(x.to(torch.int64))]
        pool = x.view(-1, 8)
        vals += [*gather(pool, torch.arange(7, device=dev)), *gather(x.view(torch.uint8)[:, None], x[:3])]
        vals += [v for pair in many([x[:64], x[64:200]]) for v in pair]
        for v in vals:
            int(v) if type(v) is Deferred and v.kind != "rng" else str(v)
        torch.cuda.synchronize(dev)
