"""Links from node traces to the request spans of SGLang's own request tracing (``--enable-trace``).

Where SGLang traces requests (``--enable-trace --trace-modules request``, ``sglang.srt.observability.trace``), every
request has a root span ``Req <rid>`` made with ``opentelemetry-api``; the scheduler holds its context in
``req.time_stats.trace_ctx``. The traced process reads that context where it records a request using a node
(``rid_map``) and carries it in the record as one field (:data:`FIELD`), so the exporter process, which never sees
SGLang's objects, can link the node's span to the request span.

The field: ``req_span=<trace id, 32 lowercase hex>-<span id, 16 lowercase hex>`` (a string in a log line and in the
``hicache.req_span`` event attribute; the dash keeps every reader from taking it for a number). Any record may carry
it; the exporter (:mod:`cptrace_otel.model.spans`) adds one OTLP link per distinct request span to the span holding
the record, with ``cptrace.link.kind=request`` and the record's ``rid``. A value that is not exactly that shape, or
names an all-zero id (invalid in W3C and OTLP), gives no link and costs nothing else: the record is placed as
always.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from . import semconv as sc
from .logline import render_value

FIELD = "req_span"
LINK_KIND = "request"
# A span holds at most this many request links (OTel SDK's default link limit); the rest are counted in
# semconv.REQUEST_LINKS_DROPPED on it: a node shared by thousands of requests keeps a bounded span.
MAX_LINKS = 128

_SHAPE = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})").fullmatch


def format_context(trace_id: object, span_id: object) -> str | None:
    """The field value for OTel ids given as ints (``SpanContext.trace_id`` / ``span_id``); None for anything that is
    not a valid pair (not ints, out of range, or zero)."""
    if type(trace_id) is not int or type(span_id) is not int:
        return None
    if not (0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64):
        return None
    return f"{trace_id:032x}-{span_id:016x}"


def parse_context(value: object) -> tuple[bytes, bytes] | None:
    """``(trace id 16 bytes, span id 8 bytes)`` of a field value, or None when it is not one (see the module doc).
    Never raises."""
    if type(value) is not str:
        return None
    m = _SHAPE(value)
    if m is None:
        return None
    tid, sid = bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2))
    if not any(tid) or not any(sid):
        return None
    return tid, sid


class LinkedSpan(Protocol):
    """What links are added to: a :class:`cptrace_otel.model.spans.Span` (a Protocol because that module imports
    this one)."""

    @property
    def attrs(self) -> dict[str, Any]: ...

    @property
    def links(self) -> list[tuple[bytes, bytes, dict[str, Any]]]: ...


def link_request(sp: LinkedSpan, value: object, rid: object = None) -> bool:
    """Add to span ``sp`` (a :class:`cptrace_otel.model.spans.Span`: ``links``, ``attrs``) the link to the request
    span named by the field ``value``, once per request span, with ``cptrace.link.kind=request`` and ``hicache.rid``
    (when the record has one). Past :data:`MAX_LINKS` request links on ``sp`` the link is counted in
    ``cptrace.link.request.dropped`` instead. True when a link was added; a bad ``value`` adds nothing."""
    ctx = parse_context(value)
    if ctx is None:
        return False
    tid, sid = ctx
    n = 0
    for t, s, a in sp.links:
        if a.get(sc.LINK_KIND) == LINK_KIND:
            if s == sid and t == tid:
                return False
            n += 1
    if n >= MAX_LINKS:
        sp.attrs[sc.REQUEST_LINKS_DROPPED] = sp.attrs.get(sc.REQUEST_LINKS_DROPPED, 0) + 1
        return False
    attrs: dict[str, Any] = {sc.LINK_KIND: LINK_KIND}
    if rid is not None:
        attrs[sc.RID] = render_value(rid)
    sp.links.append((tid, sid, attrs))
    return True
