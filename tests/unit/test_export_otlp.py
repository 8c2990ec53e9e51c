"""The hand-written OTLP encoders against opentelemetry-proto: protobuf bytes decoded with ``FromString``, JSON lines
parsed with ``json_format``; both must carry exactly the spans we built."""

from __future__ import annotations

import json
import math
import random

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from cptrace_otel.export import otlp_json, otlp_proto as otlp
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.spans import STATUS_ERROR, Span
from tests.helpers.otlp_receiver import flatten, parse_json_line


def _rand_value(rng: random.Random):
    kind = rng.randrange(7)
    if kind == 0:
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == 1:
        return rng.randrange(-300, 300)
    if kind == 2:
        return rng.uniform(-1e6, 1e6)
    if kind == 3:
        return "".join(rng.choice("abc[](),=:-é✓") for _ in range(rng.randrange(0, 80)))
    if kind == 4:
        return rng.choice([True, False])
    if kind == 5:
        return "x" * rng.randrange(100, 20000)
    return rng.randrange(1 << 20, 1 << 40)


def _spans(rng: random.Random, n: int) -> list[Span]:
    out = []
    for i in range(n):
        sp = Span(rng.randbytes(16), rng.randbytes(8), rng.choice([sc.SPAN_D2H, sc.SPAN_NODE, "ü-name"]),
                  rng.randrange(1 << 62), rng.randrange(-1, 8), ("k", i), {})
        sp.end = sp.start + rng.randrange(10**9)
        sp.attrs = {f"a{j}": _rand_value(rng) for j in range(rng.randrange(0, 6))}
        for _ in range(rng.randrange(0, 12)):
            sp.events.append((rng.randrange(1 << 63), rng.choice(["prepare", "ack", "evict"]),
                              {f"hicache.f{j}": _rand_value(rng) for j in range(rng.randrange(0, 10))}))
        for _ in range(rng.randrange(0, 3)):
            sp.links.append((rng.randbytes(16), rng.randbytes(8), {"hicache.hit": "dev", sc.RANK: 3}))
        if rng.random() < 0.3:
            sp.status_code = STATUS_ERROR
            sp.status_message = rng.choice(["", "H2: stale host ref"])
        out.append(sp)
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _assert_matches(spans: list[Span], rx: list, resource: dict) -> None:
    assert len(rx) == len(spans)
    for sp, r in zip(spans, rx, strict=False):
        assert r.resource == resource
        assert r.scope == sc.SCOPE_NAME
        assert (r.trace_id, r.span_id, r.name) == (sp.trace_id.hex(), sp.span_id.hex(), sp.name)
        assert (r.start_ns, r.end_ns, r.kind) == (sp.start, sp.end, 1)
        assert r.parent_span_id == ""
        assert list(r.attrs) == list(sp.attrs)
        for k, v in sp.attrs.items():
            assert _same(r.attrs[k], v), (k, v, r.attrs[k])
        assert len(r.events) == len(sp.events)
        for (ts, name, attrs), ev in zip(sp.events, r.events, strict=False):
            assert (ev.time_ns, ev.name) == (ts, name)
            assert [k for k, _ in ev.attr_list] == list(attrs)
            for (k, v), (_, rv) in zip(attrs.items(), ev.attr_list, strict=False):
                assert _same(rv, v), (k, v, rv)
        assert [(t, s) for t, s, _ in r.links] == [(t.hex(), s.hex()) for t, s, _ in sp.links]
        assert [a for _, _, a in r.links] == [a for _, _, a in sp.links]
        assert (r.status_code, r.status_message) == (sp.status_code, sp.status_message)


RESOURCE = {sc.SERVICE_NAME: "svc", sc.CP_RANK: 3, sc.PROCESS_PID: 12345, sc.RUN_ID: "r-1", "x.float": 0.25}


@pytest.mark.parametrize("seed", range(6))
def test_protobuf_encoding_decodes_with_opentelemetry_proto(seed: int) -> None:
    rng = random.Random(seed)
    spans = _spans(rng, 60)
    bodies = otlp.encode_requests([(RESOURCE, spans)])
    rx = []
    for b in bodies:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(b)
        # byte-exact against the reference serializer too (field order and packing are canonical)
        assert req.SerializeToString() == b
        rx.extend(flatten(req))
    _assert_matches(spans, rx, RESOURCE)


@pytest.mark.parametrize("seed", range(4))
def test_json_lines_parse_with_json_format(seed: int) -> None:
    rng = random.Random(100 + seed)
    spans = _spans(rng, 40)
    line = otlp_json.request_json([(RESOURCE, spans)])
    assert "\n" not in line
    d = json.loads(line)
    sp0 = d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert sp0["traceId"] == spans[0].trace_id.hex()  # hex ids, as the Collector's file exporter writes them
    assert isinstance(sp0["startTimeUnixNano"], str)
    _assert_matches(spans, flatten(parse_json_line(line)), RESOURCE)
    # and it is the same message as the protobuf encoding
    pb = trace_service_pb2.ExportTraceServiceRequest.FromString(otlp.encode_requests([(RESOURCE, spans)])[0])
    got = parse_json_line(line)
    for rs in got.resource_spans:  # the Collector writes "status":{} for unset; protobuf omits the empty message
        for ss in rs.scope_spans:
            for s in ss.spans:
                if s.status.code == 0 and not s.status.message:
                    s.ClearField("status")
    assert got == pb


def test_non_finite_floats_and_wide_ints() -> None:
    sp = Span(b"\x01" * 16, b"\x02" * 8, "n", 1, 0, ("k",), {"nan": float("nan"), "inf": float("inf"),
                                                           "ninf": float("-inf"), "wide": 1 << 70, "neg": -5})
    rx = flatten(trace_service_pb2.ExportTraceServiceRequest.FromString(otlp.encode_requests([(RESOURCE, [sp])])[0]))
    a = rx[0].attrs
    assert math.isnan(a["nan"]) and a["inf"] == math.inf and a["ninf"] == -math.inf
    assert a["wide"] == str(1 << 70) and a["neg"] == -5
    j = flatten(parse_json_line(otlp_json.request_json([(RESOURCE, [sp])])))[0].attrs
    assert math.isnan(j["nan"]) and j["inf"] == math.inf and j["wide"] == str(1 << 70) and j["neg"] == -5


def test_requests_split_below_limit() -> None:
    rng = random.Random(7)
    spans = []
    for i in range(300):
        sp = Span(rng.randbytes(16), rng.randbytes(8), "hicache.node", i, 0, ("k", i), {sc.NODE_ID: i})
        sp.events = [(i, "backup", {"hicache.blob": "z" * 2000, sc.SEQ: j}) for j in range(10)]
        spans.append(sp)
    limit = 256 * 1024
    bodies = otlp.encode_requests([(RESOURCE, spans[:150]), ({**RESOURCE, sc.CP_RANK: 4}, spans[150:])],
                                  max_bytes=limit)
    assert len(bodies) > 1
    assert all(len(b) <= limit for b in bodies)
    got = []
    for b in bodies:
        got.extend(flatten(trace_service_pb2.ExportTraceServiceRequest.FromString(b)))
    assert [r.attrs[sc.NODE_ID] for r in got] == list(range(300))
    assert {r.resource[sc.CP_RANK] for r in got[:150]} == {3} and {r.resource[sc.CP_RANK] for r in got[150:]} == {4}
    assert otlp.MAX_REQUEST_BYTES < 4 * 1024 * 1024  # below gRPC's default 4 MiB receive limit


def test_varint_matches_reference() -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    rng = random.Random(3)
    for n in [0, 1, 127, 128, 16383, 16384, (1 << 28), (1 << 63), (1 << 64) - 1] + [rng.getrandbits(64)
                                                                                   for _ in range(2000)]:
        assert otlp.varint(n) == _VarintBytes(n)


@pytest.mark.parametrize("seed", range(3))
def test_event_attrs_from_typed_fields_match_the_dict_path(seed: int) -> None:
    """Span events built by SpanBuilder keep typed fields (``EventAttrs``) and are encoded from them directly: the
    bytes must equal the plain-dict encoding, and decode with opentelemetry-proto to the same attributes, also for
    ranges, wide/negative ints, floats, non-ASCII text, bools, lists, repeated (cached) values and dotted names."""
    from cptrace_otel.model.attrs import EventAttrs
    from cptrace_otel.model.logline import parse_value

    rng = random.Random(seed)
    texts = ["(cnt=3,min=1,max=5,first=1,last=5)", "(cnt=2,min=0.5,max=1.5,first=0.5,last=1.5)", "[1,[2,3]]",
             "abc", "-7", "1.5", "(none)", "(0)", "nan", "-inf", str(1 << 70), "wt", "h\u00e9llo\u2713"]
    events = []
    for i in range(400):
        fields = {}
        for j in range(rng.randrange(0, 10)):
            v = rng.choice(texts + [rng.randrange(-10**6, 10**6), rng.randrange(0, 20000), rng.random(), 1 << 64,
                                    -(1 << 63), (1 << 63) - 1, True, [1, 2], "y" * rng.randrange(60, 70),
                                    rng.randrange(0, 1 << 62)])
            fields[rng.choice([f"k{j}", "dev", "io", "a.b" if rng.random() < 0.05 else f"k{j}"])] = (
                parse_value(v) if isinstance(v, str) else v)
        a = EventAttrs(fields, rng.choice([0, 7, 20000, 1 << 40]), rng.choice([0, 2, 300]), rng.choice([1, 2, 3]))
        if rng.random() < 0.05:
            a["cptrace.extra"] = 1  # a written-to EventAttrs falls back to its dict
        events.append((10**18 + i, "backup", a))  # non-zero times: proto3 omits zero scalars when re-serializing
    sp = Span(b"\x01" * 16, b"\x02" * 8, sc.SPAN_NODE, 10**18, 0, ("k",), {sc.RANK: 0})
    sp.events = events
    ref = Span(b"\x01" * 16, b"\x02" * 8, sc.SPAN_NODE, 10**18, 0, ("k",), {sc.RANK: 0})
    ref.events = [(ts, n, dict(a.items())) for ts, n, a in events]
    for _ in range(2):  # the second pass hits the value caches
        assert otlp.encode_span(sp) == otlp.encode_span(ref)
    body = otlp.encode_requests([(RESOURCE, [sp])])[0]
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    assert req.SerializeToString() == body
    _assert_matches([ref], flatten(req), RESOURCE)


def test_file_sink_writes_bounded_lines_that_parse_and_keep_every_span(tmp_path, monkeypatch) -> None:
    from cptrace_otel.export.file_sinks import OtlpJsonFileSink
    monkeypatch.setattr(OtlpJsonFileSink, "SPANS_PER_LINE", 7)
    rng = random.Random(9)
    other = dict(RESOURCE, **{sc.CP_RANK: 1})
    a, b = _spans(rng, 20), _spans(rng, 9)
    sink = OtlpJsonFileSink(str(tmp_path / "o.jsonl"))
    sink.export([(RESOURCE, a), (other, []), (other, b)])
    sink.export([(RESOURCE, a[:3])])
    sink.export([])
    sink.close()
    lines = (tmp_path / "o.jsonl").read_text().splitlines()
    per_line = [sum(len(ss["spans"]) for rs in json.loads(x)["resourceSpans"] for ss in rs["scopeSpans"])
                for x in lines]
    assert per_line == [7, 7, 7, 7, 1, 3] and sink.lines == len(lines)
    got = [s for x in lines for s in flatten(parse_json_line(x))]   # every line is a valid OTLP/JSON request
    _assert_matches(a, got[:20], RESOURCE)
    _assert_matches(b, got[20:29], other)
    _assert_matches(a[:3], got[29:], RESOURCE)


def test_request_bodies_gzip_through_isal_when_installed_else_zlib(monkeypatch) -> None:
    """The HTTP transport's compressor: ISA-L's deflate when ``isal`` imports (it is a dependency where it has
    wheels), the standard library's otherwise; either way a gzip member any reader decodes to the body."""
    import gzip
    import sys

    from cptrace_otel.export.otlp_http import HttpTransport, gzip_level1

    rng = random.Random(7)
    body = b"".join(rng.choice([b"hicache.prepare", b"\x0a\x10node_id", bytes([rng.randrange(256)])])
                    for _ in range(50_000))
    isal = pytest.importorskip("isal.igzip", reason="isal not installed (no wheel for this machine)")
    calls: list[int] = []
    real = isal.compress

    def spy(data: bytes, compresslevel: int = 2) -> bytes:
        calls.append(compresslevel)
        return real(data, compresslevel=compresslevel)

    monkeypatch.setattr(isal, "compress", spy)
    fast = gzip_level1()(body)
    assert calls == [1] and gzip.decompress(fast) == body
    # the transport's requests: ISA-L's gzip on the wire, decoded by the receiver; none with compression=none
    from tests.helpers.otlp_receiver import HttpReceiver

    req = otlp.encode_requests([({"service.name": "x"}, [Span(b"\x01" * 16, b"\x02" * 8, "s", 1, 0, (), {})])])[0]
    with HttpReceiver() as rx:
        HttpTransport(rx.url).send(req)
        HttpTransport(rx.url, compression="none").send(req)
        assert [h.get("content-encoding") for h in rx.headers] == ["gzip", None]
        assert len(rx.requests) == 2 and rx.requests[0] == rx.requests[1]
    assert calls == [1, 1]
    monkeypatch.setitem(sys.modules, "isal", None)   # as on a machine without it: the import fails
    plain = gzip_level1()(body)
    assert calls == [1, 1] and gzip.decompress(plain) == body
