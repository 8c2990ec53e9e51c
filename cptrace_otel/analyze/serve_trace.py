"""One trace a ``cptrace-otel serve`` replica holds (:class:`TraceState`) and the check of its records alone
(:func:`check_trace`), for :mod:`.serve_state`.

Contract: :func:`check_trace` runs ``check``'s analysis over a trace's records: each rank's in (epoch, seq) order
led by its config record (:func:`with_config`: the stamp on the resource, for the rules that read the CP group,
mode, IO rank, sidecars or storage identity), the ranks merged by ``ts``, every rule's findings unfiltered (the
caller reports only the rules one trace decides). :func:`from_spans` builds a trace from spans read elsewhere (a
span store's answer), the first copy of a record kept, as the intake does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..model.events import Event, int_field
from .incremental import SpanRef
from .serve_journal import ranks_without_start, trace_node

if TYPE_CHECKING:
    from .engine import Result
    from .otlp_intake import SpanRecords
    from .serve_live import LiveCheck


class TraceState:
    """The held records of one trace: rank -> events, (rank, seq) -> span, levels, last change."""

    __slots__ = ("run_id", "trace_id", "ranks", "refs", "levels", "changed", "records", "configs", "live",
                 "broken", "segmented", "reported")

    def __init__(self, run_id: str, trace_id: str, now: float) -> None:
        self.run_id, self.trace_id = run_id, trace_id
        self.ranks: dict[int, list[Event]] = {}
        self.refs: dict[tuple[int, int], SpanRef] = {}
        self.levels: dict[int, int] = {}
        self.changed = now
        self.records = 0
        self.configs: dict[int, Event] = {}   # rank -> its config record, stamped on the resource
        self.live: LiveCheck | None = None    # the live check (live mode), None idle-only
        self.broken = False                   # its check raised: NOT checked from then on (said on stderr)
        self.segmented = 0                    # records checked (idle-only) or span refs dropped (live) in
                                              # earlier segments (max_trace_records)
        self.reported: set[str] | None = None   # ids of findings reported before its end (with a span store)

    def events(self) -> list[Event]:
        """The held records, every rank's."""
        return [ev for evs in self.ranks.values() for ev in evs]

    def span_of(self, rank: int, seq: int) -> SpanRef | None:
        """The span holding record ``seq`` of ``rank`` (what :class:`~.finding_sinks.WriteBack` links to)."""
        return self.refs.get((rank, seq))


def cp_size(stamps: dict[int, Event]) -> int:
    """The CP group size the ranks' config stamps give (the largest ``cp_size``; 0 without one)."""
    return max((int_field(c.fields.get("cp_size")) or 0 for c in stamps.values()), default=0)


def with_config(tr: TraceState, rank: int, stream: list[Event]) -> list[Event]:
    """``rank``'s records of ``tr`` led by its config record (from the resource stamp, for the rules that read the
    CP group, mode, IO rank, sidecars or storage identity), unless the trace holds that record itself (a rank
    trace) or no stamp came with it."""
    cfg = tr.configs.get(rank)
    if cfg is None or (rank, cfg.seq) in tr.refs:
        return stream
    if cfg.rank != rank:   # a process that records for several ranks: one stamp, its rank
        cfg = dataclasses.replace(cfg, rank=rank)
    return [cfg, *stream]


def from_spans(run_id: str, trace_id: str, spans: Iterable[SpanRecords], now: float = 0.0) -> TraceState:
    """A trace holding the records of ``spans`` of ``run_id`` (each ``(rank, seq)`` once: its first copy), with
    their span refs, levels and config stamps (what :meth:`~.serve_state.ServeState.add` keeps of them)."""
    tr = TraceState(run_id, trace_id, now)
    for s in spans:
        if s.run_id != run_id:
            continue
        for ev in s.events:
            rk = (ev.rank, ev.seq)
            if rk in tr.refs:
                continue
            tr.refs[rk] = s.ref
            tr.ranks.setdefault(ev.rank, []).append(ev)
            tr.records += 1
            if s.level is not None:
                tr.levels[ev.rank] = s.level
            if s.config is not None:
                tr.configs[ev.rank] = s.config
    return tr


def check_trace(tr: TraceState) -> Result:
    """``check``'s analysis over ``tr``'s records alone: each rank's in (epoch, seq) order led by its config record
    (:func:`with_config`), the ranks merged by ``ts``; every rule's findings, unfiltered (the replica reports only
    the rules one trace decides)."""
    from .engine import Analysis
    from .sources.otlpfile import merge_streams

    streams = [with_config(tr, r, sorted(evs, key=lambda e: (e.epoch, e.seq))) for r, evs in sorted(tr.ranks.items())]
    return Analysis(rank_levels=tr.levels).run(merge_streams(streams), findings_only=True)


def is_cut(tr: TraceState) -> bool:
    """Whether node trace ``tr`` lacks a rank's first records (:func:`~.serve_journal.ranks_without_start`)."""
    return bool(ranks_without_start(tr.run_id, tr.trace_id, tr.ranks, {r.span_id for r in tr.refs.values()},
                                    tr.events()))


def joins_trusted(tr: TraceState) -> tuple[bool, bool]:
    """(whether ``tr``'s C3-C5 findings may be reported, whether it is short of a rank of its CP group).

    C3-C5 need every rank's group size and mode: a rank without a config stamp (an older exporter) leaves them
    to guess the group from the ranks seen, so then they are not trusted. And every rank of the group: a node
    trace with records of fewer ranks than its CP group has (``cp_size`` of the stamps; the rest went to
    another replica when the resolver changed, or came before this one) would judge a join without that rank's
    side: a false C3 where it holds the others, a C3 missed where it holds that rank alone. Such a trace is
    short (its C3-C5 not reported, the trace named UNCHECKED for them); a rank or request trace (one rank's by
    nature) and a trace outside CP never are."""
    if not all(r in tr.configs for r in tr.ranks):
        return False, False
    size = cp_size(tr.configs)
    short = size >= 2 and len(tr.ranks) < size and trace_node(
        tr.run_id, tr.trace_id, tr.events()) is not None
    return not short, short


def merge_facts(tr: TraceState, live: LiveCheck, s: SpanRecords, whole_run: bool = False) -> None:
    """Live: what ``tr``'s cross-rank merge waits for (:class:`~.serve_live.LiveCheck`), from span ``s`` (before
    its records are taken): the group, the CP group of the config stamps once every rank seen has one, as the idle
    path's C3-C5 need, for a node trace and a whole run (``whole_run``, scope run), the one rank for a rank trace;
    and, for a node trace, the ranks whose first lane span came (its merge starts only then: a tail moved here by a
    resolver change is never joined)."""
    from ..model.trace_ids import lane_span_id, rank_trace_id

    rank = s.events[0].rank
    if rank not in tr.ranks:   # a new rank (its first record is taken by the caller): the group may be known now
        if live.node is None and not whole_run:
            live.node = trace_node(tr.run_id, tr.trace_id, s.events)
        if live.node is not None or whole_run:
            # (the stamps as they will be once this span's records are taken: every rank's, or not known)
            stamps = tr.configs if s.config is None else {**tr.configs, rank: s.config}
            size = cp_size(stamps) if all(r in stamps for r in (*tr.ranks, rank)) else 0
            live.group = frozenset(range(size)) if size >= 1 else None
        elif not tr.ranks and rank_trace_id(tr.run_id, rank).hex() == tr.trace_id:
            live.group = frozenset((rank,)) if (rank in tr.configs or s.config is not None) else None
    node = live.node
    if (node is not None and rank not in live.starts
            and lane_span_id(tr.run_id, node[0], node[1], rank).hex() == s.ref.span_id):
        live.starts.add(rank)
