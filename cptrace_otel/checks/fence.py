"""C5 store fence (domain 5, R5), mode ``shared``: the IO rank copies every rank's pages to the shared host, so its
``backup`` must come after every rank's KV ``store`` to those pages ("sync, translate, copy, sync").

Rule: once the IO rank logs ``backup(op, node=n, dev=D)`` at time ``t_b``, a ``store`` on any rank whose ``dev`` ⊓ D
with ``ts > t_b`` is a violation (the copy ran before that store landed), until the IO rank gives the pages up
(``evict tier=dev`` of n or a ``free pool=dev`` ⊓ D). One finding per backup: ``C5``/``C5-fence`` on the IO rank,
node n, the backup's op. Compares ``ts`` (CLOCK_MONOTONIC, same host), not arrival order, and keeps the last few
thousand stores so a store read before the backup (ranks are merged with some lag) is still matched.

Which pages belong to which node is known across ranks only while the trees are in lockstep (C1): a rank whose tree
diverged reuses, for other nodes, pages the IO rank still holds. So :meth:`StoreFence.feed` takes each record's
structural index (its rank's structural records of the epoch so far) and every finding keeps the larger index of
its backup and its store; :meth:`StoreFence.take` hands out only those at or before the epoch's first C1
divergence (the pitfall of domain 5: C3-C5 stop after it; the divergence itself is reported as C1).

Windows are indexed by slot bucket, so a store costs a few dict lookups however many nodes are resident.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from ..events import Event
from .findings import ERROR, Finding
from .ranges import Slots, overlap, slots_of

_B = 256  # slots per bucket


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
    __slots__ = ("epoch", "node", "op", "dev", "ts", "end", "seq", "line", "src", "done", "buckets", "idx", "fi")

    def __init__(self, ev: Event, node: int, op: Any, dev: Slots, idx: int) -> None:
        self.epoch, self.node, self.op, self.dev, self.ts = ev.epoch, node, op, dev, _ts(ev)
        self.end: int | None = None
        self.seq, self.line, self.src = ev.seq, ev.line_no, ev.src
        self.done = False
        self.buckets = _buckets(dev)
        self.idx = idx      # the IO rank's structural index at the backup
        self.fi = -1        # position of this window's finding in StoreFence.findings


class StoreFence:
    RECENT = 4096      # stores remembered for backups read later than them
    CLOSED_LAG = 4096  # closed windows kept for stores read later than the close

    def __init__(self) -> None:
        self.io_rank = 0
        self.windows: dict[int, list[_Window]] = {}    # bucket -> windows
        self.by_node: dict[tuple[int, int], _Window] = {}
        self.closed: deque = deque()
        self.recent: deque = deque(maxlen=self.RECENT)  # (ts, Slots, structural index)
        self.findings: list[Finding] = []
        self.at: list[int] = []     # per finding: the larger structural index of its backup and its store
        self.stores = 0

    def feed(self, ev: Event, idx: int = 0) -> None:
        """One record; ``idx``: its rank's structural records of the epoch so far (see the module docstring)."""
        tag = ev.tag
        f = ev.fields
        if tag == "store":
            d = slots_of(f.get("dev"), f.get("devx"))
            if d is None or d.cnt <= 0:
                return
            self.stores += 1
            self.recent.append((_ts(ev), d, idx))
            for b in _buckets(d):
                for w in self.windows.get(b, ()):
                    self._test(w, _ts(ev), d, idx)
            return
        if ev.rank != self.io_rank:
            return
        if tag == "reset":   # the IO rank's reset frees every page: its windows end (node ids restart)
            for ep, n in list(self.by_node):
                self._close(ep, n, _ts(ev))
            return
        if tag == "backup":
            nid = f.get("node_id")
            d = slots_of(f.get("dev"), f.get("devx"))
            if type(nid) is not int or d is None or d.cnt <= 0:
                return
            self._close(ev.epoch, nid, _ts(ev))
            w = _Window(ev, nid, f.get("op") if type(f.get("op")) is int else None, d, idx)
            self.by_node[(ev.epoch, nid)] = w
            for b in w.buckets:
                self.windows.setdefault(b, []).append(w)
            for ts, s, sidx in self.recent:   # stores already read whose time is after this backup
                self._test(w, ts, s, sidx)
        elif tag == "evict" and f.get("tier") == "dev":
            nid = f.get("node_id")
            if type(nid) is int:
                self._close(ev.epoch, nid, _ts(ev))
        elif tag == "free" and f.get("pool") == "dev":
            s = slots_of(f.get("idx"), f.get("idx_x"))
            if s is not None:
                for b in _buckets(s):
                    for w in list(self.windows.get(b, ())):
                        if w.end is None and overlap(w.dev, s) is not None:
                            self._close(w.epoch, w.node, _ts(ev))

    def _test(self, w: _Window, ts: int, s: Slots, idx: int) -> None:
        if ts <= w.ts or (w.end is not None and ts >= w.end):
            return
        at = w.idx if w.idx > idx else idx
        if w.done and (w.fi < 0 or self.at[w.fi] <= at):
            return   # one finding per backup, judged at the earliest index any late store gives it
        if overlap(w.dev, s) is None:
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
        out = [f for f, at in zip(self.findings, self.at) if not diverged_before(f.epoch, at)]
        self.findings, self.at = [], []
        for lst in self.windows.values():   # their findings are handed out: a later store cannot reopen them
            for w in lst:
                w.fi = -1
        return out

    def _close(self, epoch: int, nid: int, ts: int) -> None:
        w = self.by_node.pop((epoch, nid), None)
        if w is None:
            return
        w.end = ts
        self.closed.append(w)
        while len(self.closed) > self.CLOSED_LAG:
            old = self.closed.popleft()
            for b in old.buckets:
                lst = self.windows.get(b)
                if lst is not None:
                    try:
                        lst.remove(old)
                    except ValueError:
                        pass
                    if not lst:
                        del self.windows[b]
