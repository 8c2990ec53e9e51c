"""Request links (cptrace_otel.model.reqlink, the span builder, the SGLang-side capture): the ``req_span`` field, the
OTLP link on the span holding the record, and that a bad or missing context never costs the record.

The test against SGLang's own tracing module is tests/sglang_real/test_reqlink_real.py; here the capture runs
against the real opentelemetry-sdk with stand-ins for SGLang's request objects.
"""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from cptrace_otel.export import otlp_proto
from cptrace_otel.model import reqlink, semconv as sc
from cptrace_otel.model.events import Event
from cptrace_otel.model.logline import parse_line, render_line
from cptrace_otel.model.spans import SpanBuilder
from tests.helpers.otlp_receiver import flatten

TID, SID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
GOOD = f"{TID}-{SID}"


def test_format_and_parse_round_trip():
    v = reqlink.format_context(int(TID, 16), int(SID, 16))
    assert v == GOOD
    assert reqlink.parse_context(v) == (bytes.fromhex(TID), bytes.fromhex(SID))
    # SGLang's id generator makes 64-bit trace ids: the upper half is zero, still valid
    assert reqlink.format_context(5, 7) == "0" * 31 + "5-" + "0" * 15 + "7"


@pytest.mark.parametrize("bad", [None, 5, 5.0, b"x", GOOD.upper(), GOOD + "0", "0" * 32 + "-" + SID,
                                 TID + "-" + "0" * 16, TID + SID, TID + ":" + SID, " " + GOOD, GOOD + "\n",
                                 f"{TID}-{SID[:-1]}g", ["x"]])
def test_parse_rejects_anything_else(bad):
    assert reqlink.parse_context(bad) is None


@pytest.mark.parametrize("t,s", [(0, 1), (1, 0), (1 << 128, 1), (1, 1 << 64), (-1, 1), ("1", 1), (True, 1), (1.0, 1)])
def test_format_rejects_invalid_ids(t, s):
    assert reqlink.format_context(t, s) is None


@pytest.mark.parametrize("value", [GOOD, "1" * 32 + "-" + "2" * 16, "0" * 31 + "1e-" + "0" * 14 + "12"])
def test_the_field_stays_a_string_through_a_log_line(value):
    pl = parse_line(render_line("rid_map", {"rid": "r1", "node_id": 3, "hit": "dev", "req_span": value}))
    assert pl is not None and pl.fields["req_span"] == value


def test_log_files_give_the_same_links(tmp_path):
    # check/ingest read log lines with the log reader (its C fast path when built): the field stays the string it
    # was, and the span builder links it as for live records
    from cptrace_otel.analyze.sources.logs import read_log_events

    digits = "1" * 32 + "-" + "2" * 16
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"[2026-09-21 14:13:20 ATTN_CP0 TP0] [CPTRACE rid_map] rid=r{i} node_id=3 hit=dev "
                           f"req_span={v} rank=0 ts={5 + i}\n" for i, v in enumerate([GOOD, digits, "bad"])))
    evs = list(read_log_events([str(log)]))
    assert [e.fields["req_span"] for e in evs] == [GOOD, digits, "bad"]
    b = SpanBuilder("run1")
    for e in evs:
        b.add(e)
    b.close_all()
    lane = _lane(b.take(), 3)
    assert [(t.hex(), s.hex()) for t, s, _ in _request_links(lane)] == [(TID, SID), ("1" * 32, "2" * 16)]


def _ev(seq, tag="rid_map", rank=0, ts=None, **f):
    return Event(tag, rank, seq, ts if ts is not None else 1_000 + seq, 0, f)


def _lane(spans, node):
    (lane,) = [s for s in spans if s.kind == sc.SPAN_NODE and s.attrs.get(sc.NODE_ID) == node]
    return lane


def _request_links(sp):
    return [lk for lk in sp.links if lk[2].get(sc.LINK_KIND) == reqlink.LINK_KIND]


def test_rid_map_with_a_request_span_links_the_node_lane_once_per_request():
    b = SpanBuilder("run1")
    b.add(_ev(1, "insert", node_id=7, parent=0, len=4, dev="(cnt=4,min=0,max=3,first=0,last=3)", kind="new"))
    b.add(_ev(2, rid="r1", node_id=7, hit="dev", req_span=GOOD))
    b.add(_ev(3, rid="r1", node_id=7, hit="dev", req_span=GOOD))      # the same request again: one link
    other = f"{TID[:-1]}d-{SID}"
    b.add(_ev(4, rid="r2", node_id=7, hit="dev", req_span=other))
    b.close_all()
    spans = b.take()
    lane = _lane(spans, 7)
    links = _request_links(lane)
    assert [(t.hex(), s.hex(), a[sc.RID]) for t, s, a in links] == [(TID, SID, "r1"), (other[:32], SID, "r2")]
    assert all(a[sc.LINK_KIND] == "request" for _, _, a in links)
    # the record keeps the field as an event attribute (searchable), and the lane its rid
    assert [dict(e[2]).get(sc.field_key("req_span")) for e in lane.events if e[1] == "rid_map"] == [GOOD, GOOD, other]
    # the project's own request trace still links to the lane, as before
    req = [s for s in spans if s.kind == sc.SPAN_REQUEST and s.attrs[sc.RID] == "r1"]
    assert req and req[0].links[0][:2] == (lane.trace_id, lane.span_id)


@pytest.mark.parametrize("bad", ["", "nonsense", GOOD.upper(), "0" * 32 + "-" + "0" * 16, 12345, "(err:ValueError)"])
def test_a_bad_request_span_costs_only_the_link(bad):
    b = SpanBuilder("run1")
    held = b.add(_ev(1, rid="r1", node_id=7, hit="dev", req_span=bad))
    b.close_all()
    spans = b.take()
    lane = _lane(spans, 7)
    assert held is lane and len(lane.events) == 1 and lane.attrs[sc.RID] == "r1"
    assert _request_links(lane) == [] and sc.REQUEST_LINKS_DROPPED not in lane.attrs


def test_links_past_the_cap_are_counted_not_kept():
    b = SpanBuilder("run1")
    n = reqlink.MAX_LINKS + 5
    for i in range(n):
        b.add(_ev(i + 1, rid=f"r{i}", node_id=3, hit="dev", req_span=reqlink.format_context(i + 1, i + 1)))
    b.close_all()
    lane = _lane(b.take(), 3)
    assert len(_request_links(lane)) == reqlink.MAX_LINKS
    assert lane.attrs[sc.REQUEST_LINKS_DROPPED] == 5
    assert len(lane.events) == n


def test_any_record_with_the_field_links_the_span_that_holds_it():
    # an L3 prefetch made for a request: its stage span links that request (the L3 sites may pass the field)
    b = SpanBuilder("run1")
    held = b.add(_ev(1, "l3_prefetch", op=4, rid="r9", node_id=2, keys="[k1]", host="(cnt=4,min=0,max=3,first=0,"
                                                                             "last=3)", req_span=GOOD))
    b.close_all()
    spans = b.take()
    (pf,) = [s for s in spans if s.kind == sc.SPAN_L3_PREFETCH]
    assert held is pf and [lk[:2] for lk in _request_links(pf)] == [(bytes.fromhex(TID), bytes.fromhex(SID))]


def test_the_link_is_in_the_encoded_otlp_bytes():
    b = SpanBuilder("run1")
    b.add(_ev(1, rid="r1", node_id=7, hit="dev", req_span=GOOD))
    b.close_all()
    bodies = otlp_proto.encode_requests([({sc.SERVICE_NAME: "sglang-hicache"}, b.take())])
    rx = [s for body in bodies for s in flatten(trace_service_pb2.ExportTraceServiceRequest.FromString(body))]
    (lane,) = [s for s in rx if s.attrs.get(sc.SPAN_KIND) == sc.SPAN_NODE]
    assert (TID, SID, {sc.LINK_KIND: "request", sc.RID: "r1"}) in lane.links


# -- the traced side: capture from SGLang-shaped request objects, with the real opentelemetry-sdk ------------------
class _Null:
    """SGLang's TraceNullContext: every attribute is itself, tracing_enable False."""

    tracing_enable = False

    def __getattr__(self, name):
        return self

    def __call__(self, *a, **k):
        return self


class _Ctx:
    def __init__(self, **kw):
        self.tracing_enable = True
        self.events = []
        self.__dict__.update(kw)

    def trace_event(self, name, level, ts=None, attrs=None):
        self.events.append((name, level, attrs))


class _Req:
    def __init__(self, ctx):
        self.time_stats = type("TS", (), {})()
        self.time_stats.trace_ctx = ctx


@pytest.fixture
def tracer():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider().get_tracer("test")


def test_capture_from_the_root_span_or_its_propagated_context(tracer):
    from opentelemetry import propagate, trace

    from cptrace_otel.traced.sglang._reqlink import request_fields

    root = tracer.start_span("Req abc")
    c = root.get_span_context()
    want = {"req_span": f"{c.trace_id:032x}-{c.span_id:016x}"}
    assert request_fields(_Req(_Ctx(root_span=root))) == want
    # the scheduler's copy: only the context extracted from the W3C carrier the tokenizer propagated
    carrier: dict = {}
    propagate.inject(carrier, trace.set_span_in_context(root))
    assert request_fields(_Req(_Ctx(root_span=None, root_span_context=propagate.extract(carrier)))) == want
    root.end()


@pytest.mark.parametrize("req", [None, object(), _Req(None), _Req(_Null()), _Req(_Ctx()),
                                 _Req(_Ctx(root_span=object())), _Req(_Ctx(root_span=None, root_span_context={})),
                                 _Req(_Ctx(tracing_enable=1, root_span=None))])
def test_capture_without_a_usable_context_gives_no_field_and_never_raises(req):
    from cptrace_otel.traced.sglang._reqlink import request_fields

    assert request_fields(req) == {}


def test_the_way_back_uses_sglangs_trace_event_and_survives_its_failure():
    from cptrace_otel.traced.sglang import _reqlink

    ctx = _Ctx()
    _reqlink.note_node(_Req(ctx), 12, "host")
    ((name, level, attrs),) = ctx.events
    assert (name, level) == ("cptrace.node", 1)
    assert attrs[sc.NODE_ID] == 12 and attrs["hicache.hit"] == "host" and isinstance(attrs[sc.RUN_ID], str)
    _reqlink.note_node(_Req(_Null()), 12, "dev")      # not traced: nothing, no error

    class Broken(_Ctx):
        def trace_event(self, *a, **k):
            raise RuntimeError("exporter gone")

    _reqlink.note_node(_Req(Broken()), 12, "dev")     # SGLang's failure costs the event only
