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

A run with at most ``full_limit`` records is drawn whole. A larger one is summarised: its epochs (at most
:data:`MAX_PANELS`, those with findings first) as densities with every finding and its evidence, then the top nodes
(by findings, then by activity: records that change a node's state, not reads such as ``rid_map`` or ``compose``)
each in a panel of its own, and a table of the top nodes. Record times are the ``ts`` field (monotonic, one clock
for the ranks of a host) when the record has one, else the event time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..model.events import Event
from ..model.l3 import ACK as L3_ACK, BACKUP as L3_BACKUP, DIR_BACKUP, DIR_PREFETCH, PREFETCH as L3_PREFETCH

FULL_LIMIT = 5000        # a run with at most this many records is drawn whole
TOP_NODES = 12           # node panels in a summarised run
NODE_MARKS = 1500        # a node panel with more records than this draws densities
MAX_PANELS = 8           # epoch panels in a summarised run
BUCKETS = 240            # density buckets per lane
TABLE_ROWS = 40          # rows of the top-nodes table
TRACE_MAP_MAX = 20000    # nodes whose trace id the report can resolve (#trace=<hex>)
FINDINGS_SHOWN = 1000    # findings listed and drawn (most severe first) ...
FINDINGS_DRAWN = 300     # ... in a summarised run
_READS = frozenset(("rid_map", "compose", "store", "fwd_hash"))   # records that do not change a node


def rec_ts(ev: Event) -> int:
    """The time a record is drawn at: its ``ts`` field when it is an int, else the event's time."""
    t = ev.fields.get("ts")
    return t if type(t) is int else ev.ts


def nodes_of(ev: Event) -> set[int]:
    """Node ids a record is about: ``node_id``, ``new_id`` (split), the ``chain`` of a reload, ``pub`` of an ack."""
    f = ev.fields
    out = set()
    for k in ("node_id", "new_id"):
        v = f.get(k)
        if type(v) is int and v >= 0:
            out.add(v)
    for k in ("chain", "pub"):
        v = f.get(k)
        if isinstance(v, list):
            out.update(x for x in v if type(x) is int and x >= 0)
    return out


@dataclasses.dataclass
class Bar:
    kind: str                  # d2h, h2d, l3b, l3p, dev, host
    start: int                 # ts
    end: int | None            # ts of the closing record; None: open
    op: int | None = None
    nodes: set[int] = dataclasses.field(default_factory=set)
    seqs: list[int] = dataclasses.field(default_factory=list)


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


_L3_OPEN: dict[str, str] = {L3_BACKUP: "l3b", L3_PREFETCH: "l3p"}   # the record opening an L3 bar -> its kind
_L3_DIR: dict[Any, str] = {DIR_BACKUP: "l3b", DIR_PREFETCH: "l3p"}   # the dir of the l3_ack closing it


def stage_bars(events: Iterable[Event]) -> list[Bar]:
    """The d2h, h2d and L3 stage instances of one rank's records of one epoch, in start order.

    A d2h instance is one node's write: its ``prepare`` (op P), the ``backup`` of that node (op P, or the merged op
    M that carried it: SGLang's ``merge_ops`` gives a merged write a new id) and the ``ack dir=d2h`` of that node
    with op P or M. An h2d instance is one ``reload`` op: the ``ack dir=h2d`` records of the op (one per node)
    close it, the last one ending the bar. ``Bar.op`` is the prepare's (reload's) op. The L3 tier's
    (:mod:`cptrace_otel.model.l3`): ``l3b`` from an ``l3_backup`` to the ``l3_ack dir=backup`` of its op, ``l3p``
    from an ``l3_prefetch`` to the ``l3_ack dir=prefetch`` of its op."""
    d2h: dict[int, Bar] = {}                 # node -> its open write
    d2h_ops: dict[int, set] = {}             # node -> the ops its open write is known by
    h2d: dict[Any, Bar] = {}                 # op -> its reload
    l3: dict[tuple, Bar] = {}                # (kind, op) -> its open L3 transfer
    out: list[Bar] = []
    for ev in events:
        tag, f = ev.tag, ev.fields
        if tag in _L3_OPEN or tag == L3_ACK:
            kind = _L3_OPEN.get(tag) or _L3_DIR.get(f.get("dir"))
            op = f.get("op")
            if kind is None:
                continue
            if tag != L3_ACK:
                lb = l3[(kind, op)] = Bar(kind, rec_ts(ev), None, op if type(op) is int else None, nodes_of(ev),
                                          [ev.seq])
                out.append(lb)
            else:
                ob = l3.pop((kind, op), None)
                if ob is not None:
                    ob.seqs.append(ev.seq)
                    ob.end = rec_ts(ev)
            continue
        if tag == "prepare" or tag == "backup":
            n, op = f.get("node_id"), f.get("op")
            b = d2h.get(n)  # type: ignore[arg-type]
            if b is None or tag == "prepare":
                b = d2h[n] = Bar("d2h", rec_ts(ev), None, op if type(op) is int else None)  # type: ignore[index]
                d2h_ops[n] = set()  # type: ignore[index]
                out.append(b)
            d2h_ops[n].add(op)  # type: ignore[index]
            b.nodes |= nodes_of(ev)
            b.seqs.append(ev.seq)
        elif tag == "reload":
            op = f.get("op")
            b = h2d[op] = Bar("h2d", rec_ts(ev), None, op if type(op) is int else None, nodes_of(ev), [ev.seq])
            out.append(b)
        elif tag == "ack":
            op, n = f.get("op"), f.get("node_id")
            if f.get("dir") == "d2h":
                b = d2h.get(n)  # type: ignore[arg-type]
                if b is None or op not in d2h_ops[n]:  # type: ignore[index]
                    continue
                del d2h[n]  # type: ignore[arg-type]
            elif f.get("dir") == "h2d":
                b = h2d.get(op)
                if b is None:
                    continue
            else:
                continue
            b.nodes |= nodes_of(ev)
            b.seqs.append(ev.seq)
            b.end = rec_ts(ev)
    return out


def holds(events: Iterable[Event], node: int) -> list[Bar]:
    """The device and host holds of ``node`` in one rank's records of one epoch (see the module docstring)."""
    cur: dict[str, Bar | None] = {"dev": None, "host": None}
    out: list[Bar] = []

    def start(kind: str, ev: Event) -> None:
        if cur[kind] is None:
            b = cur[kind] = Bar(kind, rec_ts(ev), None, None, {node})
            out.append(b)
        cur[kind].seqs.append(ev.seq)   # type: ignore[union-attr]

    def end(kind: str, ev: Event) -> None:
        b = cur[kind]
        if b is not None:
            b.end = rec_ts(ev)
            b.seqs.append(ev.seq)
            cur[kind] = None

    for ev in events:
        tag, f = ev.tag, ev.fields
        nid = f.get("node_id")
        in_chain = tag == "reload" and isinstance(f.get("chain"), list) and node in f["chain"]
        if (tag == "insert" and nid == node) or in_chain:
            start("dev", ev)
        elif tag == "split" and f.get("new_id") == node:
            start("dev", ev)
            if not isinstance(f.get("host_p"), str):   # "(none)": the prefix was not backed up
                start("host", ev)
        elif tag == "prepare" and nid == node:
            start("host", ev)
        elif tag == "evict" and nid == node:
            end("dev" if f.get("tier") == "dev" else "host", ev)
    return out


def _density(events: list[Event], t0: int, t1: int) -> list[tuple[int, int]]:
    width = max(1, t1 - t0)
    counts: dict[int, int] = {}
    for ev in events:
        b = min(BUCKETS - 1, max(0, (rec_ts(ev) - t0) * BUCKETS // width))
        counts[b] = counts.get(b, 0) + 1
    return sorted(counts.items())


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
        from ..model.spans import node_trace_id
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
    def build(self, events: list[Event], findings: list, title: str, node: int | None = None,
              epoch: int | None = None) -> Model:
        """The model of ``events`` and their ``findings`` (most severe first, as the analysis sorts them): the run,
        or with ``node`` that node (every epoch, or ``epoch``) and its findings only."""
        if node is not None:
            findings = [f for f in findings if f.node_id == node and (epoch is None or f.epoch == epoch)]
        summarised = node is None and len(events) > self.full_limit
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
        if node is not None:
            epochs = [e for e in sorted(ix.lanes) if (e, node) in ix.activity and (epoch is None or e == epoch)]
            for e in epochs:
                panels.append(self._node_panel(ix, placed, e, node, ranks))
        elif not summarised:
            for e in sorted(ix.lanes):
                panels.append(self._epoch_panel(ix, placed, e, ranks, full=True))
        else:
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
            notes.append(f"{len(events)} records: more than {self.full_limit}, so the run is summarised (densities "
                         f"per rank, every finding and its evidence, then the top {min(self.top, len(nodes))} nodes "
                         "by findings and activity); draw one node with --node N [--epoch E]")
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
        return Model(title, self.run_id, ranks, len(events), summarised, panels, placed,
                     nodes[:TABLE_ROWS], trace_map, notes, codes)

    def _place(self, f: Any, ix: _Index) -> PlacedFinding:
        evs = [ix.evidence[(f.rank, s)] for s in f.evidence if (f.rank, s) in ix.evidence]
        last = ix.evidence.get((f.rank, f.evidence[-1])) if f.evidence else None
        tid, url = self._trace(f.epoch, f.node_id)
        return PlacedFinding(f, rec_ts(last) if last is not None else None, [self.records.add(e) for e in evs],
                             tid, url)

    def _node_rows(self, ix: _Index, findings: list) -> list[NodeRow]:
        codes: dict[tuple[int, int], list[str]] = {}
        for f in findings:
            if isinstance(f.node_id, int):
                codes.setdefault((f.epoch, f.node_id), []).append(f.code)
        keys = sorted(ix.activity, key=lambda k: (-len(codes.get(k, ())), -ix.activity[k][1], -ix.activity[k][0], k))
        rows = []
        for k in keys[:max(TABLE_ROWS, self.top)]:
            tid, url = self._trace(*k)
            rows.append(NodeRow(k[0], k[1], sorted({ev.rank for ev in ix.node_events[k]}), ix.activity[k][0],
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
                lane.density = _density(evs, t0, t1)
                lane.marks = sorted({m for i in fidx if placed[i].finding.rank == r for m in placed[i].evidence})
            lanes.append(lane)
        nrec = sum(len(x) for x in ix.lanes[epoch].values())
        return Panel(f"epoch-{epoch}", f"epoch {epoch}", epoch, None, t0, t1, lanes, fidx,
                     note=f"{nrec} records on {len(ix.lanes[epoch])} rank(s)")

    def _node_panel(self, ix: _Index, placed: list[PlacedFinding], epoch: int, node: int,
                    ranks: list[int]) -> Panel:
        fidx = [i for i, p in enumerate(placed) if p.finding.epoch == epoch and p.finding.node_id == node]
        per_rank: dict[int, list[Event]] = {r: [] for r in ranks}
        for ev in ix.node_events.get((epoch, node), ()):
            per_rank[ev.rank].append(ev)
        bars = {r: ([] if r not in ix.acks else [b for b in ix.bars(epoch, r) if node in b.nodes])
                + holds(per_rank[r], node) for r in ranks}
        ts = [rec_ts(ev) for lst in per_rank.values() for ev in lst]
        ts += [t for lst in bars.values() for b in lst for t in (b.start, b.end) if t is not None]
        ts += [placed[i].ts for i in fidx if placed[i].ts is not None]  # type: ignore[misc]
        t0, t1 = (min(ts), max(ts)) if ts else ix.span(epoch)
        total = sum(map(len, per_rank.values()))
        lanes = []
        for r in ranks:
            lane = Lane(r, records=len(per_rank[r]), link=self._lane_link(r, epoch, node), no_acks=r not in ix.acks)
            ev_marks = {m for i in fidx if placed[i].finding.rank == r for m in placed[i].evidence}
            if total <= NODE_MARKS:
                lane.marks = sorted({self.records.add(ev) for ev in per_rank[r]} | ev_marks)
            else:
                lane.density = _density(per_rank[r], t0, t1)
                lane.marks = sorted(ev_marks)
            lane.bars = bars[r]
            lanes.append(lane)
        tid, url = self._trace(epoch, node)
        pid = f"trace-{tid}" if tid else f"node-e{epoch}-n{node}"
        return Panel(pid, f"node {node}, epoch {epoch}", epoch, node, t0, t1, lanes, fidx, tid, url,
                     note=f"{total} records on {sum(1 for v in per_rank.values() if v)} rank(s)")
