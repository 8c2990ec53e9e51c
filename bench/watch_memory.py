"""Memory of ``cptrace-otel watch`` over a long run streamed into Jaeger: peak RSS against the RSS after the first
100,000 events (within 2x; the watcher's memory must follow what is in flight, not the run's length).

Setup: a Jaeger of its own (the repo's ``deploy/jaeger/config.yaml``, free loopback ports, memory store with
``--max-traces`` slots, span metrics off) unless ``--jaeger``/``--otlp`` name one; ``watch --run-id R --interval``
as a subprocess; this process streams ``--events`` events of 2 ranks (clean node lifecycles, 22 records per node
and rank: those of bench/jaeger_export.py plus the host eviction that ends the node) through the exporter's own
span builder and OTLP sink at ``--rate`` events/s. The watcher's RSS (``/proc/PID/status`` VmRSS) is sampled every
0.2 s next to the records it reports checked (``--verbose`` lines).

    python bench/watch_memory.py                      # 1,000,000 events
    python bench/watch_memory.py --events 300000 --rate 3000
Needs the Jaeger binary (deploy/jaeger/up builds deploy/jaeger/bin/jaeger; or JAEGER_BIN).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_jaeger(tmp: Path, max_traces: int) -> tuple[subprocess.Popen, str, str]:
    """A Jaeger of this bench's own: (process, query URL, OTLP HTTP URL)."""
    import yaml

    from tests.helpers.jaeger_config import PORTS, private_config

    binary = os.environ.get("JAEGER_BIN") or str(ROOT / "deploy" / "jaeger" / "bin" / "jaeger")
    p = {k: _port() for k in PORTS}
    cfg = private_config(p)   # the repo's memory store, span metrics off
    cfg["extensions"]["jaeger_storage"]["backends"]["mem"]["memory"]["max_traces"] = max_traces
    (tmp / "jaeger.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([binary, "--config", str(tmp / "jaeger.yaml")], stdout=open(tmp / "jaeger.log", "w"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p['health']}/status", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"Jaeger did not start: {(tmp / 'jaeger.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{p['query']}", f"http://127.0.0.1:{p['http']}/v1/traces"


def node_events(n: int, ranks: int):
    from jaeger_export import _r, node_records

    from cptrace_otel.model.logline import parse_value

    host = _r((n * 64) % 2_000_000, 64)
    recs = node_records(n) + [(1, "evict", {"tier": "host", "node_id": n, "kind": "regular", "host": host}),
                              (2, "free", {"pool": "host", "idx": host, "node_id": n, "why": "evict"})]
    for lv, tag, f in recs:
        fields = {k: (parse_value(v) if isinstance(v, str) else v) for k, v in f.items()}
        for r in range(ranks):
            yield lv, tag, r, dict(fields)


def stream(otlp: str, run_id: str, n_events: int, rate: float, ranks: int = 2) -> int:
    """Send ``n_events`` events at ``rate``/s through SpanBuilder + the OTLP sink; the events sent."""
    from cptrace_otel.export.stack import open_sinks
    from cptrace_otel.model import config as _config, semconv as sc
    from cptrace_otel.model.events import Event
    from cptrace_otel.model.spans import SpanBuilder

    cfg = _config.from_env()
    (sink,) = open_sinks(cfg, endpoint=otlp, spool_dir="")
    builders = {r: SpanBuilder(run_id, f"bench:{r}", 1.0) for r in range(ranks)}
    seq = {r: 0 for r in range(ranks)}
    t0 = time.monotonic()
    sent = 0
    node = 0
    while sent < n_events:
        node += 1
        for lv, tag, r, f in node_events(node, ranks):
            ev = Event(tag, r, seq[r], time.time_ns(), 0, f, lv)
            f["ts"] = ev.ts   # the cross-rank merge key, as the tracer stamps it
            seq[r] += 1
            builders[r].add(ev)
            sent += 1
        if node % 50 == 0:
            for r, b in builders.items():
                b.expire(time.time_ns())
                spans = b.take()
                if spans:
                    sink.export([({sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME, sc.RUN_ID: run_id,
                                         sc.CP_RANK: r}, spans)])
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    for r, b in builders.items():
        b.close_all()
        sink.export([({sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME, sc.RUN_ID: run_id, sc.CP_RANK: r},
                            b.take())])
    sink.flush(120)
    sink.close(1)
    return sent


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for ln in fh:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=6000.0, help="events per second streamed into Jaeger")
    ap.add_argument("--interval", default="2s", help="watch --interval")
    ap.add_argument("--max-traces", type=int, default=30000, help="memory-store slots of the bench's Jaeger")
    ap.add_argument("--jaeger", default=None, help="use this Jaeger's query URL (with --otlp) instead of one's own")
    ap.add_argument("--otlp", default=None, help="its OTLP HTTP traces URL")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="watch-bench-"))
    jproc = None
    if a.jaeger:
        query, otlp = a.jaeger, a.otlp or "http://127.0.0.1:4318/v1/traces"
    else:
        jproc, query, otlp = start_jaeger(tmp, a.max_traces)
    run_id = f"watch-bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    w = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "watch", "--jaeger", query, "--run-id", run_id,
                          "--interval", a.interval, "--lookback", "5s", "--since", "10m", "--verbose"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    checked = [0]
    lines: list[str] = []

    def read_err() -> None:
        for ln in w.stderr:
            lines.append(ln.rstrip())
            m = re.search(r": (\d+) records checked", ln)
            if m:
                checked[0] = int(m.group(1))

    threading.Thread(target=read_err, daemon=True).start()
    samples: list[tuple[float, int, int]] = []   # (t, checked, rss KiB)
    done = [False]

    def sample() -> None:
        while not done[0] and w.poll() is None:
            samples.append((time.monotonic(), checked[0], rss_kib(w.pid)))
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    sent = stream(otlp, run_id, a.events, a.rate)
    t_sent = time.monotonic() - t0
    deadline = time.monotonic() + 600
    while checked[0] < sent and time.monotonic() < deadline and w.poll() is None:
        time.sleep(0.5)
    time.sleep(1)
    done[0] = True
    w.terminate()
    w.wait(30)
    if jproc is not None:
        jproc.terminate()
        jproc.wait(30)
    first = next((rss for _, c, rss in samples if c >= 100_000), None)
    peak = max((rss for _, _, rss in samples), default=0)
    print(f"watch memory: {sent} events of 2 ranks streamed into Jaeger in {t_sent:.0f} s; watch checked "
          f"{checked[0]} ({'all' if checked[0] >= sent else 'NOT all'}) by {time.monotonic() - t0:.0f} s")
    if first is None:
        print("watch never reached 100,000 records checked")
        print("\n".join(lines[-20:]))
        sys.exit(1)
    marks = []   # RSS as the records checked pass each further 100,000: flat, or growing with the run?
    for _, c, rss in samples:
        if c >= 100_000 * (len(marks) + 1):
            marks.append(f"{c // 1000}k {rss / 1024:.0f}")
    print("RSS (MiB) by records checked: " + ", ".join(marks))
    ratio = peak / first
    print(f"RSS after the first 100,000 events: {first / 1024:.1f} MiB; peak RSS: {peak / 1024:.1f} MiB; "
          f"ratio {ratio:.2f} ({'within' if ratio <= 2 else 'NOT within'} 2x)")
    for ln in lines:
        if "not in Jaeger" in ln or "down" in ln:
            print("  " + ln)


if __name__ == "__main__":
    main()
