"""The before/after tools' own logic (``bench/same_behaviour.py``, ``bench/compare_trees.py``): splitting OTLP
requests into their parts (exact bytes), locating the first difference, parsing the benchmarks' printed figures.
Independent of the package's internals: the inputs are built with opentelemetry-proto and by hand."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    saved = list(sys.path)   # the scripts put bench/ on sys.path for their helper module
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = saved


sb = _load("same_behaviour")
ct = _load("compare_trees")


def _request(spans_per_rs: list[list[str]]) -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2

    req = trace_service_pb2.ExportTraceServiceRequest()
    for i, names in enumerate(spans_per_rs):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(common_pb2.KeyValue(key="r", value=common_pb2.AnyValue(int_value=i)))
        ss = rs.scope_spans.add()
        ss.scope.name = "cptrace_otel"
        for n in names:
            sp = ss.spans.add()
            sp.name = n
            sp.trace_id = b"\x01" * 16
            sp.span_id = b"\x02" * 8
            sp.start_time_unix_nano = 2**62
    return req.SerializeToString()


def test_pb_parts_are_the_exact_bytes_of_each_part() -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    body = _request([["a", "b"], ["c"]])
    parts = list(sb.pb_parts(body))
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    spans = [s.SerializeToString() for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [v for k, v in parts if k == "span"] == spans
    assert [k for k, _ in parts] == ["resource_spans.1", "scope_spans.1", "span", "span",
                                     "resource_spans.1", "scope_spans.1", "span"]


def test_cuts_do_not_matter_but_bytes_do() -> None:
    one = list(sb.pb_parts(_request([["a", "b", "c"]])))
    # the same spans cut into two requests (each carrying the same resource r=0 and scope)
    two = [*sb.pb_parts(_request([["a"]])), *sb.pb_parts(_request([["b", "c"]]))]
    assert sb.without_cuts(iter(one), sb.show_bytes) == sb.without_cuts(iter(two), sb.show_bytes)
    other = list(sb.pb_parts(_request([["a", "b", "d"]])))
    assert sb.without_cuts(iter(one), sb.show_bytes) != sb.without_cuts(iter(other), sb.show_bytes)


def test_json_parts_keep_the_text_as_written() -> None:
    span1 = '{"name":"a","attributes":[{"key":"k","value":{"stringValue":"x]}\\"y"}}]}'
    span2 = '{"name":"b","x":1.50}'
    line = ('{"resourceSpans":[{"resource":{"attributes":[]},"scopeSpans":[{"scope":{"name":"s"},'
            f'"spans":[{span1}, {span2}]}}]}}]}}')
    json.loads(line)
    assert sb.json_parts(line) == [("resourceSpans.resource", '{"attributes":[]}'),
                                    ("scopeSpans.scope", '{"name":"s"}'), ("span", span1), ("span", span2)]


def test_first_difference_names_artifact_line_and_column() -> None:
    a = {"stdout": b"x\nabc\n", "_seconds": b"1"}
    assert sb.first_difference(a, {"stdout": b"x\nabc\n", "_seconds": b"2"}) is None
    d = sb.first_difference(a, {"stdout": b"x\nabd\n"})
    assert d is not None and d.startswith("stdout line 2 col 3")
    assert "only in current ['file x']" in sb.first_difference(a, {"stdout": b"x\nabc\n", "file x": b""})


CHECK_OUT = """\
  raw        20002 events     0.06s     355,846 ev/s (CPU time:  1,641,046 ev/s)  peak RSS    15.2 MiB  findings=None
  parse      20002 events     0.43s      45,987 ev/s (CPU time:    206,089 ev/s)  peak RSS    28.0 MiB  findings=None
  ours       20002 events     1.00s      19,914 ev/s (CPU time:     86,690 ev/s)  peak RSS    29.9 MiB  findings=0
  ours / raw line read: 0.056x
  raw         7,541 instructions/event (valgrind, net of start-up and imports)
  parse      -1,050 instructions/event (valgrind, net of start-up and imports)
  ours       34,771 instructions/event (valgrind, net of start-up and imports)
  rules      28,721 instructions/event (ours - parse: per-rank and cross-rank rules, report)
"""
EXPORT_OUT = """\
sdk  :      3885 events/s end to end (20000 events, emit 2.33s, flushed after 5.15s, ok=True); traced process CPU 59.74 ms per 1,000 events; delivered 20000
ours :     12650 events/s end to end (20000 events, emit 0.28s, flushed after 1.58s, ok=True); traced process CPU 3.59 ms per 1,000 events; exporter process CPU 27.90 ms per 1,000 events; delivered 20000; dropped 0
"""
HOT_OUT = """\
  upstream (env gate + _fmt + logger.info -> FileHandler):     93036 ns/call wall,     21111 ns/call caller CPU
  ours (bounded buffer append; drainer + exporter process):      3383 ns/call wall,       823 ns/call caller CPU
  upstream (env re-read):  2597.9 ns/call;  ours:   164.3 ns/call (bar <= 100 ns); ratio 15.8x  [timeit loop overhead 6.2 ns included]
  empty function, same args:  1965.7 ns/call;  ours:  1936.5 ns/call; ratio 0.99x (bar <= 1.2x)
"""


@pytest.mark.parametrize("bench,out,expect", [
    ("check", CHECK_OUT, {"check: ours, events/s (CPU time)": 86690, "check: ours, events/s (wall)": 19914,
                          "check: parse (reader alone), events/s (CPU time)": 206089,
                          "check: ours, peak RSS MiB": 29.9, "check: ours, instructions/event": 34771,
                          "check: parse, instructions/event": -1050, "check: rules, instructions/event": 28721,
                          "check: raw line read, events/s (CPU time) [control]": 1641046}),
    ("export", EXPORT_OUT, {"export: ours, events/s end to end": 12650,
                            "export: traced process CPU ms/1k events": 3.59,
                            "export: exporter process CPU ms/1k events": 27.90,
                            "export: SDK, events/s end to end [control]": 3885}),
    ("hot", HOT_OUT, {"hot: enabled cptrace, ns/call wall": 3383, "hot: enabled cptrace, ns/call caller CPU": 823,
                      "hot: trace_enabled() off, ns/call": 164.3, "hot: below-level cptrace, ns/call": 1936.5,
                      "hot: upstream enabled cptrace, ns/call caller CPU [control]": 21111,
                      "hot: empty function call, ns/call [control]": 1965.7}),
])
def test_compare_trees_parses_every_figure(bench: str, out: str, expect: dict) -> None:
    assert ct.parse(bench, out) == expect


def test_change_is_signed_better_positive() -> None:
    assert ct.change(100.0, 110.0, higher_better=True) == pytest.approx(0.10)
    assert ct.change(100.0, 110.0, higher_better=False) == pytest.approx(100 / 110 - 1)


def test_checker_cost_export_stream_is_clean_and_a_zero_backup_is_found() -> None:
    """bench/checker_cost.py's exporter stream is the clean d2h cycle it claims (at level 2: every copy acked, no
    finding), and the harness reports what the checker finds (an nz=0 backup of 4 slots is ZERO@backup there)."""
    from cptrace_otel.model.logline import Rng

    cc = _load("checker_cost")
    events = cc.export_events(2000)
    n, found = cc.feed(events, 2)
    assert n == 2001 and found == []
    bad = next(ev for ev in events if ev.tag == "backup" and ev.fields["node_id"] == 7)
    bad.fields["nz"] = 0
    bad.fields["dev"] = Rng(4, 0, 3, 0, 3)   # (the stream's dev=1234 is no slot set: nothing to call all-zero)
    _, found = cc.feed(events, 2)
    assert [(f.rule, f.node_id, f.evidence) for f in found] == [("ZERO@backup", 7, [bad.seq])]
    assert cc.digest(found) != cc.digest([])
