"""The live check of one held trace in a ``cptrace-otel serve`` replica: records fed to the rules as they arrive.

Contract (:class:`LiveCheck`):

* :meth:`LiveCheck.push` takes one record of the trace with the time it arrived. Each rank's records must reach the
  rules in (epoch, seq) order, but they come in batches, and a collector that retries a batch may deliver it after
  later ones. So each rank holds a small **reorder window**: a heap by (epoch, seq), from which the smallest record
  is fed once the rank holds more than ``window`` records, and every record is fed at most ``window_s`` seconds
  after it arrived (each arrival batch remembers its largest key; once the batch is ``window_s`` old, every record
  up to that key is fed). A record that arrives behind the window (its key is below one its rank already fed) cannot
  be fed in order: it is **not fed** (feeding it would let the rules judge a history that did not happen), counted
  in :attr:`LiveCheck.past_window`, and its trace is said to be partly unchecked when it is finalised.
* :meth:`LiveCheck.release` feeds what the window lets go at ``now`` (``final``: everything) to its rank's rules and
  returns the findings the fed records decided, at once: the same :class:`~.engine.Analysis` (a
  :class:`~cptrace_otel.checks.RankChecker` per rank and :class:`~cptrace_otel.checks.crossrank.CrossRank`) that the
  idle-only path runs over the whole trace, so a finding is decided by the same record it would be there.
* The cross-rank rules see the ranks merged by ``ts`` (:func:`~.sources.otlpfile.merge_key`), as on the idle path:
  each record a rank's window lets go also joins that rank's queue of the **cross-rank merge**, which hands the
  smallest head to :class:`~cptrace_otel.checks.crossrank.CrossRank` only while every rank of :attr:`group` (and
  every rank seen) has a record queued, so no later record can come before it: the order ``heapq.merge`` gives the
  idle path over the same streams, hence the same C3-C5 findings, decided live. :attr:`group` (set by the replica:
  the CP group of the config stamps, or the one rank of a rank trace) None, or a node trace whose ranks' first lane
  spans (:attr:`starts`) were not all seen: nothing is merged before :meth:`finish`, which merges what is left.
  More than ``merge_cap`` records waiting in the merge (a rank of the group that sends nothing more for a while)
  ends it for the trace: :attr:`cross_gone`, the queues are dropped and the trace's cross-rank rules are unchecked
  from there on (the caller says so).
* :meth:`LiveCheck.finish` feeds what is still held and returns the end-of-stream findings (H4-open, the rules'
  ``finish``). Every finding is returned once: the ones handed out are dropped from the analysis.

Memory: the rules' own state (what is in flight, by their contracts), at most ``window`` records per rank in the
reorder windows and ``merge_cap`` in the cross-rank merge, plus one (time, key) entry per arrival batch not yet
``window_s`` old.
"""

from __future__ import annotations

import heapq
from collections import deque

from ..checks import Finding
from ..model.events import Event
from .sources.otlpfile import merge_key

WINDOW = 4096      # records per rank held for reordering (default)
# seconds a record may be held for reordering (default): an exporter sends a span's records when the span ends (its
# closing record, or its 1 s timeout), so a rank's records of one trace can arrive that much out of order, plus the
# collector's batching
WINDOW_S = 2.0
# records of one trace waiting in the cross-rank merge for a rank of the group (default)
MERGE_CAP = 4096
# a run-scope replica's (serve --scope run) reorder window per rank: a rank's records of every node, so its
# window_s must hold all it records in that time (20k records/s for 2 s: 40k), and its merge waits for every rank
RUN_WINDOW = 65536
RUN_MERGE_CAP = 1 << 20


class _RankBuf:
    __slots__ = ("heap", "batches", "last")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, Event]] = []              # (epoch, seq, record) not fed yet
        self.batches: deque[tuple[float, tuple[int, int]]] = deque()   # (arrival, largest key of the batch)
        self.last: tuple[int, int] | None = None                   # the key of the last record fed


class LiveCheck:
    """See the module doc. ``levels`` is the trace's rank -> trace level map (read when a rank's first record is
    fed, as the idle-only path reads it)."""

    __slots__ = ("analysis", "bufs", "window", "window_s", "held", "past_window", "fed", "pending", "group",
                 "node", "starts", "xq", "xheld", "merge_cap", "cross_gone", "led")

    def __init__(self, levels: dict[int, int], window: int = WINDOW, window_s: float = WINDOW_S,
                 merge_cap: int = MERGE_CAP) -> None:
        from .engine import Analysis

        self.analysis = Analysis(rank_levels=levels)
        self.bufs: dict[int, _RankBuf] = {}
        self.window, self.window_s = max(0, window), max(0.0, window_s)
        self.held = 0          # records in the reorder windows
        self.past_window = 0   # records that came behind their rank's window (not fed)
        self.fed = 0           # records fed to the rules
        self.pending: list[Finding] = []   # findings of lead records, handed out by the next release
        # the cross-rank merge (module doc)
        self.group: frozenset[int] | None = None   # the ranks it waits for; None: not known (merged at finish)
        self.node: tuple[int, int] | None = None   # a node trace's (epoch, node id): merged once every start came
        self.starts: set[int] = set()              # ranks whose first lane span came here (node traces)
        self.xq: dict[int, deque[Event]] = {}      # rank -> records fed to its rules, not yet to CrossRank
        self.xheld = 0
        self.merge_cap = merge_cap
        self.cross_gone = False                    # the merge overflowed: cross-rank rules unchecked from there
        self.led: set[tuple[int, int]] = set()     # (rank, seq) of the config records fed by lead()

    def push(self, ev: Event, now: float) -> bool:
        """Hold ``ev`` (arrived at ``now``) in its rank's window; False when it came behind the window (not fed,
        counted in :attr:`past_window`)."""
        b = self.bufs.get(ev.rank)
        if b is None:
            b = self.bufs[ev.rank] = _RankBuf()
        key = (ev.epoch, ev.seq)
        if b.last is not None and key <= b.last:
            self.past_window += 1
            return False
        heapq.heappush(b.heap, (ev.epoch, ev.seq, ev))
        self.held += 1
        bt = b.batches
        if bt and bt[-1][0] == now:   # the same arrival batch: remember its largest key
            if key > bt[-1][1]:
                bt[-1] = (now, key)
        else:
            bt.append((now, key))
        return True

    def lead(self, ev: Event) -> None:
        """Feed ``ev`` at once, before any record of its rank: the rank's config record from the resource stamp
        (serve_trace.with_config), which leads the rank's records here as it does on the idle path. Not a record of
        the trace, so not counted in :attr:`fed`; its (rank, seq) kept in :attr:`led`, so the record itself, when
        it comes too, is known as had."""
        self.led.add((ev.rank, ev.seq))
        found = self.analysis.feed_rank(ev)
        if found:
            self.pending.extend(found)
        self._xpush(ev)

    def release(self, now: float, final: bool = False) -> list[Finding]:
        """Feed what the windows let go at ``now`` (``final``: all of it); the findings that became known."""
        out, self.pending = self.pending, []
        an = self.analysis
        cut_at = now - self.window_s
        for b in self.bufs.values():
            heap, bt = b.heap, b.batches
            cut: tuple[int, int] | None = None
            while bt and (final or bt[0][0] <= cut_at):
                k = bt.popleft()[1]
                if cut is None or k > cut:
                    cut = k
            while heap and (len(heap) > self.window or (cut is not None and heap[0][:2] <= cut)):
                epoch, seq, ev = heapq.heappop(heap)
                b.last = (epoch, seq)
                self.held -= 1
                self.fed += 1
                found = an.feed_rank(ev)
                if found:
                    out.extend(found)
                self._xpush(ev)
        self._merge(final)
        if an.findings:   # Analysis.feed keeps what it returns: handed out here, so dropped (never reported twice)
            del an.findings[:]
        out.extend(_take(an.cross.findings))
        return out

    def _xpush(self, ev: Event) -> None:
        if self.cross_gone:
            return
        q = self.xq.get(ev.rank)
        if q is None:
            q = self.xq[ev.rank] = deque()
        q.append(ev)
        self.xheld += 1
        if self.xheld > self.merge_cap:   # a rank of the group silent for long: give the merge up (module doc)
            self.cross_gone = True
            self.xq.clear()
            self.xheld = 0

    def _merge(self, final: bool) -> None:
        """Hand CrossRank the queued records in the idle path's merge order, as far as it is known (``final``:
        every stream has ended, so all of them)."""
        qs = self.xq
        if not qs or self.cross_gone:
            return
        g = self.group
        if not final:
            if g is None or (self.node is not None and not g <= self.starts):
                return
            ranks = sorted(g.union(qs))
        else:
            ranks = sorted(qs)
        feed = self.analysis.cross.feed
        while True:
            best, bk = None, 0
            for r in ranks:
                q = qs.get(r)
                if not q:
                    if final:
                        continue
                    return   # this rank's next record may come first: wait for it
                k = merge_key(q[0])
                if best is None or k < bk:
                    best, bk = q, k
            if best is None:
                return
            self.xheld -= 1
            feed(best.popleft())

    def finish(self, now: float) -> list[Finding]:
        """Feed everything held, then the end of stream: the findings only the end reveals (the state is spent)."""
        out = self.release(now, final=True)
        out.extend(self.analysis.result(findings_only=True).findings)
        return out


def _take(lst: list[Finding]) -> list[Finding]:
    """The findings in ``lst``, which is emptied (a rule's list read again only at its end)."""
    new = lst[:]
    del lst[:]
    return new

