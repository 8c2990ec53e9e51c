"""Process-life hooks: the traced process's records are delivered however it ends.

* Exit: :func:`install_exit_hook` (api, at import) registers the exit flush with ``atexit`` before the application
  can register its own handlers, so it runs after them (atexit is last-in, first-out) and records those handlers
  emit are still delivered. The one exit path: it runs the handler the pipeline registered (:func:`set_handlers`).
* SIGTERM: :func:`install_sigterm` (the pipeline, when it starts on the main thread) installs a handler that
  flushes within :data:`SIGNAL_FLUSH_S` (the pipeline's ``signal_flush(budget_s, dies)``), then chains the handler
  that was installed before (SGLang installs its own) or, when there was none, dies of SIGTERM as the process would
  have. A process that ignores SIGTERM is left alone. A handler the application installs *after* the first record
  replaces this one: it should exit through ``sys.exit`` (the exit flush runs) or call ``cptrace_otel.flush()``.
* Fork: callbacks registered with :func:`on_fork_child` run in a forked child, in the order they were registered
  (the api forgets its installed submit function, then the pipeline its threads). ``multiprocessing`` fork children
  end with ``os._exit`` (no atexit): after those callbacks, a ``multiprocessing.util.Finalize`` is armed that runs
  the exit flush when the child's bootstrap finishes.

Imports only the standard library and nothing of the package: the pipeline registers its callbacks here when it is
imported (it is never looked up from here).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any, Callable

SIGNAL_FLUSH_S = 3.0      # SIGTERM: longest wait for the flush before the chained handler (or death)

_exit_hook_registered = False
_sigterm_installed = False
_prev_sigterm: Any = None
_on_exit: Callable[[], None] | None = None
_on_signal: Callable[[float, bool], None] | None = None
_fork_children: list[Callable[[], None]] = []


def set_handlers(at_exit: Callable[[], None], signal_flush: Callable[[float, bool], None]) -> None:
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


def _on_sigterm(signum: int, frame: Any) -> None:
    prev = _prev_sigterm
    dies = not callable(prev)  # SIG_DFL (or unknown): the process ends right after this flush
    fn = _on_signal
    if fn is not None:
        try:
            fn(SIGNAL_FLUSH_S, dies)
        except Exception:
            pass
    if callable(prev):
        prev(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


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


def _arm_child_exit(_token: Any) -> None:
    mpu = sys.modules.get("multiprocessing.util")
    if mpu is not None:
        mpu.Finalize(None, _exit_hook, exitpriority=-100)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
