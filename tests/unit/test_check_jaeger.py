"""``cptrace-otel check --jaeger URL`` against a fake query service with the memory store's search semantics
(:mod:`tests.helpers.jaeger_fixtures`): the run's findings as from its files, pagination past the search depth, the
search depth lowered when refused, run-id discovery, and the errors (unreachable, HTTP error, nothing found) as exit
3 with the URL and no password."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from cptrace_otel.analyze.sources.jaegerquery import parse_duration, parse_time, window
from tests.helpers.demo_run import check, core, run_demo
from tests.helpers.jaeger_fixtures import FakeJaeger, read_requests, v2_traces


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = run_demo(tmp_path_factory.mktemp("demo"))
    d["traces"] = v2_traces(read_requests(d["otlp"]), seed=5)
    return d


def _other_run(traces: list[dict], run_id: str) -> list[dict]:
    out = copy.deepcopy(traces)
    for tr in out:
        tr["traceID"] = "f" + tr["traceID"][1:]
        for sp in tr["spans"]:
            sp["traceID"] = tr["traceID"]
        for p in tr["processes"].values():
            for t in p["tags"]:
                if t["key"] == "cptrace.run_id":
                    t["value"] = run_id
    return out


def test_check_from_jaeger_reports_what_the_files_report(demo):
    rc0, out0, _ = check("--json", *demo["otlp"])
    with FakeJaeger(demo["traces"]) as fj:
        rc, out, err = check("--json", "--jaeger", fj.url, "--run-id", demo["run_id"], "--no-progress")
        assert rc == rc0 == 1 and core(out) == core(out0), err
        got = json.loads(out)
        assert got["stats"]["events"] == 832 and got["stats"]["sources"]["jaeger"] == [fj.url]
        assert all(f["src"].startswith(fj.url + "/trace/") for f in got["findings"])
        assert f"read {len(demo['traces'])} traces (832 records) of run {demo['run_id']}" in err
        q = fj.queries[0]
        assert q["raw"] == ["true"] and json.loads(q["tags"][0]) == {"cptrace.run_id": demo["run_id"]}
        assert q["service"] == ["sglang-hicache"]
        # the text report is the one of the OTLP files with the same trace links
        rc1, text1, _ = check("--jaeger-url", fj.url, *demo["otlp"])
        rc2, text2, _ = check("--jaeger", fj.url, "--run-id", demo["run_id"])
        assert rc1 == rc2 == 1 and text1 == text2


def test_pagination_past_the_search_depth_finds_every_trace(demo):
    n = len(demo["traces"])
    with FakeJaeger(demo["traces"]) as fj:
        rc, out, err = check("--json", "--jaeger", fj.url, "--run-id", demo["run_id"], "--limit", "7", "--progress")
        assert rc == 1, err
        assert json.loads(out)["stats"]["events"] == 832 and f"read {n} traces" in err
        assert len(fj.queries) > n // 7 and "check: jaeger:" in err       # split windows, progress lines
        starts = [int(q["start"][0]) for q in fj.queries]
        ends = [int(q["end"][0]) for q in fj.queries]
        assert min(starts) == starts[0] and max(ends) == ends[0]          # halves of the first window
        _rc0, out0, _ = check("--json", *demo["otlp"])
        assert core(out) == core(out0)


def test_a_search_depth_above_max_traces_is_lowered(demo):
    with FakeJaeger(demo["traces"], max_traces=40) as fj:
        rc, out, err = check("--json", "--jaeger", fj.url, "--run-id", demo["run_id"], "--limit", "500")
        assert rc == 1 and json.loads(out)["stats"]["events"] == 832, err
        assert "Jaeger refused the search depth; searching 31 traces at a time" in err


def test_run_id_found_when_alone_and_asked_for_when_not(demo):
    with FakeJaeger(demo["traces"]) as fj:
        rc, out, err = check("--json", "--jaeger", fj.url)
        assert rc == 1 and f"run id {demo['run_id']} (the only run" in err
    with FakeJaeger(demo["traces"] + _other_run(demo["traces"], "run-b")) as fj:
        rc, out, err = check("--jaeger", fj.url)
        assert rc == 2 and out == "" and f"several runs (run-b, {demo['run_id']}; newest first)" in err
        rc, out, err = check("--json", "--jaeger", fj.url, "--run-id", demo["run_id"])
        assert rc == 1 and json.loads(out)["stats"]["events"] == 832   # the other run's records are not read


def test_nothing_to_check_in_jaeger_is_exit_3(demo):
    with FakeJaeger(demo["traces"]) as fj:
        rc, out, err = check("--jaeger", fj.url, "--run-id", "no-such-run")
        assert rc == 3 and out == "" and "no trace of run no-such-run in " + fj.url in err
        rc, out, err = check("--jaeger", fj.url, "--service", "frontend")
        assert rc == 3 and "no trace with a cptrace.run_id" in err
    bare = copy.deepcopy(demo["traces"][:3])
    for tr in bare:
        for sp in tr["spans"]:
            sp["logs"] = []
    with FakeJaeger(bare) as fj:
        rc, out, err = check("--jaeger", fj.url, "--run-id", demo["run_id"])
        assert rc == 3 and "3 trace(s) of run" in err and "no cptrace record" in err


def test_unreachable_jaeger_is_exit_3_with_the_url_and_no_password():
    port = 1   # nothing listens on loopback port 1 (tcpmux)
    rc, out, err = check("--jaeger", f"http://alice:s3cret@127.0.0.1:{port}", "--run-id", "r")
    assert rc == 3 and out == ""
    assert f"cannot reach Jaeger at http://***@127.0.0.1:{port}" in err and "s3cret" not in err and "alice" not in err
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--jaeger", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and f"127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_credentials_go_as_basic_auth(demo):
    with FakeJaeger(demo["traces"]) as fj:
        url = fj.url.replace("http://", "http://bob:pa%40ss@")
        rc, out, err = check("--jaeger", url, "--run-id", demo["run_id"])
        assert rc == 1 and "pa%40ss" not in out + err and "pa@ss" not in out + err
        import base64
        assert fj.auth and all(a == "Basic " + base64.b64encode(b"bob:pa@ss").decode() for a in fj.auth)


def test_an_http_error_is_exit_3_with_the_message(demo):
    with FakeJaeger(demo["traces"]) as fj:
        fj.search = lambda q: (503, {"data": None, "errors": [{"code": 503, "msg": "storage is down"}]})
        rc, _out, err = check("--jaeger", fj.url, "--run-id", demo["run_id"])
        assert rc == 3 and "HTTP 503" in err and "storage is down" in err and fj.url in err


def test_window_and_usage_errors():
    assert parse_duration("90") == 90 and parse_duration("1h30m") == 5400 and parse_duration("2d") == 172800
    assert parse_time("2026-12-01T00:00:00Z") == parse_time("2026-12-01 00:00") == parse_time("1796083200")
    assert parse_time("1796083200.5") == 1796083200_500000
    assert window("1h", None, None, now_s=10_000) == (10_000e6 - 3600e6, 10_000e6)
    assert window(None, "100", "200") == (100_000_000, 200_000_000)
    for bad in ("1x", "", "-5m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    rc, _, err = check("--jaeger", "http://127.0.0.1:1", "--since", "1h", "--start", "0")
    assert rc == 2 and "cannot be combined" in err
    rc, _, err = check("--jaeger", "http://127.0.0.1:1", "--start", "200", "--end", "100")
    assert rc == 2 and "after" in err
    rc, _, err = check("--since", "1h", "x.log")
    assert rc == 2 and "need --jaeger" in err
    rc, _, err = check("--jaeger", "http://127.0.0.1:1", "x.log")
    assert rc == 2 and "not both" in err



def test_window_split_at_the_median_span_start_and_its_limit():
    from cptrace_otel.analyze.sources.jaegerquery import PageTooSmall, Search

    s = Search(None, limit=2)   # type: ignore[arg-type]  (no search is made)
    page = [5, 50, 900, 60, 70]   # the span starts of a full page, in the order they came
    assert s._split(0, 10**9, page, "r") == [(0, 60), (60, 10**9)]   # not the middle of a 1000 s window
    assert s._split(10, 20, [10], "r") == [(10, 15), (15, 20)]
    with pytest.raises(PageTooSmall, match="raise --limit"):
        s._split(7, 8, page, "r")
    # a page of a run's newest traces: the older part of the window in windows as long as the page's newer half,
    # at most SPLIT_BACK windows in all, the oldest reaching back to the window's start
    dense = [1000 + 10 * i for i in range(50, 100)]   # median 1750, newest 1990: 240 µs a window
    assert s._split(0, 10**6, dense, "r") == [(0, 70), (70, 310), (310, 550), (550, 790), (790, 1030),
                                               (1030, 1270), (1270, 1510), (1510, 1750), (1750, 10**6)]
    assert s._split(1200, 10**6, dense, "r") == [(1200, 1270), (1270, 1510), (1510, 1750), (1750, 10**6)]


def test_search_answers_are_parsed_one_trace_at_a_time():
    """iter_data reads Jaeger's {"data":[...],...,"errors":...} layout trace by trace, any other layout whole, and
    raises JaegerError for JSON that does not parse and for errors Jaeger lists after the data."""
    from cptrace_otel.analyze.sources.jaeger import JaegerError, iter_data

    tr = [{"traceID": "a", "spans": [{"startTime": 1}]}, {"traceID": "b", "spans": []}]
    text = json.dumps({"data": tr, "total": 0, "limit": 0, "offset": 0, "errors": None})
    it = iter_data(text, "u")
    assert next(it) == tr[0]   # handed out before the rest is parsed
    assert list(it) == tr[1:]
    assert list(iter_data('{ "data" : [ ] , "errors": null}', "u")) == []
    assert list(iter_data(json.dumps({"errors": None, "data": tr}), "u")) == tr   # another key order: parsed whole
    assert list(iter_data('{"data":null}', "u")) == []
    with pytest.raises(JaegerError, match="search depth"):
        list(iter_data(json.dumps({"data": tr, "errors": [{"code": 500, "msg": "search depth too big"}]}), "u"))
    for bad in ('{"data":[{"traceID": "a"} {"x": 1}]}', '{"data":[{"traceID": ', "nope", '{"data":[' + "[" * 100_000):
        with pytest.raises(JaegerError):
            list(iter_data(bad, "u"))


def test_search_answer_in_pieces_parses_across_every_cut():
    """An answer read in pieces (as _get_text returns it) gives the same traces wherever the pieces are cut, also in
    the middle of a trace, of a multi-byte character's text, and with traces longer than the look-ahead."""
    from cptrace_otel.analyze.sources import jaegerstream as jaeger
    from cptrace_otel.analyze.sources.jaeger import iter_data

    tr = [{"traceID": f"t{i}", "spans": [{"startTime": i, "n": "é€" * (i * 37)}]} for i in range(40)]
    tr.append({"traceID": "big", "spans": [{"x": "y" * (jaeger.AHEAD * 3)}]})
    text = json.dumps({"data": tr, "total": 0, "errors": None}, ensure_ascii=False)
    for n in (1, 7, 500, 4096, len(text) // 3, len(text)):
        parts = [text[i:i + n] for i in range(0, len(text), n)]
        assert list(iter_data(parts, "u")) == tr, n


class _NewestFirst:
    """A search client over ``n`` short traces (two spans 25 µs apart, one trace every 10 µs from t=1000) that
    answers as Jaeger's memory store does: newest first, at most ``limit`` traces. ``answers``: each page's size."""

    def __init__(self, n: int) -> None:
        self.traces = [{"traceID": f"{i:04x}", "spans": [{"startTime": 1000 + 10 * i},
                                                          {"startTime": 1000 + 10 * i + 25}]} for i in range(n)]
        self.answers: list[int] = []

    def search_iter(self, service, tags, start_us, end_us, limit, raw, with_text):
        hit = [t for t in self.traces if any(start_us <= s["startTime"] <= end_us for s in t["spans"])]
        page = hit[::-1][:limit]   # newest first
        self.answers.append(len(page))
        return iter([(t, json.dumps(t)) for t in page])


def test_run_traces_hands_out_each_trace_once_oldest_first_and_never_a_full_page():
    """Against a store that answers newest first and at most `limit` traces (as Jaeger's memory store): every trace
    once, in start order (watch feeds records in seq order, so it holds only what waits for an older trace)."""
    from cptrace_otel.analyze.sources.jaegerquery import Search

    store = _NewestFirst(60)
    s = Search(store, limit=8)   # type: ignore[arg-type]
    got = [t["traceID"] for t in s.run_traces("r", 0, 10**6)]
    assert got == [t["traceID"] for t in store.traces]
    assert max(store.answers) == 8 and s.searches == len(store.answers) > 60 // 8


def test_a_long_window_is_paged_without_fetching_each_trace_three_times():
    """A run of 400 short traces, newest first in pages of 50, in a window 250 times longer than the run: every
    trace once, oldest first, in 1.37 fetches a trace (the split at the median alone took 2.99: the older half of
    each full page came back full again, half a page read each time)."""
    from cptrace_otel.analyze.sources.jaegerquery import Search

    store = _NewestFirst(400)
    s = Search(store, limit=50)   # type: ignore[arg-type]
    assert [t["traceID"] for t in s.run_traces("r", 0, 10**6)] == [t["traceID"] for t in store.traces]
    assert sum(store.answers) <= 1.4 * len(store.traces) and s.searches < 20, (sum(store.answers), s.searches)


def test_a_trace_past_the_bound_is_skipped_across_every_cut(monkeypatch):
    """An answer in random pieces (down to one character, cut inside strings, escapes, literals): traces above the
    bound come out as Unread with their id, the others as parsed, in order, whatever the cuts and read sizes."""
    import random

    from cptrace_otel.analyze.sources import jaegerstream as jaeger
    from cptrace_otel.analyze.sources.jaeger import Unread, iter_data

    span = {"traceID": "a" * 32, "spanID": "b" * 16, "startTime": 1, "duration": -1.5e-3, "references": [],
            "tags": [{"key": "x", "type": "string", "value": 'we"ird ]}{[ \\ \\" str'}, {"k": True, "f": False}],
            "logs": [{"timestamp": 2, "fields": [{"key": "event", "value": "backup"}]}], "warnings": None}
    traces = [{"traceID": f"t{i}", "spans": [dict(span, startTime=i)] * (i * 40)} for i in range(8)]
    doc = json.dumps({"data": traces, "total": 0, "errors": None})
    rnd = random.Random(2)
    for _ in range(100):
        parts, i = [], 0
        while i < len(doc):
            n = rnd.choice([1, 2, 3, 5, 17, 500, 5000, 70000])
            parts.append(doc[i:i + n])
            i += n
        monkeypatch.setattr(jaeger, "AHEAD", rnd.choice([64, 1000, 1 << 18]))
        bound = rnd.choice([5000, 20000, 10**9])
        out = list(iter_data(parts, "u", max_item=bound))
        assert [o.trace_id if isinstance(o, Unread) else o["traceID"] for o in out] == [t["traceID"] for t in traces]
        for o, t in zip(out, traces, strict=False):
            if isinstance(o, Unread):
                assert len(json.dumps(t)) > bound and set(o.starts) <= {t["spans"][0]["startTime"]}
            else:
                assert o == t and len(json.dumps(t)) <= bound
