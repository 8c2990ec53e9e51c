"""``cptrace-otel serve`` behind the real OTel Collector: a 4-rank simulator run with injected faults -> the
collector built from deploy/collector/builder.yaml, configured from deploy/collector/config-checkers.yaml (ports
replaced by free ones; its Jaeger exporter left out: this test is about the checker path) -> its
``load_balancing/checkers`` exporter (routing key traceID, OTLP/gRPC) -> two ``serve`` replicas.

Proves: both replicas get traffic, every record reaches exactly one replica (the records checked add up to the
run's), no finding is printed twice, and the union of both replicas' findings equals what ``check`` finds on the
same records (the demo's log files) for every rule one trace decides (``TRACE_RULES``), is contained in it for the
rules that may miss evidence in another trace (``PARTIAL_RULES``), and holds no finding of any other rule (those
are reported as suppressed in the summary, never passed).

Without the collector binary the test skips, unless ``CPTRACE_REQUIRE_COLLECTOR`` is set: then it fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from cptrace_otel.analyze.serve_state import PARTIAL_RULES, TRACE_RULES
from tests.helpers import free_port
from tests.helpers.integration import _BASE_ENV, DEPLOY, ROOT, wait_for

yaml = pytest.importorskip("yaml")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUIRE = bool(os.environ.get("CPTRACE_REQUIRE_COLLECTOR", "").strip())
COLLECTOR_DIR = DEPLOY / "collector"
FAULTS = "HASH_flip,ZERO_nostore,H1_ack,H4_nolock,C3_writer"
LINE = re.compile(r"^(\w+) (\S+) (\S+) run (\S+) rank (-?\d+) (?:node (-?\d+)|\(no node\)) \(epoch (\d+)\) seq (\S+):")


def _env() -> dict[str, str]:
    return dict(_BASE_ENV, PYTHONPATH=str(ROOT) + os.pathsep + _BASE_ENV.get("PYTHONPATH", ""))


def _collector_bin() -> Path:
    return Path(os.environ.get("COLLECTOR_BIN") or COLLECTOR_DIR / "bin" / "otelcol-cptrace")


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
    return out


def _config(http: int, grpc: int, health: int, metrics: int, checkers: list[int]) -> dict:
    cfg = yaml.safe_load((COLLECTOR_DIR / "config-checkers.yaml").read_text())
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{grpc}"
    cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http}"
    cfg["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{health}"
    cfg["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"] = metrics
    lb = cfg["exporters"]["load_balancing/checkers"]
    assert lb["routing_key"] == "traceID"
    lb["resolver"]["static"]["hostnames"] = [f"127.0.0.1:{p}" for p in checkers]
    pipe = cfg["service"]["pipelines"]["traces"]
    assert pipe["exporters"] == ["otlp/jaeger", "load_balancing/checkers"]
    pipe["exporters"] = ["load_balancing/checkers"]
    del cfg["exporters"]["otlp/jaeger"]
    return cfg


def _start_serve(tmp: Path, name: str, http: int, grpc: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", f"127.0.0.1:{http}", "--grpc",
         f"127.0.0.1:{grpc}", "--idle", "2s", "--state-dir", str(tmp / f"state-{name}")],
        stdout=open(tmp / f"{name}.out", "w"), stderr=open(tmp / f"{name}.err", "w"), env=_env(), cwd=ROOT)


def collector_setup(tmp_path: Path) -> tuple[Path, list[int]]:
    """The collector binary (else skip, or fail under ``CPTRACE_REQUIRE_COLLECTOR``) and eight free ports: the
    collector's HTTP, gRPC, health and metrics, then replica a's HTTP and gRPC, then b's; its config written to
    ``tmp_path/col.yaml``."""
    b = _collector_bin()
    if not b.is_file():
        if REQUIRE:
            pytest.fail(f"no collector binary at {b} (CPTRACE_REQUIRE_COLLECTOR is set)", pytrace=False)
        pytest.skip(f"no collector binary at {b}; build it with deploy/collector/up (or set COLLECTOR_BIN)")
    ports = [free_port() for _ in range(8)]
    (tmp_path / "col.yaml").write_text(yaml.safe_dump(_config(*ports[:4], [ports[5], ports[7]])))
    return b, ports


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop what is still running, last started first (SIGTERM, then SIGKILL after 20 s)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_two_replicas_behind_the_collector_find_what_check_finds(tmp_path):
    b, ports = collector_setup(tmp_path)
    col_http, health, a_http, a_grpc, b_http, b_grpc = ports[0], ports[2], *ports[4:]
    procs: list[subprocess.Popen] = []
    try:
        replicas = {"a": (_start_serve(tmp_path, "a", a_http, a_grpc), a_http),
                    "b": (_start_serve(tmp_path, "b", b_http, b_grpc), b_http)}
        procs += [p for p, _ in replicas.values()]

        def up(port: int) -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        for name, (_p, port) in replicas.items():
            wait_for(lambda port=port: up(port), 60, f"replica {name} ready")
        col = subprocess.Popen([str(b), f"--config={tmp_path / 'col.yaml'}"], stdout=open(tmp_path / "col.log", "w"),
                               stderr=subprocess.STDOUT)
        procs.append(col)
        wait_for(lambda: up_url(f"http://127.0.0.1:{health}/"), 60, "collector healthy")

        out = tmp_path / "demo"
        d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", "sharded",
                            "--faults", FAULTS, "--endpoint", f"http://127.0.0.1:{col_http}/v1/traces", "--out",
                            str(out), "--json"], capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
        assert d.returncode in (0, 1), d.stderr[-2000:]
        n = json.loads(d.stdout)["events"]["simulated"]

        def all_checked() -> bool:
            ms = [_metrics(port) for _p, port in replicas.values()]
            return (sum(m["cptrace_serve_events_checked_total"] for m in ms) >= n
                    and all(m["cptrace_serve_traces_held"] == 0 for m in ms))

        wait_for(all_checked, 120, f"all {n} records checked by the replicas", interval_s=1.0)
        ms = {name: _metrics(port) for name, (_p, port) in replicas.items()}
        for p, _port in replicas.values():
            p.send_signal(signal.SIGTERM)
        codes = {name: p.wait(timeout=60) for name, (p, _port) in replicas.items()}
    finally:
        stop_all(procs)

    checked = {name: m["cptrace_serve_events_checked_total"] for name, m in ms.items()}
    assert all(v > 0 for v in checked.values()), f"both replicas get traffic: {checked}"
    assert sum(checked.values()) == n, f"each record reaches exactly one replica: {checked} vs {n}"
    assert all(m["cptrace_serve_spans_dropped_total"] == 0 and m["cptrace_serve_late_records_total"] == 0
               for m in ms.values())

    lines = []
    for name in replicas:
        lines += [ln for ln in (tmp_path / f"{name}.out").read_text().splitlines() if ln.strip()]
    got = []
    for ln in lines:
        m = LINE.match(ln)
        assert m, ln
        got.append((m[2], m[3], int(m[5]), int(m[6]) if m[6] else None, int(m[7]), m[8]))
    assert len(got) == len(set(got)), "no finding is printed twice"
    assert codes == {name: 1 if any(True for _ in (tmp_path / f"{name}.out").read_text().splitlines()) else 0
                     for name in replicas}

    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(p) for p in out.glob("rank*.log"))], capture_output=True, text=True, timeout=300,
                       env=_env(), cwd=ROOT)
    assert c.returncode == 1, c.stderr[-2000:]
    want = {(f["code"], f["rule"], f["rank"], f["node_id"], f["epoch"], str(f["evidence"][-1]))
            for f in json.loads(c.stdout)["findings"]}
    have = set(got)
    exact = {f for f in want if f[1] in TRACE_RULES}
    assert exact, "the faults give findings of rules one trace decides"
    assert {f for f in have if f[1] in TRACE_RULES} == exact
    assert {f for f in have if f[1] in PARTIAL_RULES} <= {f for f in want if f[1] in PARTIAL_RULES}
    assert {f[1] for f in have} <= TRACE_RULES | PARTIAL_RULES
    assert {f[1] for f in want if f[1] == "C3"}, "the C-rule fault is found by check"
    for name in replicas:   # a rule one trace cannot decide is reported as unchecked, never passed
        last = (tmp_path / f"{name}.err").read_text().strip().splitlines()[-1]
        assert re.search(r"UNCHECKED here [^;]*\bC3\b", last), last


def up_url(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
