"""Scale-out cost: N rank processes at a fixed event rate each, through the loopback collector tier
(deploy/collector/up: the OTel Collector built from builder.yaml, routing by trace id to two Jaeger shards).

Figures (printed, not asserted; Linux: read from /proc):
* per rank: the exporter subprocess's CPU seconds per second of traffic at ``--rate`` (its CPU from the start of
  emission until everything was delivered, per event, times the rate: the share of a core it needs to keep up) and
  CPU ms per 1,000 events, its RSS (highest sampled), the same CPU figure for the traced process (the emitting loop
  included) and its RSS, the rate the emitter reached, and the flush lag (how far the exporter trailed the
  emission: ~0 when the machine kept up);
* the collector: CPU seconds per 100,000 events (and per 100,000 spans: an event is a span event, several share a
  span), from the start of emission until the shards received every span it accepted, and its RSS; the same for each
  Jaeger shard (memory store ingest);
* derived: cores per rank at the rate, ranks one core of exporters serves, events/s one collector core forwards.

Workload: bench/jaeger_export.py's node lifecycles (20 records per node: insert, prepare, backup, ack d2h, then
4 x evict, free, reload, ack h2d) over node ids shared by all ranks, each rank its own process with its own
``CPTRACE_CP_RANK`` and online checks on (the defaults), paced to ``--rate`` events/s.

    python bench/collector_scale.py                        # 4 ranks x 10,000 events/s x 15 s
    python bench/collector_scale.py --ranks 2 --rate 20000 --seconds 20 --json out.json

Uses the running tier, or starts it with deploy/collector/up (and stops it after). The machine's other load skews
every figure: the load average before the run is printed with them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTOR = ROOT / "deploy" / "collector"
EVENTS_PER_NODE = 20
CLK_TCK = os.sysconf("SC_CLK_TCK")
COLLECTOR_HTTP = "http://127.0.0.1:4418"        # deploy/collector/config-loopback.yaml
COLLECTOR_HEALTH = "http://127.0.0.1:13233/"
METRICS = {"collector": "http://127.0.0.1:8988/metrics", "jaeger-shard-a": "http://127.0.0.1:9088/metrics",
           "jaeger-shard-b": "http://127.0.0.1:9188/metrics"}


# -- /proc --------------------------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()   # fields after the command name (which may hold spaces)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    st = _stat(pid)
    return (int(st[11]) + int(st[12])) / CLK_TCK


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (the exporter worker of a rank process)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(_stat(int(d))[1]) == pid:
                    out.append(int(d))
            except (OSError, IndexError):
                pass
    return out


def metric_sum(url: str, name: str) -> float:
    """Sum over all label sets of one Prometheus-text metric (``name`` or ``name_total``)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        head = line.split("{", 1)[0].split(" ", 1)[0]
        if head in (name, name + "_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- one rank process ---------------------------------------------------------------------------------------------
def child(rank: int, ranks: int, rate: float, seconds: float, workdir: str) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from jaeger_export import node_records  # the same workload as the single-process export benchmark

    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline

    nodes = math.ceil(rate * seconds / EVENTS_PER_NODE)
    recs = [r for n in range(1, nodes + 1) for r in node_records(n)]
    cptrace = ct.cptrace
    cptrace(1, "config", cp_size=ranks, cp_rank=rank, mode="replicated", page_size=1, policy="wt")
    ct.flush(30)                                   # the pipeline and its exporter subprocess are up
    wd = Path(workdir)
    (wd / f"ready{rank}").write_text(str(os.getpid()))
    while not (wd / "go").exists():
        time.sleep(0.005)
    t0 = time.perf_counter()
    i, total = 0, len(recs)
    while i < total:                               # paced: emit what is due, then yield 2 ms
        due = min(total, int((time.perf_counter() - t0) * rate) + 1)
        while i < due:
            level, tag, f = recs[i]
            cptrace(level, tag, **f)
            i += 1
        time.sleep(0.002)
    emit_s = time.perf_counter() - t0
    ok = ct.flush(timeout_s=600)
    res = {"events": total, "emit_s": emit_s, "delivered_s": time.perf_counter() - t0, "flushed": ok,
           "dropped": pipeline.stats().get("dropped", 0)}
    (wd / f"rank{rank}.json").write_text(json.dumps(res))
    while not (wd / "exit").exists():              # stay alive so the driver can read the exporter's final CPU
        time.sleep(0.05)
    ct.shutdown(30)
    return 0


# -- driver -------------------------------------------------------------------------------------------------------
def _healthy() -> bool:
    try:
        with urllib.request.urlopen(COLLECTOR_HEALTH, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _pid(name: str) -> int:
    return int((COLLECTOR / ".run" / f"{name}.pid").read_text())


def _wait_files(paths: list[Path], procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"a rank process exited {p.returncode}:\n{p.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.02)


def run(args: argparse.Namespace) -> dict:
    tag = uuid.uuid4().hex[:8]
    run_id = f"bench-scale-{tag}"
    wd = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"cptrace-collector-scale-{tag}-"))
    wd.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(CPTRACE_LEVEL="2", CPTRACE_RUN_ID=run_id, OTEL_EXPORTER_OTLP_ENDPOINT=args.otlp,
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    procs = []
    for r in range(args.ranks):
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_child", str(r), str(args.ranks), str(args.rate),
             str(args.seconds), str(wd)],
            env=dict(env, CPTRACE_CP_RANK=str(r), CPTRACE_SPOOL_DIR=str(wd / f"spool{r}")),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    _wait_files([wd / f"ready{r}" for r in range(args.ranks)], procs, 120)
    rank_pids = [int((wd / f"ready{r}").read_text()) for r in range(args.ranks)]
    exporters = []
    for pid in rank_pids:
        kids = children(pid)
        if len(kids) != 1:
            raise SystemExit(f"rank process {pid} has {len(kids)} child processes, expected its one exporter "
                             f"(CPTRACE_EXPORTER=process is the default)")
        exporters.append(kids[0])
    servers = {name: _pid(name) for name in METRICS}
    watched = {f"rank{r}": p for r, p in enumerate(rank_pids)} | {f"exporter{r}": p for r, p in enumerate(exporters)}
    watched |= servers
    peak = {k: 0.0 for k in watched}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for k, p in watched.items():
                try:
                    peak[k] = max(peak[k], rss_mib(p))
                except OSError:
                    pass
            stop.wait(0.25)

    accepted0 = metric_sum(METRICS["collector"], "otelcol_receiver_accepted_spans")
    sent0 = metric_sum(METRICS["collector"], "otelcol_exporter_sent_spans")
    shard0 = {s: metric_sum(METRICS[s], "otelcol_receiver_accepted_spans") for s in ("jaeger-shard-a",
                                                                                    "jaeger-shard-b")}
    cpu0 = {k: cpu_s(p) for k, p in watched.items()}
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    (wd / "go").touch()
    t0 = time.monotonic()
    _wait_files([wd / f"rank{r}.json" for r in range(args.ranks)], procs, 600 + args.seconds)
    t_flushed = time.monotonic() - t0
    cpu_ranks = {k: cpu_s(p) for k, p in watched.items() if k.startswith(("rank", "exporter"))}
    # the collector forwards within its batch timeout (200 ms); wait until the shards hold what it accepted
    deadline = time.monotonic() + 60
    while True:
        accepted = metric_sum(METRICS["collector"], "otelcol_receiver_accepted_spans") - accepted0
        sent = metric_sum(METRICS["collector"], "otelcol_exporter_sent_spans") - sent0
        at_shards = {s: metric_sum(METRICS[s], "otelcol_receiver_accepted_spans") - v for s, v in shard0.items()}
        if (sent >= accepted and sum(at_shards.values()) >= sent) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    cpu_servers = {k: cpu_s(p) for k, p in servers.items()}
    stop.set()
    sampler.join()
    hwm = {k: rss_mib(p, "VmHWM") for k, p in servers.items()}
    (wd / "exit").touch()
    for p in procs:
        p.wait(timeout=120)
    results = [json.loads((wd / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    if not args.workdir:
        shutil.rmtree(wd, ignore_errors=True)
    events = sum(r["events"] for r in results)
    out = {"ranks": args.ranks, "rate_per_rank": args.rate, "seconds": args.seconds, "cpus": os.cpu_count(),
           "loadavg_before": args.loadavg, "events": events, "spans_accepted": accepted, "spans_sent": sent,
           "spans_at_shards": at_shards, "flushed_all_s": t_flushed, "per_rank": [], "servers": {}}
    for r, res in enumerate(results):
        exp_cpu = cpu_ranks[f"exporter{r}"] - cpu0[f"exporter{r}"]
        rank_cpu = cpu_ranks[f"rank{r}"] - cpu0[f"rank{r}"]
        out["per_rank"].append({
            "events": res["events"], "emit_rate": res["events"] / res["emit_s"], "flushed": res["flushed"],
            "dropped": res["dropped"], "lag_s": res["delivered_s"] - res["emit_s"],
            "exporter_cpu_s_per_s": exp_cpu / res["events"] * args.rate,
            "exporter_cpu_ms_per_1k": 1e6 * exp_cpu / res["events"], "exporter_rss_mib": peak[f"exporter{r}"],
            "traced_cpu_s_per_s": rank_cpu / res["events"] * args.rate, "traced_rss_mib": peak[f"rank{r}"]})
    for k in servers:
        c = cpu_servers[k] - cpu0[k]
        out["servers"][k] = {"cpu_s": c, "cpu_s_per_100k_events": 1e5 * c / events,
                             "cpu_s_per_100k_spans": 1e5 * c / max(accepted, 1), "rss_mib": peak[k],
                             "rss_hwm_mib": hwm[k]}
    return out


def report(o: dict) -> None:
    print(f"collector_scale: {o['ranks']} rank(s) x {o['rate_per_rank']:,.0f} events/s x {o['seconds']:.0f} s = "
          f"{o['events']:,} events ({o['spans_accepted']:,.0f} spans), {o['cpus']} CPUs, load average before "
          f"{o['loadavg_before']:.2f}")
    print("  rank  emitted ev/s  exporter CPU s/s  exporter ms/1k ev  exporter RSS  traced CPU s/s  traced RSS  "
          "lag s  dropped")
    for r, x in enumerate(o["per_rank"]):
        print(f"  {r:4d}  {x['emit_rate']:12,.0f}  {x['exporter_cpu_s_per_s']:16.3f}"
              f"  {x['exporter_cpu_ms_per_1k']:17.1f}  {x['exporter_rss_mib']:8.0f} MiB"
              f"  {x['traced_cpu_s_per_s']:14.3f}  {x['traced_rss_mib']:6.0f} MiB"
              f"  {x['lag_s']:5.1f}  {x['dropped']}")
    for k, s in o["servers"].items():
        print(f"  {k:15s} CPU {s['cpu_s_per_100k_events']:.3f} s per 100k events ({s['cpu_s_per_100k_spans']:.3f} s "
              f"per 100k spans), RSS {s['rss_mib']:.0f} MiB (peak since start {s['rss_hwm_mib']:.0f} MiB)")
    print(f"  spans: collector accepted {o['spans_accepted']:,.0f}, sent {o['spans_sent']:,.0f}, shards received "
          + ", ".join(f"{k[-1]} {v:,.0f}" for k, v in o["spans_at_shards"].items())
          + f"; every rank flushed after {o['flushed_all_s']:.1f} s")
    exp = sum(x["exporter_cpu_s_per_s"] for x in o["per_rank"]) / len(o["per_rank"])
    col = o["servers"]["collector"]["cpu_s_per_100k_events"]
    print(f"  derived: one rank at {o['rate_per_rank']:,.0f} ev/s needs {exp:.2f} cores of exporter "
          f"({1 / exp:.1f} such ranks per core); one collector core forwards ~{1e5 / col:,.0f} events/s "
          f"(~{1e5 / col / o['rate_per_rank']:.0f} such ranks)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        return child(int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4]), argv[5])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rate", type=float, default=10_000, help="events/s per rank")
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--otlp", default=COLLECTOR_HTTP, help="the collector's OTLP endpoint")
    p.add_argument("--workdir", default=None, help="handshake files (default: a new temporary folder)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    args.loadavg = os.getloadavg()[0]
    started = False
    if not _healthy():
        r = subprocess.run(["bash", str(COLLECTOR / "up")], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"deploy/collector/up failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
            return 3
        started = True
    try:
        out = run(args)
    finally:
        if started:
            subprocess.run(["bash", str(COLLECTOR / "down")], capture_output=True)
    report(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
