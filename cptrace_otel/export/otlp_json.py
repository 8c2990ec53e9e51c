"""OTLP/JSON encoding of :class:`cptrace_otel.model.spans.Span` lists: one ``ExportTraceServiceRequest`` per line, the
form the OpenTelemetry Collector's file exporter writes (read back by :mod:`cptrace_otel.analyze.sources.otlpfile`).

Built as text with the same caching idea as the protobuf encoder (:mod:`cptrace_otel.export.otlp_proto`): ``json.dumps``
over nested dicts costs ~5x more. Attribute values follow proto3 JSON: int64 as strings, doubles as numbers (NaN and
infinities as strings), bools as booleans, anything else as its ``str``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring as _jstr  # C-accelerated string quoting
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..model import semconv as sc

if TYPE_CHECKING:
    from ..model.spans import Span

_INT_CACHE_MAX = 4096                     # cache small ints only (ids, counters and hashes would churn it)
_CACHE_LIMIT = 100_000
_NO_CACHE = frozenset({sc.SEQ})           # unique per event
_json_cache: dict[tuple[str, Any], str] = {}


def _json_any(v: Any) -> str:
    t = type(v)
    if t is int:
        if -(1 << 63) <= v < (1 << 63):
            return '{"intValue":"%d"}' % v  # proto3 JSON: int64 as a string
        return '{"stringValue":"%d"}' % v
    if t is str:
        return '{"stringValue":' + _jstr(v) + "}"
    if t is float:
        if math.isfinite(v):
            return '{"doubleValue":' + repr(v) + "}"
        return '{"doubleValue":"' + ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")) + '"}'
    if t is bool:
        return '{"boolValue":true}' if v else '{"boolValue":false}'
    return '{"stringValue":' + _jstr(str(v)) + "}"


def _json_attrs(attrs: Mapping[str, Any]) -> str:
    get = _json_cache.get
    out = []
    for k, v in attrs.items():
        t = type(v)
        if (t is int and -_INT_CACHE_MAX < v < _INT_CACHE_MAX and k not in _NO_CACHE) or (t is str and len(v) <= 64):
            j = get((k, v))
            if j is None:
                if len(_json_cache) > _CACHE_LIMIT:
                    _json_cache.clear()
                j = _json_cache[(k, v)] = '{"key":' + _jstr(k) + ',"value":' + _json_any(v) + "}"
        else:
            j = '{"key":' + _jstr(k) + ',"value":' + _json_any(v) + "}"
        out.append(j)
    return "[" + ",".join(out) + "]"


def span_json(sp: Span) -> str:
    """One ``Span`` in OTLP/JSON (hex ids, int64 as strings, enums as numbers)."""
    parent = getattr(sp, "parent", b"")
    parts = ['{"traceId":"', sp.trace_id.hex(), '","spanId":"', sp.span_id.hex(),
             '","parentSpanId":"' + parent.hex() if parent else "", '","name":', _jstr(sp.name),
             ',"kind":1,"startTimeUnixNano":"', str(sp.start), '","endTimeUnixNano":"', str(sp.end), '"']
    if sp.attrs:
        parts.append(',"attributes":')
        parts.append(_json_attrs(sp.attrs))
    if sp.events:
        parts.append(',"events":[')
        parts.append(",".join(['{"timeUnixNano":"%d","name":%s,"attributes":%s}' % (ts, _jstr(name), _json_attrs(a))
                               for ts, name, a in sp.events]))
        parts.append("]")
    if sp.links:
        parts.append(',"links":[')
        parts.append(",".join(['{"traceId":"%s","spanId":"%s","attributes":%s}' % (t.hex(), i.hex(), _json_attrs(a))
                               for t, i, a in sp.links]))
        parts.append("]")
    if sp.status_code:
        st = '"code":%d' % sp.status_code
        if sp.status_message:
            st = '"message":' + _jstr(sp.status_message) + "," + st
        parts.append(',"status":{' + st + "}")
    else:
        parts.append(',"status":{}')
    parts.append("}")
    return "".join(parts)


def request_json(groups: Iterable[tuple[dict[str, Any], Sequence[Any]]]) -> str:
    """One ``ExportTraceServiceRequest`` as one line of OTLP/JSON (no newline); ``""`` when there are no spans."""
    rs = []
    scope = '{"name":' + _jstr(sc.SCOPE_NAME) + ',"version":' + _jstr(__version__) + "}"
    for resource, spans in groups:
        if not spans:
            continue
        rs.append('{"resource":{"attributes":' + _json_attrs(resource) + '},"scopeSpans":[{"scope":' + scope
                  + ',"spans":[' + ",".join([span_json(sp) for sp in spans]) + "]}]}")
    if not rs:
        return ""
    return '{"resourceSpans":[' + ",".join(rs) + "]}"
