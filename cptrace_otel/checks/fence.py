"""C5 store fence (docs/domain.md §5, R5), mode ``shared``: the IO rank copies every rank's pages to the shared host,
so its
``backup`` must come after every rank's KV ``store`` to those pages ("sync, translate, copy, sync").

Rule: once the IO rank logs ``backup(op, node=n, dev=D)`` at time ``t_b``, a ``store`` on rank r whose ``dev`` ⊓ D
with ``ts > t_b`` is a violation (the copy ran before that store landed) while, on rank r, the pages still hold n's
KV: up to rank r's first record that gives them up (``evict tier=dev`` of n or of pages ⊓ D, say a split fragment of
n; a ``free pool=dev`` ⊓ D; a ``reset``) after the copy began there: after ``t_b``, or after rank r's own ``backup``
record of n when it logged one earlier (a follower joins the copy's fences and logs ``io=0``; in a write_back flush
its whole backup, ack and eviction may be stamped before the IO rank's backup). A store after that writes the next
owner's KV, not the data this copy moves (pages are reused only once given up). Each rank's tenure ends on that
rank's own timeline: the ranks are not in step in time, so a follower may evict and reuse the pages well before the
IO rank logs its eviction. A store at ``t_b`` or before (a fence margin of 1 ns included) is legal. One finding per
backup: ``C5``/``C5-fence`` on the IO rank, node n, the backup's op. Compares ``ts`` (CLOCK_MONOTONIC, same host),
not arrival order.

Records of a rank are read in that rank's order, but ranks are merged with some lag: a store (or a rank's end of the
tenure) may be read before the IO rank's backup. Each rank's recent stores and give-ups are kept in bounded queues
in its own (ts) order, so a new backup looks back only over the stores whose ``ts`` is after its own (none at all
when nothing read so far is later than it, the usual case of sources merged by ``ts``) and over the give-ups since
the copy began on each rank.

Which pages belong to which node is known across ranks only while the trees are in lockstep (C1): a rank whose tree
diverged reuses, for other nodes, pages the IO rank still holds. So :meth:`StoreFence.feed` takes each record's
structural index (its rank's structural records of the epoch so far) and every finding keeps the larger index of its
backup and its store; :meth:`StoreFence.take` hands out only those at or before the epoch's first C1 divergence (the
pitfall of docs/domain.md §5: C3-C5 stop after it; the divergence itself is reported as C1).

Cost: windows are indexed by slot bucket and leave the index once every rank of the group has given the pages up, so
a store costs a few dict lookups and a test per window that still holds its pages, however long the run (the number
of windows in a bucket follows the resident nodes, not the records read).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..model.events import Event
from .findings import ERROR, Finding
from .ranges import EXACT, Slots, overlap, slots_of

_B = 256  # slots per bucket

# kinds of the per-rank give-up entries
_GIVE, _EVICT, _RESET = 1, 2, 3


def _buckets(s: Slots) -> set[int]:
    if s.runs is not None:
        out: set[int] = set()
        for a, b in s.runs:
            out.update(range(a // _B, b // _B + 1))
        return out
    return set(range(s.lo // _B, s.hi // _B + 1))


def _ts(ev: Event) -> int:
    """The record's ``ts=`` field (CLOCK_MONOTONIC, comparable across the ranks of one host) when it has one; the
    event time otherwise. OTLP sources stamp events with each process's call time, which is not a cross-rank order."""
    t = ev.fields.get("ts")
    return t if type(t) is int else ev.ts


class _Window:
    """The IO rank's copy of node ``node``'s pages ``dev``, begun at ``ts``; ``ends``: rank -> the ``ts`` at which
    that rank gave the pages up (its first such record after ``ts``)."""

    __slots__ = ("epoch", "node", "op", "dev", "ts", "seq", "line", "src", "done", "buckets", "idx", "fi", "ends",
                 "live", "since")

    def __init__(self, ev: Event, node: int, op: int | None, dev: Slots, idx: int) -> None:
        self.epoch, self.node, self.op, self.dev, self.ts = ev.epoch, node, op, dev, _ts(ev)
        self.seq, self.line, self.src = ev.seq, ev.line_no, ev.src
        self.done = False
        self.buckets = _buckets(dev)
        self.idx = idx      # the IO rank's structural index at the backup
        self.fi = -1        # position of this window's finding in StoreFence.findings
        self.ends: dict[int, int] = {}
        self.since: dict[int, int] = {}   # rank -> the ts of its own backup record of the node, when earlier
        self.live = True    # still in the bucket index

    def floor(self, r: int) -> int:
        """Rank ``r``'s give-ups count after this ts: the copy's begin there."""
        s = self.since.get(r)
        return self.ts if s is None or s > self.ts else s


class StoreFence:
    RECENT = 4096      # stores (and give-ups) remembered per rank for backups read later than them
    CLOSED_LAG = 4096  # windows the IO rank gave up, kept for ranks whose end of the tenure is read later
    EARLY = 4096       # followers' backup records remembered for the IO rank's backup read later

    def __init__(self) -> None:
        self.io_rank = 0
        self.group = 0      # ranks in the group (config cp_size); the ranks seen count when larger
        self.ranks: set[int] = set()
        self.windows: dict[int, list[_Window]] = {}    # bucket -> windows still holding their pages on some rank
        self.by_node: dict[tuple[int, int], _Window] = {}   # (epoch, node) -> the node's latest window
        self.closed: deque = deque()   # windows the IO rank gave up, oldest first
        self.recent: dict[int, deque] = {}   # rank -> (ts, slots, index) of its latest stores, in its order
        self.gives: dict[int, deque] = {}    # rank -> (ts, kind, epoch, node, slots) of its latest give-ups
        self.early: dict[tuple[int, int], dict[int, int]] = {}   # (epoch, node) -> rank -> its backup's ts
        self.early_order: deque = deque()
        self.max_ts = -1 << 62
        self.findings: list[Finding] = []
        self.at: list[int] = []     # per finding: the larger structural index of its backup and its store
        self.stores = 0
        self.undecidable = 0             # stores whose overlap with a window the summaries could not decide
        self.undecidable_nodes: list[int] = []

    def feed(self, ev: Event, idx: int = 0) -> None:
        """One record; ``idx``: its rank's structural records of the epoch so far (see the module docstring)."""
        tag = ev.tag
        f = ev.fields
        r = ev.rank
        ts = _ts(ev)
        if r not in self.ranks:
            self.ranks.add(r)
            self.recent[r] = deque(maxlen=self.RECENT)
            self.gives[r] = deque(maxlen=self.RECENT)
        if ts > self.max_ts:
            self.max_ts = ts
        if tag == "store":
            d = slots_of(f.get("dev"), f.get("devx"))
            if d is None or d.cnt <= 0:
                return
            self.stores += 1
            self.recent[r].append((ts, d, idx))
            seen: set[int] = set()
            for b in _buckets(d):
                for w in self.windows.get(b, ()):
                    if id(w) not in seen:
                        seen.add(id(w))
                        self._test(w, r, ts, d, idx)
            return
        if tag == "backup":
            if r == self.io_rank:
                self._backup(ev, f, ts, idx)
            else:
                self._follower_backup(ev.epoch, f.get("node_id"), r, ts)
            return
        if tag == "reset":   # a reset frees every page of the rank: its tenures end (node ids restart)
            self.gives[r].append((ts, _RESET, None, None, None))
            for lst in list(self.windows.values()):
                for w in list(lst):
                    self._end(w, r, ts)
            return
        if tag == "evict":
            if f.get("tier") != "dev":
                return
            nid = f.get("node_id")
            d = slots_of(f.get("dev"), f.get("devx"))
            self.gives[r].append((ts, _EVICT, ev.epoch, nid, d))
            w = self.by_node.get((ev.epoch, nid)) if type(nid) is int else None  # type: ignore[assignment]
            if w is not None and w.live:
                self._end(w, r, ts)
            if d is not None:
                self._give(r, ts, d)
            return
        if tag == "free" and f.get("pool") == "dev":
            d = slots_of(f.get("idx"), f.get("idx_x"))
            if d is not None and d.cnt > 0:
                self.gives[r].append((ts, _GIVE, None, None, d))
                self._give(r, ts, d)

    def _give(self, r: int, ts: int, d: Slots) -> None:
        """Rank ``r`` gave the slots ``d`` up at ``ts``."""
        seen: set[int] = set()
        for b in _buckets(d):
            for w in list(self.windows.get(b, ())):
                if id(w) not in seen:
                    seen.add(id(w))
                    if overlap(w.dev, d) is not None:
                        self._end(w, r, ts)

    def _follower_backup(self, epoch: int, nid: object, r: int, ts: int) -> None:
        """Rank ``r`` (not the IO rank) logged its backup record of node ``nid``: the copy began there."""
        if type(nid) is not int:
            return
        w = self.by_node.get((epoch, nid))
        if w is not None and w.live and r not in w.since:
            w.since[r] = ts
            return
        key = (epoch, nid)
        m = self.early.get(key)
        if m is None:
            m = self.early[key] = {}
            self.early_order.append((key, m))
            if len(self.early_order) > self.EARLY:
                k, old = self.early_order.popleft()
                if self.early.get(k) is old:
                    del self.early[k]
        m[r] = ts

    def _end(self, w: _Window, r: int, ts: int) -> None:
        """Rank ``r``'s tenure of ``w``'s pages ended at ``ts`` (only a record after the copy began can end it)."""
        if ts <= w.floor(r):
            return
        e = w.ends.get(r)
        if e is not None and e <= ts:
            return
        w.ends[r] = ts
        if e is None:
            if r == self.io_rank:
                self.closed.append(w)
                while len(self.closed) > self.CLOSED_LAG:
                    self._retire(self.closed.popleft())
            if len(w.ends) >= max(self.group, len(self.ranks)):
                self._retire(w)

    def _retire(self, w: _Window) -> None:
        """Every rank gave ``w``'s pages up (or the IO rank did long ago): no store can be judged against it."""
        if not w.live:
            return
        w.live = False
        for b in w.buckets:
            lst = self.windows.get(b)
            if lst is not None:
                try:
                    lst.remove(w)
                except ValueError:
                    pass
                if not lst:
                    del self.windows[b]
        key = (w.epoch, w.node)
        if self.by_node.get(key) is w:
            del self.by_node[key]

    def _backup(self, ev: Event, f: dict, ts: int, idx: int) -> None:
        nid = f.get("node_id")
        d = slots_of(f.get("dev"), f.get("devx"))
        if type(nid) is not int or d is None or d.cnt <= 0:
            return
        old = self.by_node.get((ev.epoch, nid))
        if old is not None:   # a new backup of the node: later stores are judged against it
            for r in self.ranks:
                self._end(old, r, ts)
            self._retire(old)
        w = _Window(ev, nid, f.get("op") if type(f.get("op")) is int else None, d, idx)
        key = (ev.epoch, nid)
        self.by_node[key] = w
        early = self.early.pop(key, None)
        if early is not None:
            w.since.update(early)
        for b in w.buckets:
            self.windows.setdefault(b, []).append(w)
        if early is not None or self.max_ts > ts:
            self._look_back(w)

    def _look_back(self, w: _Window) -> None:
        """Records already read (merge lag, or a follower's flush stamped before the IO rank's backup): first each
        rank's give-ups since the copy began there, the earliest ending its tenure; then its stores after the
        backup and before that end."""
        t_b = w.ts
        for r, q in self.gives.items():
            floor = w.floor(r)
            later = []
            for ent in reversed(q):   # the rank's own order is its ts order: stop at the first record not later
                if ent[0] <= floor:
                    break
                later.append(ent)
            for ts, kind, epoch, node, d in reversed(later):
                if (kind == _RESET or (kind == _EVICT and epoch == w.epoch and node == w.node)
                        or (d is not None and overlap(w.dev, d) is not None)):
                    self._end(w, r, ts)
                    break
        if self.max_ts <= t_b:
            return
        for r, q in self.recent.items():
            later = []
            for ent in reversed(q):
                if ent[0] <= t_b:
                    break
                later.append(ent)
            for ts, d, idx in reversed(later):
                self._test(w, r, ts, d, idx)

    def _test(self, w: _Window, r: int, ts: int, s: Slots, idx: int) -> None:
        if ts <= w.ts:
            return
        e = w.ends.get(r)
        if e is not None and ts >= e:
            return   # the rank gave the pages up before this store: it writes the next owner's KV
        at = w.idx if w.idx > idx else idx
        if w.done and (w.fi < 0 or self.at[w.fi] <= at):
            return   # one finding per backup, judged at the earliest index any late store gives it
        c = overlap(w.dev, s)
        if c is None:
            return
        if c != EXACT:   # the rng summaries cannot decide: counted, never a finding
            self.undecidable += 1
            if len(self.undecidable_nodes) < 5 and w.node not in self.undecidable_nodes:
                self.undecidable_nodes.append(w.node)
            return
        if w.done:
            self.at[w.fi] = at
            return
        w.done = True
        w.fi = len(self.findings)
        self.at.append(at)
        f = Finding("C5", "C5-fence", self.io_rank, w.epoch, w.node, w.op, "exact", [w.seq],
                    f"node {w.node}: a store to its pages landed {ts - w.ts} ns after the IO rank's backup (op {w.op}) "
                    "began: the shared-mode copy ran before the pre-copy fence", ERROR, w.src, w.line)
        f.evidence_lines = [w.line]
        self.findings.append(f)

    def take(self, diverged_before: Callable[[int, int], bool]) -> list[Finding]:
        """Hand out the findings so far, less those that ``diverged_before(epoch, index)`` puts after the epoch's
        first C1 divergence, and forget them."""
        out = [f for f, at in zip(self.findings, self.at, strict=False) if not diverged_before(f.epoch, at)]
        self.findings, self.at = [], []
        for lst in self.windows.values():   # their findings are handed out: a later store cannot reopen them
            for w in lst:
                w.fi = -1
        for w in self.closed:
            w.fi = -1
        return out
