"""Events -> OTLP-shaped spans: trace model v2 of docs/ARCHITECTURE.md, shared by the live exporter and ``ingest``.

Contract:

* Every :class:`~cptrace_otel.model.events.Event` fed to :meth:`SpanBuilder.add` becomes exactly one span event
  (name = tag, timestamp = ``ev.ts``, attributes = typed fields + ``cptrace.seq`` / ``cptrace.epoch`` /
  ``cptrace.record.level``).
* Trace ids are deterministic (:mod:`cptrace_otel.model.trace_ids`), so every rank process of a run puts a node's
  records into the same trace without any context propagation: node trace ``blake2b(f"{run_id}|{epoch}|{node_id}")``,
  rank trace ``blake2b(f"{run_id}|rank|{rank}")``, request trace ``blake2b(f"{run_id}|rid|{rid}")`` (16 bytes; 0
  maps to 1).
* Lanes: in a node trace each rank's spans hang under that rank's **lane** span (``rank 3 · node``, kind
  ``hicache.node``), which also holds the node's structural records (insert, evict, split, free, rid_map, ...). The
  first lane segment of (run, epoch, node, rank) is a root with the span id :func:`.trace_ids.lane_span_id` (any
  process can name it, e.g. the watcher writing cross-rank findings); a later segment of the same lane (the lane is
  cut like any span, below) hashes the seq of its first record in and is a child of the first segment, which this
  process has already sent. No span has a parent that another process must send, and the UI shows one top-level
  row per rank.
* Stage spans are children of the lane: ``rank 3 · d2h`` (``prepare`` .. ``ack dir=d2h``, holds ``backup``),
  ``rank 3 · h2d`` (``reload`` .. ``ack dir=h2d``), and the L3 tier's (:mod:`cptrace_otel.model.l3`)
  ``rank 3 · l3-backup`` (``l3_backup`` .. ``l3_ack dir=backup``) and ``rank 3 · l3-prefetch`` (``l3_prefetch`` ..
  ``l3_ack dir=prefetch``, in the trace of the node the fetched pages extend). An ``l3_hit`` goes to its node's
  lane, linked (``cptrace.link.kind=l3-prefetch``) to the prefetch span that fetched the pages. A stage span ends
  at its closing record (``closed_by=tag``).
* Sending: a lane segment is sent once, together with all its children, when it closes: once it has been open
  ``span_timeout_s`` (``timeout``), at :meth:`close_all` (``flush``), at a ``reset`` of its rank (``reset``) or when it
  grows past :data:`MAX_EVENTS` events / :data:`MAX_SPAN_BYTES` (``limit``). Children still open then are closed with
  the same reason and the lane's end covers them. So a child never names an unsent parent, nothing stays open past
  the timeout, and a crash loses at most that window.
* Continuations: a stage record whose stage span was cut (timeout/limit/flush, not its own closing record) opens a
  continuation stage span on the same rank (same kind, ``cptrace.span.continues=true``, an OTLP link to the cut span),
  in the current lane segment (a new one if the old is gone). So every record of a stage instance (prepare to its
  d2h ack, reload to its h2d ack) is in that stage's span or a continuation of it, never in the lane's own events.
* ``rid_map`` records put ``hicache.rid`` on the lane and link the request trace's span to it.
* A record carrying SGLang's request span (field ``req_span``, :mod:`cptrace_otel.model.reqlink`) links the span
  holding it to that span (``cptrace.link.kind=request``, once per request span, at most ``reqlink.MAX_LINKS``).
* SGLang's ``kv_canary`` records (:mod:`cptrace_otel.model.canary`) name a slot, not a node: with online checks on, the
  rank's checker decides the node whose device slots held it (rule ``CANARY``) before the record is placed, and
  the record and its finding go to that node's lane; a violation no node owns stays on the rank span.
* A ``free`` without a node (SGLang frees some slots by index) breaking an in-flight copy (H2c, H4a/H4b) goes to the
  lane of the copy's node (checked first: ``free_owner``), fields unchanged; else (or checks off) to the rank span.
* Online checks: with a ``checker_factory`` (``rank -> RankChecker``), each event is fed to the rank's checker and the
  findings it returns are stamped on the span that holds the event (:func:`violation_attributes`, status ERROR with
  every finding's message, one ``hicache.violation`` event per finding naming its evidence records, and one OTLP link
  per evidence span). A checker that raises is switched off (once, with a warning): tracing must not die because a
  rule did. The checks run over batches of records, with the same result as one record at a time
  (:mod:`cptrace_otel.model.span_checks`).

Time is whatever ``ev.ts`` says (wall-clock ns for live records); :meth:`expire` takes "now" explicitly so replays
and tests are deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import semconv as sc
from .attrs import EventAttrs, approx_bytes
from .canary import TAG as CANARY_TAG
from .events import Event
from .l3 import ACK as L3_ACK, BACKUP as L3_BACKUP, DIR_BACKUP, DIR_PREFETCH, HIT as L3_HIT, PREFETCH as L3_PREFETCH
from .logline import render_value
from .reqlink import FIELD as REQ_SPAN, link_request
from .span_checks import CHECK_BATCH, MAX_SEQ_REFS, SpanChecks
from .trace_ids import hashed_id, lane_span_id, node_trace_id, rank_trace_id, request_trace_id

# violation_attributes: the one helper making the per-code violation keys (the watcher imports it from here)
from .violations import STATUS_ERROR, stamp_findings, violation_attributes  # noqa: F401

# A span closes when it holds this many events or this many (approximate) bytes of attribute data: keeps a hot node's
# span small enough for the UI and far below the 3.5 MiB request split.
MAX_EVENTS = 1000
MAX_SPAN_BYTES = 1 << 20
# A lane segment closes once it has this many children (a node copied back and forth very often).
MAX_CHILDREN = 200
# Bounded memories (with span_checks.MAX_SEQ_REFS, the records whose span can still be named as evidence): stage
# instances cut (for continuations), lanes that already had their first segment.
MAX_CUT = 1 << 16
MAX_LANES_SEEN = 1 << 18
# What one builder holds at once, however dense the records are in time (a replay of records 1 ns apart never
# reaches the timeout): spans open, and records in open spans (with the closed children parked in their open lanes).
# Past either bound the oldest open spans are closed (``closed_by=bound``) until both are under 3/4 of it.
MAX_OPEN = 20_000
MAX_HELD = 100_000

STATUS_UNSET, STATUS_OK = 0, 1
# The stages: the record opening one -> (the stage's key word, its span kind); (tag, dir) of the record closing it
_OPEN_STAGE = {"prepare": ("d2h", sc.SPAN_D2H), "reload": ("h2d", sc.SPAN_H2D),
               L3_BACKUP: (L3_BACKUP, sc.SPAN_L3_BACKUP), L3_PREFETCH: (L3_PREFETCH, sc.SPAN_L3_PREFETCH)}
_ACK_STAGE: dict[tuple[str, Any], tuple[str, str]] = {
    ("ack", "d2h"): _OPEN_STAGE["prepare"], ("ack", "h2d"): _OPEN_STAGE["reload"],
    (L3_ACK, DIR_BACKUP): _OPEN_STAGE[L3_BACKUP], (L3_ACK, DIR_PREFETCH): _OPEN_STAGE[L3_PREFETCH]}

# What add does with a record, by tag (one dict lookup instead of a chain of tag comparisons per record).
_R_PLAIN, _R_FREE, _R_OPEN, _R_BACKUP, _R_ACK, _R_RID_MAP, _R_L3_HIT, _R_FWD_HASH, _R_CANARY, _R_RESET = range(10)
_ROLE: dict[str, int] = {**{t: _R_OPEN for t in _OPEN_STAGE}, "backup": _R_BACKUP, "ack": _R_ACK, L3_ACK: _R_ACK,
                         "rid_map": _R_RID_MAP, L3_HIT: _R_L3_HIT, "fwd_hash": _R_FWD_HASH, CANARY_TAG: _R_CANARY,
                         "reset": _R_RESET, "free": _R_FREE}

_NONE: Any = ()   # findings / children / open children of a builder's span until it has some (lanes: in _lane)


class Span:
    """One finished (or open) span, in the shape the OTLP encoders need. ``parent`` is the parent span id (b"" for
    a root); ``kind`` the semconv SPAN_* kind; ``lane`` the open lane span a stage span hangs under (None when
    closed / for roots); ``children`` a lane's closed children, sent with it."""

    __slots__ = ("trace_id", "span_id", "name", "start", "end", "attrs", "events", "links", "status_code",
                 "status_message", "rank", "key", "nbytes", "findings", "parent", "kind", "lane", "children",
                 "open_kids", "nrec")

    def __init__(self, trace_id: bytes, span_id: bytes, name: str, start: int, rank: int, key: tuple[object, ...],
                 attrs: dict[str, Any], parent: bytes = b"", kind: str = "", findings: Any = None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.name = name
        self.start = start
        self.end = start
        self.attrs = attrs
        self.events: list[tuple[int, str, EventAttrs | dict[str, Any]]] = []   # (time_ns, name = tag, attributes)
        self.links: list[tuple[bytes, bytes, dict[str, Any]]] = []   # (trace_id, span_id, attributes)
        self.status_code = STATUS_UNSET
        self.status_message = ""
        self.rank = rank
        self.key = key
        self.nbytes = 0
        self.findings: list[Any] = [] if findings is None else findings   # (the builder's: _NONE until one)
        self.parent = parent
        self.kind = kind or name
        self.lane: Span | None = None
        self.children: list[Span] = _NONE
        self.open_kids: list[Span] = _NONE
        self.nrec = 0   # records it held when it closed (its violation events not counted)

    def __repr__(self) -> str:  # for test failures
        return f"Span({self.name} trace={self.trace_id.hex()} events={len(self.events)} attrs={self.attrs})"


class SpanBuilder(SpanChecks):
    """Maps one rank process's events to spans. Not thread-safe: one builder per exporter loop.

    ``instance`` makes span ids unique per traced process (two processes may run with the same rank). Finished spans
    accumulate until :meth:`take`. ``sizer`` is :func:`~cptrace_otel.model.attrs.approx_bytes` or a function giving
    the same number (the exporter passes its C version).
    """

    def __init__(self, run_id: str, instance: str = "", span_timeout_s: float = 1.0,
                 checker_factory: Callable[[int], Any] | None = None, track_traces: bool = True,
                 sizer: Callable[[dict[str, Any]], int] = approx_bytes) -> None:
        self.run_id = run_id
        self._sizer = sizer
        self.instance = instance
        self.timeout_ns = int(span_timeout_s * 1e9)
        self._checker_factory = checker_factory
        self._checkers: dict[int, Any] = {}
        self._feeds: dict[int, Callable[[Event], Any]] = {}   # rank -> its checker's feed method
        self._open: dict[Any, Span] = {}          # insertion order = open order (oldest first)
        self._done: list[Span] = []
        self._trace_cache: dict[tuple[int, int], bytes] = {}
        self._names: dict[tuple[int, str], str] = {}
        # seq -> (trace id, span id, tag, op) of recent records: a finding links to the spans of its evidence
        self._seq_refs: dict[int, tuple[bytes, bytes, str, Any]] = {}
        # records placed whose checks have not run yet, (record, its span), in order; (None, span) for a span closed
        # after them, stamped with its findings in that order (flush_checks)
        self._pending: list[tuple[Event | None, Span]] = []
        # stage key -> the stage span cut before its closing record (a later record of it opens a continuation)
        self._cut: dict[Any, Span] = {}
        self._lanes_seen: set[tuple[int, int, int]] = set()
        self._l3p_refs: dict[tuple, tuple[bytes, bytes]] = {}   # (rank, op) -> span of that L3 prefetch
        self._sent_recs = 0   # records in the spans sent (the events property: these + the ones held)
        self.spans = 0
        self.findings = 0
        # distinct trace ids, for summaries (ingest); a long-running exporter turns it off to stay bounded
        self.traces: set[bytes] = set()
        self._track = track_traces
        self._max_ts = 0
        # No span times out before a record this late: the head's start + timeout when spans open in time order (a
        # later head started no earlier), so add skips looking at the head until then; 0 when unknown / unordered.
        self._expire_at = 0
        self._opened = 0
        self._last_open_ts = 0
        self._unordered = False
        self._held = 0   # records in open spans and in the closed children parked in open lanes (MAX_HELD)
        self.on_config: Callable[[Event], None] | None = None   # called with each config record (the exporter)

    # -- span bookkeeping ----------------------------------------------------------------------------------------
    def _node_trace(self, epoch: int, node: int) -> bytes:
        k = (epoch, node)
        t = self._trace_cache.get(k)
        if t is None:
            if len(self._trace_cache) > 200_000:
                self._trace_cache.clear()
            t = self._trace_cache[k] = node_trace_id(self.run_id, epoch, node)
        return t

    def _name(self, rank: int, kind: str) -> str:
        k = (rank, kind)
        n = self._names.get(k)
        if n is None:
            if len(self._names) > 10_000:
                self._names.clear()
            n = self._names[k] = sc.span_name(rank, kind)
        return n

    def _open_span(self, key: tuple[object, ...], trace_id: bytes, kind: str, ev: Event, akey: str | None = None,
                   aval: object = None, span_id: bytes | None = None, lane: Span | None = None) -> Span:
        """A new open span; attributes rank, ``akey`` = ``aval`` (node id or rid, when given) and kind."""
        rank, ts = ev.rank, ev.ts
        n = self._opened = self._opened + 1  # part of the id: unique even for spans opened without a record
        if span_id is None:
            span_id = hashed_id(f"{self.instance}|{rank}|{ev.epoch}|{ev.seq}|{kind}|{key[-1]}|{n}", 8)
        attrs: dict[str, Any] = ({sc.RANK: rank, sc.SPAN_KIND: kind} if akey is None else
                                 {sc.RANK: rank, akey: aval, sc.SPAN_KIND: kind})
        name = self._names.get((rank, kind)) or self._name(rank, kind)
        if lane is None:
            sp = Span(trace_id, span_id, name, ts, rank, key, attrs, b"", kind, _NONE)
        else:
            sp = Span(trace_id, span_id, name, ts, rank, key, attrs, lane.span_id, kind, _NONE)
            sp.lane = lane
            lane.open_kids.append(sp)
        if ts < self._last_open_ts:
            self._unordered = True
            self._expire_at = 0
        else:
            self._last_open_ts = ts
        self._open[key] = sp
        return sp

    def _lane(self, rank: int, epoch: int, node: int, ev: Event) -> Span:
        """The open lane segment of (rank, epoch, node), opened if there is none."""
        key = (rank, epoch, node, "node")
        sp = self._open.get(key)
        if sp is None:
            lk = (epoch, node, rank)
            first = lane_span_id(self.run_id, epoch, node, rank)
            if lk in self._lanes_seen:
                # a later segment: nested under the first (already sent), so the rank keeps one top-level row
                sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_NODE, ev, sc.NODE_ID, node,
                                     lane_span_id(self.run_id, epoch, node, rank, ev.seq))
                sp.parent = first
            else:
                if len(self._lanes_seen) >= MAX_LANES_SEEN:
                    self._lanes_seen.clear()
                self._lanes_seen.add(lk)
                sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_NODE, ev, sc.NODE_ID, node, first)
            sp.children, sp.open_kids = [], []
        return sp

    def _stage(self, key: tuple[object, ...], kind: str, ev: Event, node: int, cont: bool = True) -> Span:
        """A new stage span for ``key`` under the current lane (a continuation when the key was cut and ``cont``)."""
        rank, epoch = ev.rank, ev.epoch
        lane = self._open.get((rank, epoch, node, "node")) or self._lane(rank, epoch, node, ev)
        sp = self._open_span(key, lane.trace_id, kind, ev, sc.NODE_ID, node, None, lane)
        prev = self._cut.pop(key, None)
        if prev is not None and cont:
            sp.attrs[sc.CONTINUES] = True
            sp.links.append((prev.trace_id, prev.span_id, {sc.LINK_KIND: "continues"}))
        return sp

    def _close(self, sp: Span, why: str) -> None:
        """Close ``sp``: a stage span is parked in its lane (sent with it); a lane closes its open children with the
        same reason, then goes out followed by all of them; other spans go out alone."""
        if self._open.get(sp.key) is sp:
            del self._open[sp.key]
        sp.attrs[sc.STAGE_CLOSED] = why
        sp.nrec = len(sp.events)   # (before the violation events are added)
        if self._pending:   # records it may hold are not checked yet: stamped after them, in flush_checks
            self._pending.append((None, sp))
        elif sp.findings:   # violation attributes, status ERROR, violation events, links to the evidence spans
            stamp_findings(sp, self._seq_refs)
        if sp.end < sp.start:
            sp.end = sp.start
        lane = sp.lane
        if lane is not None:
            sp.lane = None
            try:
                lane.open_kids.remove(sp)
            except ValueError:
                pass
            if why != "tag":
                if len(self._cut) >= MAX_CUT:
                    del self._cut[next(iter(self._cut))]
                self._cut[sp.key] = sp
            lane.children.append(sp)
            if sp.end > lane.end:
                lane.end = sp.end
            return
        kids = sp.open_kids
        while kids:
            self._close(kids[-1], why)
        self.spans += 1
        if self._track:
            self.traces.add(sp.trace_id)
        self._done.append(sp)
        n = sp.nrec
        children = sp.children
        if children:
            for c in children:
                n += c.nrec
            self.spans += len(children)
            self._done.extend(children)
            sp.children = _NONE
        self._held -= n
        self._sent_recs += n

    # -- public --------------------------------------------------------------------------------------------------
    def add(self, ev: Event) -> Span:
        """Record ``ev`` as one span event; returns the span that holds it."""
        ts = ev.ts
        opened = self._open
        if ts > self._max_ts:
            self._max_ts = ts
            if ts >= self._expire_at and opened:
                head = next(iter(opened.values()))
                if ts - head.start >= self.timeout_ns:
                    self.expire(ts)
                elif not self._unordered:
                    self._expire_at = head.start + self.timeout_ns
        tag = ev.tag
        f = ev.fields
        rank = ev.rank
        epoch = ev.epoch
        node = f.get("node_id")
        role = _ROLE.get(tag, _R_PLAIN)
        link_rid = found = None
        closing = fed = False
        sp: Span | None
        key: tuple[Any, ...]
        if role <= _R_FREE and type(node) is int and node >= 0:
            # the most common record: a structural one (a free naming its node among them), on its node's lane
            sp = opened.get((rank, epoch, node, "node")) or self._lane(rank, epoch, node, ev)
        elif role < _R_FWD_HASH and type(node) is int and node >= 0:   # a stage's record, rid_map, l3_hit
            if role == _R_ACK:
                sp = None
                stage = _ACK_STAGE.get((tag, f.get("dir")))   # the stage this ack closes: (key word, kind)
                if stage is not None:
                    key = (rank, epoch, node, stage[0], f.get("op"))
                    sp = opened.get(key)
                    if sp is None and key in self._cut:
                        sp = self._stage(key, stage[1], ev, node)
                    closing = sp is not None
                if sp is None:
                    sp = self._lane(rank, epoch, node, ev)
            elif role == _R_OPEN:   # prepare, reload, l3_backup, l3_prefetch: a new stage instance
                opening = _OPEN_STAGE[tag]
                op = f.get("op")
                key = (rank, epoch, node, opening[0], op)
                old = opened.get(key)
                if old is not None:
                    self._close(old, "tag")
                sp = self._stage(key, opening[1], ev, node, False)   # (a cut span of the key is forgotten)
                if tag == L3_PREFETCH:
                    self._remember_prefetch(rank, op, sp)
            elif role == _R_BACKUP:
                key = (rank, epoch, node, "d2h", f.get("op"))
                # (the open span is looked up first: a new one only when its prepare's span is gone)
                sp = opened.get(key)
                if sp is None:
                    sp = self._stage(key, sc.SPAN_D2H, ev, node)
            else:
                sp = self._lane(rank, epoch, node, ev)
                if role == _R_RID_MAP and "rid" in f:
                    link_rid = render_value(f["rid"])
                    sp.attrs[sc.RID] = link_rid
                elif role == _R_L3_HIT:
                    self._link_prefetch(rank, f.get("op"), sp)
        else:
            if role == _R_CANARY and self._checks_on():
                # SGLang's kv-canary record names a slot, not a node: the checker decides whose slot it was (rule
                # CANARY), so it runs before the record is placed, and the record goes to that node's lane with its
                # finding
                found, fed = self._feed_now(ev), True
                owner = next((x.node_id for x in found or () if type(getattr(x, "node_id", None)) is int), None)
                if owner is not None:
                    node = owner
            elif role == _R_RESET:
                # A reset ends every open span of this rank: node ids restart, so nothing may join them any more.
                for sp in [s for s in opened.values() if s.rank == rank and s.lane is None]:
                    self._close(sp, "reset")
            elif role == _R_FREE and self._checks_on():   # (without a node)
                # (in the copy's node trace a checker of that trace alone, a serve replica, sees the breach)
                found, fed = self._feed_now(ev), True
                owner = getattr(self._checkers.get(rank), "free_owner", None)
                node = owner if type(owner) is int and owner >= 0 else node
            if role == _R_FWD_HASH:
                rid = render_value(f.get("rid", "?"))
                key = (rank, "req", rid)
                sp = opened.get(key)
                if sp is None:
                    sp = self._open_span(key, request_trace_id(self.run_id, rid), sc.SPAN_REQUEST, ev, sc.RID, rid)
            elif type(node) is int and node >= 0:   # a canary, reset or free the checker gave a node, on its lane
                sp = opened.get((rank, epoch, node, "node")) or self._lane(rank, epoch, node, ev)
            else:   # on the rank span (a record of a stage role without a node among them)
                key = (rank, "rank")
                sp = opened.get(key)
                if sp is None:
                    sp = self._open_span(key, rank_trace_id(self.run_id, rank), sc.SPAN_RANK, ev)
                if tag == "config" and self.on_config is not None:
                    self.on_config(ev)

        evs = sp.events
        evs.append((ts, tag, EventAttrs(f, ev.seq, epoch, ev.level)))
        nbytes = sp.nbytes = sp.nbytes + self._sizer(f)
        if REQ_SPAN in f:   # the span of SGLang's request that used the node (rid_map): an OTLP link to it
            link_request(sp, f[REQ_SPAN], f.get("rid"))
        if ts > sp.end:
            sp.end = ts

        if link_rid is not None:
            rkey = (rank, "req", link_rid)
            rsp = self._open.get(rkey)
            if rsp is None:
                rsp = self._open_span(rkey, request_trace_id(self.run_id, link_rid), sc.SPAN_REQUEST, ev, sc.RID,
                                      link_rid)
            link_attrs: dict[str, Any] = {sc.RANK: rank, sc.NODE_ID: node}
            if "hit" in f:
                link_attrs[sc.field_key("hit")] = render_value(f["hit"])
            rsp.links.append((sp.trace_id, sp.span_id, link_attrs))
            if ts > rsp.end:
                rsp.end = ts

        if fed:   # checked before it was placed (the pending records were checked before it)
            self._seq_refs[ev.seq] = (sp.trace_id, sp.span_id, tag, f.get("op"))
            if found:
                self._found(sp, found)
        elif self._checker_factory is not None:
            pend = self._pending
            pend.append((ev, sp))
            if len(pend) >= CHECK_BATCH:
                self.flush_checks()

        if closing:
            self._close(sp, "tag")
        elif len(evs) >= MAX_EVENTS or nbytes >= MAX_SPAN_BYTES:
            self._close(sp, "limit")
        else:
            lane = sp.lane
            if lane is not None and len(lane.children) >= MAX_CHILDREN:
                self._close(lane, "limit")
        held = self._held = self._held + 1
        if held > MAX_HELD or len(opened) > MAX_OPEN:
            self._shed()
        return sp

    def _shed(self) -> None:
        """Close the oldest open spans (a stage span's lane with it, as at a timeout) until the open spans and the
        records they hold are both under 3/4 of :data:`MAX_OPEN` / :data:`MAX_HELD`: what a replay holds is bounded
        by these, not by the span timeout alone. A node's later records then open a new lane segment (and stage
        continuations), as after a timeout."""
        opened = self._open
        low_open, low_held = MAX_OPEN * 3 // 4, MAX_HELD * 3 // 4
        # oldest first, from one copy (taking a dict's first item after each delete walks the deleted ones)
        for sp in list(opened.values()):
            if len(opened) <= low_open and self._held <= low_held:
                break
            if opened.get(sp.key) is sp:   # not closed with its lane already
                self._close(sp.lane if sp.lane is not None else sp, "bound")

    def _remember_prefetch(self, rank: int, op: object, sp: Span) -> None:
        """The span of rank's L3 prefetch ``op``, for the link from the ``l3_hit`` that later uses its pages."""
        refs = self._l3p_refs
        if len(refs) >= MAX_SEQ_REFS:
            del refs[next(iter(refs))]
        refs[(rank, op)] = (sp.trace_id, sp.span_id)

    def _link_prefetch(self, rank: int, op: object, lane: Span) -> None:
        """Link ``lane`` (an ``l3_hit``'s node) to the span of the prefetch that fetched the pages (once per lane)."""
        ref = self._l3p_refs.get((rank, op))
        if ref is None or (ref[0] == lane.trace_id and ref[1] == lane.span_id):
            return
        if not any(lk[0] == ref[0] and lk[1] == ref[1] for lk in lane.links):
            lane.links.append((ref[0], ref[1], {sc.LINK_KIND: "l3-prefetch", sc.OP: op}))

    def expire(self, now_ns: int) -> None:
        """Close every span (lane, rank or request span, with a lane's children) open ``span_timeout_s`` at
        ``now_ns``."""
        self.flush_checks()
        limit = now_ns - self.timeout_ns
        while self._open:
            sp = next(iter(self._open.values()))
            if sp.start > limit:
                if self._unordered:
                    # Spans were opened out of time order (a replay merging clocks): scan them all.
                    for s in [s for s in self._open.values() if s.start <= limit and s.lane is None]:
                        if self._open.get(s.key) is s:
                            self._close(s, "timeout")
                return
            self._close(sp.lane if sp.lane is not None else sp, "timeout")

    def close_all(self, why: str = "flush") -> None:
        """Close every open span (flush)."""
        self.flush_checks()
        for sp in list(self._open.values()):
            if sp.lane is None and self._open.get(sp.key) is sp:
                self._close(sp, why)

    def finish(self) -> None:
        """End of stream: the findings only the end reveals (:meth:`~.span_checks.SpanChecks.finish_checks`), then
        close everything."""
        self.finish_checks()
        self.close_all("flush")

    def annotate_rank(self, rank: int, attrs: dict[str, Any]) -> None:
        """Set span attributes (e.g. the pipeline's drop counter) on the rank's rank span, opening one if needed."""
        self._rank_span(rank, "annotate").attrs.update(attrs)

    def _rank_span(self, rank: int, why: str) -> Span:
        """The rank's open rank span, else a new one at the latest record time (the records' clock, not the
        exporter's, so the same records give the same span; the wall clock before any record)."""
        sp = self._open.get((rank, "rank"))
        if sp is None:
            fake = Event(why, rank, -1, self._max_ts or time.time_ns(), 0, {})
            sp = self._open_span((rank, "rank"), rank_trace_id(self.run_id, rank), sc.SPAN_RANK, fake)
        return sp

    def take(self) -> list[Span]:
        """Spans finished since the last call (a lane segment is followed by its children)."""
        self.flush_checks()
        done, self._done = self._done, []
        return done

    @property
    def events(self) -> int:
        """Records added so far."""
        return self._held + self._sent_recs

    @property
    def open_spans(self) -> int:
        """Spans open now."""
        return len(self._open)

    @property
    def held_records(self) -> int:
        """Records held now, in open spans and in closed children parked in open lanes (at most ``MAX_HELD``)."""
        return self._held

    @property
    def finished_spans(self) -> int:
        """Spans finished and not yet taken (:meth:`take`)."""
        return len(self._done)

    def rank_span_open(self, rank: int) -> bool:
        """True while ``rank``'s rank span (the one :meth:`annotate_rank` writes to) is open."""
        return (rank, "rank") in self._open
