"""``check --jaeger``, ``watch`` and the Alertmanager poster against hostile servers on real loopback sockets
(:mod:`tests.helpers.hostile`): they fail closed (exit 3 with the URL, the status and an escaped excerpt; never 0,
never "clean"), every request has a total deadline (a server that drips one byte at a time), credentials never follow
a redirect to another origin (127.0.0.2 is another loopback address), a bad trace costs itself only, memory stays
bounded on huge answers (measured with tracemalloc), a running watcher survives any answer and says per poll whether
its window was checked. No test sleeps to pass: the tests wait for lines and states."""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import subprocess
import sys
import threading
import tracemalloc

import pytest

from cptrace_otel.analyze.finding_sinks import Alerts
from cptrace_otel.analyze.sources.jaeger import JaegerClient, JaegerError, Unread
from cptrace_otel.cli import parse_args
from cptrace_otel.commands import watch as watch_cmd
from tests.helpers.demo_run import check, run_demo
from tests.helpers.hostile import HostileServer, drip, services_ok
from tests.helpers.jaeger_fixtures import FakeJaeger, read_requests, v2_traces

PASSWORD = "s3cr3t-Pw"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = run_demo(tmp_path_factory.mktemp("demo"))
    d["traces"] = v2_traces(read_requests(d["otlp"]))
    return d


def watch_once(url: str, *more: str) -> tuple[int, str, str]:
    args = parse_args(["watch", "--jaeger", url, "--once", *(() if "--since" in more else ("--since", "1h")),
                                 *more])
    out, err = io.StringIO(), io.StringIO()
    rc = watch_cmd.run(args, out, err)
    return rc, out.getvalue(), err.getvalue()


# -- what a search can answer ------------------------------------------------------------------------------------
def _bad_answers(good: bytes) -> dict[str, object]:
    """The 11 answers of the issue's list (and more): each makes a search unreadable."""
    deep = b'{"data":[' + b"[" * 200_000 + b"]" * 200_000 + b"]}"
    return {
        "http-500": (500, b'{"data":null,"errors":[{"code":500,"msg":"storage is down"}]}'),
        "http-502-html": (502, b"<html><body>Bad Gateway\x00\x1b[31m</body></html>"),
        "truncated-mid-trace": (200, good[: len(good) // 2]),
        "truncated-after-trace": (200, good[: good.index(b"},{") + 1]),
        "lone-brace": (200, b"}"),
        "empty-body": (200, b""),
        "not-json": (200, b"\xff\xfegarbage"),
        "data-is-string": (200, b'{"data":"x","total":1}'),
        "data-is-object": (200, b'{"total":1,"data":{"a":1}}'),
        "top-level-list": (200, b"[1,2,3]"),
        "errors-set": (200, b'{"data":[],"errors":[{"code":400,"msg":"bad tags"}]}'),
        "deep-nesting": (200, deep),
        "trailing-garbage": (200, good + b"xyz"),
    }


def _serve(status_body: tuple[int, bytes]):
    status, body = status_body

    def behave(h):
        if services_ok(h):
            return
        h.json(status, body)

    return behave


@pytest.mark.parametrize("case", sorted(_bad_answers(b'{"data":[{"a":1},{"b":2}],"errors":null}')))
def test_an_unreadable_search_is_exit_3_for_check_and_watch_once(case, demo):
    good = json.dumps({"data": demo["traces"][:5], "errors": None}, separators=(",", ":")).encode()
    answer = _bad_answers(good)[case]
    with HostileServer(_serve(answer)) as hs:
        rc, out, err = check("--jaeger", hs.url, "--run-id", demo["run_id"])
        assert rc == 3 and "no findings" not in out and hs.url in err, (case, err)
        assert "HTTP 200: }" not in err   # what came back is quoted, escaped and sized
        rc, out, err = watch_once(hs.url, "--run-id", demo["run_id"])
        assert rc == 3 and "NOT checked" in err and "checked (" not in err, (case, err)
        # the message names the status and what came back, printable whatever the body held
        assert f"HTTP {answer[0]}" in err or "unreachable" in err or "nested too deeply" in err, err
        assert "\x00" not in err and "\x1b" not in err and "\ufffd" not in err


def test_the_messages_quote_an_escaped_excerpt():
    with HostileServer(_serve((200, b"}"))) as hs:
        rc, _, err = check("--jaeger", hs.url, "--run-id", "r")
    assert rc == 3 and "'}' (1 character)" in err and "not JSON" in err


# -- deadlines -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_dripping_server_meets_the_total_deadline(where, monkeypatch):
    """One byte every 50 ms: each read gets data long before its 0.5 s timeout, so only the total deadline (1 s)
    ends the request; the command then exits 3 saying so (the old per-read timeout waited for ever)."""
    monkeypatch.setenv("CPTRACE_QUERY_DEADLINE_S", "1")
    monkeypatch.setenv("CPTRACE_QUERY_READ_TIMEOUT_S", "0.5")
    body = b'{"data":[' + b" " * 100_000 + b"]}"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    stop = threading.Event()
    data = head + b"X-Pad: " + b"a" * 100000 + b"\r\n\r\n" + body if where == "headers" else head + b"\r\n" + body
    slow = drip(data, 0.05, stop)

    def behave(h):
        if services_ok(h):
            return
        slow(h)

    with HostileServer(behave) as hs:
        try:
            rc, _out, err = check("--jaeger", hs.url, "--run-id", "r")
            assert rc == 3 and "no complete answer within 1 s" in err, err
            rc, _out, err = watch_once(hs.url, "--run-id", "r")
            assert rc == 3 and "NOT checked" in err and "no complete answer within 1 s" in err, err
        finally:
            stop.set()


# -- one bad trace -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["spans-a-string", "starttime-a-string", "tags-numbers", "trace-a-list"])
def test_one_bad_trace_costs_that_trace_only(damage, demo):
    traces = copy.deepcopy(demo["traces"])
    victim = traces[len(traces) // 2]
    tid = victim["traceID"]
    if damage == "spans-a-string":
        victim["spans"] = "x"
    elif damage == "starttime-a-string":
        victim["spans"][0]["startTime"] = "yesterday"
    elif damage == "tags-numbers":
        for sp in victim["spans"]:
            sp["tags"] = [1, 2, 3]
            for lg in sp["logs"]:
                lg["fields"] = [{"key": "cptrace.seq", "value": {"x": 1}}, 7]
    else:
        traces[len(traces) // 2] = [victim]   # (no id: reported as such)
        tid = "(no id)"
    with FakeJaeger(demo["traces"]) as fj:   # its service list; the search answers the damaged traces
        fj.search = lambda q: (200, {"data": traces, "errors": None})
        rc, out, err = check("--jaeger", fj.url, "--run-id", demo["run_id"])
        assert rc == 3, err
        assert "findings" in out and "no findings" not in out   # the other traces were checked and reported
        assert "could not be read" in err and (tid in err), err
        rc, out, err = watch_once(fj.url, "--run-id", demo["run_id"])
        assert rc == 3 and out.strip(), err   # findings of the rest printed, exit 3 for the unread trace
        assert "checked, except 1 trace(s) that could not be read" in err and tid in err, err


# -- credentials and redirects ---------------------------------------------------------------------------------------
def test_credentials_do_not_follow_a_redirect_to_another_origin(demo):
    with HostileServer(_serve((200, json.dumps({"data": demo["traces"], "errors": None}).encode())),
                       host="127.0.0.2") as other:
        def behave(h):
            h.send_response(302)
            h.send_header("Location", other.url + h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()

        with HostileServer(behave) as hs:
            url = hs.url.replace("http://", f"http://alice:{PASSWORD}@")
            rc, out, err = check("--jaeger", url, "--run-id", demo["run_id"])
            assert rc == 3 and "another origin: not followed" in err and other.url in err, err
            assert PASSWORD not in out + err
            assert hs.requests and all(a == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
                                       for _m, _p, a in hs.requests)
            rc, _out, err = watch_once(url, "--run-id", demo["run_id"])
            assert rc == 3 and PASSWORD not in err
        assert other.requests == []   # nothing, with or without the credentials, reached the other origin
        with HostileServer(behave) as hs:   # without credentials, the redirect is followed
            rc, out, err = check("--jaeger", hs.url, "--run-id", demo["run_id"])
            assert rc == 1, err
        assert other.requests and all(a is None for _m, _p, a in other.requests)


def test_a_same_origin_redirect_keeps_the_credentials(demo):
    auth = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    body = json.dumps({"data": demo["traces"], "errors": None}).encode()

    def behave(h):
        if h.path.startswith("/moved/"):
            h.json(200, body)
        else:
            h.send_response(307)
            h.send_header("Location", "/moved" + h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()

    with HostileServer(behave) as hs:
        rc, out, err = check("--jaeger", hs.url.replace("http://", f"http://bob:{PASSWORD}@"), "--run-id",
                             demo["run_id"])
        assert rc == 1 and PASSWORD not in out + err, err
        assert [a for _m, _p, a in hs.requests] == [auth, auth]


@pytest.mark.parametrize("shape", ["http://u:{pw}@{hp}", "http://u:{pw}@@{hp}", "http://u:a@{pw}@{hp}",
                                   "u:{pw}@{hp}"])
def test_no_url_shape_prints_the_password(shape):
    url = shape.format(pw=PASSWORD, hp="127.0.0.1:1")
    rc, out, err = check("--jaeger", url, "--run-id", "r")
    assert rc in (2, 3) and PASSWORD not in out + err and PASSWORD[3:] not in out + err, err
    args = parse_args(["watch", "--jaeger", url, "--once", "--alertmanager", url])
    e = io.StringIO()
    assert watch_cmd.run(args, io.StringIO(), e) in (2, 3) and PASSWORD not in e.getvalue()


# -- Alertmanager ------------------------------------------------------------------------------------------------
class _Finding:
    code, rule, rank, node_id, epoch, message, severity, evidence = "C3", "C3", 2, 7, 0, "m", "ERROR", (1,)


def test_alertmanager_userinfo_is_basic_auth_and_never_printed():
    def behave(h):
        h.json(200, {"status": "success"})

    with HostileServer(behave) as am:
        notes: list[str] = []
        a = Alerts(am.url.replace("http://", f"http://ops:{PASSWORD}@"), 30.0, note=notes.append)
        a.found("run-1", _Finding, "http://j/trace/ab")
        assert a.post() is True and a.posts == 1
        (m, p, auth) = am.requests[0]
        assert (m, p) == ("POST", "/api/v2/alerts")
        assert auth == "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
        assert PASSWORD not in a.url and not notes


@pytest.mark.parametrize("reply", ["garbage", "incomplete", "http-500", "huge", "redirect-away", "drip"])
def test_alertmanager_answers_are_survived_and_reported(reply, monkeypatch):
    monkeypatch.setenv("CPTRACE_QUERY_DEADLINE_S", "1")
    monkeypatch.setenv("CPTRACE_QUERY_READ_TIMEOUT_S", "0.5")
    stop = threading.Event()
    with HostileServer(lambda h: h.json(200, {}), host="127.0.0.2") as away:
        def behave(h):
            if reply == "garbage":
                h.raw(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
            elif reply == "incomplete":
                h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n")   # headers never end
            elif reply == "http-500":
                h.json(500, {"message": "cluster is sick"})
            elif reply == "huge":   # an endless 200 answer: the poster reads none of it
                h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                chunk = b"x" * (1 << 20)
                for _ in range(1024):
                    if stop.is_set():
                        return
                    h.raw(chunk)
            elif reply == "redirect-away":
                h.send_response(307)
                h.send_header("Location", away.url + "/api/v2/alerts")
                h.send_header("Content-Length", "0")
                h.end_headers()
            else:
                drip(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 10_000, 0.05, stop)(h)

        with HostileServer(behave) as am:
            notes: list[str] = []
            a = Alerts(am.url.replace("http://", f"http://ops:{PASSWORD}@"), 30.0, note=notes.append)
            a.found("run-1", _Finding, "http://j/trace/ab")
            tracemalloc.start()
            try:
                ok = a.post()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
                stop.set()
            if reply == "huge":
                assert ok is True and peak < 16 << 20   # delivered; the 1 GiB reply is not read
            else:
                assert ok is False and len(notes) == 1 and PASSWORD not in notes[0], notes
                assert "127.0.0.1" in notes[0]
                assert a.post() is False and len(notes) == 1   # one line while it stays so
        assert away.requests == []


# -- bounded memory --------------------------------------------------------------------------------------------------
def _trace(i: int, spans: int, pad: int = 0) -> dict:
    return {"traceID": f"{i:032x}", "processes": {"p1": {"serviceName": "s", "tags": []}},
            "spans": [{"traceID": f"{i:032x}", "spanID": f"{j:016x}", "operationName": "op", "startTime": 1000 + j,
                       "duration": 1, "tags": [{"key": "k", "type": "string", "value": "v" * pad}], "logs": [],
                       "processID": "p1"} for j in range(spans)]}


def test_a_huge_trace_is_reported_and_skipped_in_bounded_memory(monkeypatch):
    """A search answer holding a 60 MB trace between two small ones, with max_trace_bytes at 4 MiB: the small traces
    are read, the huge one comes out as Unread with its id and a sample of its span starts, and the peak memory of
    the whole read stays far below the trace's size (the previous code held the whole answer as text, and parsed the
    trace whole: several times its size)."""
    monkeypatch.setenv("CPTRACE_QUERY_MAX_TRACE_BYTES", str(4 << 20))
    small = [_trace(1, 3), _trace(3, 3)]
    big = _trace(2, 60_000, pad=900)
    body = b'{"data":[' + json.dumps(small[0]).encode() + b"," + json.dumps(big).encode() + b"," + \
        json.dumps(small[1]).encode() + b'],"total":3,"errors":null}'
    size = len(body)
    del big

    def behave(h):
        h.send_response(200)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        for i in range(0, size, 1 << 20):
            h.raw(body[i:i + (1 << 20)])

    with HostileServer(behave) as hs:
        c = JaegerClient(hs.url)
        tracemalloc.start()
        try:
            got = list(c.search_iter("s", limit=10))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert size > 55 << 20
    assert [g["traceID"] for g in got if not isinstance(g, Unread)] == [small[0]["traceID"], small[1]["traceID"]]
    (u,) = [g for g in got if isinstance(g, Unread)]
    assert u.trace_id == f"{2:032x}" and "too large" in u.reason and u.starts and min(u.starts) >= 1000
    assert peak < 40 << 20, peak   # 4 MiB of trace text (twice, while parsing) and a few chunks: not 60 MB


def test_an_endless_answer_stops_at_the_stream_bound_in_bounded_memory(monkeypatch):
    monkeypatch.setenv("CPTRACE_QUERY_MAX_BYTES", str(1 << 20))   # streamed searches: 16 MiB
    stop = threading.Event()

    def behave(h):
        h.raw(b"HTTP/1.1 200 OK\r\n\r\n" + b'{"data":[')
        one = json.dumps(_trace(5, 50)).encode() + b","
        while not stop.is_set():
            h.raw(one * 200)

    with HostileServer(behave) as hs:
        c = JaegerClient(hs.url)
        tracemalloc.start()
        try:
            with pytest.raises(JaegerError, match="answer larger than"):
                for _ in c.search_iter("s", limit=10):
                    pass
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            stop.set()
    assert peak < 24 << 20, peak


def test_a_page_past_the_answer_bound_is_searched_again_with_half_the_depth(demo, monkeypatch):
    """The text one search keeps is bounded (CPTRACE_QUERY_MAX_BYTES): a page past it is abandoned and searched with
    half the depth, and every trace is still read once."""
    monkeypatch.setenv("CPTRACE_QUERY_MAX_BYTES", str(200_000))
    monkeypatch.setenv("CPTRACE_QUERY_MAX_TRACE_BYTES", str(200_000))
    # Paging splits a search by time: traces whose first spans start in one microsecond cannot be told apart (check
    # then asks for a larger --limit, tested elsewhere). The demo can start several traces in one microsecond, so
    # the traces are moved apart by a microsecond each, in their order (what the records say is unchanged).
    traces = copy.deepcopy(demo["traces"])
    traces.sort(key=lambda tr: min(sp["startTime"] for sp in tr["spans"]))
    for i, tr in enumerate(traces):
        for sp in tr["spans"]:
            sp["startTime"] += i
    with FakeJaeger(traces) as fj:
        rc, out, err = check("--json", "--jaeger", fj.url, "--run-id", demo["run_id"])
        limits = sorted({int(q["limit"][0]) for q in fj.queries})
    assert rc == 1, err
    assert "searching" in err and limits[0] < 1000
    assert json.loads(out)["stats"]["events"] == 832


def test_watch_once_requests_do_not_grow_with_the_number_of_runs(demo):
    """300 runs of one trace each: one paginated search of the service per window, not a search per run (the old
    watch made 1 + runs searches per window)."""
    base = demo["traces"][0]
    traces = []
    for i in range(300):
        tr = copy.deepcopy(base)
        tr["traceID"] = f"{i + 1:032x}"
        for p in tr["processes"].values():
            for t in p["tags"]:
                if t["key"] == "cptrace.run_id":
                    t["value"] = f"run-{i}"
        traces.append(tr)
    with FakeJaeger(traces) as fj:
        rc, _out, err = watch_once(fj.url, "--since", "1h")
        searches = len(fj.queries)
    assert rc in (0, 1), err
    assert err.count(": finished") == 300
    assert searches < 30, searches


def test_watch_memory_does_not_grow_with_small_runs(demo):
    """A RunWatch of a small run costs kilobytes (the old evidence index allocated 2 x 65,536 slots per rank: about
    1 MiB per rank and run, 1 GiB for 1,000 runs)."""
    from cptrace_otel.analyze.incremental import RunWatch

    tr = demo["traces"][0]
    tracemalloc.start()
    try:
        ws = []
        for i in range(200):
            w = RunWatch(f"run-{i}")
            w.add_trace(tr)
            ws.append(w)
        cur = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert cur / 200 < 200_000, cur / 200


# -- a running watcher ---------------------------------------------------------------------------------------------
def test_a_running_watcher_survives_every_answer_and_says_which_windows_were_checked(demo, tmp_path):
    """``watch`` (no --once) as a real process against a Jaeger that answers garbage, HTTP 500, a cut answer, a
    wrong-typed trace and then the truth, and an Alertmanager that answers garbage: it goes on through all of it,
    each poll line says whether its window was checked, the findings come out, and SIGTERM ends it with exit 3
    (some trace could not be read)."""
    traces = copy.deepcopy(demo["traces"])
    bad = copy.deepcopy(traces[0])
    bad["traceID"] = "f" * 32
    bad["spans"][0]["startTime"] = "soon"
    good = json.dumps({"data": traces + [bad], "errors": None}).encode()
    script = [(200, b"\x00garbage"), (500, b'{"errors":[{"msg":"down"}]}'), (200, good[:1000]), (200, good)]
    calls = [0]

    def behave(h):
        if services_ok(h):
            return
        i = min(calls[0], len(script) - 1)
        calls[0] += 1
        h.json(*script[i])

    with HostileServer(behave) as hs, HostileServer(lambda h: h.raw(b"\x00\x01\x02")) as am:
        env = dict(os.environ, CPTRACE_QUERY_DEADLINE_S="5", CPTRACE_QUERY_READ_TIMEOUT_S="2")
        p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "watch", "--jaeger", hs.url,
                              "--run-id", demo["run_id"], "--interval", "0.05s", "--since", "3650d",
                              "--alertmanager", am.url.replace("http://", f"http://ops:{PASSWORD}@")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        lines: list[str] = []
        try:
            for line in p.stderr:   # wait for the states, not for time
                lines.append(line)
                if "checked, except 1 trace(s)" in line:
                    break
            p.terminate()
            out, rest = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        err = "".join(lines) + rest
    assert p.returncode == 3, err
    assert err.count("NOT checked") >= 3 and "trying again in" in err
    assert "HTTP 500: down" in err and "'\\x00garbage'" in err and "the answer ends" in err
    assert "f" * 32 in err and "checked, except 1 trace(s) that could not be read" in err
    assert "Alertmanager at" in err and PASSWORD not in err + out
    assert out.strip()   # the findings of the readable traces


def test_a_watcher_stopped_while_jaeger_is_down_exits_3(tmp_path):
    """Jaeger answers its service list, then drops every search connection: the watcher says it is down, says per
    poll that the window was not checked, and SIGTERM then ends it with exit 3 (the window was never read), not 0."""
    def behave(h):
        if services_ok(h):
            return
        h.close_connection = True
        h.connection.shutdown(2)   # no answer at all

    with HostileServer(behave) as hs:
        p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "watch", "--jaeger", hs.url, "--interval",
                              "0.05s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        lines: list[str] = []
        try:
            for line in p.stderr:
                lines.append(line)
                if "NOT checked" in line:
                    break
            p.terminate()
            _out, rest = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    err = "".join(lines) + rest
    assert p.returncode == 3, err
    assert f"watch: Jaeger at {hs.url} is down" in err and "could not be read" in err
