"""The incremental state of ``cptrace-otel watch`` for one run: Jaeger traces in, each new finding out once.

Contract (:class:`RunWatch`):

* :meth:`RunWatch.add_trace` takes one trace in Jaeger's JSON model as a search returns it (whole, old spans
  included). Spans of the watcher's own service (:data:`WATCH_SERVICE`: the findings it wrote back) are skipped, so
  its output is never read as input. Every record of a rank whose ``cptrace.seq`` is at or past the rank's watermark
  (the next seq it has not fed yet) is kept as pending; older ones were fed before and are dropped at once.
* :meth:`RunWatch.step` feeds each rank's pending records in seq order while they are contiguous (the ranks merged
  by their ``ts`` field, as ``check`` merges files), through the same rules as ``check``: a :class:`RankChecker` per
  rank and one :class:`CrossRank`. It returns the findings that became known. A gap in a rank's seqs (spans still in
  flight) holds that rank back; a gap still there after :data:`GAP_POLLS` steps, or more than :data:`MAX_PENDING`
  records waiting behind one, is given up (the records are lost: a Jaeger restart or eviction) with a note.
* :meth:`RunWatch.finish` ends the run (the rules' end-of-stream findings) and frees its state.
* The evidence index maps ``(rank, seq)`` of the last :data:`KEEP` records of each rank to the span that holds it
  (trace id, span id, start µs, the codes already stamped on it), for the write-back's span links.

Memory: the rules' own state (what is in flight, by their contracts), the pending records (what arrived ahead of a
gap), and the evidence index (at most :data:`KEEP` entries per rank, allocated as records arrive): none grows with
the length of the run, and a small run costs little.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from ..checks import Finding, RankChecker
from ..checks.crossrank import CrossRank
from ..model.events import Event

WATCH_SERVICE = "cptrace-watch"   # service.name of the spans watch writes back (never read as input)
KEEP = 1 << 16                    # records per rank whose span is remembered, for evidence links
GAP_POLLS = 3                     # steps a seq gap may stay open before its records are taken as lost
MAX_PENDING = 200_000             # records per rank waiting behind a gap before it is given up at once


class SpanRef:
    """The span holding some records: ids as Jaeger returns them (hex), start µs, violation codes on it."""

    __slots__ = ("trace_id", "span_id", "start_us", "codes")

    def __init__(self, trace_id: str, span_id: str, start_us: int, codes: frozenset) -> None:
        self.trace_id, self.span_id, self.start_us, self.codes = trace_id, span_id, start_us, codes


class _Rank:
    __slots__ = ("next", "pending", "stuck", "refs", "checker", "fed")

    def __init__(self, checker: RankChecker, start: int = 0) -> None:
        self.next = start                       # the next seq to feed
        self.pending: dict[int, Event] = {}     # seq -> record at or past ``next``
        self.stuck = 0                          # steps in a row that a gap held this rank back
        # evidence index: seq -> its span, the last KEEP indexed (a dict that grows with what arrived, not a ring
        # allocated whole: a run of a few records costs a few entries, so a thousand runs cost little)
        self.refs: dict[int, SpanRef] = {}
        self.checker = checker
        self.fed = False


class RunWatch:
    """One run's incremental check (see the module doc). ``note(text)`` receives the lines for stderr."""

    def __init__(self, run_id: str, level: int | None = None, start: dict[int, int] | None = None,
                 note: Callable[[str], None] = lambda s: None) -> None:
        self.run_id = run_id
        self.level = level
        self.note = note
        self.ranks: dict[int, _Rank] = {}
        self.cross = CrossRank(level)
        self._start = dict(start or {})
        self._cross_taken = 0
        self._levels: dict[int, int] = {}   # rank -> the highest trace level its resources recorded
        self.events = 0          # records fed so far
        self.new_records = 0     # records that arrived in the current step (the run is still changing)

    # -- intake ----------------------------------------------------------------------------------------------------
    def _rank(self, r: int) -> _Rank:
        st = self.ranks.get(r)
        if st is None:
            st = self.ranks[r] = _Rank(RankChecker(r, self.level), self._start.get(r, 0))
        return st

    def add_trace(self, trace: dict[str, Any]) -> None:
        """One Jaeger-model trace (see the module doc); raises one of ``otlpfile.BAD_SHAPE`` for a trace of the wrong
        shape."""
        from .jaeger_read import records_py

        self.add_records(records_py(trace)[1])

    def add_records(self, spans: list) -> None:
        """One trace's span rows as :mod:`.jaeger_read` reads them (the compiled reader or its twin): what
        :meth:`add_trace` does with the trace they come from."""
        per_rank: dict[int, list[Event]] = {}
        levels = self._levels
        for service, rank, codes, trace_id, span_id, start_us, lvl, seqs, events in spans:
            if service == WATCH_SERVICE or not self._index_span(rank, codes, trace_id, span_id, start_us, seqs):
                continue
            if lvl is not None:
                r, v = lvl
                levels[r] = max(levels.get(r, 0), v)
            for ev in events:
                lst = per_rank.get(ev.rank)
                if lst is None:
                    lst = per_rank[ev.rank] = []
                lst.append(ev)
        for r, evs in per_rank.items():
            st = self._rank(r)
            lvl = levels.get(r)
            if self.level is None and lvl is not None and not st.fed:
                st.checker.config_level = lvl   # the exporter's recorded level, as check uses it
            pending = st.pending
            for ev in evs:
                seq = ev.seq
                if seq >= st.next and seq not in pending:
                    pending[seq] = ev
                    self.new_records += 1

    def _index_span(self, rank: int, codes: str | None, trace_id: str, span_id: str, start_us: int,
                    seqs: list) -> bool:
        """Put the span's new records into the evidence index; False when it holds no record to feed."""
        st = self._rank(rank)
        ref = None
        fresh = False
        for seq in seqs:
            if seq is not None and seq >= st.next:
                fresh = True
                if ref is None:
                    ref = SpanRef(trace_id, span_id, start_us,
                                  frozenset(codes.split(",")) if codes is not None else frozenset())
                refs = st.refs
                refs[seq] = ref
                if len(refs) > KEEP:
                    del refs[next(iter(refs))]
        return fresh

    def span_of(self, rank: int, seq: int) -> SpanRef | None:
        """The span that holds record ``seq`` of ``rank``, while the evidence index remembers it."""
        st = self.ranks.get(rank)
        if st is None:
            return None
        return st.refs.get(seq)

    # -- feeding ---------------------------------------------------------------------------------------------------
    def step(self, final: bool = False, end_of_poll: bool = True) -> list[Finding]:
        """Feed what is contiguous now (``final``: everything, gaps given up); the new findings. Call it with
        ``end_of_poll=False`` between the pages of one poll (memory: what arrived is fed as soon as it can be); only
        the last step of a poll counts towards :data:`GAP_POLLS`."""
        streams = []
        for r, st in sorted(self.ranks.items()):
            ready = []
            while True:
                ev = st.pending.pop(st.next, None)
                if ev is None:
                    if not st.pending:
                        st.stuck = 0
                        break
                    st.stuck += end_of_poll
                    if not (final or st.stuck > GAP_POLLS or len(st.pending) > MAX_PENDING):
                        break
                    nxt = min(st.pending)
                    self.note(f"run {self.run_id}: rank {r}: records {st.next}..{nxt - 1} are not in Jaeger "
                              f"(lost, or evicted from its store): continuing at {nxt}")
                    st.next, st.stuck = nxt, 0
                    continue
                ready.append(ev)
                st.next += 1
            if ready:
                st.fed = True
                streams.append(ready)
        out: list[Finding] = []
        evs = streams[0] if len(streams) == 1 else heapq.merge(
            *streams, key=lambda e: e.fields["ts"] if type(e.fields.get("ts")) is int else e.ts)
        cross = self.cross.feed
        for ev in evs:
            found = self.ranks[ev.rank].checker.feed(ev)
            if found:
                out.extend(found)
            cross(ev)
            self.events += 1
        out.extend(self._cross_new())
        return out

    def _cross_new(self) -> list[Finding]:
        lst = self.cross.findings
        new = lst[self._cross_taken:]
        # the list is only read by CrossRank.finish (which sorts and returns it): findings handed out are dropped
        del lst[:]
        self._cross_taken = 0
        return new

    def finish(self) -> list[Finding]:
        """End of the run: what only the end reveals. The state is spent afterwards."""
        out = self.step(final=True)
        for r in sorted(self.ranks):
            out.extend(self.ranks[r].checker.finish())
        if self.cross.level < 2 and any(st.checker.level >= 2 for st in self.ranks.values()):
            self.cross.seen_level = 2
        out.extend(self.cross.finish())
        return out

    def watermarks(self) -> dict[int, int]:
        """rank -> the next seq not fed (kept when the run is retired, so a late record is not fed twice)."""
        return {r: st.next for r, st in self.ranks.items()}

    def pending(self) -> int:
        return sum(len(st.pending) for st in self.ranks.values())

