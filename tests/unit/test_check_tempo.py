"""``check --tempo`` against a fake Tempo in its documented response formats (:mod:`tests.helpers.tempo_fixtures`;
Tempo itself
is AGPL and not run here): the run's findings are those of its files, also through small search pages; the TraceQL
is the documented run query; unreachable is exit 3; no --run-id is a usage error."""

from __future__ import annotations

import json

import pytest

from cptrace_otel.analyze.sources.tempo import run_query, run_trace_ids, traces_data
from tests.helpers.demo_run import check, core, run_demo
from tests.helpers.jaeger_fixtures import read_requests
from tests.helpers.tempo_fixtures import FakeTempo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = run_demo(tmp_path_factory.mktemp("demo"))
    _rc, out, _ = check("--json", *d["otlp"])
    d["want"] = core(out)
    d["reqs"] = read_requests(d["otlp"])
    return d


def test_tempo_gives_the_findings_of_the_files(demo):
    with FakeTempo(demo["reqs"]) as ft:
        rc, out, err = check("--json", "--tempo", ft.url, "--run-id", demo["run_id"], "--since", "3650d")
        assert rc == 1, err
        assert core(out) == demo["want"]
        assert json.loads(out)["stats"]["sources"]["tempo"] == [ft.url]
        assert {q["q"][0] for q in ft.queries} == {run_query(demo["run_id"])}


def test_full_pages_are_split_by_time():
    class Stub:   # 100 traces, one per second; a search returns at most `limit` of them, in no order
        calls = 0

        def search(self, q, a, b, limit):
            Stub.calls += 1
            return [{"traceID": f"t{s}"} for s in range(100) if a <= s <= b][::-1][:limit]

    ids = list(run_trace_ids(Stub(), "r", 0, 99, limit=10))
    assert sorted(ids) == sorted(f"t{s}" for s in range(100)) and Stub.calls > 10


def test_tempo_page_too_small_is_exit_3(demo):
    with FakeTempo(demo["reqs"]) as ft:   # Tempo's window is in whole seconds: a page cannot be split below one
        rc, _, err = check("--tempo", ft.url, "--run-id", demo["run_id"], "--since", "3650d", "--limit", "2")
    assert rc == 3 and "raise --limit" in err


def test_run_query_and_trace_formats():
    assert run_query('a"b') == '{ resource.cptrace.run_id = "a\\"b" }'
    rs = [{"resource": {}, "scopeSpans": []}]
    assert traces_data({"batches": rs}) == traces_data({"trace": {"resourceSpans": rs}}) == {"resourceSpans": rs}
    assert traces_data(None) == {"resourceSpans": []}


def test_tempo_unreachable_and_usage():
    rc, _, err = check("--tempo", "http://127.0.0.1:9", "--run-id", "r")
    assert rc == 3 and "cannot reach Tempo at http://127.0.0.1:9" in err
    rc, _, err = check("--tempo", "http://127.0.0.1:9")
    assert rc == 2 and "--run-id" in err


def test_tempo_run_not_there(demo):
    with FakeTempo(demo["reqs"]) as ft:
        rc, _, err = check("--tempo", ft.url, "--run-id", "no-such-run", "--since", "3650d")
    assert rc == 3 and "no trace of run no-such-run" in err


def test_one_unreadable_tempo_trace_costs_that_trace_only(demo):
    """One trace answered with a body that is not JSON and one with values of the wrong type: the others are
    checked and reported, both are named, exit 3 (never 0 for a run not read whole)."""
    with FakeTempo(demo["reqs"]) as ft:
        tids = sorted(ft.traces)
        broken, wrong = tids[0], tids[1]
        real = ft.trace

        def trace(tid):
            if tid == broken:
                return 200, "}"   # (json-encoded by the fake: a JSON string, not a trace)
            if tid == wrong:
                return 200, {"batches": [{"resource": 5, "scopeSpans": "x"}]}
            return real(tid)

        ft.trace = trace
        rc, out, err = check("--tempo", ft.url, "--run-id", demo["run_id"], "--since", "3650d")
    assert rc == 3, err
    assert "findings" in out and "no findings" not in out
    assert wrong in err and broken in err and "not a Tempo trace" in err and "could not be read" in err, err
