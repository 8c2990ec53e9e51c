"""The durable journal of one ``cptrace-otel serve`` replica: what it held, checked and emitted, so a replica killed
(SIGKILL, OOM, a node lost) and started again loses nothing silently and doubles no finding.

One append-only text file, ``DIR/journal``, one line per fact (the run id percent-quoted, the trace id as hex):

* ``O run trace n``: the replica took ``n`` records of the trace (written by the receiving thread *before* the
  request is answered 200, so the collector never drops data the journal does not know about);
* ``E run trace fid``: a finding of the trace is about to be printed (``fid`` = :func:`finding_id`); written before
  the finding goes out, so a kill between the two leaves the trace open (reported unchecked), never a doubled line;
* ``F run trace``: the trace was checked and its findings emitted (or its check failed, said on stderr);
* ``U run trace``: the trace was open when a previous process died, and has been reported UNCHECKED.

On start (:meth:`Journal.open`) the file is read: every trace opened and neither finalised nor reported is
*lost* (its records died with the process): :meth:`Journal.open` returns them once, the caller reports each as
UNCHECKED, and they are written ``U``. Records of a finalised trace that arrive later are late (as in
:class:`~.serve_state.ServeState`, never checked twice), those of a lost trace are counted
(:attr:`Journal.lost_records`) and not checked either: a check of their tail alone could pass a fault whose first
half died, or double one the dead process had printed. A finding whose id was already emitted is never emitted
again (:meth:`Journal.fresh`).

Durability: each fact is one ``os.write`` on an ``O_APPEND`` descriptor (no user-space buffer), so it survives the
process's death at any instruction; the file is ``fsync``'d at most once per ``fsync_s`` (default 1 s) by the
checking thread (:meth:`Journal.tick`), so a crash of the *host* can lose the last second of facts (those traces are
then not reported on restart). Cost: one ``write`` per request (a line per trace it holds) and one per finalised
trace.

Bound: the closed traces (``F``/``U``) and the emitted finding ids are each kept for the newest :data:`MAX_KEPT`
(oldest forgotten first; a late record of a forgotten trace is held again as a new trace, as
``ServeState``'s own bound does); the open traces are bounded by ``--max-nodes``. When the file passes twice the size
of what is kept (at least :data:`MIN_COMPACT_BYTES`), :meth:`tick` rewrites it from memory into ``journal.new``,
``fsync``s it and renames it over ``journal`` (atomic: a kill during compaction leaves the old file). A lock file
(``flock``) keeps a second process off the same folder.

:func:`ranks_without_start` is the other half of "never checked partially": a trace whose first records went to
another replica (the resolver's list changed mid-life) is told by its missing first lane span.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from ..checks import Finding

MAX_KEPT = 200_000               # closed traces, and emitted finding ids, remembered
MIN_COMPACT_BYTES = 4 << 20      # the file is not rewritten below this size
NAME = "journal"


class JournalError(Exception):
    """The state folder cannot be used (not writable, or held by another process)."""


def finding_id(run_id: str, trace_id: str, f: Finding) -> str:
    """A finding's identity across processes: the same finding found again gives the same id."""
    last = f.evidence[-1] if f.evidence else -1
    key = f"{run_id}|{trace_id}|{f.code}|{f.rule}|{f.rank}|{f.epoch}|{f.node_id}|{last}"
    return hashlib.blake2b(key.encode("utf-8", "replace"), digest_size=8).hexdigest()


def ranks_without_start(run_id: str, trace_id: str, ranks: Iterable[int], span_ids: set[str],
                        events: Iterable[Any]) -> list[int]:
    """The ranks whose first records of this node trace were not seen here: a rank has records in the trace but the
    trace lacks that rank's first lane segment (span id ``trace_ids.lane_span_id(run, epoch, node, rank)``, which
    any process computes; it holds the rank's first structural record of the node and is exported first). That is a
    trace the resolver moved here mid-life, or one that began on a replica since removed: its records checked alone
    could miss or misjudge a fault, so the caller reports it UNCHECKED. [] for a trace that is not a node trace (a
    rank or request trace) and for a whole one (0 of the simulator's and the benchmark's 2,872 node traces flagged;
    ``bench/serve_moved_traces.py``)."""
    from ..model.trace_ids import lane_span_id

    node = trace_node(run_id, trace_id, events)
    if node is None:
        return []
    return [r for r in sorted(ranks) if lane_span_id(run_id, node[0], node[1], r).hex() not in span_ids]


def trace_node(run_id: str, trace_id: str, events: Iterable[Any]) -> tuple[int, int] | None:
    """The ``(epoch, node id)`` whose node trace ``trace_id`` is (the one among ``events``' nodes its id hashes);
    None for a trace that is not a node trace (a rank or request trace)."""
    from ..model.trace_ids import node_trace_id

    tried: set[tuple[int, int]] = set()
    for ev in events:
        nid = ev.node_id
        if nid is None or (ev.epoch, nid) in tried:
            continue
        tried.add((ev.epoch, nid))
        if node_trace_id(run_id, ev.epoch, nid).hex() == trace_id:
            return (ev.epoch, nid)
    return None


def default_dir(port: int) -> str:
    """The folder a replica listening on ``port`` uses when ``--state-dir`` is not given:
    ``$XDG_STATE_HOME/cptrace-otel/serve-PORT`` (``~/.local/state`` without it): it outlives a reboot (``/tmp`` may
    not), and one folder per port lets several replicas share a host."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "cptrace-otel", f"serve-{port}")


class Journal:
    """See the module doc. Thread-safe: the receiving threads call :meth:`opened`, the checking thread the rest."""

    def __init__(self, folder: str, fsync_s: float = 1.0, max_kept: int = MAX_KEPT,
                 note: Callable[[str], None] = lambda s: None) -> None:
        import threading

        self.folder, self.fsync_s, self.max_kept = folder, fsync_s, max(1, max_kept)
        self.path = os.path.join(folder, NAME)
        self._lock = threading.Lock()
        self.open_keys: dict[tuple[str, str], int] = {}   # key -> records taken (so a loss says how many)
        self.closed: OrderedDict[tuple[str, str], str] = OrderedDict()   # key -> "F" or "U", oldest first
        self.emitted: OrderedDict[str, None] = OrderedDict()
        self._lost: list[tuple[str, str, int]] = []
        self.lost_records = 0      # records of a lost trace that arrived after the restart (not checked)
        self.suppressed_repeats = 0   # findings not emitted again (their id was in the journal)
        self.writes = 0
        self.errors = 0            # writes that failed (disk full, folder removed): said once, the replica goes on
        self.note = note
        self._fd = -1
        self._lock_fd = -1
        self._dirty = False
        self._synced = time.monotonic()
        self._size = 0
        self.skipped = 0           # unreadable lines at start (a write cut by a host crash)

    # -- start ----------------------------------------------------------------------------------------------------
    def open(self) -> list[tuple[str, str, int]]:
        """Take the folder (create it, lock it), read the journal; the traces lost by the previous process, as (run
        id, trace id, records it had taken), each reported once (they are written ``U`` before this returns).
        Raises :class:`JournalError`."""
        import fcntl

        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise JournalError(f"cannot use state folder {self.folder}: {e.strerror or e}") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise JournalError(f"state folder {self.folder} is held by another process (two replicas on one "
                               "folder would report each other's traces): give each its own --state-dir") from e
        bad = self._replay()
        self._lost = sorted((r, t, n) for (r, t), n in self.open_keys.items())
        for r, t, _n in self._lost:
            self._close((r, t), "U")
        self.open_keys.clear()
        try:   # the file now holds what is kept, lost traces as U: a second restart reports none again
            self._rewrite()
        except OSError as e:
            raise JournalError(f"cannot write the journal in {self.folder}: {e.strerror or e}") from e
        self.skipped = bad
        return list(self._lost)

    def _replay(self) -> int:
        bad = 0
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise JournalError(f"cannot read {self.path}: {e.strerror or e}") from e
        for line in lines:
            parts = line.split()
            if not line.endswith("\n") or len(parts) < 3 or parts[0] not in ("O", "F", "U", "E"):
                bad += 1
                continue
            key = (unquote(parts[1]), parts[2])
            if parts[0] == "O":
                if key not in self.closed:
                    self.open_keys[key] = self.open_keys.get(key, 0) + (int(parts[3]) if len(parts) > 3
                                                                         and parts[3].isdigit() else 0)
            elif parts[0] == "E":
                if len(parts) == 4:
                    self._remember(parts[3])
                else:
                    bad += 1
            else:
                self.open_keys.pop(key, None)
                self._close(key, parts[0])
        return bad

    def _close(self, key: tuple[str, str], how: str) -> None:
        self.closed[key] = how
        self.closed.move_to_end(key)
        if len(self.closed) > self.max_kept:
            self.closed.popitem(last=False)

    def _remember(self, fid: str) -> None:
        self.emitted[fid] = None
        if len(self.emitted) > self.max_kept:
            self.emitted.popitem(last=False)

    # -- the facts --------------------------------------------------------------------------------------------------
    def _append(self, text: str) -> None:
        data = text.encode("utf-8")
        try:
            os.write(self._fd, data)   # one write: the kernel has it once this returns, whatever kills the process
        except OSError as e:   # the traced data still flows and is checked; only the restart-safety is lost
            self._failed(e)
            return
        self._size += len(data)
        self.writes += 1
        self._dirty = True

    def _failed(self, e: OSError) -> None:
        if not self.errors:
            self.note(f"journal {self.path} cannot be written ({e.strerror or e}): traces held now are not "
                      "reported after a kill (counted in cptrace_serve_journal_errors_total)")
        self.errors += 1

    def opened(self, records: Iterable[tuple[str, str, int]]) -> None:
        """Record that the replica took ``n`` records of each (run id, trace id, n) (called before the request is
        answered): one line per trace of the request, so a loss says how many records died."""
        with self._lock:
            lines = []
            for r, t, n in records:
                k = (r, t)
                if k in self.closed:
                    continue
                self.open_keys[k] = self.open_keys.get(k, 0) + n
                lines.append(f"O {quote(r, safe='')} {t} {n}\n")
            if lines:
                self._append("".join(lines))

    def state_of(self, run_id: str, trace_id: str) -> str | None:
        """"late" when the trace was checked already (by this process or before a restart), "lost" when it was
        open when the previous process died; None when it may be held. Called for a trace the state does not hold."""
        with self._lock:
            how = self.closed.get((run_id, trace_id))
        return None if how is None else ("late" if how == "F" else "lost")

    def fresh(self, run_id: str, trace_id: str, found: list[Finding]) -> list[Finding]:
        """The findings of ``found`` not emitted before, journaled (``E``) before the caller emits them."""
        with self._lock:
            out, lines = [], []
            for f in found:
                fid = finding_id(run_id, trace_id, f)
                if fid in self.emitted:
                    self.suppressed_repeats += 1
                    continue
                self._remember(fid)
                out.append(f)
                lines.append(f"E {quote(run_id, safe='')} {trace_id} {fid}\n")
            if lines:
                self._append("".join(lines))
        return out

    def finalised(self, run_id: str, trace_id: str) -> None:
        """Record that the trace was checked and its findings emitted (or its check failed, said on stderr)."""
        key = (run_id, trace_id)
        with self._lock:
            self.open_keys.pop(key, None)
            self._close(key, "F")
            self._append(f"F {quote(run_id, safe='')} {trace_id}\n")

    def tick(self, now: float | None = None) -> None:
        """The checking thread's periodic call: ``fsync`` when facts were written and ``fsync_s`` passed; compact
        when the file is past twice what is kept."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._fd < 0:
                return
            kept = 64 * (len(self.open_keys) + len(self.closed) + len(self.emitted))
            try:
                if self._size > max(MIN_COMPACT_BYTES, 2 * kept):
                    self._rewrite()
                elif self._dirty and now - self._synced >= self.fsync_s:
                    os.fsync(self._fd)
                    self._dirty, self._synced = False, now
            except OSError as e:
                self._failed(e)

    def close(self) -> None:
        """fsync and release the folder (the clean shutdown's last step)."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)   # releases the flock
                self._lock_fd = -1

    def _rewrite(self) -> None:
        """Write what is kept into ``journal.new``, fsync it, rename it over the journal (atomic), reopen."""
        tmp = self.path + ".new"
        lines = [f"{how} {quote(r, safe='')} {t}\n" for (r, t), how in self.closed.items()]
        lines += [f"O {quote(r, safe='')} {t} {n}\n" for (r, t), n in self.open_keys.items()]
        # an emitted id is written with an empty key: only its id is read back
        lines += [f"E - - {fid}\n" for fid in self.emitted]
        data = "".join(lines).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.folder, os.O_RDONLY)
        try:   # the rename itself is durable once the folder is synced
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size, self._dirty, self._synced = len(data), False, time.monotonic()

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.open_keys), "closed": len(self.closed), "emitted": len(self.emitted),
                "bytes": self._size, "lost_records": self.lost_records}
