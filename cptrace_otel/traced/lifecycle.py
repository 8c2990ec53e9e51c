"""Process-life hooks: the traced process's records are delivered however it ends.

* Exit: :func:`install_exit_hook` (api, at import) registers the exit flush with ``atexit`` before the application
  can register its own handlers, so it runs after them (atexit is last-in, first-out) and records those handlers
  emit are still delivered. The one exit path: it runs the handler the pipeline registered (:func:`set_handlers`).
* SIGTERM: :func:`install_sigterm` (the pipeline, when it starts on the main thread) installs a handler that
  flushes within :data:`SIGNAL_FLUSH_S` (the pipeline's ``signal_flush(budget_s, dies)``), then chains the handler
  that was installed before (SGLang installs its own) or, when there was none, dies of SIGTERM as the process would
  have. A process that ignores SIGTERM is left alone. A handler the application installs *after* the first record
  replaces this one: it should exit through ``sys.exit`` (the exit flush runs) or call ``cptrace_otel.flush()``.
* Signal safety: the handler runs on the main thread between two bytecodes of whatever frame it interrupted, which
  may be inside ``flush()``, ``shutdown()`` or the exit flush. So nothing the handler or the threads it waits for
  needs can be a Python-level lock that frame may hold: the pipeline's wake-ups and flush waiters are
  :class:`Flag` (one C-level lock each, whose acquire and release are single calls: never held between bytecodes),
  the thread channel's queue is a ``queue.SimpleQueue`` (C), and the handler flushes the pipeline being shut down
  too (the pipeline's ``signal_flush``). A SIGTERM that lands while the handler flushes is folded into it (one
  flush, one chained call); one that lands during the exit flush waits for it to finish, then is handled (the
  application's handler runs, or the process dies of SIGTERM), so a storm of signals neither deadlocks nor cuts
  the flush short, and the exit stays within the exit budget.
* Fork: callbacks registered with :func:`on_fork_child` run in a forked child, in the order they were registered
  (the api forgets its installed submit function, then the pipeline its threads). ``multiprocessing`` fork children
  end with ``os._exit`` (no atexit): after those callbacks, a ``multiprocessing.util.Finalize`` is armed that runs
  the exit flush when the child's bootstrap finishes.

Imports only the standard library and nothing of the package: the pipeline registers its callbacks here when it is
imported (it is never looked up from here).
"""

from __future__ import annotations

import _thread
import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

SIGNAL_FLUSH_S = 3.0      # SIGTERM: longest wait for the flush before the chained handler (or death)

_exit_hook_registered = False
_sigterm_installed = False
_prev_sigterm: Any = None
_on_exit: Callable[[], None] | None = None
_on_signal: Callable[[float, bool], object] | None = None
_fork_children: list[Callable[[], None]] = []
_in_handler = False          # the handler is flushing: a nested SIGTERM is folded into it
_exit_flush_running = False  # the exit flush runs: a SIGTERM waits for it (see _deferred)
_deferred: tuple | None = None


class Flag:
    """An event that a signal handler may set or wait on whatever the interrupted frame was doing: one C-level lock,
    held while the flag is clear. :meth:`set` releases it (a no-op when set), :meth:`wait` acquires it with a
    timeout and, unless ``consume``, releases it again (the flag stays set). Acquire and release are single C
    calls, so a frame interrupted by a signal never holds anything a handler or another thread then waits for
    (``threading.Event`` holds its condition's lock across several bytecodes)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # already set
            pass

    def clear(self) -> None:
        self._lock.acquire(False)

    def wait(self, timeout: float, consume: bool = False) -> bool:
        got = self._lock.acquire(True, max(0.0, timeout))
        if got and not consume:
            self._lock.release()
        return got

    @property
    def raw_set(self) -> Callable[[], None]:
        """A C callable that sets the flag and runs no Python code (the lock's ``release``; it raises RuntimeError
        when the flag is already set): for native code to call (the record ring's side path wakes the drainer)."""
        return self._lock.release



def set_handlers(at_exit: Callable[[], None], signal_flush: Callable[[float, bool], object]) -> None:
    """The pipeline's exit handler (run at exit and at the end of a multiprocessing child) and its SIGTERM flush
    (``signal_flush(budget_s, dies)``: ``dies`` when the process ends right after it, so a backend that is down is
    not waited for). Called once, when the pipeline module is imported."""
    global _on_exit, _on_signal
    _on_exit, _on_signal = at_exit, signal_flush


def on_fork_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in every forked child (registration order), before the multiprocessing exit flush is armed."""
    _fork_children.append(fn)


def _exit_hook() -> None:
    fn = _on_exit
    if fn is not None:
        try:
            fn()
        except Exception:
            pass


def install_exit_hook() -> None:
    """Register the exit flush now (idempotent)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_exit_hook)
        _exit_hook_registered = True


def install_sigterm() -> None:
    """Install the SIGTERM flush (idempotent; only on the main thread, where signal handlers can be set)."""
    global _sigterm_installed, _prev_sigterm
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
        if prev == signal.SIG_IGN:
            return
        _prev_sigterm = prev
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError, AttributeError):
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Flush (within :data:`SIGNAL_FLUSH_S`), then chain the previous handler or die of SIGTERM. Signal-safe: see
    the module docstring."""
    global _in_handler, _deferred
    if _in_handler:
        return  # a storm: this one is folded into the flush under way, which chains once
    if _exit_flush_running:
        _deferred = (signum, frame)  # handled when the exit flush is done (run_deferred)
        return
    _in_handler = True
    try:
        fn = _on_signal
        if fn is not None:
            try:
                fn(SIGNAL_FLUSH_S, not callable(_prev_sigterm))  # dies: SIG_DFL, the process ends right after
            except Exception:
                pass
    finally:
        _in_handler = False
    _chain(signum, frame)


def _chain(signum: int, frame: FrameType | None) -> None:
    prev = _prev_sigterm
    if callable(prev):
        prev(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def exit_flush_running(on: bool) -> None:
    """The exit flush starts (True) or ends (False): a SIGTERM meanwhile waits for it (:func:`run_deferred`)."""
    global _exit_flush_running
    _exit_flush_running = on


def run_deferred() -> None:
    """After the exit flush: handle a SIGTERM that arrived during it (chain the application's handler, or die)."""
    global _deferred
    d, _deferred = _deferred, None
    if d is not None:
        try:
            _chain(*d)
        except SystemExit:
            pass  # already exiting: an atexit callback cannot change the exit status


class _Token:
    """multiprocessing.util.register_after_fork needs a weak-referenceable object."""


_TOKEN = _Token()


def _after_fork_in_child() -> None:
    for fn in list(_fork_children):
        try:
            fn()
        except Exception:
            pass
    # a multiprocessing child flushes at its end (it skips atexit); the module is looked up, never imported here
    mpu = sys.modules.get("multiprocessing.util")
    if mpu is None:
        return
    try:
        # Run by the child's bootstrap after it clears the inherited finalizers, so the Finalize below survives.
        mpu.register_after_fork(_TOKEN, _arm_child_exit)
    except Exception:
        pass


def _arm_child_exit(_token: object) -> None:
    mpu = sys.modules.get("multiprocessing.util")
    if mpu is not None:
        mpu.Finalize(None, _exit_hook, exitpriority=-100)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
