"""OTLP protobuf encoding of :class:`cptrace_otel.model.spans.Span` lists: ``ExportTraceServiceRequest`` bytes (the
OTLP/JSON form the OpenTelemetry Collector's file exporter writes is :mod:`cptrace_otel.export.otlp_json`).

Why a hand-written protobuf encoder: building ``opentelemetry.proto`` messages costs ~20-30 us per event in Python
(one message object per attribute; perf-anchors C.4: 46.7k events/s), which caps the exporter process far below its
100k events/s goal. The wire format of the few messages we emit is small and stable, and the attribute keys and most
values repeat, so we encode straight to bytes with per-key/per-value caches. ``tests/unit/test_export_otlp.py`` checks
every byte against ``opentelemetry-proto`` decoding (``ExportTraceServiceRequest.FromString``), so the encoder cannot
drift from the schema silently.

Requests are split so that each stays below :data:`MAX_REQUEST_BYTES` (3.5 MiB before compression): gRPC servers
reject more than 4 MiB, and an oversize request is re-sent uselessly by retrying exporters.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._speedups.otlp import load as _load_c_encoders
from .._version import __version__
from ..model import semconv as sc
from ..model.attrs import EventAttrs, approx_bytes, attribute_key, fields_to_attributes, range_keys
from ..model.grammar import OTLP as _W
from ..model.logline import Rng

if TYPE_CHECKING:
    from ..model.spans import Span

MAX_REQUEST_BYTES = int(3.5 * 1024 * 1024)

_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_MASK64 = (1 << 64) - 1

# The protobuf tags and fixed parts of the fields written below (cptrace_otel.model.grammar: the C encoder's too)
_T_KEY, _T_VALUE = bytes((_W.kv_key,)), bytes((_W.kv_value,))
_T_STR, _T_INT, _T_DOUBLE = bytes((_W.any_string,)), bytes((_W.any_int,)), bytes((_W.any_double,))
_TRUE, _FALSE = bytes((_W.any_bool, 1)), bytes((_W.any_bool, 0))
_SPAN_TRACE_ID = bytes((_W.span_trace_id, _W.trace_id_bytes))
_SPAN_SPAN_ID = bytes((_W.span_span_id, _W.span_id_bytes))
_SPAN_PARENT = bytes((_W.span_parent, _W.span_id_bytes))
_SPAN_NAME, _SPAN_KIND = bytes((_W.span_name,)), bytes((_W.span_kind, _W.kind_internal))
_SPAN_START, _SPAN_END = bytes((_W.span_start,)), bytes((_W.span_end,))
_SPAN_ATTRS, _SPAN_EVENTS = bytes((_W.span_attributes,)), bytes((_W.span_events,))
_SPAN_LINKS, _SPAN_STATUS = bytes((_W.span_links,)), bytes((_W.span_status,))
_EV_TIME, _EV_NAME = bytes((_W.event_time,)), bytes((_W.event_name,))
_LINK_TRACE_ID = bytes((_W.link_trace_id, _W.trace_id_bytes))
_LINK_SPAN_ID = bytes((_W.link_span_id, _W.span_id_bytes))
_LINK_ATTRS = bytes((_W.link_attributes,))
_STATUS_MESSAGE, _STATUS_CODE = bytes((_W.status_message,)), bytes((_W.status_code,))
_REQUEST_RESOURCE_SPANS = bytes((_W.request_resource_spans,))
_RESOURCE_SPANS_RESOURCE = bytes((_W.resource_spans_resource,))
_RESOURCE_SPANS_SCOPE_SPANS = bytes((_W.resource_spans_scope_spans,))
_RESOURCE_ATTRIBUTES = bytes((_W.resource_attributes,))
_SCOPE_SPANS_SCOPE, _SCOPE_SPANS_SPANS = bytes((_W.scope_spans_scope,)), bytes((_W.scope_spans_spans,))
_SCOPE_NAME, _SCOPE_VERSION = bytes((_W.scope_name,)), bytes((_W.scope_version,))


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_slow(i) for i in range(1 << 14)]
# 14 low bits as two varint bytes that both say "more follows": big ints go 14 bits per table lookup.
_CONT14 = [bytes(((i & 0x7F) | 0x80, ((i >> 7) & 0x7F) | 0x80)) for i in range(1 << 14)]


def varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int (negative int64 values must be masked to 64 bits first)."""
    if n < 16384:
        return _SMALL[n]
    if n < 268435456:  # 2**28: the common cases unrolled (one concatenation instead of a loop and a join)
        return _CONT14[n & 0x3FFF] + _SMALL[n >> 14]
    if n < 4398046511104:  # 2**42
        return _CONT14[n & 0x3FFF] + _CONT14[(n >> 14) & 0x3FFF] + _SMALL[n >> 28]
    if n < 72057594037927936:  # 2**56
        return (_CONT14[n & 0x3FFF] + _CONT14[(n >> 14) & 0x3FFF] + _CONT14[(n >> 28) & 0x3FFF]
                + _SMALL[n >> 42])
    parts = []
    while n >= 16384:
        parts.append(_CONT14[n & 0x3FFF])
        n >>= 14
    parts.append(_SMALL[n])
    return b"".join(parts)


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 16384 else varint(n)) + payload


def _utf8(s: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: protobuf strings must be valid UTF-8
        return s.encode("utf-8", "replace")


# -- AnyValue / KeyValue ------------------------------------------------------------------------------------------
_key_prefix: dict[str, bytes] = {}        # key -> KeyValue.key field bytes


def any_value(v: Any) -> bytes:
    """Encoded ``AnyValue`` for an int (int64), bool, float (double) or str; anything else as its ``str``."""
    t = type(v)
    if t is int:
        if -(1 << 63) <= v < (1 << 63):
            return _T_INT + varint(v & _MASK64)
        return _ld(_T_STR, _utf8(str(v)))
    if t is str:
        return _ld(_T_STR, _utf8(v))
    if t is float:
        return _T_DOUBLE + _pack_d(v)
    if t is bool:
        return _TRUE if v else _FALSE
    return _ld(_T_STR, _utf8(str(v)))


def _keyp(k: str) -> bytes:
    b = _key_prefix.get(k)
    if b is None:
        if len(_key_prefix) > 50_000:  # field names are few; a caller inventing names must not grow this forever
            _key_prefix.clear()
        b = _key_prefix[k] = _ld(_T_KEY, _utf8(k))
    return b


def _field(tag: bytes, k: str, v: object) -> bytes:
    return _ld(tag, _keyp(k) + _ld(_T_VALUE, any_value(v)))


# Per field tag: key -> prefixes. ``ints[n]`` is everything before an int value whose varint is n bytes (n = 1..10),
# so an int attribute costs one varint and two appends; ``sp`` is the key part before a string's AnyValue.
class _KeyEnc:
    __slots__ = ("ints", "sp")

    def __init__(self, tag: bytes, k: str) -> None:
        kp = _keyp(k)
        self.ints = [b""] + [tag + varint(len(kp) + 3 + n) + kp + _T_VALUE + bytes([1 + n]) + _T_INT
                             for n in range(1, 11)]
        self.sp = kp + _T_VALUE


_key_enc: dict[bytes, dict[str, _KeyEnc]] = {}


def _attrs(tag: bytes, attrs: Mapping[str, Any]) -> bytes:
    """The repeated ``KeyValue`` field ``tag`` for ``attrs``."""
    encs = _key_enc.get(tag)
    if encs is None or len(encs) > 50_000:
        encs = _key_enc[tag] = {}
    get = encs.get
    out: list[bytes] = []
    append = out.append
    small = _SMALL
    for k, v in attrs.items():
        t = type(v)
        if t is int and -(1 << 63) <= v < (1 << 63):
            e = get(k)
            if e is None:
                e = encs[k] = _KeyEnc(tag, k)
            vb = small[v] if 0 <= v < 16384 else varint(v & _MASK64)
            append(e.ints[len(vb)])
            append(vb)
        elif t is str:
            e = get(k)
            if e is None:
                e = encs[k] = _KeyEnc(tag, k)
            sb = v.encode() if v.isascii() else v.encode("utf-8", "replace")
            n = len(sb)
            av = _T_STR + (small[n] if n < 16384 else varint(n)) + sb
            kv = e.sp + (small[len(av)] if len(av) < 16384 else varint(len(av))) + av
            append(tag)
            append(small[len(kv)] if len(kv) < 16384 else varint(len(kv)))
            append(kv)
        else:
            append(_field(tag, k, v))
    return b"".join(out)


# -- span event attributes straight from typed fields ------------------------------------------------------------------
# ``attrs.EventAttrs`` keeps an event's typed fields; this writes exactly the bytes ``_attrs(_EV_TAG, attrs.as_dict())``
# would (a test holds them equal) without building that dict: one pass over the fields, a per-field-name encoder
# holding the ``hicache.<k>`` key prefixes, and whole KeyValue fields cached for small repeated values.
_EV_TAG = bytes((_W.event_attributes,))
_VAL_CACHE_INT = 16384     # ints below this have their whole KeyValue field cached per key
_VAL_CACHE_STR = 64        # so do strings up to this length
_VAL_CACHE_PER_KEY = 4096  # bounded: a key with many distinct values stops caching new ones


class _FieldEnc:
    """Encoder of one field name's attribute(s) inside a span event (tag 0x1a)."""

    __slots__ = ("key", "ints", "sp", "vals", "parts", "part_keys", "ok")

    def __init__(self, name: str) -> None:
        key = self.key = attribute_key(name)
        ke = _KeyEnc(_EV_TAG, key)
        self.ints = ke.ints
        self.sp = ke.sp
        self.vals: dict[Any, bytes] = {}
        self.part_keys = range_keys(name)
        self.parts = [_KeyEnc(_EV_TAG, pk) for pk in self.part_keys]
        # A field name with a dot could collide with another field's range part keys (dict semantics would merge
        # them): such events take the dict path.
        self.ok = "." not in name

    def int_field(self, v: int) -> bytes:
        vb = _SMALL[v] if 0 <= v < 16384 else varint(v & _MASK64)
        return self.ints[len(vb)] + vb

    def str_field(self, v: str) -> bytes:
        sb = v.encode() if v.isascii() else _utf8(v)
        n = len(sb)
        av = _T_STR + (_SMALL[n] if n < 16384 else varint(n)) + sb
        kv = self.sp + (_SMALL[len(av)] if len(av) < 16384 else varint(len(av))) + av
        return _EV_TAG + (_SMALL[len(kv)] if len(kv) < 16384 else varint(len(kv))) + kv


_field_enc: dict[str, _FieldEnc] = {}
_FIXED: dict[tuple[int, int], bytes] = {}  # (key, small int) -> KeyValue field bytes for seq / epoch / level
_SEQ_ENC = _KeyEnc(_EV_TAG, sc.SEQ)
_EPOCH_ENC = _KeyEnc(_EV_TAG, sc.EPOCH)
_LEVEL_ENC = _KeyEnc(_EV_TAG, sc.LEVEL)


def _small_fixed(enc: _KeyEnc, v: int) -> bytes:
    if 0 <= v < 256:
        ck = (id(enc), v)
        b = _FIXED.get(ck)
        if b is None:
            vb = _SMALL[v]
            b = _FIXED[ck] = enc.ints[len(vb)] + vb
        return b
    big: bytes | None = varint(v & _MASK64) if -(1 << 63) <= v < (1 << 63) else None
    if big is None:
        return _field(_EV_TAG, "", v)  # unreachable in practice (seq/epoch/level are small ints)
    return enc.ints[len(big)] + big


_kv_cache: dict[tuple[str, Any], bytes] = {}   # (field name, small int | short str | all-int Rng) -> field bytes
_KV_CACHE_MAX = 200_000


def _field_miss(k: str, v: Any, t: type) -> bytes:
    """Encoded attribute field(s) of one typed field, uncached; caches the result when the value is a small one.
    The common shapes are written with the field's encoder, every other value is encoded from
    ``attrs.fields_to_attributes`` (the mapping itself), which gives the same bytes for the common shapes too."""
    e = _field_enc.get(k)
    if e is None:
        if len(_field_enc) > 50_000:
            _field_enc.clear()
        e = _field_enc[k] = _FieldEnc(k)
    cache = False
    if t is int and -(1 << 63) <= v < (1 << 63):
        b = e.int_field(v)
        cache = 0 <= v < _VAL_CACHE_INT
    elif t is str:
        b = e.str_field(v)
        cache = len(v) <= _VAL_CACHE_STR
    elif t is Rng and all(type(pv) is int and -(1 << 63) <= pv < (1 << 63) for pv in v):
        out = []
        for pe, pv in zip(e.parts, v, strict=False):
            vb = varint(pv & _MASK64)
            out.append(pe.ints[len(vb)] + vb)
        b = b"".join(out)   # not cached: see _event_attrs, ranges are encoded inline
    else:
        b = b"".join([_field(_EV_TAG, ak, av) for ak, av in fields_to_attributes({k: v}).items()])
    if cache:
        if len(_kv_cache) >= _KV_CACHE_MAX:
            _kv_cache.clear()
        _kv_cache[(k, v)] = b
    return b


def _event_attrs(a: EventAttrs) -> bytes:
    """The span event's repeated attributes field (tag 0x1a) for a ``attrs.EventAttrs``."""
    if a.dirty:
        return _attrs(_EV_TAG, a.as_dict())
    fields = a.fields
    # A field name with a dot could collide with another field's range part keys: dict semantics decide. The
    # caches (_kv_cache, _field_enc, _rng_cache) only ever hold dot-free names (_field_miss, their only filler, is
    # reached below after the dot test), so a cache hit proves the name dot-free and only misses test for a dot.
    get = _kv_cache.get
    out: list[bytes] = []
    append = out.append
    for k, v in fields.items():
        t = type(v)
        if t is int:
            if 0 <= v < _VAL_CACHE_INT:
                b = get((k, v))
                if b is None:
                    if "." in k:
                        return _attrs(_EV_TAG, a.as_dict())
                    b = _field_miss(k, v, t)
                append(b)
                continue
            if 0 <= v < (1 << 63):
                e = _field_enc.get(k)
                if e is not None:
                    vb = varint(v)
                    append(e.ints[len(vb)])
                    append(vb)
                    continue
        elif t is str:
            if len(v) <= _VAL_CACHE_STR:
                b = get((k, v))
                if b is not None:
                    append(b)
                    continue
        elif t is Rng:
            # A range recurs on a few records of its node's lifecycle (dev on insert / prepare / backup / evict,
            # host on prepare / backup / reloads): cache its five int64 parts per (field, range) in a small
            # table. Only all-int ranges are cached or looked up (``1 == True == 1.0`` must not share an entry).
            e = _field_enc.get(k)
            if e is not None:
                c, lo, hi, fi, la = v
                if (type(c) is int and type(lo) is int and type(hi) is int and type(fi) is int and type(la) is int
                        and 0 <= c < _2_63 and 0 <= lo < _2_63 and 0 <= hi < _2_63 and 0 <= fi < _2_63
                        and 0 <= la < _2_63):
                    ck = (k, v)
                    b = _rng_cache.get(ck)
                    if b is None:
                        p = e.parts
                        vb0, vb1, vb2, vb3, vb4 = varint(c), varint(lo), varint(hi), varint(fi), varint(la)
                        b = b"".join((p[0].ints[len(vb0)], vb0, p[1].ints[len(vb1)], vb1, p[2].ints[len(vb2)], vb2,
                                      p[3].ints[len(vb3)], vb3, p[4].ints[len(vb4)], vb4))
                        if len(_rng_cache) >= _RNG_CACHE_MAX:
                            _rng_cache.clear()
                        _rng_cache[ck] = b
                    append(b)
                    continue
        elif t is list:
            # a list travels as its rendered text (attrs: render_value); for a list of plain ints that text is
            # ``[a,b,...]`` with str() of each item
            e = _field_enc.get(k)
            if e is not None and len(v) <= 4096:
                for x in v:
                    if type(x) is not int:
                        break
                else:
                    append(e.str_field("[" + ",".join(map(str, v)) + "]"))
                    continue
        if "." in k:
            return _attrs(_EV_TAG, a.as_dict())
        append(_field_miss(k, v, t))
    seq, epoch, level = a.seq, a.epoch, a.level
    if type(seq) is int and 0 <= seq < (1 << 63):
        vb = _SMALL[seq] if seq < 16384 else varint(seq)
        append(_SEQ_INTS[len(vb)])
        append(vb)
    else:
        append(_field(_EV_TAG, sc.SEQ, seq))
    b = _EL_CACHE.get((epoch, level)) if type(epoch) is int and type(level) is int else None
    if b is None:
        b = _small_fixed(_EPOCH_ENC, epoch) if type(epoch) is int else _field(_EV_TAG, sc.EPOCH, epoch)
        b += _small_fixed(_LEVEL_ENC, level) if type(level) is int else _field(_EV_TAG, sc.LEVEL, level)
        if type(epoch) is int and type(level) is int and 0 <= epoch < 65536 and 0 <= level < 16:
            if len(_EL_CACHE) > 100_000:
                _EL_CACHE.clear()
            _EL_CACHE[(epoch, level)] = b
    append(b)
    return b"".join(out)


_SEQ_INTS = _SEQ_ENC.ints
_rng_cache: dict[tuple[str, Any], bytes] = {}   # (field name, all-int Rng) -> its five KeyValue fields
_RNG_CACHE_MAX = 16384   # a few live node lifecycles' worth; cleared when full
_2_63 = 1 << 63
_EL_CACHE: dict[tuple[int, int], bytes] = {}


# -- messages -------------------------------------------------------------------------------------------------------
_name_cache: dict[tuple[bytes, str], bytes] = {}


def _name(tag: bytes, s: str) -> bytes:
    ck = (tag, s)
    b = _name_cache.get(ck)
    if b is None:
        if len(_name_cache) > 10_000:
            _name_cache.clear()
        b = _name_cache[ck] = _ld(tag, _utf8(s))
    return b


_span_attr_cache: dict[tuple, bytes] = {}
_ev_names: dict[str, bytes] = {}  # event name -> its encoded name field


def _span_attrs(attrs: dict[str, Any]) -> bytes:
    """``_attrs(_SPAN_ATTRS, attrs)``, cached for the few small int/str attribute sets stage spans repeat (rank, node
    id, closed_by). Only int and str values are cached: ``True == 1`` would otherwise share an entry."""
    if len(attrs) > 6:
        return _attrs(_SPAN_ATTRS, attrs)
    for v in attrs.values():
        t = type(v)
        if (t is not int and t is not str) or (t is str and len(v) > 64):
            return _attrs(_SPAN_ATTRS, attrs)
    key = tuple(attrs.items())
    b = _span_attr_cache.get(key)
    if b is None:
        if len(_span_attr_cache) >= 100_000:
            _span_attr_cache.clear()
        b = _span_attr_cache[key] = _attrs(_SPAN_ATTRS, attrs)
    return b


def _event_field(ts: int, name: str, attrs: EventAttrs | dict[str, Any]) -> bytes:
    """One ``Span.events`` field (tag 0x5a): the Python encoder, and the C encoder's fallback for odd events."""
    nb = _ev_names.get(name)
    if nb is None:
        nb = _name(_EV_NAME, name)
        if len(_ev_names) < 10_000:
            _ev_names[name] = nb
    ev = _EV_TIME + _pack_q(ts & _MASK64) + nb + (
        _event_attrs(attrs) if type(attrs) is EventAttrs else _attrs(_EV_TAG, attrs))
    n = len(ev)
    return _SPAN_EVENTS + (_SMALL[n] if n < 16384 else varint(n)) + ev


# The C encoders (cptrace_otel._speedups.otlp) when they were built: span events (the bytes of _event_field) and
# whole spans fields (the bytes of _span_field), each handing what it does not cover back to the Python encoder; and
# attrs.approx_bytes in C (``sizer``, for the span builder).
_span_events, _span_fields, sizer = _load_c_encoders() or (None, None, approx_bytes)


def c_encoders_built() -> bool:
    """Whether spans and their events are encoded by the C encoders (``_speedups/otlp.c``), else all in Python."""
    return _span_events is not None


def encode_span(sp: Span) -> bytes:
    """Encoded ``Span`` message body (kind INTERNAL; ``parent_span_id`` when the span has a parent: a stage span's
    lane)."""
    parts = [_SPAN_TRACE_ID, sp.trace_id, _SPAN_SPAN_ID, sp.span_id, _name(_SPAN_NAME, sp.name), _SPAN_KIND,
             _SPAN_START, _pack_q(sp.start & _MASK64), _SPAN_END, _pack_q(sp.end & _MASK64)]
    parent = getattr(sp, "parent", b"")
    if parent:
        parts[4:4] = [_SPAN_PARENT, parent]
    if sp.attrs:
        parts.append(_span_attrs(sp.attrs))
    append = parts.append
    if _span_events is not None:
        append(_span_events(sp.events, _event_field))
    else:
        append(b"".join([_event_field(ts, name, attrs) for ts, name, attrs in sp.events]))
    for tid, sid, attrs in sp.links:
        append(_ld(_SPAN_LINKS, _LINK_TRACE_ID + tid + _LINK_SPAN_ID + sid + _attrs(_LINK_ATTRS, attrs)))
    if sp.status_code:
        st = b""
        if sp.status_message:
            st += _ld(_STATUS_MESSAGE, _utf8(sp.status_message))
        st += _STATUS_CODE + varint(sp.status_code)
        append(_ld(_SPAN_STATUS, st))
    return b"".join(parts)


def _span_field(sp: Span) -> bytes:
    """One ``ScopeSpans.spans`` field (tag 0x12) of ``sp``: the Python encoder, and the C encoder's fallback."""
    return _ld(_SCOPE_SPANS_SPANS, encode_span(sp))


def span_fields(spans: Sequence[Any]) -> list[bytes]:
    """The ``ScopeSpans.spans`` field of each span (C when built: the same bytes as :func:`_span_field`)."""
    if _span_fields is not None:
        return _span_fields(spans, _span_field, _event_field)
    return [_span_field(sp) for sp in spans]


def _resource_header(resource: dict[str, Any]) -> bytes:
    """``ResourceSpans.resource`` field plus the opening of its one ``ScopeSpans`` (without the spans)."""
    return _ld(_RESOURCE_SPANS_RESOURCE, _attrs(_RESOURCE_ATTRIBUTES, resource))


def _scope() -> bytes:
    return _ld(_SCOPE_SPANS_SCOPE, _ld(_SCOPE_NAME, sc.SCOPE_NAME.encode()) + _ld(_SCOPE_VERSION, __version__.encode()))


def encode_requests(groups: Iterable[tuple[dict[str, Any], Sequence[Any]]],
                    max_bytes: int = MAX_REQUEST_BYTES, records: list[int] | None = None) -> list[bytes]:
    """``ExportTraceServiceRequest`` bodies for ``(resource attributes, spans)`` groups, each below ``max_bytes``.

    A single span larger than ``max_bytes`` still goes out alone (spans are capped upstream, see spans.MAX_SPAN_BYTES).
    ``records``, when given, receives the number of span events of each body (the delivery accounting's unit).
    """
    out: list[bytes] = []
    cur: list[bytes] = []
    cur_size = 0
    n_cur = 0  # span events in ``cur`` and ``chunk``
    scope = _scope()
    for resource, spans in groups:
        if not spans:
            continue
        head = _resource_header(resource)
        overhead = len(head) + len(scope) + 24
        chunk: list[bytes] = []
        size = 0
        for sp, body in zip(spans, span_fields(spans), strict=False):
            if (chunk or cur) and cur_size + overhead + size + len(body) > max_bytes:
                if chunk:
                    cur.append(_resource_spans(head, scope, chunk))
                out.append(b"".join(cur))
                if records is not None:
                    records.append(n_cur)
                cur, cur_size, chunk, size, n_cur = [], 0, [], 0, 0
            chunk.append(body)
            size += len(body)
            n_cur += len(sp.events)
        if chunk:
            rs = _resource_spans(head, scope, chunk)
            cur.append(rs)
            cur_size += len(rs)
    if cur:
        out.append(b"".join(cur))
        if records is not None:
            records.append(n_cur)
    return out


def _resource_spans(head: bytes, scope: bytes, span_fields: list[bytes]) -> bytes:
    ss = _ld(_RESOURCE_SPANS_SCOPE_SPANS, scope + b"".join(span_fields))
    return _ld(_REQUEST_RESOURCE_SPANS, head + ss)
