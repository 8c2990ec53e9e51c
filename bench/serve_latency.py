"""From a violating record entering the OTel Collector to its alert in Alertmanager: a ``serve`` replica that checks
records as they arrive (``--live``) beside one that checks a trace only when it is idle (the default), in one run.

The path: this process sends OTLP/HTTP protobuf to the real collector (built from deploy/collector/builder.yaml,
configured from deploy/collector/config-checkers.yaml with free ports, its Jaeger exporter left out), whose pipeline
fans every span out through two ``load_balancing`` exporters (routing key traceID, OTLP/gRPC), one per replica:
``live`` (``--live``) and ``idle-only`` (the default), and with ``--paths`` a run checker ``run`` (``--scope run``:
the whole stream as one replica's runs). Each replica posts to its own real Alertmanager (Debian's
``prometheus-alertmanager``, deploy/alertmanager/alertmanager.yml, on a free port); this process polls each
Alertmanager's ``GET /api/v2/alerts`` every 50 ms.

The stream: a clean replicated-mode run of 2 ranks (bench/check_throughput.py's generator, replayed into OTLP by
``cptrace-otel ingest``) sent at ``--rate`` records per second for ``--seconds``, in requests of 200 spans; at each
of ``--at`` (seconds into the stream) the requests of a faulted simulator run (``cptrace-otel demo --faults
HASH_flip``, its run id made unique per injection) are sent in between. The request that holds the record deciding
the run's first finding is found beforehand (the run fed to a live state one request at a time); its send time is
the start, the first poll that shows that alert (same run id, code and rank) in an Alertmanager the end.

    python bench/serve_latency.py                      # 5,000 records/s for 60 s, faults at 5, 12, 19 s
    python bench/serve_latency.py --rate 50000 --seconds 40
    python bench/serve_latency.py --rate 20000 --seconds 30 --paths live   # the live replica alone

Printed: for each path, the latency of each injection and min / median / max; the rate the sender reached; each
replica's records checked, turned away (503), past its reorder window, and its CPU seconds. What is measured is the
alert's arrival in Alertmanager's API; a notification to a receiver adds the route's ``group_wait`` (10 s in the
shipped alertmanager.yml). ``COLLECTOR_BIN`` names the collector binary (default deploy/collector/bin/otelcol-cptrace,
built by deploy/collector/up).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

SPANS_PER_REQUEST = 200
PATH_ARGS = {"live": ["--live"], "idle-only": [], "run": ["--scope", "run"]}   # each path's replica: serve's arguments


def _free_port() -> int:
    from tests.helpers import free_port

    return free_port()


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except OSError:
        return None


def _wait(pred, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def _with_run(body: bytes, run_id: str) -> bytes:
    """``body`` (an ExportTraceServiceRequest) with every resource's ``cptrace.run_id`` set to ``run_id``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from cptrace_otel.model import semconv as sc

    req = ExportTraceServiceRequest.FromString(body)
    for rs in req.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == sc.RUN_ID:
                kv.value.string_value = run_id
    return req.SerializeToString()


def _decider(bodies: list[bytes]) -> tuple[int, str, int]:
    """(index of the request holding the record that decides the run's first reported finding, its code, rank): the
    run fed to a live state one request at a time, nothing held back (window 0)."""
    from cptrace_otel.analyze.otlp_intake import decode
    from cptrace_otel.analyze.serve_state import ServeState

    found: list = []
    st = ServeState(lambda tr, fs: found.extend(fs), idle_s=3600, live=True, window=0, window_s=0.0)
    for i, b in enumerate(bodies):
        st.add(decode(b).spans, now=float(i))
        if found:
            return i, found[0].code, found[0].rank
    raise SystemExit("the faulted run gave no finding before its end")


def _collector_config(http_port: int, health: int, metrics: int, replicas: dict[str, int]) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "deploy" / "collector" / "config-checkers.yaml").read_text())
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http_port}"
    cfg["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{health}"
    cfg["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"] = metrics
    lb = cfg["exporters"].pop("load_balancing/checkers")
    del cfg["exporters"]["otlp/jaeger"], cfg["exporters"]["load_balancing/runs"]
    for name, port in replicas.items():
        e = json.loads(json.dumps(lb))
        e["resolver"]["static"]["hostnames"] = [f"127.0.0.1:{port}"]
        cfg["exporters"][f"load_balancing/{name.replace('-', '')}"] = e
    cfg["service"]["pipelines"]["traces"]["exporters"] = [f"load_balancing/{n.replace('-', '')}" for n in replicas]
    return cfg


def _metrics(port: int) -> dict[str, float]:
    text = (_get(f"http://127.0.0.1:{port}/metrics", timeout=30.0) or b"").decode()   # a busy replica answers late
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln and not ln.startswith("#")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=5000, help="records per second of the clean stream (default 5000)")
    ap.add_argument("--seconds", type=float, default=60, help="length of the clean stream (default 60)")
    ap.add_argument("--at", default="5,12,19", help="seconds into the stream of the faulted runs (default 5,12,19)")
    ap.add_argument("--idle", default="30s", help="both replicas' --idle (default 30s, serve's default)")
    ap.add_argument("--keep", default=None, help="folder to keep the generated files and logs in")
    ap.add_argument("--paths", default="live,idle-only",
                    help="the replicas to run, of live, idle-only and run (a run checker, --scope run; default live "
                         "and idle-only; one alone leaves it the CPU the others would take)")
    args = ap.parse_args(argv)
    names = tuple(dict.fromkeys(x.strip() for x in args.paths.split(",") if x.strip()))
    if not names or not set(names) <= set(PATH_ARGS):
        ap.error(f"--paths: a comma-separated list of {', '.join(PATH_ARGS)}")
    at = sorted(float(x) for x in args.at.split(","))
    col_bin = Path(os.environ.get("COLLECTOR_BIN") or ROOT / "deploy" / "collector" / "bin" / "otelcol-cptrace")
    am_bin = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not col_bin.is_file() or not am_bin:
        raise SystemExit(f"needs the collector ({col_bin}; deploy/collector/up builds it) and Alertmanager "
                         f"({am_bin or 'prometheus-alertmanager: not found'})")
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="serve-latency-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    from bench.check_throughput import generate
    from bench.serve_throughput import _bodies
    from cptrace_otel.analyze.otlp_intake import decode
    from tests.helpers.otlp_receiver import parse_json_line

    # -- the workload, made before the clock starts -------------------------------------------------------------
    lines = max(1000, int(args.rate * args.seconds / 2))   # 2 ranks, one record per line
    logs = generate(str(tmp / "rank{rank}.log"), lines, 2)
    otlp = tmp / "clean.otlp.jsonl"
    subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "--no-progress", "--file", str(otlp), *logs],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    clean = [(b, decode(b).records) for b in _bodies(otlp, SPANS_PER_REQUEST)]
    demo = tmp / "faulted"
    d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", "HASH_flip",
                        "--out", str(demo), "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    if d.returncode not in (0, 1):
        raise SystemExit(f"demo failed: {d.stderr[-1000:]}")
    fault_bodies = [parse_json_line(ln).SerializeToString() for f in sorted(demo.glob("*.otlp.jsonl"))
                    for ln in f.read_text().splitlines() if ln.strip()]
    k, code, rank = _decider(fault_bodies)
    injections = [[_with_run(b, f"bench-fault-{i}") for b in fault_bodies] for i in range(len(at))]
    total = sum(n for _, n in clean)
    print(f"stream: {total} records in {len(clean)} requests at {args.rate:,.0f}/s; {len(at)} faulted runs of "
          f"{sum(decode(b).records for b in fault_bodies)} records at {at} s (deciding record in request {k + 1} of "
          f"{len(fault_bodies)}: {code} rank {rank})")

    # -- the services -------------------------------------------------------------------------------------------
    procs: list[subprocess.Popen] = []
    ports = {n: (_free_port(), _free_port(), _free_port()) for n in names}   # serve http, serve grpc, alertmanager
    try:
        for n in names:
            am_dir = tmp / f"am-{n}"
            am_dir.mkdir(exist_ok=True)
            procs.append(subprocess.Popen(
                [am_bin, f"--config.file={ROOT / 'deploy' / 'alertmanager' / 'alertmanager.yml'}",
                 f"--web.listen-address=127.0.0.1:{ports[n][2]}", "--cluster.listen-address=",
                 f"--storage.path={am_dir}"], stdout=subprocess.DEVNULL, stderr=open(tmp / f"am-{n}.log", "w")))
        replicas = {}
        for n in names:
            p = subprocess.Popen(
                [sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", f"127.0.0.1:{ports[n][0]}",
                 "--grpc", f"127.0.0.1:{ports[n][1]}", "--idle", args.idle, "--queue", "256",
                 "--alertmanager", f"http://127.0.0.1:{ports[n][2]}", *PATH_ARGS[n]],
                stdout=open(tmp / f"{n}.out", "w"), stderr=open(tmp / f"{n}.err", "w"), env=env, cwd=ROOT)
            procs.append(p)
            replicas[n] = p
        for n in names:
            _wait(lambda n=n: _get(f"http://127.0.0.1:{ports[n][0]}/readyz") is not None, 60, f"replica {n}")
            _wait(lambda n=n: _get(f"http://127.0.0.1:{ports[n][2]}/-/ready") is not None, 60, f"alertmanager {n}")
        import yaml

        c_http, c_health, c_metrics = _free_port(), _free_port(), _free_port()
        (tmp / "col.yaml").write_text(yaml.safe_dump(_collector_config(c_http, c_health, c_metrics,
                                                                       {n: ports[n][1] for n in names})))
        procs.append(subprocess.Popen([str(col_bin), f"--config={tmp / 'col.yaml'}"],
                                      stdout=open(tmp / "col.log", "w"), stderr=subprocess.STDOUT))
        _wait(lambda: _get(f"http://127.0.0.1:{c_health}/") is not None, 60, "collector")

        # -- the run ------------------------------------------------------------------------------------------
        seen: dict[tuple[str, int], float] = {}   # (path, injection) -> time the alert was first seen
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                for n in names:
                    raw = _get(f"http://127.0.0.1:{ports[n][2]}/api/v2/alerts", timeout=1.0)
                    now = time.monotonic()
                    for a in json.loads(raw or b"[]"):
                        lb = a.get("labels", {})
                        run = lb.get("run_id", "")
                        if (run.startswith("bench-fault-") and lb.get("code") == code
                                and lb.get("rank") == str(rank)):
                            seen.setdefault((n, int(run.rsplit("-", 1)[1])), now)
                stop.wait(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        conn = http.client.HTTPConnection("127.0.0.1", c_http, timeout=30)

        def send(body: bytes) -> None:
            while True:
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                r = conn.getresponse()
                r.read()
                if r.status == 200:
                    return
                time.sleep(0.05)   # the collector refused (memory limiter): resend, as an exporter does

        sent_at: dict[int, float] = {}
        cpu0 = {n: _cpu(replicas[n].pid) for n in names}
        t0 = time.monotonic()
        due = 0.0
        pending = list(enumerate(injections))
        for body, n_rec in clean:
            while pending and time.monotonic() - t0 >= at[pending[0][0]]:
                i, bodies = pending.pop(0)
                for j, b in enumerate(bodies):
                    if j == k:
                        sent_at[i] = time.monotonic()
                    send(b)
            wait = t0 + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            send(body)
            due += n_rec / args.rate
        elapsed = time.monotonic() - t0
        for i, bodies in pending:   # the stream ended first: send what is left now
            for j, b in enumerate(bodies):
                if j == k:
                    sent_at[i] = time.monotonic()
                send(b)
        # wait for every alert (the idle-only path: --idle after the faulted run's last record, plus a sweep)
        _wait(lambda: len(seen) == len(names) * len(at), 180, "every alert")
        stop.set()
        cpu = {n: _cpu(replicas[n].pid) - cpu0[n] for n in names}
        m = {n: _metrics(ports[n][0]) for n in names}
    finally:
        for p in reversed(procs):   # the collector, then the replicas (their last post), then the Alertmanagers
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()

    print(f"sent {total} records in {elapsed:.1f} s: {total / elapsed:,.0f} records/s (target {args.rate:,.0f})")
    for n in names:
        lat = [seen[(n, i)] - sent_at[i] for i in range(len(at))]
        mm = m[n]
        print(f"{n:>9}: violating record -> alert in Alertmanager: " + ", ".join(f"{x:.2f}" for x in lat)
              + f" s; min {min(lat):.2f} median {statistics.median(lat):.2f} max {max(lat):.2f} s | "
              f"{mm.get('cptrace_serve_events_checked_total', 0):.0f} records checked, "
              f"{mm.get('cptrace_serve_spans_dropped_total', 0):.0f} spans turned away (503), "
              f"{mm.get('cptrace_serve_past_window_records_total', 0):.0f} past the reorder window, "
              f"{mm.get('cptrace_serve_records_held', 0):.0f} records held at the end, {cpu[n]:.1f} CPU s")
    print(f"files in {tmp}")
    return 0


def _cpu(pid: int) -> float:
    from bench._proc import cpu_s

    return cpu_s(pid) or 0.0


if __name__ == "__main__":
    raise SystemExit(main())
