"""Reliable delivery for network sinks: a sender thread, a disk spool while the backend is unreachable, replay in order.

Contract of :class:`ReliableSender`:

* :meth:`submit` queues one encoded request (blocks only when the in-memory queue is full and the backend is slow:
  that back-pressure reaches the traced process as counted drops, never as blocking, see pipeline.py).
* A request the transport (:class:`~.sinks.Transport`) answers ``RETRY`` for (connection refused, timeout, 429/5xx,
  gRPC UNAVAILABLE) goes to the spool, and so does every later request until the spool is empty again, so delivery
  order is kept. The oldest spooled request is retried with exponential backoff (``backoff_s`` ..
  ``max_backoff_s``); once one goes through the spool is replayed, oldest first.
* The spool is a directory of one file per request (falls back to memory if the directory cannot be written),
  bounded by ``max_bytes``; requests that do not fit are dropped and counted (``spool_dropped``).
* The outage is reported on stderr with the URL and the spool path, at most every ``report_every_s``, and its end
  once. :meth:`stats` gives the counters and ``backend_down``; :meth:`flush` returns False while anything is
  undelivered.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Any, Callable

from .sinks import Outcome, SendResult

DEFAULT_SPOOL_MAX_BYTES = 512 << 20


class Spool:
    """FIFO of request bodies on disk (``<dir>/<counter>.otlp``), or in memory when the directory is unusable."""

    def __init__(self, directory: str, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.bytes = 0
        self._names: collections.deque[tuple[str, int]] = collections.deque()
        self._mem: collections.deque[bytes] | None = None
        self._n = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._mem) if self._mem is not None else len(self._names)

    def _use_memory(self, why: str) -> None:
        print(f"cptrace_otel: cannot spool to {self.dir} ({why}); spooling in memory", file=sys.stderr)
        self._mem = collections.deque()

    def push(self, body: bytes) -> bool:
        """Keep ``body`` for later; False (and counted) when the spool is full."""
        if self.bytes + len(body) > self.max_bytes:
            self.dropped += 1
            return False
        if self._mem is None:
            try:
                os.makedirs(self.dir, exist_ok=True)
                self._n += 1
                name = os.path.join(self.dir, f"{self._n:012d}.otlp")
                with open(name, "wb") as f:
                    f.write(body)
                self._names.append((name, len(body)))
                self.bytes += len(body)
                return True
            except OSError as e:
                if len(self._names):
                    # Keep order: requests already on disk go first; give up on this one rather than reorder.
                    self.dropped += 1
                    return False
                self._use_memory(str(e))
        assert self._mem is not None
        self._mem.append(body)
        self.bytes += len(body)
        return True

    def peek(self) -> bytes | None:
        if self._mem is not None and self._mem:
            return self._mem[0]
        while self._names:
            name, _ = self._names[0]
            try:
                with open(name, "rb") as f:
                    return f.read()
            except OSError:
                self._pop_name()
                self.dropped += 1
        return None

    def _pop_name(self) -> None:
        name, n = self._names.popleft()
        self.bytes -= n
        try:
            os.unlink(name)
        except OSError:
            pass

    def pop(self) -> None:
        if self._mem is not None and self._mem:
            self.bytes -= len(self._mem.popleft())
            if not self._mem and not self._names:
                self._mem = None  # back to disk next time
            return
        if self._names:
            self._pop_name()
        if not self._names:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass


class ReliableSender:
    """Sends encoded requests through ``transport`` on its own thread, spooling across outages (see module doc).

    ``transport.send`` returns a :class:`~.sinks.SendResult` (any ``(outcome, detail)`` pair whose outcome equals
    an :class:`~.sinks.Outcome`, such as ``("ok", "")``, will do)."""

    def __init__(self, transport: Any, spool_dir: str, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
                 queue_max: int = 64, backoff_s: float = 0.25, max_backoff_s: float = 2.0,
                 report_every_s: float = 10.0, report: Callable[[str], None] | None = None) -> None:
        self.transport = transport
        self.url = getattr(transport, "url", "?")
        self.spool = Spool(spool_dir, max_bytes)
        self._q: collections.deque[bytes] = collections.deque()
        self._queue_max = queue_max
        self._cv = threading.Condition()
        self._unfinished = 0
        self._closing = False
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.report_every_s = report_every_s
        self._report = report or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.sent = 0
        self.sent_bytes = 0
        self.failed = 0          # requests the backend rejected for good
        self.spooled = 0         # requests that went through the spool
        self.down_since: float | None = None
        self.last_error = ""
        self._last_report = 0.0
        self._thread = threading.Thread(target=self._run, name="cptrace-otlp-sender", daemon=True)
        self._thread.start()

    # -- producer side -------------------------------------------------------------------------------------------
    def submit(self, body: bytes) -> None:
        with self._cv:
            while len(self._q) >= self._queue_max and not self._closing:
                self._cv.wait(0.5)
            self._q.append(body)
            self._unfinished += 1
            self._cv.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted request is delivered (or rejected for good); False on timeout."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cv:
            while self._unfinished > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.2))
            return True

    def close(self, timeout_s: float) -> bool:
        ok = self.flush(timeout_s)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=1.0)
        if not ok and len(self.spool):
            self._report(f"cptrace_otel: OTLP endpoint {self.url} still unreachable at exit; "
                         f"{len(self.spool)} requests ({self.spool.bytes} B) left undelivered in {self.spool.dir}")
        self.transport.close()
        return ok

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sent_requests": self.sent,
            "sent_bytes": self.sent_bytes,
            "failed_requests": self.failed,
            "spooled_requests": self.spooled,
            "spool_pending": len(self.spool),
            "spool_dropped": self.spool.dropped,
            "backend_down": self.down_since is not None,
            "last_error": self.last_error,
        }

    # -- sender thread ------------------------------------------------------------------------------------------
    def _done(self, n: int = 1) -> None:
        with self._cv:
            self._unfinished -= n
            self._cv.notify_all()

    def _run(self) -> None:
        backoff = self.backoff_s
        while True:
            with self._cv:
                while not self._q and not len(self.spool) and not self._closing:
                    self._cv.wait(0.5)
                if self._closing and (not self._q and not len(self.spool) or self.down_since is not None):
                    return
                body = self._q.popleft() if (self._q and not len(self.spool)) else None
                self._cv.notify_all()
            if body is not None:
                self._send_one(body)
                continue
            # Outage mode: move new requests behind the spooled ones, then retry the oldest.
            self._drain_queue_to_spool()
            head = self.spool.peek()
            if head is None:
                continue
            res, detail = self._attempt(head)
            if res == Outcome.RETRY:
                self._outage(detail)
                with self._cv:
                    if not self._closing:
                        self._cv.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            backoff = self.backoff_s
            self.spool.pop()
            if res == Outcome.OK:
                self.sent += 1
                self.sent_bytes += len(head)
            else:
                self.failed += 1
                self._report(f"cptrace_otel: OTLP endpoint {self.url} rejected a request ({detail}); dropped")
            if not len(self.spool) and self.down_since is not None:
                self._report(f"cptrace_otel: OTLP endpoint {self.url} reachable again after "
                             f"{time.monotonic() - self.down_since:.1f}s; spooled requests replayed")
                self.down_since = None
            self._done()  # last: a flush waiting on it sees the final state

    def _attempt(self, body: bytes) -> SendResult:
        try:
            return self.transport.send(body)
        except Exception as e:  # a transport bug must not kill the sender
            return SendResult(Outcome.RETRY, f"{type(e).__name__}: {e}")

    def _send_one(self, body: bytes) -> None:
        res, detail = self._attempt(body)
        if res == Outcome.OK:
            self.sent += 1
            self.sent_bytes += len(body)
            if self.down_since is not None and not len(self.spool):
                self._report(f"cptrace_otel: OTLP endpoint {self.url} reachable again")
                self.down_since = None
            self._done()
        elif res == Outcome.RETRY:
            self._outage(detail)
            self._to_spool(body)
        else:
            self.failed += 1
            self.last_error = detail
            self._report(f"cptrace_otel: OTLP endpoint {self.url} rejected a request ({detail}); dropped")
            self._done()

    def _to_spool(self, body: bytes) -> None:
        if self.spool.push(body):
            self.spooled += 1
        else:
            self._done()  # dropped (counted in spool.dropped)

    def _drain_queue_to_spool(self) -> None:
        while True:
            with self._cv:
                if not self._q:
                    return
                body = self._q.popleft()
                self._cv.notify_all()
            self._to_spool(body)

    def _outage(self, detail: str) -> None:
        now = time.monotonic()
        self.last_error = detail
        first = self.down_since is None
        if first:
            self.down_since = now
        if first or now - self._last_report >= self.report_every_s:
            self._last_report = now
            self._report(f"cptrace_otel: OTLP endpoint {self.url} unreachable ({detail}); spooling to "
                         f"{self.spool.dir} ({len(self.spool) + 1} requests, {self.spool.bytes} B pending, "
                         f"{self.spool.dropped} dropped), retrying")
