"""Process-life hooks: the traced process's records are delivered however it ends.

* Exit: :func:`install_exit_hook` (api, at import) registers the exit flush with ``atexit`` before the application
  can register its own handlers, so it runs after them (atexit is last-in, first-out) and records those handlers
  emit are still delivered.
* SIGTERM: :func:`install_sigterm` (the pipeline, when it starts on the main thread) installs a handler that
  flushes within :data:`SIGNAL_FLUSH_S`, then chains the handler that was installed before (SGLang installs its
  own) or, when there was none, dies of SIGTERM as the process would have. A process that ignores SIGTERM is left
  alone. A handler the application installs *after* the first record replaces this one: it should exit through
  ``sys.exit`` (the exit flush runs) or call ``cptrace_otel.flush()``.
* ``multiprocessing`` fork children end with ``os._exit`` (no atexit): :func:`after_fork_in_child` (api's at-fork
  hook) arms a ``multiprocessing.util.Finalize`` that runs the exit flush when the child's bootstrap finishes.

Imports only the standard library; the pipeline is looked up in ``sys.modules`` (never imported from here).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

SIGNAL_FLUSH_S = 3.0      # SIGTERM: longest wait for the flush before the chained handler (or death)

_PIPELINE = __package__ + ".pipeline"
_exit_hook_registered = False
_sigterm_installed = False
_prev_sigterm: Any = None


def _pipeline() -> Any:
    return sys.modules.get(_PIPELINE)


def _exit_hook() -> None:
    p = _pipeline()
    if p is not None:
        try:
            p._at_exit()
        except Exception:
            pass


def install_exit_hook() -> None:
    """Register the exit flush now (idempotent)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_exit_hook)
        _exit_hook_registered = True


def exit_hook_registered() -> bool:
    return _exit_hook_registered


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
    p = _pipeline()
    if p is not None:
        try:
            st = p._state
            if st is not None and dies:
                st.exiting = True  # do not wait for a backend that is down: the spool keeps its requests
            p.flush(SIGNAL_FLUSH_S)
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


def after_fork_in_child() -> None:
    """In a fork child: if it is a multiprocessing child, flush when its bootstrap ends (it skips atexit)."""
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
