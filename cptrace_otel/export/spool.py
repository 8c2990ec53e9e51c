"""Reliable delivery for network sinks: a sender thread, a disk spool while the backend is unreachable, replay in order.

Contract of :class:`ReliableSender`:

* :meth:`submit` queues one encoded request (blocks only when the in-memory queue is full and the backend is slow:
  that back-pressure reaches the traced process as counted drops, never as blocking, see pipeline.py).
* A request the transport (:class:`~.sinks.Transport`) answers ``RETRY`` for (connection refused, timeout, 429/5xx,
  gRPC UNAVAILABLE) goes to the spool, and so does every later request until the spool is empty again, so delivery
  order is kept. The oldest spooled request is retried with exponential backoff (``backoff_s`` ..
  ``max_backoff_s``), or after the transport's ``retry_after`` when the backend asked for a longer pause (HTTP
  ``Retry-After`` on 429/503); new requests never cut a pause short (they go to the spool meanwhile). Once one goes
  through the spool is replayed, oldest first.
* ``FATAL`` (a configuration error: TLS, headers) is reported once; that request and every later one is dropped
  and counted (``failed_requests``, ``config_error``), and nothing is retried.
* The spool is a directory of one file per request (falls back to memory if the directory cannot be written),
  bounded by ``max_bytes``; requests that do not fit are dropped and counted (``spool_dropped``).
* The outage is reported on stderr with the URL and the spool path, at most every ``report_every_s``, and its end
  once. :meth:`stats` gives the counters and ``backend_down``; :meth:`flush` returns False while anything is
  undelivered.
* Every request carries the number of records (span events) it holds: ``lost_records`` counts those rejected for
  good, dropped because the spool was full, or abandoned at :meth:`close`; ``settled_records`` counts those that
  reached a final state (delivered, on disk in the spool, or lost and counted), in submission order, so the exporter
  can tell the traced process how many of its records are safe (pipeline.py's in-flight accounting).
* At exit while the backend is down, :meth:`close` does not wait: what is queued goes to the spool at once, so the
  worker exits (and releases the traced process's inherited stderr) right away.
* The spool reads only regular files it created: directories are made ``0700`` (an existing one must be a real
  directory owned by this user, not a link; its mode is tightened to ``0700``), request files are created ``0600``
  with ``O_EXCL | O_NOFOLLOW``, and every file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
  ``fstat`` (a regular file owned by this user) before it is read (:func:`read_own_file`). A symlink, FIFO, device,
  socket or another user's file found there is reported and skipped (never read, never sent, never blocks).
* Orphaned spools: a spool directory ``D`` is locked (``flock`` on ``D.lock``) while its sender lives and names
  its endpoint (``D.endpoint``). A new sender adopts the spools of finished senders for the same endpoint
  (:func:`adopt_orphans`): their files are renamed into its own spool, oldest first, under its byte cap (files over
  the cap are deleted and counted), so they are replayed exactly once.
"""

from __future__ import annotations

import collections
import errno
import os
import stat
import sys

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no locking, no adoption
    fcntl = None  # type: ignore[assignment]
import threading
import time
from collections.abc import Callable
from typing import Any

from ..model.config import mask
from .ownfiles import MAX_SIDE_FILE, NotOwnFile, kind_of, open_own, owner_ok, read_own_file, secure_dir, write_new
from .sinks import Outcome, SendResult, Transport, is_auth_failure

DEFAULT_SPOOL_MAX_BYTES = 512 << 20
class Spool:
    """FIFO of request bodies on disk (``<dir>/<counter>.otlp``), or in memory when the directory is unusable."""

    def __init__(self, directory: str, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.bytes = 0
        self._names: collections.deque[tuple[str, int, int]] = collections.deque()  # (path, bytes, records)
        self._mem: collections.deque[tuple[bytes, int]] | None = None
        self._n = 0
        self.dropped = 0
        self.dropped_records = 0
        self.endpoint = ""
        self._lock_fd: int | None = None
        self.skipped = 0   # files found in the spool that were not its own regular files (reported, never read)
        self.report: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)

    def __len__(self) -> int:
        return len(self._mem) if self._mem is not None else len(self._names)

    def _use_memory(self, why: str) -> None:
        self.report(f"cptrace_otel: cannot spool to {self.dir} ({why}); spooling in memory")
        self._mem = collections.deque()

    def _drop(self, records: int) -> bool:
        self.dropped += 1
        self.dropped_records += records
        return False

    def _open_dir(self) -> None:
        """Create the directory, lock it for this process's lifetime and name the endpoint (for adoption)."""
        secure_dir(self.dir)
        if self._lock_fd is None and fcntl is not None:
            fd = open_own(self.dir + ".lock", os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise
            self._lock_fd = fd
            efd = open_own(self.dir + ".endpoint", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.write(efd, self.endpoint.encode("utf-8", "replace"))
            finally:
                os.close(efd)

    def _new_name(self) -> str:
        self._n += 1
        return os.path.join(self.dir, f"{self._n:012d}.otlp")

    def _skip(self, path: str, e: OSError) -> None:
        self.skipped += 1
        self.report(f"cptrace_otel: skipped {path} in the spool: {e.strerror or e} (only regular files this "
                    "exporter wrote are read; it is left alone)")

    def push(self, body: bytes, records: int = 0) -> bool:
        """Keep ``body`` (holding ``records`` records) for later; False (and counted) when the spool is full."""
        if self.bytes + len(body) > self.max_bytes:
            return self._drop(records)
        if self._mem is None:
            try:
                self._open_dir()
                name = self._new_name()
                for _ in range(8):  # a name taken by something planted there: the next one
                    try:
                        write_new(name, body)
                        break
                    except FileExistsError:
                        name = self._new_name()
                else:
                    raise FileExistsError(errno.EEXIST, "every spool file name tried was taken", name)
                self._names.append((name, len(body), records))
                self.bytes += len(body)
                return True
            except OSError as e:
                if len(self._names):
                    # Keep order: requests already on disk go first; give up on this one rather than reorder.
                    return self._drop(records)
                self._use_memory(str(e))
        assert self._mem is not None
        self._mem.append((body, records))
        self.bytes += len(body)
        return True

    def adopt(self, path: str, size: int) -> bool:
        """Take over a request file of a finished sender (renamed into this spool: it moves exactly once; the
        caller checked it is a regular file of this user, and :meth:`peek` checks again when it reads it)."""
        if self._mem is not None or self.bytes + size > self.max_bytes:
            return False
        self._open_dir()
        name = self._new_name()
        while os.path.lexists(name):
            name = self._new_name()
        os.rename(path, name)
        self._names.append((name, size, 0))
        self.bytes += size
        return True

    def head_records(self) -> int:
        """Records in the oldest request (0 for an adopted one: its records belong to a finished process)."""
        if self._mem is not None and self._mem:
            return self._mem[0][1]
        return self._names[0][2] if self._names else 0

    def peek(self) -> bytes | None:
        if self._mem is not None and self._mem:
            return self._mem[0][0]
        while self._names:
            name, _, records = self._names[0]
            try:
                return read_own_file(name)
            except NotOwnFile as e:  # replaced by a link or a FIFO since it was written: never read or sent
                self._skip(name, e)
                self.bytes -= self._names.popleft()[1]
                self._drop(records)
            except OSError:
                self._pop_name()
                self._drop(records)
        return None

    def _pop_name(self) -> None:
        name, n, _ = self._names.popleft()
        self.bytes -= n
        try:
            os.unlink(name)
        except OSError:
            pass

    def pop(self) -> None:
        if self._mem is not None and self._mem:
            self.bytes -= len(self._mem.popleft()[0])
            if not self._mem and not self._names:
                self._mem = None  # back to disk next time
            return
        if self._names:
            self._pop_name()
        if not self._names:
            self.remove_dir()

    def remove_dir(self) -> None:
        """Remove the (empty) directory and its lock: nothing left to adopt."""
        for extra in (".endpoint", ".lock"):
            try:
                os.unlink(self.dir + extra)
            except OSError:
                pass
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = None
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def adopt_orphans(spool: Spool, report: Callable[[str], None]) -> int:
    """Move the request files of finished senders' spools (siblings of ``spool.dir`` for the same endpoint, whose
    lock is free) into ``spool``, oldest directory first; files over its byte cap are deleted and counted. Returns
    the number adopted. Never raises."""
    if fcntl is None:
        return 0
    root, own = os.path.split(spool.dir)
    try:
        names = sorted(os.listdir(root), key=lambda n: _mtime(os.path.join(root, n)))
    except OSError:
        return 0
    adopted = over = over_bytes = skipped = 0
    for name in names:
        d = os.path.join(root, name)
        if name == own:
            continue
        try:
            dst = os.lstat(d)
        except OSError:
            continue
        if not stat.S_ISDIR(dst.st_mode) or not owner_ok(dst):
            continue  # a link, a file, another user's folder: never a spool of ours
        try:
            if read_own_file(d + ".endpoint", MAX_SIDE_FILE).decode("utf-8", "replace") != spool.endpoint:
                continue
            fd = open_own(d + ".lock", os.O_RDWR)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its sender is gone
            except OSError:
                continue
            files = sorted(n for n in os.listdir(d) if n.endswith(".otlp"))
            for fn in files:
                path = os.path.join(d, fn)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or not owner_ok(st):
                        skipped += 1
                        spool.skipped += 1
                        report(f"cptrace_otel: skipped {path} in a finished process's spool: "
                               f"{kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'another user owns it'} "
                               "(only regular files an exporter wrote are replayed; it is left alone)")
                        continue
                    size = st.st_size
                    if spool.adopt(path, size):
                        adopted += 1
                    else:
                        os.unlink(path)
                        over += 1
                        over_bytes += size
                except OSError:
                    continue
            for extra in (".endpoint", ".lock"):
                try:
                    os.unlink(d + extra)
                except OSError:
                    pass
            try:
                os.rmdir(d)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
    if adopted:
        report(f"cptrace_otel: replaying {adopted} requests left in the spool by finished processes ({root})")
    if over:
        spool.dropped += over
        report(f"cptrace_otel: dropped {over} spooled requests ({over_bytes} B) of finished processes: over the "
               f"spool cap of {spool.max_bytes} B (CPTRACE_SPOOL_MAX_BYTES)")
    return adopted


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


class ReliableSender:
    """Sends encoded requests through ``transport`` on its own thread, spooling across outages (see module doc).

    ``transport.send`` returns a :class:`~.sinks.SendResult` (any ``(outcome, detail)`` pair whose outcome equals
    an :class:`~.sinks.Outcome`, such as ``("ok", "")``, will do)."""

    def __init__(self, transport: Transport, spool_dir: str, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
                 queue_max: int = 64, backoff_s: float = 0.25, max_backoff_s: float = 2.0,
                 report_every_s: float = 10.0, report: Callable[[str], None] | None = None) -> None:
        self.transport = transport
        self.url = getattr(transport, "url", "?")
        self.spool = Spool(spool_dir, max_bytes)
        self.spool.endpoint = self.url
        self._q: collections.deque[tuple[bytes, int]] = collections.deque()
        self._queue_max = queue_max
        self._cv = threading.Condition()
        self._unfinished = 0
        self._closing = False
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.report_every_s = report_every_s
        self._report = report or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.spool.report = self._report
        self.sent = 0
        self.sent_bytes = 0
        self.failed = 0          # requests the backend rejected for good
        self.spooled = 0         # requests that went through the spool
        self.down_since: float | None = None
        self.last_error = ""
        self.config_error = ""   # a FATAL detail: set once, then every request is dropped
        self._retry_at = 0.0     # monotonic time before which the spool head is not retried
        self._backoff = backoff_s
        self._last_report = 0.0
        self._rejected_n = self._rejected_records = 0
        self._last_rejected_report = 0.0
        self.lost_records = 0      # records in requests rejected, dropped (spool full) or abandoned at close
        self.settled_records = 0   # records delivered, spooled to disk, or lost and counted (submission order)
        self.adopted = 0
        self._thread = threading.Thread(target=self._run, name="cptrace-otlp-sender", daemon=True)
        self._thread.start()

    # -- producer side -------------------------------------------------------------------------------------------
    def adopt_orphans(self) -> int:
        """Take over the spools finished senders left next to this one's (:func:`adopt_orphans`); they are
        delivered first, and :meth:`flush` waits for them too."""
        with self._cv:
            n = adopt_orphans(self.spool, self._report)
            self.adopted += n
            self._unfinished += n
            self._cv.notify_all()
        return n

    def submit(self, body: bytes, records: int = 0) -> None:
        with self._cv:
            while len(self._q) >= self._queue_max and not self._closing:
                self._cv.wait(0.5)
            self._q.append((body, records))
            self._unfinished += 1
            self._cv.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted request is delivered (or rejected for good); False on timeout, and after a
        configuration error (its requests were all dropped)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cv:
            while self._unfinished > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.2))
            return not self.config_error

    def close(self, timeout_s: float) -> bool:
        """Deliver within ``timeout_s`` (at once to the spool while the backend is down), then stop. Requests still
        queued in memory after that are lost and counted; spooled ones stay for the next run to replay."""
        ok = self.flush(0.0 if self.down_since is not None else timeout_s)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():  # (else it hangs in a send: the spool is its own)
            self._drain_queue_to_spool()
        with self._cv:
            left = list(self._q)
            self._q.clear()
        if left:
            n = sum(r for _, r in left)
            self._lose(n)
            self._report(f"cptrace_otel: OTLP endpoint {self.url}: {len(left)} requests ({n} records) not delivered "
                         f"within {timeout_s:g}s at exit; lost")
        if not ok and len(self.spool):
            self._report(f"cptrace_otel: OTLP endpoint {self.url} still unreachable at exit; "
                         f"{len(self.spool)} requests ({self.spool.bytes} B) left undelivered in {self.spool.dir} "
                         "(the next run replays them)")
        if self.spool._lock_fd is not None and not len(self.spool):
            self.spool.remove_dir()
        self.transport.close()
        return ok

    def _lose(self, records: int) -> None:
        self.lost_records += records
        self.settled_records += records

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sent_requests": self.sent,
            "sent_bytes": self.sent_bytes,
            "failed_requests": self.failed,
            "spooled_requests": self.spooled,
            "spool_pending": len(self.spool),
            "spool_dropped": self.spool.dropped,
            "lost_records": self.lost_records + self.spool.dropped_records,
            "backend_down": self.down_since is not None,
            "last_error": self.last_error,
            "config_error": self.config_error,
            "redirects_refused": getattr(self.transport, "redirects_refused", 0),
            "spool_skipped_files": self.spool.skipped,
        }

    # -- sender thread ------------------------------------------------------------------------------------------
    def _done(self, n: int = 1) -> None:
        with self._cv:
            self._unfinished -= n
            self._cv.notify_all()

    def _pause(self, detail: str) -> None:
        """A RETRY: the spool head waits the current backoff (doubled for next time), or the backend's
        ``retry_after`` when longer."""
        ra = getattr(self.transport, "retry_after", None)
        wait = self._backoff
        if type(ra) in (int, float) and ra > wait:  # type: ignore[operator]
            wait = float(ra)  # type: ignore[arg-type]
        self._retry_at = time.monotonic() + wait
        self._backoff = min(self._backoff * 2, self.max_backoff_s)
        self._outage(detail)

    def _wait_retry(self) -> None:
        """Sleep until the retry time; new requests wake it only to be moved to the spool (order kept), never to
        retry early. Closing ends the wait."""
        while True:
            with self._cv:
                if self._closing:
                    return
                left = self._retry_at - time.monotonic()
                if left <= 0:
                    return
                if not self._q:
                    self._cv.wait(left)
            self._drain_queue_to_spool()

    def _fatal(self, detail: str) -> None:
        if not self.config_error:
            self.config_error = detail
            self.last_error = detail
            self._report(f"cptrace_otel: OTLP endpoint {self.url}: {detail}; not retrying: every request is "
                         f"dropped and counted (failed_requests)")

    def _rejected(self, detail: str, records: int) -> None:
        """Report a dropped request (DROP): an authentication failure is named so, the backend is not unreachable.
        Named at the first rejection and then at most every ``report_every_s`` with the running count, so a backend
        that refuses everything (a 401 on a bad token) does not print a line per request."""
        self.last_error = detail
        self._rejected_n += 1
        self._rejected_records += records
        now = time.monotonic()
        if self._rejected_n > 1 and now - self._last_rejected_report < self.report_every_s:
            return
        self._last_rejected_report = now
        what = "refused the credentials (authentication failed: " if is_auth_failure(detail) else "rejected a request ("
        self._report(f"cptrace_otel: OTLP endpoint {self.url} {what}{detail}); {records} records dropped "
                     f"({self._rejected_n} requests, {self._rejected_records} records rejected so far)")

    def _drop_all(self) -> None:
        """After a FATAL: drop the queue and the spool, counted (requests and records)."""
        with self._cv:
            left = list(self._q)
            self._q.clear()
            self._cv.notify_all()
        n = len(left)
        self._lose(sum(r for _, r in left))
        while len(self.spool):
            self.lost_records += self.spool.head_records()  # (settled when spooled)
            self.spool.pop()
            n += 1
        if n:
            self.failed += n
            self._done(n)

    def _run(self) -> None:
        while True:
            if self.config_error:
                self._drop_all()
                with self._cv:
                    if self._closing:
                        return
                    if not self._q:
                        self._cv.wait(0.5)
                continue
            with self._cv:
                while not self._q and not len(self.spool) and not self._closing:
                    self._cv.wait(0.5)
                if self._closing and ((not self._q and not len(self.spool)) or self.down_since is not None):
                    return
                nxt = self._q.popleft() if (self._q and not len(self.spool)) else None
                self._cv.notify_all()
            if nxt is not None:
                self._send_one(*nxt)
                continue
            # Outage mode: move new requests behind the spooled ones, then retry the oldest.
            self._drain_queue_to_spool()
            head = self.spool.peek()
            if head is None:
                continue
            self._wait_retry()
            if self._closing:
                continue
            res, detail = self._attempt(head)
            if res == Outcome.RETRY:
                self._pause(detail)
                continue
            self._backoff = self.backoff_s
            records = self.spool.head_records()
            self.spool.pop()
            if res == Outcome.FATAL:
                self.failed += 1
                self.lost_records += records  # (settled when spooled)
                self._fatal(detail)
            elif res == Outcome.OK:
                self.sent += 1
                self.sent_bytes += len(head)
            else:
                self.failed += 1
                self.lost_records += records  # (settled when spooled)
                self._rejected(detail, records)
            if not len(self.spool) and self.down_since is not None:
                self._report(f"cptrace_otel: OTLP endpoint {self.url} reachable again after "
                             f"{time.monotonic() - self.down_since:.1f}s; spooled requests replayed")
                self.down_since = None
            self._done()  # last: a flush waiting on it sees the final state

    def _attempt(self, body: bytes) -> SendResult:
        try:
            return self.transport.send(body)
        except Exception as e:  # a transport bug must not kill the sender
            return SendResult(Outcome.RETRY, mask(f"{type(e).__name__}: {e}", getattr(self.transport, "secrets", ())))

    def _send_one(self, body: bytes, records: int = 0) -> None:
        res, detail = self._attempt(body)
        if res == Outcome.OK:
            self.sent += 1
            self.sent_bytes += len(body)
            self.settled_records += records
            if self.down_since is not None and not len(self.spool):
                self._report(f"cptrace_otel: OTLP endpoint {self.url} reachable again")
                self.down_since = None
            self._done()
        elif res == Outcome.RETRY:
            self._pause(detail)
            self._to_spool(body, records)
        elif res == Outcome.FATAL:
            self.failed += 1
            self._lose(records)
            self._fatal(detail)
            self._done()
        else:
            self.failed += 1
            self._lose(records)
            self._rejected(detail, records)
            self._done()

    def _to_spool(self, body: bytes, records: int = 0) -> None:
        self.settled_records += records  # on disk, or dropped and counted (spool.dropped_records)
        if self.spool.push(body, records):
            self.spooled += 1
        else:
            self._done()  # dropped (counted in spool.dropped)

    def _drain_queue_to_spool(self) -> None:
        while True:
            with self._cv:
                if not self._q:
                    return
                nxt = self._q.popleft()
                self._cv.notify_all()
            self._to_spool(*nxt)

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
