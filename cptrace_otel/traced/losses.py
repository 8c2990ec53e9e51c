"""Every lost record named: the records a pipeline that cannot start drops, and the rate-limited stderr line that
names every loss with its running count.

Contract (docs/failure-modes.md, "Every lost record"):

* A pipeline that cannot start (no free file descriptor, no address space for a thread, an import that fails) says
  so once on stderr, with the error, and every record emitted while it is down is dropped and counted
  (:data:`START`). Starting is tried again after a backoff (:data:`FIRST_RETRY_S` doubling to :data:`MAX_RETRY_S`),
  never once per record: between tries a record costs a counter increment.
* :func:`flush` / :func:`shutdown` (``cptrace_otel``) return False once any record of the pipeline was lost, for
  whatever reason: the answer stays False for every later flush until :func:`shutdown`, so a program that checks
  only its last flush or its shutdown still sees it; the records dropped while no pipeline could start belong to the
  pipeline that starts next (or to the ``shutdown()`` called meanwhile). A pipeline started after a shutdown starts
  with no loss. ``stats()["dropped"]`` counts them all, and the rank span's ``cptrace.dropped``.
* :class:`LossReport` names losses on stderr: the first at once, then at most every :data:`REPORT_EVERY_S` seconds
  with the running count, so a full ring or buffer at full speed prints a handful of lines, not one per record.

This module is imported with the API (it imports nothing heavy) so that it still works where imports fail.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TypedDict

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 60.0
REPORT_EVERY_S = 10.0


def _say(msg: str) -> None:
    try:
        print(f"cptrace_otel: {msg}", file=sys.stderr, flush=True)
    except Exception:  # a closed or full stderr must not reach the traced process
        pass


class StartStats(TypedDict, total=False):
    """``stats()`` while no pipeline ever started: empty, or the records dropped and why."""

    dropped: int
    exporter: None
    start_error: str


class StartFailure:
    """The records dropped while no pipeline could be started, and when to try again. One per process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.dropped = 0
        self.failures = 0
        self.error = ""
        self._clock = clock
        self._next_try = 0.0
        self._backoff = FIRST_RETRY_S
        self._lock = threading.Lock()

    def due(self) -> bool:
        """Whether starting should be tried now (never failed, or its backoff has passed)."""
        return self.failures == 0 or self._clock() >= self._next_try

    def failed(self, e: BaseException) -> None:
        """A start failed with ``e``: named on stderr the first time (and when the error changes), retried after the
        backoff."""
        with self._lock:
            self.failures += 1
            text = f"{type(e).__name__}: {e}"[:300]
            if text != self.error:
                _say(f"the tracing pipeline cannot start ({text}); records are dropped and counted until it can "
                     f"(next try in {self._backoff:g} s, backing off to {MAX_RETRY_S:g} s)")
            self.error = text
            self._next_try = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, MAX_RETRY_S)

    def retry_now(self) -> None:
        """A new configuration (``configure``/``reload_config``): the next record tries to start at once."""
        self._next_try = 0.0
        self._backoff = FIRST_RETRY_S

    def take(self) -> int:
        """The records dropped while no pipeline could start, handed to the pipeline that starts (or to the
        ``shutdown()`` that answers for them), and reset: each is counted once, by whoever answers for it."""
        n, self.dropped = self.dropped, 0
        return n

    def drop(self) -> None:
        self.dropped += 1  # (a racing increment may be lost under free threading; the GIL keeps it whole)

    def stats(self) -> StartStats:
        """``stats()`` while no pipeline ever started: the records dropped and why (empty when none was)."""
        return {"dropped": self.dropped, "exporter": None, "start_error": self.error} if self.dropped else {}

    def started(self) -> None:
        """A pipeline started: the next failure backs off from the start again (the drops stay counted)."""
        if self.failures:
            _say(f"the tracing pipeline started after {self.failures} failed tries; {self.dropped} records were "
                 "dropped meanwhile (counted in cptrace.dropped)")
        self.failures = 0
        self._backoff = FIRST_RETRY_S


START = StartFailure()


class LossReport:
    """Names the growth of a loss counter on stderr, rate-limited: :meth:`update` with the running total."""

    def __init__(self, what: str, every_s: float = REPORT_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.every_s = every_s
        self.reported = 0
        self.lines = 0
        self._clock = clock
        self._last = -1e18

    def update(self, total: int, why: str = "") -> None:
        if total <= self.reported:
            return
        now = self._clock()
        if self.lines and now - self._last < self.every_s:
            return
        new = total - self.reported
        self.reported, self._last = total, now
        self.lines += 1
        _say(f"{new} records {self.what} ({total} in all{'; ' + why if why else ''}); each is counted in stats()"
             f"['dropped'] and cptrace.dropped, and flush() returns False (at most one line every {self.every_s:g} s)")
