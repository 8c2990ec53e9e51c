"""The C encoder of span events (``_speedups/otlp.c``) writes exactly the bytes of the Python encoder, for the common
events it encodes itself and for every odd event it hands back to Python; both decode with opentelemetry-proto.

Skipped when the extension was not built (no compiler), unless ``CPTRACE_REQUIRE_SPEEDUPS=1`` (``.ci/run``), which
turns a missing build into a failure."""

from __future__ import annotations

import os
import random

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from cptrace_otel.export import otlp_proto as otlp
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.attrs import EventAttrs
from cptrace_otel.model.logline import Rng
from cptrace_otel.model.spans import Span

if otlp._span_events is None:
    if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
        pytest.fail("cptrace_otel._speedups._otlp was not built (CPTRACE_REQUIRE_SPEEDUPS=1)", pytrace=False)
    pytest.skip("cptrace_otel._speedups._otlp not built", allow_module_level=True)

C = otlp._span_events


def _python(events: list) -> bytes:
    return b"".join([otlp._event_field(ts, name, a) for ts, name, a in events])


def _value(rng: random.Random):
    return rng.choice([
        rng.randrange(0, 16384), rng.randrange(16384, 1 << 62), rng.randrange(-(1 << 63), 0), (1 << 63) - 1,
        -(1 << 63), 1 << 63, -(1 << 63) - 1, 1 << 70, True, False, 0.5, float("nan"),
        "wt", "", "h\u00e9llo\u2713", "bad\ud800surrogate", "x" * rng.randrange(60, 200),
        Rng(64, 0, 63, 0, 63), Rng(2, -5, 1 << 62, 3, 4), Rng(1, 1 << 63, 0, 0, 0), Rng(2, 0.5, 1.5, 0.5, 1.5),
        [], [1], [rng.randrange(-10**9, 10**9) for _ in range(rng.randrange(1, 8))], [1, 1 << 64], [1, "a"],
        [True], list(range(4097)), None, (1, 2),
    ])


def _events(rng: random.Random, n: int) -> list:
    out = []
    for i in range(n):
        fields = {}
        for j in range(rng.randrange(0, 9)):
            key = rng.choice([f"k{j}", "node_id", "dev", "pub", "a.b" if rng.random() < 0.05 else "op",
                              "\u00fcber" if rng.random() < 0.05 else "h"])
            fields[key] = _value(rng)
        a = EventAttrs(fields, rng.choice([0, 7, 20000, 1 << 40, 1 << 63]), rng.choice([0, 2, 300, -1]),
                       rng.choice([1, 2, 3]))
        if rng.random() < 0.05:
            a["cptrace.extra"] = 1   # dirty: the dict path
        if rng.random() < 0.05:
            a = {"hicache.node_id": 3, "x": 0.25}   # a plain dict of attributes (annotations)
        ts = rng.choice([10**18 + i, 0, -1, (1 << 64) + 5])
        name = rng.choice(["backup", "ack", "evict", "\u00e9v\u00e9nement", "bad\udc80name"])
        out.append((ts, name, a))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_c_encoder_writes_the_python_bytes(seed: int) -> None:
    rng = random.Random(seed)
    events = _events(rng, 300)
    for _ in range(2):   # the second pass hits the Python encoder's caches in the fallback
        assert C(events, otlp._event_field) == _python(events)


def test_common_events_never_reach_the_fallback() -> None:
    """The C encoder covers the exporter's usual events itself (otherwise it would not be worth having)."""
    fields = {"node_id": 7, "op": 1 << 40, "dev": Rng(64, 0, 63, 0, 63), "kind": "new", "pub": [7, 8],
              "h": -(1 << 63), "hp": []}
    events = [(10**18 + i, "backup", EventAttrs(dict(fields), i, 0, 1)) for i in range(50)]

    def refuse(*a):
        raise AssertionError(f"fallback called for {a!r}")

    assert C(events, refuse) == _python(events)


def test_c_encoder_output_decodes_with_opentelemetry_proto() -> None:
    rng = random.Random(11)
    events = _events(rng, 200)
    sp = Span(b"\x01" * 16, b"\x02" * 8, sc.SPAN_NODE, 10**18, 0, ("k",), {sc.RANK: 0})
    sp.events = events
    body = otlp.encode_requests([({sc.SERVICE_NAME: "svc"}, [sp])])[0]
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)   # (zero times: no byte-exact re-encode)
    got = req.resource_spans[0].scope_spans[0].spans[0].events
    assert len(got) == len(events)
    for (ts, _name, a), ev in zip(events, got, strict=False):
        assert ev.time_unix_nano == ts & ((1 << 64) - 1)
        assert [kv.key for kv in ev.attributes] == list(a.keys())


def test_bad_input_is_an_error_not_a_crash() -> None:
    with pytest.raises(TypeError):
        C([("not", "a triple")], otlp._event_field)
    with pytest.raises(TypeError):
        C([(1, "x", {})], lambda *a: "not bytes")
    with pytest.raises(ZeroDivisionError):
        C([(1, "x", {})], lambda *a: 1 / 0)
    assert C([], otlp._event_field) == b""


def _spans(rng: random.Random, n: int) -> list:
    """Spans of every shape: common ones (int/str attributes, no links, no status) and odd ones the C encoder hands
    back to Python (a bool / float / huge-int / surrogate attribute, links, a status, ids of a wrong size)."""
    out = []
    for i in range(n):
        attrs = {sc.RANK: rng.choice([0, 3, -1]), sc.NODE_ID: rng.randrange(0, 1 << 40), sc.SPAN_KIND: "hicache.d2h"}
        odd = rng.random()
        if odd < 0.05:
            attrs[sc.CONTINUES] = True
        elif odd < 0.1:
            attrs["x.float"] = 0.5
        elif odd < 0.15:
            attrs["x.huge"] = 1 << 64
        elif odd < 0.2:
            attrs["x.bad"] = "bad\ud800"
        elif odd < 0.25:
            attrs["x.\u00fcber"] = "h\u00e9llo"
        name = rng.choice([sc.SPAN_NODE, "rank 3 \u00b7 d2h", "bad\udc80name"])
        tid = rng.choice([bytes([i % 251 + 1]) * 16, b"\x01" * 15])
        sp = Span(tid, bytes([i % 7 + 1]) * 8, name, rng.choice([10**18 + i, -1, 1 << 65]), 0, ("k", i), attrs,
                  rng.choice([b"", b"\x09" * 8, b"\x09" * 4]))
        sp.end = sp.start + rng.randrange(0, 10**9)
        sp.events = _events(rng, rng.randrange(0, 6))
        if rng.random() < 0.1:
            sp.links.append((b"\x05" * 16, b"\x06" * 8, {sc.LINK_KIND: "continues"}))
        if rng.random() < 0.1:
            sp.status_code, sp.status_message = 2, "H1: bad"
        out.append(sp)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_c_span_encoder_writes_the_python_bytes(seed: int) -> None:
    rng = random.Random(100 + seed)
    spans = _spans(rng, 200)
    want = [otlp._span_field(sp) for sp in spans]
    assert otlp._span_fields(spans, otlp._span_field, otlp._event_field) == want
    body = otlp.encode_requests([({sc.SERVICE_NAME: "svc"}, spans)])[0]
    saved = otlp._span_fields
    try:
        otlp._span_fields = None   # the pure-Python request encoder: the same request bytes
        assert otlp.encode_requests([({sc.SERVICE_NAME: "svc"}, spans)])[0] == body
    finally:
        otlp._span_fields = saved


def test_common_spans_never_reach_the_span_fallback() -> None:
    spans = _spans(random.Random(7), 400)
    common = [sp for sp in spans if not sp.links and not sp.status_code and len(sp.trace_id) == 16
              and len(sp.parent) in (0, 8) and all(type(v) in (int, str) for v in sp.attrs.values())
              and all(type(v) is str or -(1 << 63) <= v < (1 << 63) for v in sp.attrs.values())
              and "\udc80" not in sp.name and not any(type(v) is str and "\ud800" in v for v in sp.attrs.values())]
    assert len(common) > 30

    def refuse(sp):
        raise AssertionError(f"span fallback called for {sp!r}")

    assert otlp._span_fields(common, refuse, otlp._event_field) == [otlp._span_field(sp) for sp in common]


def test_span_encoder_bad_input_is_an_error_not_a_crash() -> None:
    sp = _spans(random.Random(1), 1)[0]
    sp.links.append((b"\x05" * 16, b"\x06" * 8, {}))   # the fallback path
    with pytest.raises(TypeError):
        otlp._span_fields([sp], lambda s: "not bytes", otlp._event_field)
    with pytest.raises(AttributeError):
        otlp._span_fields([object()], otlp._span_field, otlp._event_field)
    assert otlp._span_fields([], otlp._span_field, otlp._event_field) == []


@pytest.mark.parametrize("seed", range(4))
def test_c_sizer_gives_the_python_estimate(seed: int) -> None:
    """The exporter's span builder sizes events with the C ``approx_bytes``: the same number as the model's, so the
    span byte cap cuts spans at the same record."""
    from cptrace_otel.model.attrs import approx_bytes

    class Sub(str):
        pass

    rng = random.Random(200 + seed)
    for _ in range(300):
        fields = {f"k{j}": _value(rng) for j in range(rng.randrange(0, 9))}
        if rng.random() < 0.1:
            fields["s"] = Sub("sub")
        assert otlp.sizer(fields) == approx_bytes(fields)
    with pytest.raises(TypeError):
        otlp.sizer([1, 2])
