"""Deferred fingerprint values: a result that a GPU kernel will have written once its CUDA event completes.

``khash``/``knz``/``rng`` on a CUDA tensor return a :class:`Deferred` instead of syncing. It behaves like the
upstream value where it is consumed: ``int(d)``, ``operator.index(d)``, ``str(d)`` and ``format(d)`` force it
(waiting for the event: a host sync, taken only then) and give exactly the upstream value. The pipeline's drainer
thread calls :func:`resolve` in record order, off the caller's thread.

A :class:`Pending` is one enqueued launch (an event, the pinned host row its results land in, references that keep
the source tensors alive until the kernel ran); several Deferreds can share one (``khash`` and ``knz`` come from the
same fused pass). This module imports nothing heavy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_lock = threading.Lock()

# Poll interval bounds for timed waits (event.query() is cheap; sleeping releases the GIL to the traced threads).
_POLL_MIN_S = 20e-6
POLL_MAX_S = 1e-3


class Pending:
    """One enqueued fingerprint launch. ``host`` is read only after ``event`` completed.

    ``on_done(dropped)`` returns pooled resources: ``dropped=False`` after the results were read, ``True`` when the
    object is garbage-collected unread (the launch may still be running)."""

    __slots__ = ("event", "host", "keep", "_values", "_on_done")

    def __init__(self, event: torch.cuda.Event, host: torch.Tensor, keep: object = None,
                 on_done: Callable[[bool], None] | None = None):
        self.event = event
        self.host: torch.Tensor | None = host
        self.keep = keep
        self._values: tuple | None = None
        self._on_done = on_done

    def ready(self) -> bool:
        """True once the results are on the host (no sync: an event query)."""
        if self._values is not None:
            return True
        try:
            return bool(self.event.query())
        except Exception:
            return True  # a broken event: let values() report it

    def values(self) -> tuple:
        """The host row as a tuple, waiting for the event if needed (a host sync when it has not completed)."""
        v = self._values
        if v is None:
            self.event.synchronize()
            v = self._collect()
        return v

    def wait(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: without limit) for the results; True when ready."""
        if self._values is not None:
            return True
        if timeout_s is None:
            self.values()
            return True
        deadline = time.monotonic() + timeout_s
        pause = _POLL_MIN_S
        while not self.ready():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, POLL_MAX_S)
        self._collect()
        return True

    def __del__(self) -> None:
        # Dropped unread (e.g. a khash() argument of a cptrace call below the trace level): hand the slot back
        # flagged as possibly still in use; the pool reuses it only once the event has completed.
        on_done = self._on_done
        if on_done is not None:
            self._on_done = None
            try:
                on_done(True)
            except Exception:
                pass

    def _collect(self) -> tuple:
        with _lock:
            if self._values is None:
                # host is dropped only together with storing the values, so it is still here
                assert self.host is not None
                self._values = tuple(self.host.tolist())
                on_done, self._on_done = self._on_done, None
                self.keep = None
                self.host = None
                if on_done is not None:
                    on_done(False)  # hands the result slot and the event back to their pools
            return self._values


class Deferred:
    """A fingerprint value that becomes known when its kernel has run.

    ``kind`` is ``"khash"``, ``"knz"`` or ``"rng"``; ``finish`` maps the pending launch's host row to the upstream
    value; ``sentinel`` is what :func:`resolve` gives when the wait times out or the launch failed."""

    __slots__ = ("kind", "_pending", "_finish", "_value", "sentinel")

    def __init__(self, kind: str, pending: Pending, finish: Callable[[tuple], int | str], sentinel: int | str):
        self.kind = kind
        self._pending = pending
        self._finish = finish
        self._value: Any = _UNSET
        self.sentinel = sentinel

    def ready(self) -> bool:
        """True when :meth:`value` will not wait (event query, no sync)."""
        return self._value is not _UNSET or self._pending.ready()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` seconds without holding the GIL for long; True when the value is known."""
        if self._value is not _UNSET:
            return True
        try:
            return self._pending.wait(timeout_s)
        except Exception:
            self._value = self.sentinel
            return True

    def value(self) -> Any:
        """The upstream value (forces a wait for the kernel if it has not completed)."""
        v = self._value
        if v is _UNSET:
            try:
                v = self._finish(self._pending.values())
            except Exception:
                v = self.sentinel
            self._value = v
            self._pending = _DONE
        return v

    def __int__(self) -> int:
        return int(self.value())

    def __index__(self) -> int:
        return int(self.value())

    def __str__(self) -> str:
        return str(self.value())

    def __format__(self, spec: str) -> str:
        return format(self.value(), spec)

    def __repr__(self) -> str:
        if self._value is not _UNSET:
            return f"Deferred({self.kind}={self._value!r})"
        return f"Deferred({self.kind}, pending)"


class _Unset:
    __slots__ = ()


_UNSET: Any = _Unset()


class _Done:
    """Placeholder pending for a Deferred whose value is cached (drops the launch's references)."""

    __slots__ = ()

    def ready(self) -> bool:
        return True


_DONE: Any = _Done()


def is_deferred(v: object) -> bool:
    """True for a :class:`Deferred` (cheap type check for the drainer)."""
    return type(v) is Deferred


def resolve(v: object, timeout_s: float | None = None) -> Any:
    """``v`` itself, or for a Deferred its value once ready; its ``sentinel`` if not ready within ``timeout_s``."""
    if type(v) is not Deferred:
        return v
    if v.wait(timeout_s):
        return v.value()
    return v.sentinel
