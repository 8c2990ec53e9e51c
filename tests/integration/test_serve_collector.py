"""``cptrace-otel serve`` behind the real OTel Collector: simulator runs with injected faults (4 ranks sharded and
shared, 16 ranks sharded; each with a cross-rank fault: C3 or C5) -> the
collector built from deploy/collector/builder.yaml, configured from deploy/collector/config-checkers.yaml (ports
replaced by free ones; its Jaeger exporter left out: this test is about the checker path) -> its
``load_balancing/checkers`` exporter (routing key traceID, OTLP/gRPC) -> two ``serve`` replicas.

Proves: both replicas get traffic, every record reaches exactly one replica (the records checked add up to the
run's), no finding is printed twice, and the union of both replicas' findings equals what ``check`` finds on the
same records (the demo's log files) for every rule one trace decides (``TRACE_RULES``) and for the cross-rank
joins that each rank's config stamp lets one trace decide while the ranks are in lockstep (``LOCKSTEP_RULES``: C3,
C5), is contained in it for the rules that may miss evidence in another trace (``PARTIAL_RULES``), and holds no
finding of any other rule (those are reported as suppressed in the summary, never passed).

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
from collections.abc import Callable
from pathlib import Path

import pytest

from cptrace_otel.analyze.serve_state import LOCKSTEP_RULES, PARTIAL_RULES, TRACE_RULES
from tests.helpers import free_port
from tests.helpers.integration import _BASE_ENV, DEPLOY, ROOT, collector_binary, wait_for

yaml = pytest.importorskip("yaml")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLLECTOR_DIR = DEPLOY / "collector"
# (ranks, mode, faults, the cross-rank rule the faults make check find)
FAULTS = "HASH_flip,ZERO_nostore,H1_ack,H4_nolock,C3_writer"
RUNS = {"4-sharded": (4, "sharded", FAULTS, "C3"),
        "4-shared": (4, "shared", "H4_nolock,HASH_flip", "C5"),
        "16-sharded": (16, "sharded", "C3_writer,HASH_flip", "C3")}
LINE = re.compile(r"^(\w+) (\S+) (\S+) run (\S+) rank (-?\d+) (?:node (-?\d+)|\(no node\)) \(epoch (\d+)\) seq (\S+):")


def _env() -> dict[str, str]:
    return dict(_BASE_ENV, PYTHONPATH=str(ROOT) + os.pathsep + _BASE_ENV.get("PYTHONPATH", ""))



def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
    return out


def _config(http: int, grpc: int, health: int, metrics: int, checkers: list[int], runs: list[int] | None = None
            ) -> dict:
    """deploy/collector/config-checkers.yaml on these ports, without its Jaeger exporter; its run checkers'
    exporter (``load_balancing/runs``) kept only with ``runs`` (their gRPC ports), and then the trace checkers'
    only with ``checkers``."""
    cfg = yaml.safe_load((COLLECTOR_DIR / "config-checkers.yaml").read_text())
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{grpc}"
    cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http}"
    cfg["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{health}"
    cfg["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"] = metrics
    lb = cfg["exporters"]["load_balancing/checkers"]
    assert lb["routing_key"] == "traceID"
    lb["resolver"]["static"]["hostnames"] = [f"127.0.0.1:{p}" for p in checkers]
    lr = cfg["exporters"]["load_balancing/runs"]
    assert (lr["routing_key"], lr["routing_attributes"]) == ("attributes", ["cptrace.run_id"])
    lr["resolver"]["static"]["hostnames"] = [f"127.0.0.1:{p}" for p in runs or ()]
    pipe = cfg["service"]["pipelines"]["traces"]
    assert pipe["exporters"] == ["otlp/jaeger", "load_balancing/checkers", "load_balancing/runs"]
    pipe["exporters"] = [e for e, keep in (("load_balancing/checkers", checkers), ("load_balancing/runs", runs))
                         if keep]
    for e in ("otlp/jaeger", *(() if checkers else ("load_balancing/checkers",)), *(() if runs else
                                                                                     ("load_balancing/runs",))):
        del cfg["exporters"][e]
    return cfg


def _start_serve(tmp: Path, name: str, http: int, grpc: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", f"127.0.0.1:{http}", "--grpc",
         f"127.0.0.1:{grpc}", "--idle", "2s", "--state-dir", str(tmp / f"state-{name}"), *extra],
        stdout=open(tmp / f"{name}.out", "w"), stderr=open(tmp / f"{name}.err", "w"), env=_env(), cwd=ROOT)


def collector_setup(tmp_path: Path, scope: str = "trace") -> tuple[Path, list[int]]:
    """The collector binary (else skip, or fail under ``CPTRACE_REQUIRE_COLLECTOR``) and eight free ports: the
    collector's HTTP, gRPC, health and metrics, then replica a's HTTP and gRPC, then b's; its config written to
    ``tmp_path/col.yaml``: a and b the trace checkers, or (``scope`` run) a the one run checker."""
    b = collector_binary()
    ports = [free_port() for _ in range(8)]
    checkers, runs = ([ports[5], ports[7]], None) if scope == "trace" else ([], [ports[5]])
    (tmp_path / "col.yaml").write_text(yaml.safe_dump(_config(*ports[:4], checkers, runs)))
    return b, ports


def two_replicas(tmp_path: Path, send: Callable[[str], int], wait_s: float = 120,
                 scope: str = "trace") -> tuple[dict[str, dict[str, float]], dict[str, int], int]:
    """Two ``serve`` replicas (``a``, ``b``: stdout and stderr in ``tmp_path/<name>.out``/``.err``) behind the
    collector (:func:`collector_setup`'s config), or (``scope`` run) the one run checker ``a``; ``send(url)`` sends
    a run to the collector's OTLP/HTTP traces URL and returns how many records it holds. Once the replicas together
    have checked that many and hold no trace: each replica's /metrics then, its exit code after SIGTERM, and that
    count; every process started here is stopped."""
    b, ports = collector_setup(tmp_path, scope)
    col_http, health, a_http, a_grpc, b_http, b_grpc = ports[0], ports[2], *ports[4:]
    procs: list[subprocess.Popen] = []
    try:
        replicas = ({"a": (_start_serve(tmp_path, "a", a_http, a_grpc), a_http),
                     "b": (_start_serve(tmp_path, "b", b_http, b_grpc), b_http)} if scope == "trace" else
                    {"a": (_start_serve(tmp_path, "a", a_http, a_grpc, "--scope", "run"), a_http)})
        procs += [p for p, _ in replicas.values()]
        for name, (_p, port) in replicas.items():
            wait_for(lambda port=port: up_url(f"http://127.0.0.1:{port}/readyz"), 60, f"replica {name} ready")
        col = subprocess.Popen([str(b), f"--config={tmp_path / 'col.yaml'}"], stdout=open(tmp_path / "col.log", "w"),
                               stderr=subprocess.STDOUT)
        procs.append(col)
        wait_for(lambda: up_url(f"http://127.0.0.1:{health}/"), 60, "collector healthy")
        n = send(f"http://127.0.0.1:{col_http}/v1/traces")

        def all_checked() -> bool:
            ms = [_metrics(port) for _p, port in replicas.values()]
            return (sum(m["cptrace_serve_events_checked_total"] for m in ms) >= n
                    and all(m["cptrace_serve_traces_held"] == 0 for m in ms))

        wait_for(all_checked, wait_s, f"all {n} records checked by the replicas", interval_s=1.0)
        ms = {name: _metrics(port) for name, (_p, port) in replicas.items()}
        for p, _port in replicas.values():
            p.send_signal(signal.SIGTERM)
        codes = {name: p.wait(timeout=60) for name, (p, _port) in replicas.items()}
    finally:
        stop_all(procs)
    return ms, codes, n


def _demo(ranks: int, mode: str, faults: str, out: Path) -> Callable[[str], int]:
    """A ``send`` for :func:`two_replicas`: the faulted simulator run exported to the collector (logs in ``out``)."""
    def send(url: str) -> int:
        d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", str(ranks), "--mode", mode,
                            "--faults", faults, "--endpoint", url, "--out", str(out), "--json"],
                           capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
        assert d.returncode in (0, 1), d.stderr[-2000:]
        return json.loads(d.stdout)["events"]["simulated"]
    return send


def _printed(tmp_path: Path, replicas: tuple[str, ...]) -> list[tuple]:
    """The findings the replicas printed: (code, rule, rank, node, epoch, last evidence seq) each."""
    got = []
    for name in replicas:
        for ln in (tmp_path / f"{name}.out").read_text().splitlines():
            if ln.strip():
                m = LINE.match(ln)
                assert m, ln
                got.append((m[2], m[3], int(m[5]), int(m[6]) if m[6] else None, int(m[7]), m[8]))
    return got


def _check_findings(out: Path) -> set[tuple]:
    """What ``check`` finds on the run's log files, keyed as :func:`_printed` keys a printed finding."""
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(p) for p in out.glob("rank*.log"))], capture_output=True, text=True, timeout=300,
                       env=_env(), cwd=ROOT)
    assert c.returncode == 1, c.stderr[-2000:]
    return {(f["code"], f["rule"], f["rank"], f["node_id"], f["epoch"], str(f["evidence"][-1]))
            for f in json.loads(c.stdout)["findings"]}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_two_replicas_behind_the_collector_find_what_check_finds(tmp_path, run):
    ranks, mode, faults, cross = RUNS[run]
    out = tmp_path / "demo"
    ms, codes, n = two_replicas(tmp_path, _demo(ranks, mode, faults, out))
    replicas = ("a", "b")

    checked = {name: m["cptrace_serve_events_checked_total"] for name, m in ms.items()}
    assert all(v > 0 for v in checked.values()), f"both replicas get traffic: {checked}"
    assert sum(checked.values()) == n, f"each record reaches exactly one replica: {checked} vs {n}"
    assert all(m["cptrace_serve_spans_dropped_total"] == 0 and m["cptrace_serve_late_records_total"] == 0
               for m in ms.values())

    got = _printed(tmp_path, replicas)
    assert len(got) == len(set(got)), "no finding is printed twice"
    assert codes == {name: 1 if any(True for _ in (tmp_path / f"{name}.out").read_text().splitlines()) else 0
                     for name in replicas}

    want = _check_findings(out)
    have = set(got)
    exact = {f for f in want if f[1] in TRACE_RULES | LOCKSTEP_RULES}
    assert exact, "the faults give findings of rules one trace decides"
    assert {f for f in have if f[1] in TRACE_RULES | LOCKSTEP_RULES} == exact
    assert {f for f in have if f[1] in PARTIAL_RULES} <= {f for f in want if f[1] in PARTIAL_RULES}
    assert {f[1] for f in have} <= TRACE_RULES | LOCKSTEP_RULES | PARTIAL_RULES
    assert {f for f in have if f[1] == cross}, f"the {cross} fault is found by the replicas"
    for name in replicas:   # a rule one trace cannot decide is reported as unchecked, never passed
        last = (tmp_path / f"{name}.err").read_text().strip().splitlines()[-1]
        assert re.search(r"UNCHECKED here [^;]*\bC1\b", last), last
        assert not re.search(rf"UNCHECKED here [^;]*(?<![\w-]){cross}(?![\w-])", last), last


# (ranks, mode, faults) whose findings include rules one trace cannot decide (C1, C2: a rank's whole stream)
RUN_FAULTS = {"4-sharded": (4, "sharded", FAULTS + ",C1_div,C2_round"),
              "4-shared": (4, "shared", "H4_nolock,HASH_flip,C1_div"),
              "16-sharded": (16, "sharded", "C3_writer,HASH_flip,C1_div,C2_round")}


@pytest.mark.parametrize("run", sorted(RUN_FAULTS))
def test_a_run_checker_behind_the_collector_finds_everything_check_finds(tmp_path, run):
    """The collector's ``load_balancing/runs`` exporter (routing_key attributes on cptrace.run_id) -> one
    ``serve --scope run`` replica: every record checked once, none behind its reorder window, and exactly the
    findings ``check`` gives on the run's log files, every rule (C1 and C2 among them), none printed twice."""
    ranks, mode, faults = RUN_FAULTS[run]
    out = tmp_path / "demo"
    ms, codes, n = two_replicas(tmp_path, _demo(ranks, mode, faults, out), scope="run")
    m = ms["a"]
    assert m["cptrace_serve_events_checked_total"] == n
    assert (m["cptrace_serve_past_window_records_total"], m["cptrace_serve_spans_dropped_total"],
            m["cptrace_serve_late_records_total"]) == (0, 0, 0)
    got = _printed(tmp_path, ("a",))
    assert len(got) == len(set(got)), "no finding is printed twice"
    want = _check_findings(out)
    assert {"C1", "C3" if mode == "sharded" else "C5"} <= {f[1] for f in want}
    assert set(got) == want, (sorted(want - set(got)), sorted(set(got) - want))
    assert codes == {"a": 1}
    last = (tmp_path / "a.err").read_text().strip().splitlines()[-1]
    assert "UNCHECKED here (a rank's whole stream or the run's order needed): none;" in last, last


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop the processes a test started, the last started first (the collector before its replicas)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def up_url(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_the_collector_reaches_a_replica_over_mutual_tls_with_a_token(tmp_path):
    """The real collector's loadbalancing exporter with ``protocol.otlp.tls`` (CA, client certificate and key) and
    ``headers`` sends to a replica run with ``--tls-cert/--tls-key/--tls-client-ca`` and ``--auth-token-file``:
    every record is checked. The same collector with another token gets every request refused
    (UNAUTHENTICATED, counted by the replica): nothing of that run is checked."""
    import ssl

    from tests.helpers.otlp_receiver import make_pki

    pytest.importorskip("cryptography")
    b = collector_binary()
    (tmp_path / "pki").mkdir()
    pki = make_pki(str(tmp_path / "pki"))
    token = "Bearer collector-to-checker-t0ken"
    (tmp_path / "token").write_text(token + "\n")
    col_http, col_grpc, health, metrics, r_http, r_grpc = (free_port() for _ in range(6))
    ctx = ssl.create_default_context(cafile=pki["ca"])
    ctx.load_cert_chain(pki["client_cert"], pki["client_key"])

    def replica_metrics() -> dict[str, float]:
        req = urllib.request.Request(f"https://127.0.0.1:{r_http}/metrics", headers={"Authorization": token})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in r.read().decode().splitlines()
                    if ln and not ln.startswith("#")}

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{r_http}/readyz", timeout=2, context=ctx) as r:
                return r.status == 200
        except OSError:
            return False

    def collector(name: str, header: str) -> subprocess.Popen:
        cfg = _config(col_http, col_grpc, health, metrics, [r_grpc])
        otlp = cfg["exporters"]["load_balancing/checkers"]["protocol"]["otlp"]
        otlp["tls"] = {"insecure": False, "ca_file": pki["ca"], "cert_file": pki["client_cert"],
                       "key_file": pki["client_key"]}
        otlp["headers"] = {"authorization": header}
        otlp["retry_on_failure"]["max_elapsed_time"] = "10s"
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        p = subprocess.Popen([str(b), f"--config={tmp_path / f'{name}.yaml'}"],
                             stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        wait_for(lambda: up_url(f"http://127.0.0.1:{health}/"), 60, "collector healthy")
        return p

    def demo(name: str) -> int:
        d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", "HASH_flip",
                            "--endpoint", f"http://127.0.0.1:{col_http}/v1/traces", "--out", str(tmp_path / name),
                            "--json"], capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
        assert d.returncode in (0, 1), d.stderr[-2000:]
        return json.loads(d.stdout)["events"]["simulated"]

    procs: list[subprocess.Popen] = []
    try:
        serve = subprocess.Popen(
            [sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", f"127.0.0.1:{r_http}", "--grpc",
             f"127.0.0.1:{r_grpc}", "--idle", "2s", "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
             "--tls-client-ca", pki["ca"], "--auth-token-file", str(tmp_path / "token"), "--state-dir",
             str(tmp_path / "state")],
            stdout=open(tmp_path / "serve.out", "w"), stderr=open(tmp_path / "serve.err", "w"), env=_env(), cwd=ROOT)
        procs.append(serve)
        wait_for(ready, 60, "TLS replica ready")
        col = collector("col", token)
        n = demo("good")
        wait_for(lambda: replica_metrics()["cptrace_serve_events_checked_total"] >= n
                 and replica_metrics()["cptrace_serve_traces_held"] == 0, 120, f"{n} records checked over TLS",
                 interval_s=1.0)
        col.terminate()
        col.wait(timeout=30)
        col = collector("wrong", "Bearer not-the-token")
        demo("refused")
        wait_for(lambda: replica_metrics()["cptrace_serve_requests_unauthorized_total"] > 0, 60,
                 "the wrong token refused")
        col.terminate()
        col.wait(timeout=30)
        m = replica_metrics()
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=60)
    finally:
        stop_all(procs)
    assert m["cptrace_serve_events_checked_total"] == n, "the refused run was not checked, the accepted one whole"
    assert m["cptrace_serve_spans_dropped_total"] == 0
    printed = (tmp_path / "serve.out").read_text() + (tmp_path / "serve.err").read_text()
    assert code == 1 and "HASH" in printed, printed[-2000:]
    assert token.split()[1] not in printed
