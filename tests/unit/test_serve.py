"""``cptrace-otel serve`` as a process: real OTLP protobuf bytes (the project's encoder, checked by
opentelemetry-proto) over HTTP; answers 200 (with partial_success), 400, 413, 415 and 503; /metrics; SIGTERM
finalises every held trace and prints its findings once. Plus the intake decoder on its own."""

from __future__ import annotations

import concurrent.futures
import gzip
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from cptrace_otel.analyze.otlp_intake import Undecodable, decode
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import parse_json_line


@pytest.fixture(scope="module")
def demo_bodies(tmp_path_factory) -> list[bytes]:
    """The OTLP requests of a 2-rank simulator run with a HASH fault (protobuf bytes, one per file line)."""
    out = tmp_path_factory.mktemp("demo")
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", "HASH_flip",
                        "--out", str(out), "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    bodies = []
    for f in sorted(out.glob("*.otlp.jsonl")):
        bodies += [parse_json_line(ln).SerializeToString() for ln in f.read_text().splitlines() if ln.strip()]
    return bodies


class Serve:
    def __init__(self, tmp: Path, *extra: str) -> None:
        self.out, self.err = tmp / "serve.out", tmp / "serve.err"
        self.p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0",
                                   *extra], stdout=open(self.out, "w"), stderr=open(self.err, "w"), cwd=ROOT)
        deadline = time.monotonic() + 30
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)/", self.err.read_text())):
            assert self.p.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{m[1]}"

    def post(self, body: bytes, ctype: str = "application/x-protobuf", **headers: str) -> tuple[int, bytes, dict]:
        req = urllib.request.Request(self.url + "/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": ctype, **headers})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in r.read().decode().splitlines()
                    if ln and not ln.startswith("#")}

    def stop(self) -> int:
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=60)


def test_decode_reads_every_record_and_rejects_garbage(demo_bodies):
    n = sum(decode(b).records for b in demo_bodies)
    assert n > 100
    with pytest.raises(Undecodable):
        decode(b"\xff\xff\xff not protobuf")


def test_accepts_checks_at_shutdown_and_prints_each_finding_once(tmp_path, demo_bodies):
    s = Serve(tmp_path, "--idle", "1h")
    try:
        for b in demo_bodies[:len(demo_bodies) // 2]:
            code, body, _ = s.post(b)
            assert code == 200
            assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
        for b in demo_bodies[len(demo_bodies) // 2:]:   # gzip, as the collector's otlphttp exporter sends
            assert s.post(gzip.compress(b), **{"Content-Encoding": "gzip"})[0] == 200
        time.sleep(1.0)
        m = s.metrics()
        assert m["cptrace_serve_traces_held"] > 0 and m["cptrace_serve_events_checked_total"] == 0
        assert m["cptrace_serve_spans_received_total"] == sum(
            len(sp.spans) for b in demo_bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
            for sp in rs.scope_spans)
    finally:
        rc = s.stop()
    lines = s.out.read_text().splitlines()
    assert rc == 1 and lines and all(" HASH " in ln or " ZERO " in ln or " H" in ln for ln in lines)
    assert any(ln.startswith("ERROR HASH HASH run ") for ln in lines)
    assert len(lines) == len(set(lines))
    assert "UNCHECKED here" in s.err.read_text().splitlines()[-1]


def test_bad_requests_are_refused_with_the_reason(tmp_path, demo_bodies):
    s = Serve(tmp_path, "--max-body", "100000")
    try:
        assert s.post(b"\x0a\x05garbage")[0] == 400
        assert s.post(b"{}", "application/json")[0] == 415
        big = b"".join(demo_bodies)   # one valid request (protobuf messages concatenate), over the limit
        assert len(big) > 100_000
        assert s.post(big)[0] == 413
        assert s.post(gzip.compress(b"\x00" * 200_000), **{"Content-Encoding": "gzip"})[0] == 413
        # a span with records but no run id: rejected, the rest accepted (partial_success)
        req = ExportTraceServiceRequest.FromString(demo_bodies[0])
        rs = req.resource_spans[0]
        keep = [kv for kv in rs.resource.attributes if kv.key != "cptrace.run_id"]
        del rs.resource.attributes[:]
        rs.resource.attributes.extend(keep)
        small = ExportTraceServiceRequest()
        small.resource_spans.add().CopyFrom(rs)
        del small.resource_spans[0].scope_spans[0].spans[1:]
        code, body, _ = s.post(small.SerializeToString())
        assert code == 200
        ps = ExportTraceServiceResponse.FromString(body).partial_success
        assert ps.rejected_spans == 1 and "cptrace.run_id" in ps.error_message
        m = s.metrics()
        assert m["cptrace_serve_requests_bad_total"] == 4 and m["cptrace_serve_spans_rejected_total"] == 1
    finally:
        assert s.stop() == 0


def test_a_full_queue_answers_503_and_counts_what_it_turned_away(tmp_path, demo_bodies):
    s = Serve(tmp_path, "--queue", "1", "--idle", "0.001")
    body = b"".join(demo_bodies)   # one request with every span (the messages concatenate)
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            answers = list(ex.map(lambda _i: s.post(body), range(64)))
        codes = [a[0] for a in answers]
        assert set(codes) <= {200, 503} and 503 in codes, codes
        assert all(a[2].get("Retry-After") == "1" for a in answers if a[0] == 503)
        spans = sum(len(sp.spans) for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                    for sp in rs.scope_spans)
        m = s.metrics()
        assert m["cptrace_serve_spans_dropped_total"] == spans * codes.count(503)
        assert m["cptrace_serve_spans_received_total"] == spans * codes.count(200)
    finally:
        s.stop()


def _unstamped(body: bytes) -> bytes:
    """``body`` without the online checks' violation marks (a span already carrying a code is not written again)."""
    req = ExportTraceServiceRequest.FromString(body)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                keep = [kv for kv in sp.attributes if not kv.key.startswith("cptrace.violation")]
                del sp.attributes[:]
                sp.attributes.extend(keep)
    return req.SerializeToString()


def test_findings_are_written_back_into_their_trace_and_alerted(tmp_path, demo_bodies):
    """--endpoint: one cptrace.finding span per finding, in the trace the printed line links to, linking the
    evidence spans; --alertmanager: the finding posted as an alert with its run id and trace link (an in-test
    Alertmanager endpoint: the real one is in the integration tests of watch, which shares finding_sinks)."""
    from tests.helpers.otlp_receiver import AlertSink, HttpReceiver

    am = AlertSink()
    with HttpReceiver() as rx:
        s = Serve(tmp_path, "--idle", "0.5", "--endpoint", rx.url, "--alertmanager",
                  am.url, "--alert-interval", "0.5")
        try:
            for b in demo_bodies:   # as an exporter without online checks sends them: nothing stamped yet
                assert s.post(_unstamped(b))[0] == 200
            deadline = time.monotonic() + 30
            while not (am.posted and s.out.read_text()):
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            rc = s.stop()
        am.close()
        lines = s.out.read_text().splitlines()
        assert rc == 1 and lines
        spans = [sp for sp in rx.spans() if sp.name == "cptrace.finding"]
    assert len(spans) == len(lines)
    linked = {ln.rsplit("/trace/", 1)[1] for ln in lines}
    assert {sp.trace_id for sp in spans} == linked
    assert all(sp.resource["cptrace.run_id"] in lines[0] and sp.links for sp in spans)
    alerts = am.alerts()
    assert alerts and {a["labels"]["code"] for a in alerts} <= {ln.split()[1] for ln in lines}
    assert all(a["annotations"]["jaeger"].rsplit("/trace/", 1)[1] in linked for a in alerts)


def _state_with(demo_bodies, **kw):
    from cptrace_otel.analyze.serve_state import ServeState

    got: list = []
    st = ServeState(lambda tr, found: got.append((tr.trace_id, found)), **kw)
    return st, got, [sp for b in demo_bodies for sp in decode(b).spans]


def test_state_bounds_finalise_early_and_count_it(demo_bodies):
    st, got, spans = _state_with(demo_bodies, idle_s=3600, max_nodes=3)
    st.add(spans, now=0.0)
    traces = {sp.trace_id for sp in spans}
    assert len(st.traces) == 3 and st.early == len(traces) - 3   # the held set never exceeds the bound
    st.finish_all()
    assert len(got) == len(traces) and len({t for t, _ in got}) == len(traces)   # each trace checked once
    # spans of a trace finalised early that come later are counted as late, not checked on their own
    assert st.events_checked + st.late == sum(len(sp.events) for sp in spans) and st.late > 0
    assert not st.traces and not st.runs


def test_state_idle_window_and_late_records(demo_bodies):
    st, got, spans = _state_with(demo_bodies, idle_s=10, run_idle_s=100)
    half = len(spans) // 2
    st.add(spans[:half], now=0.0)
    assert st.sweep(now=5.0) == 0 and not got          # not idle yet
    n = st.sweep(now=11.0)
    assert n == len(got) > 0 and not st.traces          # idle: checked and freed
    seen = {t for t, _ in got}
    late = [sp for sp in spans[half:] if sp.trace_id in seen]
    st.add(spans[half:], now=12.0)
    assert st.late == sum(len(sp.events) for sp in late)   # a checked trace is not checked again
    st.sweep(now=30.0)
    assert len({t for t, _ in got}) == len(got)            # no trace reported twice
    assert st.runs and not st.traces
    st.sweep(now=200.0)                                    # the run idle past run_idle_s: finished, forgotten
    assert not st.runs


def test_state_max_runs_finishes_the_least_recently_changed(demo_bodies):
    from cptrace_otel.analyze.otlp_intake import SpanRecords

    st, got, spans = _state_with(demo_bodies, idle_s=3600, max_runs=1)
    sp = spans[0]
    st.add([sp], now=0.0)
    st.add([SpanRecords("other-run", sp.trace_id, sp.ref, sp.level, sp.events)], now=1.0)
    assert list(st.runs) == ["other-run"] and st.early == 1 and len(got) == 1


def test_grpc_receiver_accepts_and_counts(tmp_path, demo_bodies):
    """--grpc: the OTLP TraceService the collector's loadbalancing exporter calls; the records are checked as over
    HTTP (the same queue), a request of spans without a run id gets partial_success."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    from tests.helpers import free_port

    port = free_port()
    s = Serve(tmp_path, "--grpc", f"127.0.0.1:{port}", "--idle", "1h")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = trace_service_pb2_grpc.TraceServiceStub(ch)
            for b in demo_bodies:
                resp = stub.Export(ExportTraceServiceRequest.FromString(b), timeout=30)
                assert not resp.HasField("partial_success")
            req = ExportTraceServiceRequest.FromString(demo_bodies[0])
            rs = req.resource_spans[0]
            keep = [kv for kv in rs.resource.attributes if kv.key != "cptrace.run_id"]
            del rs.resource.attributes[:]
            rs.resource.attributes.extend(keep)
            assert stub.Export(req, timeout=30).partial_success.rejected_spans > 0
        m = s.metrics()   # each record is held (in a reorder window) or checked
        assert m["cptrace_serve_records_held"] + m["cptrace_serve_events_checked_total"] == sum(
            decode(b).records for b in demo_bodies)
    finally:
        assert s.stop() == 1


def test_state_a_trace_whose_check_raises_is_reported_not_checked(demo_bodies, monkeypatch):
    from cptrace_otel.analyze import engine

    notes: list[str] = []
    st, got, spans = _state_with(demo_bodies, idle_s=3600, live=False)   # live: tests/unit/test_serve_live.py
    st.note = notes.append
    monkeypatch.setattr(engine.Analysis, "run", lambda self, evs, **kw: (_ for _ in ()).throw(KeyError("boom")))
    st.add(spans, now=0.0)
    n = len(st.traces)
    st.finish_all()
    assert st.errors == n and not got and not st.traces
    assert sum("NOT checked" in x and "KeyError" in x for x in notes) == n


# -- the cross-rank rules on node traces: each rank's config record, stamped on the resource --------------------------

CROSS_RUNS = {"C3": ("sharded", "C3_writer"), "C5": ("shared", "H4_nolock,HASH_flip")}
CROSS_OUT: dict = {}   # rule -> the run's folder (its log files)


@pytest.fixture(scope="module", params=sorted(CROSS_RUNS))
def cross_demo(request, tmp_path_factory) -> tuple[str, list[bytes], set]:
    """A 4-rank simulator run whose faults give a cross-rank finding: C3 (sharded: another rank's backup carries
    io=0) or C5 (shared: a node evicted while its backup is in flight, a flipped byte; the ranks' hashes differ from
    the IO rank's). The rule, its OTLP requests (protobuf bytes) and ``check``'s findings over its log files."""
    import json

    mode, faults = CROSS_RUNS[request.param]
    out = tmp_path_factory.mktemp("cross")
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", mode,
                        "--faults", faults, "--out", str(out), "--json"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    bodies = []
    for f in sorted(out.glob("*.otlp.jsonl")):
        bodies += [parse_json_line(ln).SerializeToString() for ln in f.read_text().splitlines() if ln.strip()]
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(x) for x in out.glob("rank*.log"))], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    want = {(f["rule"], f["rank"], f["node_id"], f["epoch"], f["evidence"][-1])
            for f in json.loads(c.stdout)["findings"]}
    CROSS_OUT[request.param] = out
    return request.param, bodies, want


def _replica(bodies: list[bytes]):
    """Every trace of ``bodies`` checked by one ServeState: (state, the reported findings as check's tuples)."""
    from cptrace_otel.analyze.serve_state import ServeState

    got: set = set()
    st = ServeState(lambda tr, found: got.update((f.rule, f.rank, f.node_id, f.epoch, f.evidence[-1]) for f in found),
                    idle_s=0)
    for b in bodies:
        st.add(decode(b).spans, now=0.0)
    st.finish_all()
    return st, got


def _without_config_stamp(body: bytes, rank: int) -> bytes:
    """``body`` as it would be if ``rank``'s exporter stamped no config (an older one)."""
    from cptrace_otel.model import config_stamp

    req = ExportTraceServiceRequest.FromString(body)
    for rs in req.resource_spans:
        if not any(kv.key == "sglang.cp.rank" and kv.value.int_value == rank for kv in rs.resource.attributes):
            continue
        stamp = (config_stamp.SEQ, config_stamp.EPOCH, config_stamp.LEVEL)
        keep = [kv for kv in rs.resource.attributes
                if not kv.key.startswith(config_stamp.PREFIX) and kv.key not in stamp]
        del rs.resource.attributes[:]
        rs.resource.attributes.extend(keep)
    return req.SerializeToString()


def test_node_traces_give_checks_cross_rank_findings(cross_demo):
    """C3 and C5 on node traces, each checked alone (as replicas behind the collector check them), equal ``check``'s
    over the whole run; C1 gives no false finding on the in-lockstep run (it is still not reported: see
    serve_state), because each rank's config record comes with every request."""
    from cptrace_otel.analyze.serve_state import LOCKSTEP_RULES, PARTIAL_RULES, TRACE_RULES

    rule, bodies, want = cross_demo
    st, got = _replica(bodies)
    assert {f for f in want if f[0] == rule}, want
    for rules in (TRACE_RULES, LOCKSTEP_RULES):
        assert {f for f in got if f[0] in rules} == {f for f in want if f[0] in rules}
    assert {f for f in got if f[0] in PARTIAL_RULES} <= want
    assert st.suppressed.get("C1", 0) == 0, st.suppressed   # without the stamp: the later ranks "diverge"


def test_a_rank_without_the_config_stamp_leaves_c3_c5_unreported(cross_demo):
    """One rank's exporter stamps no config (an older one): its node traces' C3/C5 findings are not trusted, so not
    reported, and counted as suppressed (never passed silently)."""
    rule, bodies, want = cross_demo
    st, got = _replica([_without_config_stamp(b, 3) for b in bodies])
    assert {f for f in want if f[0] == rule}
    assert not {f for f in got if f[0] in ("C3", "C5")}
    assert st.suppressed[rule] > 0, st.suppressed


def _field_dicts():
    from hypothesis import strategies as st

    names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
    values = st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), st.text(alphabet="abcdwz_/", min_size=1,
                                                                     max_size=20))
    # (strings as the exporter renders them: a numeric-looking one is read back as the number, as every reader does)
    return st.dictionaries(names, values, max_size=8)


def test_config_stamp_round_trips_and_a_new_record_replaces_it():
    """stamp -> resource -> record gives the config record back (tag, rank, seq, epoch, level, fields); a second
    config record replaces the whole stamp (no field of the first survives), the other resource attributes stay."""
    from hypothesis import given, settings, strategies as st

    from cptrace_otel.model import config_stamp
    from cptrace_otel.model.events import Event

    @settings(max_examples=150, deadline=None)
    @given(_field_dicts(), _field_dicts(), st.integers(0, 2 ** 40), st.integers(0, 9), st.integers(1, 3))
    def prop(first, second, seq, epoch, level):
        base = {"service.name": "x", "cptrace.run_id": "r"}
        a = Event("config", 2, seq, 5, epoch, first, level, "live", 0)
        b = Event("config", 2, seq + 1, 6, epoch, second, level, "live", 0)
        res = config_stamp.restamp(base, a)
        got = config_stamp.record(res, 2)
        assert got is not None and (got.tag, got.rank, got.seq, got.epoch, got.level) == ("config", 2, seq, epoch,
                                                                                          level)
        assert got.fields == first
        res2 = config_stamp.restamp(res, b)
        assert config_stamp.record(res2, 2).fields == second and res2["cptrace.run_id"] == "r"
        assert config_stamp.record(base, 2) is None and base == {"service.name": "x", "cptrace.run_id": "r"}

    prop()


def test_ingested_logs_carry_the_config_stamp_too(cross_demo, tmp_path):
    """``ingest`` replays log files with the exporter's span model: its requests carry each rank's config stamp, so
    a replica finds the same C3/C5 on the replayed records as ``check`` on the logs."""
    rule, _bodies, want = cross_demo
    out = tmp_path / "ingest.jsonl"
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "--no-progress", "--file", str(out),
                        *sorted(str(x) for x in CROSS_OUT[rule].glob("rank*.log"))], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    _st, got = _replica([parse_json_line(ln).SerializeToString() for ln in out.read_text().splitlines() if ln.strip()])
    # (ingest numbers the records itself: compared without the evidence's seq)
    assert {f[:4] for f in got if f[0] in ("C3", "C5")} == {f[:4] for f in want if f[0] in ("C3", "C5")} != set()


def test_c4_on_node_traces_equals_checks(cross_demo, tmp_path):
    """No simulator fault breaks C4, so the run's OTLP requests are changed as a rank that logs another page count
    would send them: rank 1's first two prepare/reload dev or host counts plus one. ``check`` over the changed OTLP
    file and a replica over the same requests give the same C4 findings (none before the change)."""
    import json

    from google.protobuf.json_format import MessageToDict

    _rule, bodies, want = cross_demo
    assert not {f for f in want if f[0] == "C4"}
    reqs = [ExportTraceServiceRequest.FromString(b) for b in bodies]
    bumped = 0
    for req in reqs:
        for rs in req.resource_spans:
            if not any(kv.key == "sglang.cp.rank" and kv.value.int_value == 1 for kv in rs.resource.attributes):
                continue
            for ev in (e for ss in rs.scope_spans for sp in ss.spans for e in sp.events):
                for kv in ev.attributes:
                    if bumped < 2 and ev.name in ("prepare", "reload") and kv.key in ("hicache.dev.cnt",
                                                                                      "hicache.host.cnt"):
                        kv.value.int_value += 1
                        bumped += 1
    assert bumped == 2
    changed = tmp_path / "changed.otlp.jsonl"
    changed.write_text("".join(json.dumps(MessageToDict(r)) + "\n" for r in reqs))
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json", str(changed)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    want_c4 = {(f["rule"], f["rank"], f["node_id"], f["epoch"], f["evidence"][-1])
               for f in json.loads(c.stdout)["findings"] if f["rule"] == "C4"}
    _st, got = _replica([r.SerializeToString() for r in reqs])
    assert want_c4 and {f for f in got if f[0] == "C4"} == want_c4


def test_after_a_c1_divergence_a_replica_reports_c3_check_reports_and_c1_never(tmp_path):
    """C1_div (a rank skips one backup, and so every later one while its pool stays full): ``check`` reports C1 and
    the first C3, then stops judging later nodes; a replica cannot see the run's order, so C1 is not reported (its
    per-trace findings are counted as suppressed) and C3 is judged per node: ``check``'s C3 is among the replica's,
    the extra ones are on later nodes of the diverged rank (docs/deploy.md states it)."""
    import json

    out = tmp_path / "div"
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", "sharded",
                        "--faults", "C1_div", "--out", str(out), "--json"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(x) for x in out.glob("rank*.log"))], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    want = json.loads(c.stdout)["findings"]
    c1 = [f for f in want if f["rule"] == "C1"]
    c3 = {(f["rule"], f["rank"], f["node_id"], f["epoch"], f["evidence"][-1]) for f in want if f["rule"] == "C3"}
    assert c1 and c3
    bodies = []
    for f in sorted(out.glob("*.otlp.jsonl")):
        bodies += [parse_json_line(ln).SerializeToString() for ln in f.read_text().splitlines() if ln.strip()]
    st, got = _replica(bodies)
    assert not {f for f in got if f[0] == "C1"} and st.suppressed["C1"] > 0
    mine = {f for f in got if f[0] == "C3"}
    assert c3 <= mine
    assert all(f[1] == c1[0]["rank"] and f[2] > c1[0]["node_id"] for f in mine - c3)
