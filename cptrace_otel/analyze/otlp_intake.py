"""OTLP protobuf requests -> cptrace records with the trace and span that hold them (``cptrace-otel serve``'s intake).

:func:`decode` takes the bytes of one ``ExportTraceServiceRequest`` (the body of ``POST /v1/traces`` with
``Content-Type: application/x-protobuf``) and returns an :class:`Intake`: one :class:`SpanRecords` per span that holds
cptrace records, and the spans that could not be read (counted, with the first reasons), for the OTLP
``partial_success`` answer. Bytes that are not such a request raise :class:`Undecodable` (HTTP 400).

What is read, as the other OTLP readers read it (:func:`.sources.otlpfile.collect`): every span event with an int
``cptrace.seq`` is one record (name = tag, time = ts, ``hicache.*`` attributes = its fields, rank = the span's
``sglang.cp.rank``, else the resource's); ``hicache.violation`` events (findings) are skipped; the run is the
resource's ``cptrace.run_id``, the trace level its ``cptrace.level`` and the rank's config record its stamp
(:mod:`~cptrace_otel.model.config_stamp`). Spans of other services without records
are accepted and ignored (the collector fans every trace out to the checkers), and so are the checker's own
write-back spans (service :data:`~.incremental.WATCH_SERVICE`): its output is never read as input. A span with
records but no run id, or whose record values do not convert, is rejected whole (the other spans of the request are
kept).

Two twins read the bytes: the C reader (``_speedups/otlpin.c``, when built) reads a request straight from its bytes
and answers for every body it reads with certainty; any other body (an unknown field, a malformed or truncated one,
a value it leaves to Python) and a build without the extension go through opentelemetry-proto's objects
(:func:`from_request`, the reference twin). Both give the same records, rejects and reasons
(tests/unit/test_otlp_intake_c.py); :func:`~cptrace_otel._speedups.twin_off` on this module's ``_C`` switches the C
reader off.
"""

from __future__ import annotations

import gc
from typing import Any

from ..model import semconv as sc
from ..model.attrs import attributes_to_fields
from ..model.config_stamp import record as config_record
from ..model.events import Event
from .incremental import WATCH_SERVICE, SpanRef

MAX_REASONS = 5   # reasons kept per request for the partial_success message
SRC = "otlp"      # Event.src of the records read here


class Undecodable(ValueError):
    """The body is not an ``ExportTraceServiceRequest`` in protobuf."""


class SpanRecords:
    """The records of one span: run id, trace id (hex), the span's :class:`SpanRef` (for evidence links), the
    resource's trace level, the records as :class:`Event` objects, and the rank's ``config`` record stamped on the
    resource (:mod:`~cptrace_otel.model.config_stamp`; None without a stamp)."""

    __slots__ = ("run_id", "trace_id", "ref", "level", "events", "config")

    def __init__(self, run_id: str, trace_id: str, ref: SpanRef, level: int | None, events: list[Event],
                 config: Event | None = None) -> None:
        self.run_id, self.trace_id, self.ref, self.level, self.events = run_id, trace_id, ref, level, events
        self.config = config


class Intake:
    """What one request held: ``spans`` (records by span), ``rejected`` (spans not read), ``reasons`` (the first
    :data:`MAX_REASONS` reasons), ``spans_seen`` (every span of the request)."""

    __slots__ = ("spans", "rejected", "reasons", "spans_seen")

    def __init__(self) -> None:
        self.spans: list[SpanRecords] = []
        self.rejected = 0
        self.reasons: list[str] = []
        self.spans_seen = 0

    def reject(self, why: str) -> None:
        self.rejected += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(why)

    @property
    def records(self) -> int:
        return sum(len(s.events) for s in self.spans)


def value(v: Any) -> Any:
    """Python value of an OTLP protobuf ``AnyValue`` (arrays as lists, kvlists as dicts, unset as None)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    x = getattr(v, kind)
    if kind == "array_value":
        return [value(e) for e in x.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in x.values}
    return x


def decode(body: bytes) -> Intake:
    """The records of one ``ExportTraceServiceRequest`` body (see the module doc); :class:`Undecodable` when the
    bytes are not one."""
    global _C
    c = _C
    if c is _UNLOADED:   # loaded at the first request: importing this module stays light
        c = _C = _load_c()
    got = None
    if c is not None:
        # Every object the C reader builds is kept (no cycle among them), yet each few hundred allocations start a
        # collection that walks the young ones: with it on, half the reader's CPU went to the collector. The C call
        # runs under the GIL (a text left to parse_value aside), and the collector is put back as it was.
        was = gc.isenabled()
        gc.disable()
        try:
            got = c(body)
        finally:
            if was:
                gc.enable()
    if got is not None:   # the C reader read it all
        out = Intake()
        out.spans_seen = got[0]
        stamps: dict[bytes, Event | None] = {}   # one Resource's stamp read once, not per span
        for run_id, level, trace_hex, span_hex, start_us, codes, evs, stamp in got[1]:
            config = None
            if stamp is not None:
                config = stamps[stamp] if stamp in stamps else stamps.setdefault(stamp, _stamped_config(stamp))
            _emit(out, run_id, level, trace_hex, span_hex, start_us, codes, evs, config)
        return out
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        req = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as e:
        raise Undecodable(f"not an OTLP ExportTraceServiceRequest in protobuf ({type(e).__name__}: "
                          f"{str(e)[:160]})") from None
    return from_request(req)


def from_request(req: Any) -> Intake:
    """The records of a parsed ``ExportTraceServiceRequest`` (what gRPC hands over; see the module doc)."""
    out = Intake()
    prefix = sc.FIELD_PREFIX
    for rs in req.resource_spans:
        res = {kv.key: value(kv.value) for kv in rs.resource.attributes}
        own = res.get(sc.SERVICE_NAME) == WATCH_SERVICE
        run_id = res.get(sc.RUN_ID)
        rrank = res.get(sc.CP_RANK)
        lvl = res.get(sc.TRACE_LEVEL)
        level = lvl if type(lvl) is int else None
        config = config_record(res, rrank if type(rrank) is int else 0)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.spans_seen += 1
                if own or not sp.events:
                    continue
                try:
                    evs, codes = _records(sp, rrank, prefix)
                except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as e:
                    out.reject(f"span {sp.span_id.hex()}: a record value of the wrong type "
                               f"({type(e).__name__}: {str(e)[:120]})")
                    continue
                if evs:
                    _emit(out, run_id, level, sp.trace_id.hex(), sp.span_id.hex(), sp.start_time_unix_nano // 1000,
                          codes, evs, config)
    return out


def _emit(out: Intake, run_id: Any, level: int | None, trace_hex: str, span_hex: str, start_us: int,
          codes: frozenset, evs: list[Event], config: Event | None) -> None:
    """The records of one span into ``out``: kept, or rejected when the resource has no run id."""
    if not isinstance(run_id, str) or not run_id:
        out.reject(f"span {span_hex}: {len(evs)} cptrace record(s) but no {sc.RUN_ID} on the resource")
        return
    out.spans.append(SpanRecords(run_id, trace_hex, SpanRef(trace_hex, span_hex, start_us, codes), level, evs,
                                 config))


def _stamped_config(resource: bytes) -> Event | None:
    """The config record stamped on a Resource message (its bytes, as the C reader hands them over), read as
    :func:`from_request` reads it."""
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    res = {kv.key: value(kv.value) for kv in Resource.FromString(resource).attributes}
    rrank = res.get(sc.CP_RANK)
    return config_record(res, rrank if type(rrank) is int else 0)


def _records(sp: Any, rrank: Any, prefix: str) -> tuple[list[Event], frozenset]:
    """The records of one span and the violation codes already stamped on it."""
    rank = rrank
    codes: frozenset = frozenset()
    for kv in sp.attributes:
        if kv.key == sc.RANK:
            rank = value(kv.value)
        elif kv.key == sc.VIOLATION:
            codes = frozenset(str(value(kv.value)).split(","))
    if type(rank) is not int:
        rank = 0
    evs = []
    for e in sp.events:
        name = e.name
        if name == sc.EVENT_VIOLATION:
            continue
        fattrs, meta = [], {}
        for kv in e.attributes:
            k = kv.key
            if k.startswith(prefix):
                fattrs.append((k, value(kv.value)))
            else:
                meta[k] = value(kv.value)
        seq = meta.get(sc.SEQ)
        if type(seq) is not int:
            continue
        epoch = meta.get(sc.EPOCH, 0)
        level = meta.get(sc.LEVEL, 1)
        evs.append(Event(name, rank, seq, e.time_unix_nano, epoch if type(epoch) is int else 0,
                         attributes_to_fields(fattrs), level if type(level) is int else 1, SRC, 0))
    return evs, codes


def _load_c() -> Any:
    from .._speedups.otlpin import load

    return load(SRC, WATCH_SERVICE)


_UNLOADED: Any = object()
_C: Any = _UNLOADED   # the C reader (otlpin.c) once loaded, None when not built or switched off
