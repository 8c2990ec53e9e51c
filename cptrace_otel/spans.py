"""Events -> OTLP-shaped spans: the trace model of docs/ARCHITECTURE.md, shared by the live exporter and ``ingest``.

Contract:

* Every :class:`~cptrace_otel.events.Event` fed to :meth:`SpanBuilder.add` becomes exactly one span event (name = tag,
  timestamp = ``ev.ts``, attributes = typed fields + ``cptrace.seq`` / ``cptrace.epoch`` / ``cptrace.record.level``).
* Trace ids are deterministic, so every rank process of a run puts a node's records into the same trace without any
  context propagation: node trace ``blake2b(f"{run_id}|{epoch}|{node_id}")``, rank trace
  ``blake2b(f"{run_id}|rank|{rank}")``, request trace ``blake2b(f"{run_id}|rid|{rid}")`` (16 bytes; 0 maps to 1).
* Stage spans per (rank, epoch, node): ``hicache.d2h`` (``prepare`` .. ``ack dir=d2h``, holds ``backup``),
  ``hicache.h2d`` (``reload`` .. ``ack dir=h2d``), ``hicache.node`` (every other record of the node). Every span is a
  root of its trace (no parent that is never sent). A span ends at its closing record (``closed_by=tag``), once it
  has been open ``span_timeout_s`` (``timeout``), at :meth:`close_all` (``flush``), at a ``reset`` of its rank
  (``reset``) or when it grows past :data:`MAX_EVENTS` events / :data:`MAX_SPAN_BYTES` (``limit``); a later record
  of the same stage opens a new span. So nothing stays open for long and a crash loses at most that window.
* ``rid_map`` records put ``hicache.rid`` on the node span and link the request trace's span to it.
* Online checks: with a ``checker_factory`` (``rank -> RankChecker``), each event is fed to the rank's checker and the
  findings it returns are stamped on the span that holds the event (``cptrace.violation``, status ERROR, one
  ``hicache.violation`` event per finding). A checker that raises is switched off (once, with a warning): tracing
  must not die because a rule did.

Time is whatever ``ev.ts`` says (wall-clock ns for live records); :meth:`expire` takes "now" explicitly so replays
and tests are deterministic.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any, Callable, Iterable

from . import semconv as sc
from .attrs import fields_to_attributes
from .events import Event
from .logline import Rng, render_value

# A span closes when it holds this many events or this many (approximate) bytes of attribute data: keeps a hot node's
# span small enough for the UI and far below the 3.5 MiB request split.
MAX_EVENTS = 1000
MAX_SPAN_BYTES = 1 << 20

STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

_DIGEST = hashlib.blake2b


def _id(text: str, size: int) -> bytes:
    d = _DIGEST(text.encode("utf-8", "replace"), digest_size=size).digest()
    return d if any(d) else (b"\x00" * (size - 1) + b"\x01")  # all-zero ids are invalid in OTLP


def node_trace_id(run_id: str, epoch: int, node_id: int) -> bytes:
    """Trace id of one node lineage: identical in every rank process of the run."""
    return _id(f"{run_id}|{epoch}|{node_id}", 16)


def rank_trace_id(run_id: str, rank: int) -> bytes:
    """Trace id holding a rank's records that belong to no node (config, reset, free of unowned slots, ...)."""
    return _id(f"{run_id}|rank|{rank}", 16)


def request_trace_id(run_id: str, rid: str) -> bytes:
    """Trace id of one request (``fwd_hash`` records; links to the node traces named by ``rid_map``)."""
    return _id(f"{run_id}|rid|{rid}", 16)


class Span:
    """One finished (or open) span, in the shape the OTLP encoders need."""

    __slots__ = ("trace_id", "span_id", "name", "start", "end", "attrs", "events", "links", "status_code",
                 "status_message", "rank", "key", "nbytes", "findings")

    def __init__(self, trace_id: bytes, span_id: bytes, name: str, start: int, rank: int, key: Any,
                 attrs: dict[str, Any]) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.name = name
        self.start = start
        self.end = start
        self.attrs = attrs
        # (time_ns, name, attributes)
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        # (trace_id, span_id, attributes)
        self.links: list[tuple[bytes, bytes, dict[str, Any]]] = []
        self.status_code = STATUS_UNSET
        self.status_message = ""
        self.rank = rank
        self.key = key
        self.nbytes = 0
        self.findings: list[Any] = []

    def __repr__(self) -> str:  # for test failures
        return f"Span({self.name} trace={self.trace_id.hex()} events={len(self.events)} attrs={self.attrs})"


def event_attributes(fields: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``attrs.fields_to_attributes(fields)`` and the approximate encoded size of those attributes
    (:func:`_approx_bytes`, the span byte cap's estimate)."""
    return fields_to_attributes(fields), _approx_bytes(fields)


class EventAttrs(Mapping):
    """A span event's attributes, kept as the event's typed fields plus its seq / epoch / level until someone reads
    them: ``attrs.fields_to_attributes(fields)`` followed by ``cptrace.seq``, ``cptrace.epoch``,
    ``cptrace.record.level``, in that order (a read-only mapping equal to that dict).

    Why lazy: the exporter's protobuf encoder (``export.otlp``) writes these straight from the typed fields, so the
    per-event attribute dict (most of the exporter's time per event) is only built for the JSON file sink, tests and
    other readers. Writing to it turns it into a plain dict copy (``dirty``), which the encoder then uses instead.
    """

    __slots__ = ("fields", "seq", "epoch", "level", "_d", "dirty")

    def __init__(self, fields: dict[str, Any], seq: int, epoch: int, level: int) -> None:
        self.fields = fields
        self.seq = seq
        self.epoch = epoch
        self.level = level
        self._d: dict[str, Any] | None = None
        self.dirty = False

    def as_dict(self) -> dict[str, Any]:
        d = self._d
        if d is None:
            d = fields_to_attributes(self.fields)
            d[sc.SEQ] = self.seq
            d[sc.EPOCH] = self.epoch
            d[sc.LEVEL] = self.level
            self._d = d
        return d

    def __getitem__(self, key: str) -> Any:
        if key == sc.SEQ and not self.dirty:
            return self.seq
        return self.as_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        if key == sc.SEQ and not self.dirty:
            return self.seq
        return self.as_dict().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.as_dict()[key] = value
        self.dirty = True

    def __delitem__(self, key: str) -> None:
        del self.as_dict()[key]
        self.dirty = True

    def __iter__(self) -> Any:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def items(self) -> Any:
        return self.as_dict().items()

    def keys(self) -> Any:
        return self.as_dict().keys()

    def values(self) -> Any:
        return self.as_dict().values()

    def copy(self) -> dict[str, Any]:
        return dict(self.as_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventAttrs):
            other = other.as_dict()
        return self.as_dict() == other

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dict

    def __repr__(self) -> str:
        return repr(self.as_dict())


def _approx_bytes(fields: dict[str, Any]) -> int:
    """Approximate encoded size of an event's attributes (the span byte cap)."""
    n = 16 + 12 * len(fields)
    for v in fields.values():
        t = type(v)
        if t is str:
            n += len(v) - 4
        elif t is not int and t is not float:
            n += 48 if t is Rng else len(str(v))
    return n


def checker_factory(enabled: bool, level: int | None) -> Callable[[int], Any] | None:
    """The ``checker_factory`` for :class:`SpanBuilder`: ``rank -> RankChecker(rank, level)`` (``level`` None: the
    checker infers it from the stream) when the online checks are ``enabled`` and the checks package provides them,
    else None."""
    if not enabled:
        return None
    try:
        from .checks import RankChecker  # type: ignore[attr-defined]
    except Exception:
        return None
    return lambda rank: RankChecker(rank, level)


class SpanBuilder:
    """Maps one rank process's events to spans. Not thread-safe: one builder per exporter loop.

    ``instance`` makes span ids unique per traced process (two processes may run with the same rank). Finished spans
    accumulate until :meth:`take`.
    """

    def __init__(self, run_id: str, instance: str = "", span_timeout_s: float = 1.0,
                 checker_factory: Callable[[int], Any] | None = None, track_traces: bool = True) -> None:
        self.run_id = run_id
        self.instance = instance
        self.timeout_ns = int(span_timeout_s * 1e9)
        self._checker_factory = checker_factory
        self._checkers: dict[int, Any] = {}
        self._feeds: dict[int, Callable[[Event], Any]] = {}   # rank -> its checker's feed method
        self._open: dict[Any, Span] = {}          # insertion order = open order (oldest first)
        self._done: list[Span] = []
        self._trace_cache: dict[tuple[int, int], bytes] = {}
        self.events = 0
        self.spans = 0
        self.findings = 0
        # distinct trace ids, for summaries (ingest); a long-running exporter turns it off to stay bounded
        self.traces: set[bytes] = set()
        self._track = track_traces
        self._max_ts = 0
        self._opened = 0
        self._last_open_ts = 0
        self._unordered = False

    # -- span bookkeeping ----------------------------------------------------------------------------------------
    def _node_trace(self, epoch: int, node: int) -> bytes:
        k = (epoch, node)
        t = self._trace_cache.get(k)
        if t is None:
            if len(self._trace_cache) > 200_000:
                self._trace_cache.clear()
            t = self._trace_cache[k] = node_trace_id(self.run_id, epoch, node)
        return t

    def _open_span(self, key: Any, trace_id: bytes, name: str, ev: Event, extra: dict[str, Any]) -> Span:
        self._opened += 1  # part of the id: unique even for spans opened without a record (annotations)
        span_id = _id(f"{self.instance}|{ev.rank}|{ev.epoch}|{ev.seq}|{name}|{key[-1]}|{self._opened}", 8)
        attrs: dict[str, Any] = {sc.RANK: ev.rank}
        attrs.update(extra)
        sp = Span(trace_id, span_id, name, ev.ts, ev.rank, key, attrs)
        if ev.ts < self._last_open_ts:
            self._unordered = True
        else:
            self._last_open_ts = ev.ts
        self._open[key] = sp
        return sp

    def _close(self, sp: Span, why: str) -> None:
        if self._open.get(sp.key) is sp:
            del self._open[sp.key]
        sp.attrs[sc.STAGE_CLOSED] = why
        if sp.findings:
            _stamp(sp)
        if sp.end < sp.start:
            sp.end = sp.start
        self.spans += 1
        if self._track:
            self.traces.add(sp.trace_id)
        self._done.append(sp)

    def _span_for(self, key: Any, trace_id: bytes, name: str, ev: Event, extra: dict[str, Any]) -> Span:
        sp = self._open.get(key)
        if sp is None:
            sp = self._open_span(key, trace_id, name, ev, extra)
        return sp

    # -- public --------------------------------------------------------------------------------------------------
    def add(self, ev: Event) -> Span:
        """Record ``ev`` as one span event; returns the span that holds it."""
        ts = ev.ts
        if ts > self._max_ts:
            self._max_ts = ts
            if self._open:
                head = next(iter(self._open.values()))
                if ts - head.start >= self.timeout_ns:
                    self.expire(ts)
        tag = ev.tag
        f = ev.fields
        rank = ev.rank
        epoch = ev.epoch
        node = f.get("node_id")
        closing = False
        link_rid = None
        if tag == "reset":
            # A reset ends every open span of this rank: node ids restart, so nothing may join them any more.
            for sp in [s for s in self._open.values() if s.rank == rank]:
                self._close(sp, "reset")
        if tag == "fwd_hash":
            rid = render_value(f.get("rid", "?"))
            key = (rank, "req", rid)
            sp = self._span_for(key, request_trace_id(self.run_id, rid), sc.SPAN_REQUEST, ev,
                                {sc.RID: rid})
        elif type(node) is int and node >= 0:
            op = f.get("op")
            if tag == "prepare":
                key = (rank, epoch, node, "d2h", op)
                old = self._open.get(key)
                if old is not None:
                    self._close(old, "tag")
                sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_D2H, ev, {sc.NODE_ID: node})
            elif tag == "reload":
                key = (rank, epoch, node, "h2d", op)
                old = self._open.get(key)
                if old is not None:
                    self._close(old, "tag")
                sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_H2D, ev, {sc.NODE_ID: node})
            elif tag == "backup":
                key = (rank, epoch, node, "d2h", op)
                # (the open span is looked up first: its trace id and attributes are only built for a new one)
                sp = self._open.get(key)
                if sp is None:
                    sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_D2H, ev, {sc.NODE_ID: node})
            else:
                sp = None
                if tag == "ack":
                    d = f.get("dir")
                    if d == "d2h" or d == "h2d":
                        sp = self._open.get((rank, epoch, node, d, op))
                        closing = sp is not None
                if sp is None:
                    key = (rank, epoch, node, "node")
                    sp = self._open.get(key)
                    if sp is None:
                        sp = self._open_span(key, self._node_trace(epoch, node), sc.SPAN_NODE, ev,
                                             {sc.NODE_ID: node})
                    if tag == "rid_map" and "rid" in f:
                        link_rid = render_value(f["rid"])
                        sp.attrs[sc.RID] = link_rid
        else:
            key = (rank, "rank")
            sp = self._open.get(key)
            if sp is None:
                sp = self._open_span(key, rank_trace_id(self.run_id, rank), sc.SPAN_RANK, ev, {})

        sp.events.append((ts, tag, EventAttrs(f, ev.seq, epoch, ev.level)))
        sp.nbytes += _approx_bytes(f)
        if ts > sp.end:
            sp.end = ts
        self.events += 1

        if link_rid is not None:
            rkey = (rank, "req", link_rid)
            rsp = self._span_for(rkey, request_trace_id(self.run_id, link_rid), sc.SPAN_REQUEST, ev,
                                 {sc.RID: link_rid})
            link_attrs: dict[str, Any] = {sc.RANK: rank, sc.NODE_ID: node}
            if "hit" in f:
                link_attrs[sc.field_key("hit")] = render_value(f["hit"])
            rsp.links.append((sp.trace_id, sp.span_id, link_attrs))
            if ts > rsp.end:
                rsp.end = ts

        if self._checker_factory is not None:
            fd = self._feeds.get(rank)
            if fd is None:
                ck = self._checkers.get(rank)
                if ck is not None:
                    # feed_fast (RankChecker): feed without the empty list per record; same findings
                    fd = self._feeds[rank] = getattr(ck, "feed_fast", None) or ck.feed
            if fd is not None:
                try:
                    found = fd(ev)
                except Exception as e:  # a broken rule must not stop tracing
                    self._checker_factory = None
                    print(f"cptrace_otel: online checks disabled after an error in the checker: {e!r}",
                          file=sys.stderr)
                    found = None
                if found:
                    sp.findings.extend(found)
                    self.findings += len(found)
            else:
                self._check(ev, sp)

        if closing:
            self._close(sp, "tag")
        elif len(sp.events) >= MAX_EVENTS or sp.nbytes >= MAX_SPAN_BYTES:
            self._close(sp, "limit")
        return sp

    def _checker(self, rank: int) -> Any:
        ck = self._checkers.get(rank)
        if ck is None and self._checker_factory is not None:
            ck = self._checkers[rank] = self._checker_factory(rank)
        return ck

    def _check(self, ev: Event, sp: Span) -> None:
        try:
            found = self._checker(ev.rank).feed(ev)
        except Exception as e:  # a broken rule must not stop tracing
            self._checker_factory = None
            print(f"cptrace_otel: online checks disabled after an error in the checker: {e!r}", file=sys.stderr)
            return
        if found:
            sp.findings.extend(found)
            self.findings += len(found)

    def expire(self, now_ns: int) -> None:
        """Close every span that has been open ``span_timeout_s`` at ``now_ns``."""
        limit = now_ns - self.timeout_ns
        while self._open:
            sp = next(iter(self._open.values()))
            if sp.start > limit:
                if self._unordered:
                    # Spans were opened out of time order (a replay merging clocks): scan them all.
                    for s in [s for s in self._open.values() if s.start <= limit]:
                        self._close(s, "timeout")
                return
            self._close(sp, "timeout")

    def close_all(self, why: str = "flush") -> None:
        """Close every open span (flush)."""
        for sp in list(self._open.values()):
            self._close(sp, why)

    def finish(self) -> None:
        """End of stream: findings that only the end reveals (``RankChecker.finish``), then close everything.

        A finding is stamped on the open span holding its last evidence record, else on a rank span."""
        if self._checker_factory is not None:
            for rank, ck in list(self._checkers.items()):
                try:
                    found = ck.finish() or []
                except Exception as e:
                    print(f"cptrace_otel: checker finish failed: {e!r}", file=sys.stderr)
                    continue
                for fd in found:
                    self._stamp_late(rank, fd)
        self.close_all("flush")

    def _stamp_late(self, rank: int, fd: Any) -> None:
        evidence = list(getattr(fd, "evidence", None) or [])
        target = None
        if evidence:
            want = evidence[-1]
            for sp in self._open.values():
                if sp.rank == rank and any(a.get(sc.SEQ) == want for _, _, a in sp.events):
                    target = sp
                    break
        if target is None:
            key = (rank, "rank")
            target = self._open.get(key)
            if target is None:
                ts = self._max_ts
                fake = Event("finish", rank, -1, ts, 0, {})
                target = self._open_span(key, rank_trace_id(self.run_id, rank), sc.SPAN_RANK, fake, {})
        target.findings.append(fd)
        self.findings += 1

    def annotate_rank(self, rank: int, attrs: dict[str, Any], ts: int) -> None:
        """Set span attributes (e.g. the pipeline's drop counter) on the rank's rank span, opening one if needed."""
        key = (rank, "rank")
        sp = self._open.get(key)
        if sp is None:
            fake = Event("annotate", rank, -1, ts, 0, {})
            sp = self._open_span(key, rank_trace_id(self.run_id, rank), sc.SPAN_RANK, fake, {})
        sp.attrs.update(attrs)

    def take(self) -> list[Span]:
        """Spans finished since the last call."""
        done, self._done = self._done, []
        return done

    @property
    def open_spans(self) -> int:
        """Spans open now."""
        return len(self._open)

    @property
    def finished_spans(self) -> int:
        """Spans finished and not yet taken (:meth:`take`)."""
        return len(self._done)

    def rank_span_open(self, rank: int) -> bool:
        """True while ``rank``'s rank span (the one :meth:`annotate_rank` writes to) is open."""
        return (rank, "rank") in self._open

    def unchecked(self) -> list[Any]:
        out: list[Any] = []
        for ck in self._checkers.values():
            try:
                out.extend(ck.unchecked())
            except Exception:
                pass
        return out

    def iter_open(self) -> Iterable[Span]:
        return iter(list(self._open.values()))


def _stamp(sp: Span) -> None:
    """Put a span's findings on it: violation attributes, status ERROR, one violation event per finding."""
    codes = sorted({str(getattr(f, "code", "?")) for f in sp.findings})
    rules = sorted({str(getattr(f, "rule", "")) for f in sp.findings} - {""})
    certs = {str(getattr(f, "certainty", "")) for f in sp.findings}
    sp.attrs[sc.VIOLATION] = ",".join(codes)
    if rules:
        sp.attrs[sc.VIOLATION_RULES] = ",".join(rules)
    sp.attrs[sc.CERTAINTY] = "exact" if "exact" in certs else (sorted(certs)[0] if certs else "")
    first = sp.findings[0]
    sp.status_code = STATUS_ERROR
    sp.status_message = str(getattr(first, "message", "") or getattr(first, "code", "violation"))
    ts_of_seq = {a.get(sc.SEQ): t for t, _, a in sp.events}
    for f in sp.findings:
        ev_seqs = [int(x) for x in (getattr(f, "evidence", None) or []) if isinstance(x, int)]
        ts = sp.end
        for s in reversed(ev_seqs):
            if s in ts_of_seq:
                ts = ts_of_seq[s]
                break
        sp.events.append((ts, sc.EVENT_VIOLATION, {
            sc.V_CODE: str(getattr(f, "code", "?")),
            sc.V_RULE: str(getattr(f, "rule", "")),
            sc.V_CERTAINTY: str(getattr(f, "certainty", "")),
            sc.V_EVIDENCE: ",".join(str(s) for s in ev_seqs),
            sc.V_MESSAGE: str(getattr(f, "message", "")),
        }))
