"""``cptrace-otel watch`` without a real backend: a demo run's traces in Jaeger's JSON model
(:mod:`_jaeger_fixtures`) fed to :class:`RunWatch` in pieces, out of order and twice give exactly ``check``'s
findings, each once; the watcher's own spans are no input; a seq gap holds a rank back and is given up after a few
polls; the write-back span carries the trace model's violation attributes and links to its evidence spans; the
Alertmanager payload keeps one alert per code, rank and run; ``watch --once`` against a fake Jaeger."""

from __future__ import annotations

import io
import json
import random

import pytest

from cptrace_otel.analyze.finding_sinks import ALERTNAME, Alerts, already_stamped, finding_span, finding_trace
from cptrace_otel.analyze.incremental import GAP_POLLS, WATCH_SERVICE, RunWatch
from cptrace_otel.cli import parse_args
from cptrace_otel.commands import watch as watch_cmd
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.trace_ids import node_trace_id
from tests.helpers.demo_run import check, core, run_demo
from tests.helpers.jaeger_fixtures import FakeJaeger, read_requests, v2_traces


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = run_demo(tmp_path_factory.mktemp("demo"))
    rc, out, _ = check("--json", *d["otlp"])
    assert rc == 1
    d["want"] = sorted(json.dumps(f, sort_keys=True) for f in core(out))
    d["traces"] = v2_traces(read_requests(d["otlp"]))
    return d


def _core(findings) -> list[str]:
    from cptrace_otel.analyze.result_output import finding_dict

    drop = ("src", "line_no", "evidence_lines", "trace_id", "jaeger_url")
    return sorted(json.dumps({k: v for k, v in finding_dict(f).items() if k not in drop}, sort_keys=True)
                  for f in findings)


def test_pieces_out_of_order_and_twice_give_checks_findings_once(demo):
    traces = list(demo["traces"])
    random.Random(3).shuffle(traces)
    half = len(traces) // 2
    w = RunWatch(demo["run_id"])
    got = []
    for batch in (traces[half:], traces[:half] + traces[half:]):   # the second poll sees everything again
        for tr in batch:
            w.add_trace(tr)
        got += w.step()
    got += w.finish()
    assert _core(got) == demo["want"]
    assert w.events == sum(1 for t in traces for s in t["spans"] for lg in s["logs"]
                           if any(x["key"] == sc.SEQ for x in lg["fields"]))


def test_own_spans_are_no_input(demo):
    w = RunWatch(demo["run_id"])
    for tr in v2_traces(read_requests(demo["otlp"]), service=WATCH_SERVICE):
        w.add_trace(tr)
    assert w.pending() == 0 and w.step() == [] and w.events == 0


def test_a_gap_holds_a_rank_back_then_is_given_up(demo):
    notes = []
    w = RunWatch(demo["run_id"], note=notes.append)
    first = min(demo["traces"], key=lambda t: min(s["startTime"] for s in t["spans"]))
    rest = [t for t in demo["traces"] if t is not first]
    for tr in rest:
        w.add_trace(tr)
    w.step()
    held = w.pending()
    assert held > 0   # a rank whose first records are missing waits for them
    for _ in range(GAP_POLLS + 1):
        w.step()
    assert w.pending() < held and any("are not in Jaeger" in n for n in notes), notes


def test_write_back_span_carries_the_violation_and_links_the_evidence(demo):
    w = RunWatch(demo["run_id"])
    for tr in demo["traces"]:
        w.add_trace(tr)
    found = w.step() + w.finish()
    cross = [f for f in found if f.code in ("C1", "C3")]
    assert cross
    ids = {(s["traceID"], s["spanID"]) for t in demo["traces"] for s in t["spans"]}
    for f in cross:
        assert not already_stamped(w, f)
        sp = finding_span(w, f, 0)
        assert sp.trace_id == node_trace_id(demo["run_id"], f.epoch, f.node_id) == finding_trace(demo["run_id"], f)
        assert sp.attrs[sc.VIOLATION] == f.code and sp.attrs[sc.RANK] == f.rank and sp.status_code == 2
        assert [e[1] for e in sp.events] == [sc.EVENT_VIOLATION]
        assert sp.links and all((t.hex(), s.hex()) in ids for t, s, _ in sp.links)
        assert finding_span(w, f, 1).span_id == sp.span_id   # the same finding, the same span
    # the exporter stamped HASH online: not written twice
    assert all(already_stamped(w, f) for f in found if f.code == "HASH")


def test_alerts_one_per_code_rank_run_reposted_with_the_same_labels():
    class F:
        code, rule, rank, node_id, message = "C3", "C3", 2, 7, "prepare on ranks [0, 1] but not on rank 2"

    a = Alerts("http://127.0.0.1:9", 30.0, hold_s=100.0)
    a.found("run-1", F, "http://j/trace/ab", now=1000.0)
    a.found("run-1", F, "http://j/trace/ab", now=1010.0)
    (p1,) = a.payload(now=1010.0)
    (p2,) = a.payload(now=1040.0)
    assert p1["labels"] == p2["labels"] == {"alertname": ALERTNAME, "severity": "page", "code": "C3", "rank": "2",
                                            "run_id": "run-1"}
    assert p1["startsAt"] == p2["startsAt"] and p2["endsAt"] > p1["endsAt"]
    assert "2 findings" in p1["annotations"]["message"] and p1["annotations"]["jaeger"] == "http://j/trace/ab"
    assert a.payload(now=1200.0) == []   # past hold_s: no longer posted, resolves at its endsAt
    notes = []
    b = Alerts("http://127.0.0.1:9", 30.0, note=notes.append)
    b.found("run-1", F, "x")
    assert b.post() is False and b.post() is False and len(notes) == 1   # one line while unreachable


def test_watch_once_against_a_fake_jaeger(demo):
    with FakeJaeger(demo["traces"]) as fj:
        args = parse_args(["watch", "--jaeger", fj.url, "--run-id", demo["run_id"], "--once",
                                     "--since", "3650d"])
        out, err = io.StringIO(), io.StringIO()
        rc = watch_cmd.run(args, out, err)
    assert rc == 1, err.getvalue()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(demo["want"])
    for f in map(json.loads, demo["want"]):
        tid = node_trace_id(demo["run_id"], f["epoch"], f["node_id"]).hex()
        assert any(f" {f['code']} " in ln and ln.endswith(f"/trace/{tid}") for ln in lines), (f, lines)


def test_watch_unreachable_at_start(capsys):
    args = parse_args(["watch", "--jaeger", "http://127.0.0.1:9", "--once"])
    err = io.StringIO()
    assert watch_cmd.run(args, io.StringIO(), err) == 3 and "127.0.0.1:9" in err.getvalue()
