"""What the HTML report draws, computed from the events and findings of an analysis (no HTML here).

A report is made of :class:`Panel` s, one per epoch (a run) or per epoch of one node (``--node``), each with one
:class:`Lane` per CP rank on a shared time axis. A lane holds

* marks: the records drawn one by one (:class:`Records` keeps them, with their fields, for the hover text);
* bars: the stage instances of the domain reference (section 2): ``d2h`` from a ``prepare`` to the last
  ``ack dir=d2h`` of its op (its ``backup`` records inside), ``h2d`` from a ``reload`` to the last ``ack dir=h2d`` of
  its op, the L3 tier's ``l3b`` (``l3_backup`` .. ``l3_ack dir=backup``) and ``l3p`` (``l3_prefetch`` ..
  ``l3_ack dir=prefetch``); and in node panels the node's holds: ``dev`` (device slots: from ``insert``, a
  ``reload`` whose chain names it or the ``split`` that created it, to its ``evict tier=dev``) and ``host`` (host
  slots: from ``prepare`` or the creating ``split``, to its ``evict tier=host``). A bar whose end record never came
  is ``open`` and drawn to the panel's end; a rank whose stream has no ``ack`` or ``l3_ack`` at all (level 1) gets
  no stage bars;
* density: when a lane has more records than the panel may draw, counts per time bucket instead of marks;
* findings: every finding of the panel's epoch (and node), placed at the record that completed it, its evidence
  records always drawn as marks (at most :data:`FINDINGS_SHOWN` findings, most severe first, or
  :data:`FINDINGS_DRAWN` in a summarised run: the page says how many more ``check --json`` lists).

A one-node report (``node``) is drawn from one pass over the run's records, holding what its panels draw and not
the records (:class:`_NodeIndex`; bars and densities: :mod:`.report_bars`): its records one by one up to
:data:`NODE_MARKS`, then densities; at most :data:`NODE_BARS` stage bars and as many holds per lane, the first and
the last half. A run with at most ``full_limit`` records is drawn whole. A larger one is summarised: its epochs (at most
:data:`MAX_PANELS`, those with findings first) as densities with every finding and its evidence, then the top nodes
(by findings, then by activity: records that change a node's state, not reads such as ``rid_map`` or ``compose``)
each in a panel of its own, and a table of the top nodes. Record times are the ``ts`` field (monotonic, one clock
for the ranks of a host) when the record has one, else the event time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..model.events import Event
from ..model.l3 import ACK as L3_ACK
from .report_bars import Bar, Hist, Holds, Kept, Stages, density, holds, nodes_of, rec_ts, stage_bars

if TYPE_CHECKING:
    from ..checks.findings import Finding

FULL_LIMIT = 5000        # a run with at most this many records is drawn whole
TOP_NODES = 12           # node panels in a summarised run
NODE_MARKS = 1500        # a node panel with more records than this draws densities
MAX_PANELS = 8           # epoch panels in a summarised run
NODE_BARS = 2000         # bars a lane of a node panel draws at most (the first and the last half)
SETTLE_EVERY = 1024      # records of a lane between two settlings of its stage bars (a one-node report)
TABLE_ROWS = 40          # rows of the top-nodes table
TRACE_MAP_MAX = 20000    # nodes whose trace id the report can resolve (#trace=<hex>)
FINDINGS_SHOWN = 1000    # findings listed and drawn (most severe first) ...
FINDINGS_DRAWN = 300     # ... in a summarised run
_READS = frozenset(("rid_map", "compose", "store", "fwd_hash"))   # records that do not change a node


@dataclasses.dataclass
class Lane:
    rank: int
    marks: list[int] = dataclasses.field(default_factory=list)      # indices into Records
    bars: list[Bar] = dataclasses.field(default_factory=list)
    density: list[tuple[int, int]] | None = None                    # (bucket, count), non-empty buckets
    records: int = 0                                                # records of the lane in this panel
    link: str | None = None                                         # Jaeger URL
    no_acks: bool = False                                           # no ack record: no stage bars (level 1)


@dataclasses.dataclass
class Panel:
    pid: str                   # HTML id
    title: str
    epoch: int
    node: int | None
    t0: int
    t1: int
    lanes: list[Lane]
    findings: list[int]        # indices into Model.findings
    trace_id: str | None = None
    link: str | None = None
    note: str = ""


@dataclasses.dataclass
class PlacedFinding:
    finding: Any               # checks.Finding
    ts: int | None             # where it is drawn (the completing record), None when no record is known
    evidence: list[int]        # indices into Records
    trace_id: str | None = None
    link: str | None = None


class Records:
    """The records the report draws, each once: ``rows[i]`` is ``[tag, rank, seq, ts, epoch, fields text, where]``."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self._index: dict[int, int] = {}
        from ..model.logline import render_value
        self._render = render_value

    def add(self, ev: Event) -> int:
        i = self._index.get(id(ev))
        if i is None:
            r = self._render
            text = " ".join(f"{k}={r(v)}" for k, v in ev.fields.items() if k not in ("rank", "ts"))
            where = f"{ev.src}:{ev.line_no}" if ev.line_no else ev.src
            i = self._index[id(ev)] = len(self.rows)
            self.rows.append([ev.tag, ev.rank, ev.seq, rec_ts(ev), ev.epoch, text, where])
        return i


@dataclasses.dataclass
class NodeRow:
    epoch: int
    node: int
    ranks: list[int]
    records: int
    activity: int
    codes: list[str]
    trace_id: str | None = None
    link: str | None = None
    panel: str | None = None   # id of its panel when drawn


@dataclasses.dataclass
class Model:
    title: str
    run_id: str | None
    ranks: list[int]
    events: int
    summarised: bool
    panels: list[Panel]
    findings: list[PlacedFinding]
    nodes: list[NodeRow]
    trace_map: dict[str, tuple[int, int]]
    notes: list[str]
    codes: dict[str, int]      # findings per code, all of them (``findings`` holds those listed and drawn)


class _Index:
    """One pass over a group's events: per (epoch, rank) lanes, node activity, the evidence records."""

    def __init__(self, events: list[Event], findings: list) -> None:
        want = {(f.rank, s) for f in findings for s in f.evidence}
        self.lanes: dict[int, dict[int, list[Event]]] = {}
        self.activity: dict[tuple[int, int], list[int]] = {}    # (epoch, node) -> [records, activity]
        self.node_events: dict[tuple[int, int], list[Event]] = {}
        self.evidence: dict[tuple[int, int], Event] = {}
        self.ranks: set[int] = set()
        self.acks: set[int] = set()                              # ranks with ack records
        lanes, act, nevs = self.lanes, self.activity, self.node_events
        for ev in events:
            r, e = ev.rank, ev.epoch
            per = lanes.get(e)
            if per is None:
                per = lanes[e] = {}
            lst = per.get(r)
            if lst is None:
                lst = per[r] = []
                self.ranks.add(r)
            lst.append(ev)
            if ev.tag == "ack" or ev.tag == L3_ACK:   # (level 2: stage bars can close)
                self.acks.add(r)
            if want and (r, ev.seq) in want:
                self.evidence[(r, ev.seq)] = ev
            for n in nodes_of(ev):
                k = (e, n)
                a = act.get(k)
                if a is None:
                    a = act[k] = [0, 0]
                    nevs[k] = []
                a[0] += 1
                if ev.tag not in _READS:
                    a[1] += 1
                nevs[k].append(ev)
        self._bars: dict[tuple[int, int], list[Bar]] = {}

    def span(self, epoch: int) -> tuple[int, int]:
        ts = [rec_ts(lst[i]) for lst in self.lanes.get(epoch, {}).values() for i in (0, -1)]
        return (min(ts), max(ts)) if ts else (0, 1)

    def bars(self, epoch: int, rank: int) -> list[Bar]:
        k = (epoch, rank)
        if k not in self._bars:
            self._bars[k] = stage_bars(self.lanes.get(epoch, {}).get(rank, []))
        return self._bars[k]

    def node_ranks(self, key: tuple[int, int]) -> list[int]:
        return sorted({ev.rank for ev in self.node_events[key]})

    def node_lanes(self, epoch: int, node: int) -> dict[int, _NodeLane]:
        """The lanes of ``node``'s panel in ``epoch``, one per rank with a record of it."""
        out: dict[int, _NodeLane] = {}
        for ev in self.node_events.get((epoch, node), ()):
            nl = out.get(ev.rank)
            if nl is None:
                nl = out[ev.rank] = _NodeLane(node)
            nl.note(ev)
        for r, nl in out.items():
            if r in self.acks:
                nl.bars.extend(b for b in self.bars(epoch, r) if node in b.nodes)
            nl.bars.extend(holds(nl.events or (), node))
        return out


class _NodeLane:
    """What one rank's lane of a node panel draws: the node's records (``events`` while they are few enough to be
    drawn one by one, else None), their times (``hist``, ``lo``..``hi``) and the bars with the node in them."""

    __slots__ = ("bars", "dropped", "events", "hi", "hist", "lo", "records")

    def __init__(self, node: int) -> None:
        self.records, self.dropped = 0, 0
        self.events: list[Event] | None = []
        self.hist: Hist | None = None
        self.lo: int | None = None
        self.hi: int | None = None
        self.bars: list[Bar] = []

    def note(self, ev: Event, keep: bool = True) -> None:
        """One of the node's records: counted, its time noted, and kept while ``keep`` (else its time goes to the
        histogram, as do those of the records kept so far)."""
        t = rec_ts(ev)
        self.records += 1
        self.lo = t if self.lo is None or t < self.lo else self.lo
        self.hi = t if self.hi is None or t > self.hi else self.hi
        if keep and self.events is not None:
            self.events.append(ev)
            return
        self.to_hist()
        self.hist.add(t)  # type: ignore[union-attr]

    def to_hist(self) -> None:
        """Count the kept records' times in a histogram and drop them (too many to draw one by one)."""
        if self.hist is None:
            self.hist = Hist()
            for kept in self.events or ():
                self.hist.add(rec_ts(kept))
            self.events = None

    def density(self, t0: int, t1: int) -> list[tuple[int, int]]:
        if self.events is not None:
            return density((rec_ts(ev) for ev in self.events), t0, t1)
        return self.hist.density(t0, t1) if self.hist is not None else []


class _Feed:
    """One (epoch, rank) lane of a one-node report as it is fed: the node's lane, the lane's stage bars (settled
    into ``stages`` when there are ``due`` of them) and the node's holds."""

    __slots__ = ("due", "holds", "lane", "stages", "st")

    def __init__(self, node: int) -> None:
        self.lane, self.st, self.holds = _NodeLane(node), Stages(), Holds(node, Kept(NODE_BARS))
        self.stages, self.due = Kept(NODE_BARS), SETTLE_EVERY


class _NodeIndex:
    """One pass over a group's events for the panels of one ``node`` (every epoch, or ``epoch``), keeping what they
    draw and not the records: per (epoch, rank) the span of the lane, its stage bars as they settle (those with the
    node in them, at most :data:`NODE_BARS`: :class:`.report_bars.Kept`), the node's holds and records (one by one up
    to :data:`NODE_MARKS` in the epoch, then a :class:`.report_bars.Hist`), and the findings' evidence records. Its
    memory follows the run's structure (ranks, epochs, operations in flight), not the number of its records."""

    def __init__(self, events: Iterable[Event], findings: list, node: int, epoch: int | None) -> None:
        want = {(f.rank, s) for f in findings for s in f.evidence}
        self.node, self.count = node, 0
        self.ranks: set[int] = set()
        self.acks: set[int] = set()
        self.evidence: dict[tuple[int, int], Event] = {}
        self.activity: dict[tuple[int, int], list[int]] = {}
        self._ends: dict[tuple[int, int], list[int]] = {}   # (epoch, rank) -> [first ts, last ts]
        self._feeds: dict[tuple[int, int], _Feed] = {}
        total: dict[int, int] = {}                          # epoch -> the node's records
        for ev in events:
            self.count += 1
            r, e = ev.rank, ev.epoch
            t = rec_ts(ev)
            ends = self._ends.get((e, r))
            if ends is None:
                self._ends[(e, r)] = [t, t]
                self.ranks.add(r)
            else:
                ends[1] = t
            if ev.tag == "ack" or ev.tag == L3_ACK:
                self.acks.add(r)
            if want and (r, ev.seq) in want:
                self.evidence[(r, ev.seq)] = ev
            if epoch is not None and e != epoch:
                continue
            fd = self._feeds.get((e, r))
            if fd is None:
                fd = self._feeds[(e, r)] = _Feed(node)
            fd.st.add(ev)
            fd.holds.add(ev)
            if node in nodes_of(ev):
                a = self.activity.get((e, node))
                if a is None:
                    a = self.activity[(e, node)] = [0, 0]
                a[0] += 1
                if ev.tag not in _READS:
                    a[1] += 1
                n = total[e] = total.get(e, 0) + 1
                if n == NODE_MARKS + 1:   # too many to draw one by one: every lane of the epoch draws densities
                    for (le, _r), other in self._feeds.items():
                        if le == e:
                            other.lane.to_hist()
                fd.lane.note(ev, keep=n <= NODE_MARKS)
            if len(fd.st.out) >= fd.due:
                fd.st.settle(node, fd.stages)
                fd.due = max(SETTLE_EVERY, 2 * len(fd.st.out))   # (bars still open stay: settle less often)
        for fd in self._feeds.values():   # the end: every bar is as it will stay
            fd.st.settle(node, fd.stages)
            for b in fd.st.out:
                if node in b.nodes:
                    fd.stages.add(b)
            fd.st.out = []

    def span(self, epoch: int) -> tuple[int, int]:
        ts = [t for (e, _r), ends in self._ends.items() if e == epoch for t in ends]
        return (min(ts), max(ts)) if ts else (0, 1)

    def node_ranks(self, key: tuple[int, int]) -> list[int]:
        return sorted(r for (e, r), fd in self._feeds.items() if e == key[0] and fd.lane.records)

    def node_lanes(self, epoch: int, node: int) -> dict[int, _NodeLane]:
        out: dict[int, _NodeLane] = {}
        for (e, r), fd in self._feeds.items():
            if e != epoch or not fd.lane.records:
                continue
            hk: Kept = fd.holds.out
            stages = r in self.acks
            fd.lane.bars = (sorted(fd.stages.bars(), key=lambda b: b.start) if stages else []) + hk.bars()
            fd.lane.dropped = (fd.stages.dropped if stages else 0) + hk.dropped
            out[r] = fd.lane
        return out


def _without_userinfo(url: str | None) -> str | None:
    """The Jaeger base for the page's links without ``user:password@``: a page is shared, a credential is not (and
    the browser asks for it). A base that is not an http(s) URL is left as given (the links refuse it)."""
    if not url or "@" not in url:
        return url
    from . import links
    from .sources.httpio import split_userinfo

    try:
        return split_userinfo(links.normalize_base(url))[0]
    except ValueError:
        return url


class Builder:
    """Builds the :class:`Model` of one group of events (one run) and its findings."""

    def __init__(self, records: Records, run_id: str | None = None, jaeger_url: str | None = None,
                 full_limit: int = FULL_LIMIT, top: int = TOP_NODES) -> None:
        self.records, self.run_id, self.jaeger = records, run_id, _without_userinfo(jaeger_url)
        self.full_limit, self.top = full_limit, top

    # -- links ----------------------------------------------------------------------------------------------------
    def _trace(self, epoch: int, node: int | None) -> tuple[str | None, str | None]:
        if self.run_id is None or node is None or node < 0:
            return None, None
        from ..model.trace_ids import node_trace_id
        tid = node_trace_id(self.run_id, epoch, node).hex()
        if not self.jaeger:
            return tid, None
        from . import links
        return tid, links.trace_url(self.jaeger, tid)

    def _lane_link(self, rank: int, epoch: int, node: int | None) -> str | None:
        if not self.jaeger:
            return None
        from urllib.parse import quote

        from ..model import semconv as sc
        from . import links
        _tid, url = self._trace(epoch, node)
        if url is not None:   # the node's trace with this rank's spans found (highlighted) in it
            return f"{url}?uiFind={quote(f'{sc.CP_RANK}={rank}')}"
        tags: dict[str, Any] = {sc.CP_RANK: rank}
        if node is not None:
            tags[sc.NODE_ID] = node
        if self.run_id:
            tags[sc.RUN_ID] = self.run_id
        return links.search_url(self.jaeger, tags=tags, lookback="2d")

    # -- the model ------------------------------------------------------------------------------------------------
    def build(self, events: Iterable[Event], findings: list, title: str, node: int | None = None,
              epoch: int | None = None) -> Model:
        """The model of ``events`` and their ``findings`` (most severe first, as the analysis sorts them): the run,
        or with ``node`` that node (every epoch, or ``epoch``) and its findings only. ``events`` is read once; for
        a node, record by record (:class:`_NodeIndex`: what is held follows the run's structure, not its size)."""
        ix: _Index | _NodeIndex
        if node is not None:
            findings = [f for f in findings if f.node_id == node and (epoch is None or f.epoch == epoch)]
            shown = findings[:FINDINGS_SHOWN]
            ix = _NodeIndex(events, shown, node, epoch)
            summarised, count = False, ix.count
        else:
            events = events if isinstance(events, list) else list(events)
            summarised, count = len(events) > self.full_limit, len(events)
            shown = findings[:FINDINGS_DRAWN if summarised else FINDINGS_SHOWN]
            ix = _Index(events, shown)
        placed = [self._place(f, ix) for f in shown]
        notes: list[str] = []
        if len(shown) < len(findings):
            notes.append(f"{len(findings)} findings: the first {len(shown)} (most severe first) are listed and drawn; "
                         "cptrace-otel check --json lists them all")
        ranks = sorted(ix.ranks)
        nodes = self._node_rows(ix, findings)
        if node is not None:
            nodes = [r for r in nodes if r.node == node and (epoch is None or r.epoch == epoch)]
        panels: list[Panel] = []
        if isinstance(ix, _NodeIndex):
            for e in sorted(e for e, n in ix.activity if n == node):
                panels.append(self._node_panel(ix, placed, e, ix.node, ranks))
        else:
            panels += self._run_panels(ix, placed, findings, nodes, ranks, summarised, count, notes)
        if not (ix.acks >= ix.ranks):
            notes.append("no ack records on rank(s) " + ", ".join(map(str, sorted(ix.ranks - ix.acks)))
                         + " (trace level 1): no d2h/h2d stage bars there")
        trace_map: dict[str, tuple[int, int]] = {}
        if self.run_id is not None:
            keys = sorted(ix.activity, key=lambda k: -ix.activity[k][0])[:TRACE_MAP_MAX]
            for e, n in keys:
                tid, _ = self._trace(e, n)
                if tid:
                    trace_map[tid] = (e, n)
        codes: dict[str, int] = {}
        for f in findings:
            codes[f.code] = codes.get(f.code, 0) + 1
        return Model(title, self.run_id, ranks, count, summarised, panels, placed,
                     nodes[:TABLE_ROWS], trace_map, notes, codes)

    def _run_panels(self, ix: _Index, placed: list[PlacedFinding], findings: list, nodes: list[NodeRow],
                    ranks: list[int], summarised: bool, count: int, notes: list[str]) -> list[Panel]:
        """A run's panels: every epoch drawn whole, or summarised (densities, then the top nodes)."""
        panels: list[Panel] = []
        if not summarised:
            for e in sorted(ix.lanes):
                panels.append(self._epoch_panel(ix, placed, e, ranks, full=True))
            return panels
        fcount: dict[int, int] = {}
        for f in findings:
            fcount[f.epoch] = fcount.get(f.epoch, 0) + 1
        chosen = sorted(ix.lanes, key=lambda e: (-fcount.get(e, 0), -sum(map(len, ix.lanes[e].values())), e))
        chosen = sorted(chosen[:MAX_PANELS])
        if len(ix.lanes) > len(chosen):
            notes.append(f"{len(ix.lanes) - len(chosen)} of {len(ix.lanes)} epochs not drawn (those with the "
                         "fewest findings, then records)")
        for e in chosen:
            panels.append(self._epoch_panel(ix, placed, e, ranks, full=False))
        for row in nodes[:self.top]:
            p = self._node_panel(ix, placed, row.epoch, row.node, ranks)
            row.panel = p.pid
            panels.append(p)
        notes.append(f"{count} records: more than {self.full_limit}, so the run is summarised (densities "
                     f"per rank, every finding and its evidence, then the top {min(self.top, len(nodes))} nodes "
                     "by findings and activity); draw one node with --node N [--epoch E]")
        return panels

    def _place(self, f: Finding, ix: _Index | _NodeIndex) -> PlacedFinding:
        evs = [ix.evidence[(f.rank, s)] for s in f.evidence if (f.rank, s) in ix.evidence]
        last = ix.evidence.get((f.rank, f.evidence[-1])) if f.evidence else None
        tid, url = self._trace(f.epoch, f.node_id)
        return PlacedFinding(f, rec_ts(last) if last is not None else None, [self.records.add(e) for e in evs],
                             tid, url)

    def _node_rows(self, ix: _Index | _NodeIndex, findings: list) -> list[NodeRow]:
        codes: dict[tuple[int, int], list[str]] = {}
        for f in findings:
            if isinstance(f.node_id, int):
                codes.setdefault((f.epoch, f.node_id), []).append(f.code)
        keys = sorted(ix.activity, key=lambda k: (-len(codes.get(k, ())), -ix.activity[k][1], -ix.activity[k][0], k))
        rows = []
        for k in keys[:max(TABLE_ROWS, self.top)]:
            tid, url = self._trace(*k)
            rows.append(NodeRow(k[0], k[1], ix.node_ranks(k), ix.activity[k][0],
                                ix.activity[k][1],
                                sorted(set(codes.get(k, ()))), tid, url))
        return rows

    def _epoch_panel(self, ix: _Index, placed: list[PlacedFinding], epoch: int, ranks: list[int],
                     full: bool) -> Panel:
        t0, t1 = ix.span(epoch)
        fidx = [i for i, p in enumerate(placed) if p.finding.epoch == epoch]
        lanes = []
        for r in ranks:
            evs = ix.lanes[epoch].get(r, [])
            lane = Lane(r, records=len(evs), link=self._lane_link(r, epoch, None), no_acks=r not in ix.acks)
            if full:
                lane.marks = [self.records.add(ev) for ev in evs]
                lane.bars = [] if lane.no_acks else ix.bars(epoch, r)
            else:
                lane.density = density((rec_ts(ev) for ev in evs), t0, t1)
                lane.marks = sorted({m for i in fidx if placed[i].finding.rank == r for m in placed[i].evidence})
            lanes.append(lane)
        nrec = sum(len(x) for x in ix.lanes[epoch].values())
        return Panel(f"epoch-{epoch}", f"epoch {epoch}", epoch, None, t0, t1, lanes, fidx,
                     note=f"{nrec} records on {len(ix.lanes[epoch])} rank(s)")

    def _node_panel(self, ix: _Index | _NodeIndex, placed: list[PlacedFinding], epoch: int, node: int,
                    ranks: list[int]) -> Panel:
        fidx = [i for i, p in enumerate(placed) if p.finding.epoch == epoch and p.finding.node_id == node]
        lanes_of = ix.node_lanes(epoch, node)
        ts = [t for nl in lanes_of.values() for t in (nl.lo, nl.hi) if t is not None]
        ts += [t for nl in lanes_of.values() for b in nl.bars for t in (b.start, b.end) if t is not None]
        ts += [placed[i].ts for i in fidx if placed[i].ts is not None]  # type: ignore[misc]
        t0, t1 = (min(ts), max(ts)) if ts else ix.span(epoch)
        total = sum(nl.records for nl in lanes_of.values())
        lanes, dropped = [], 0
        for r in ranks:
            nl = lanes_of.get(r)
            lane = Lane(r, records=nl.records if nl else 0, link=self._lane_link(r, epoch, node),
                        no_acks=r not in ix.acks)
            ev_marks = {m for i in fidx if placed[i].finding.rank == r for m in placed[i].evidence}
            if nl is not None and nl.events is not None and total <= NODE_MARKS:
                lane.marks = sorted({self.records.add(ev) for ev in nl.events} | ev_marks)
            else:
                lane.density = nl.density(t0, t1) if nl is not None else []
                lane.marks = sorted(ev_marks)
            if nl is not None:
                lane.bars, dropped = nl.bars, dropped + nl.dropped
            lanes.append(lane)
        tid, url = self._trace(epoch, node)
        pid = f"trace-{tid}" if tid else f"node-e{epoch}-n{node}"
        note = f"{total} records on {len(lanes_of)} rank(s)"
        if dropped:
            note += (f"; {dropped} bars not drawn (past {NODE_BARS} in a lane: the first and the last "
                     f"{NODE_BARS // 2} are)")
        return Panel(pid, f"node {node}, epoch {epoch}", epoch, node, t0, t1, lanes, fidx, tid, url, note=note)
