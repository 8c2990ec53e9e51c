"""Memory of one ``serve`` replica's state over a long stream of nodes that end: RSS sampled as records flow.

In-process (the HTTP server left out: its memory is its bounded queue; the collector set as a running replica
sets it, ``serve_loop.GC_THRESHOLD``): the requests of a clean replicated-mode run
of 2 ranks (bench/check_throughput.py's generator, replayed into OTLP by ``cptrace-otel ingest``, 200 spans per
request) are decoded by the replica's intake (``otlp_intake.decode``, fresh records each time) and given to a
``ServeState`` with the replica's defaults (``--idle 30s``, ``--max-nodes 100000``; live as ``serve --live``,
unless ``--idle-only``),
again and again, each replay under a new run id, so nodes keep starting and ending (finalised when idle, runs
finished when idle). The clock the state sees is the stream's own: ``--rate`` records per second, so a trace
idle for ``--idle`` of stream time is finalised whatever this machine's speed. Printed every ``--every`` records:
records so far, RSS (``/proc/self/status`` VmRSS), traces and runs held, records held, traces finalised early.

    python bench/serve_memory.py --seconds 240               # live, stream at 20,000 records/s
    python bench/serve_memory.py --seconds 240 --idle-only
    python bench/serve_memory.py --seconds 240 --scope run   # a run checker (serve --scope run)

Runs until ``--events`` records or ``--seconds`` of wall time, whichever first; prints the RSS range after the
state filled (``--idle`` of stream time in), the records per wall second, and the held traces' size.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _trace_kinds(bodies: list[bytes]) -> dict[tuple[str, str], tuple]:
    """(run id, trace id) -> ("node", epoch, node id) | ("rank", rank) | ("other",), from every span of the run."""
    from cptrace_otel.analyze.otlp_intake import decode
    from cptrace_otel.analyze.serve_journal import trace_node
    from cptrace_otel.model.trace_ids import rank_trace_id

    evs: dict[tuple[str, str], list] = {}
    for b in bodies:
        for s in decode(b).spans:
            evs.setdefault((s.run_id, s.trace_id), []).extend(s.events)
    out: dict[tuple[str, str], tuple] = {}
    for (run, tid), events in evs.items():
        node = trace_node(run, tid, events)
        if node is not None:
            out[(run, tid)] = ("node", *node)
        elif events and rank_trace_id(run, events[0].rank).hex() == tid:
            out[(run, tid)] = ("rank", events[0].rank)
        else:
            out[(run, tid)] = ("other",)
    return out


def _renamed(s, run: str, kinds: dict[tuple[str, str], tuple]):
    """Span ``s`` as the exporter would have sent it under run id ``run``: its trace id, and a first lane span's id,
    are made of the run id (so the replica knows a node trace, a rank trace and each rank's first lane span as it
    does a real run's), its config stamp kept."""
    from cptrace_otel.analyze.incremental import SpanRef
    from cptrace_otel.analyze.otlp_intake import SpanRecords
    from cptrace_otel.model.trace_ids import hashed_id, lane_span_id, node_trace_id, rank_trace_id

    kind = kinds[(s.run_id, s.trace_id)]
    span_id = s.ref.span_id
    if kind[0] == "node":
        tid = node_trace_id(run, kind[1], kind[2]).hex()
        rank = s.events[0].rank if s.events else None
        if rank is not None and span_id == lane_span_id(s.run_id, kind[1], kind[2], rank).hex():
            span_id = lane_span_id(run, kind[1], kind[2], rank).hex()
    elif kind[0] == "rank":
        tid = rank_trace_id(run, kind[1]).hex()
    else:
        tid = hashed_id(f"{run}|{s.trace_id}", 16).hex()
    return SpanRecords(run, tid, SpanRef(tid, span_id, s.ref.start_us, s.ref.codes), s.level, s.events, s.config)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20000, help="stream records per second (default 20000)")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of stream time (default 30, serve's default)")
    ap.add_argument("--max-nodes", type=int, default=100_000)
    ap.add_argument("--idle-only", action="store_true")
    ap.add_argument("--scope", default="trace", choices=("trace", "run"),
                    help="the replica's --scope (run: a run checker, live; each replay is a run that ends)")
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--seconds", type=float, default=300.0, help="wall-time budget (default 300)")
    ap.add_argument("--lines", type=int, default=20_000, help="log lines per rank of the replayed run")
    ap.add_argument("--every", type=int, default=200_000)
    args = ap.parse_args(argv)

    from bench.check_throughput import generate
    from bench.serve_throughput import _bodies
    from cptrace_otel.analyze.otlp_intake import decode
    from cptrace_otel.analyze.serve_live import RUN_MERGE_CAP, RUN_WINDOW
    from cptrace_otel.analyze.serve_loop import GC_THRESHOLD
    from cptrace_otel.analyze.serve_state import ServeState

    tmp = Path(tempfile.mkdtemp(prefix="serve-memory-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    logs = generate(str(tmp / "rank{rank}.log"), args.lines, 2)
    otlp = tmp / "run.otlp.jsonl"
    subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "--no-progress", "--file", str(otlp), *logs],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    bodies = _bodies(otlp)
    kinds = _trace_kinds(bodies)
    if args.scope == "run" and args.idle_only:
        ap.error("--scope run checks live: no --idle-only")
    st = ServeState(lambda tr, found: None, idle_s=args.idle, max_nodes=args.max_nodes, live=not args.idle_only,
                    scope=args.scope, **({"window": RUN_WINDOW, "merge_cap": RUN_MERGE_CAP} if args.scope == "run"
                                         else {}))
    gc.collect()
    gc.set_threshold(*GC_THRESHOLD)   # the collector's setting of a running replica (serve_loop.Checker.start)
    base = rss_mib()
    mode = "run scope" if args.scope == "run" else "live" if not args.idle_only else "idle-only"
    print(f"{mode}: replaying {len(bodies)} requests under a new run id each "
          f"time; stream {args.rate:,.0f} records/s, --idle {args.idle:g}s, --max-nodes {args.max_nodes}; RSS with "
          f"the workload loaded {base:.0f} MiB")
    print(f"{'records':>10} {'stream s':>9} {'RSS MiB':>8} {'traces':>7} {'runs':>5} {'held rec':>9} {'early':>6}")
    n = copy = 0
    nxt = args.every
    t0 = time.monotonic()
    samples: list[tuple[int, float, float]] = []
    while n < args.events and time.monotonic() - t0 < args.seconds:
        run = f"mem-{copy}"
        copy += 1
        for b in bodies:
            if time.monotonic() - t0 >= args.seconds:
                break
            spans = [_renamed(s, run, kinds) for s in decode(b).spans]
            now = n / args.rate
            st.add(spans, now=now)
            st.sweep(now=now)
            n += sum(len(s.events) for s in spans)
            if n >= nxt:
                nxt += args.every
                r = rss_mib()
                samples.append((n, now, r))
                print(f"{n:>10} {now:>9.1f} {r:>8.0f} {len(st.traces):>7} {len(st.runs):>5} {st.records_held:>9} "
                      f"{st.early:>6}", flush=True)
    wall = time.monotonic() - t0
    filled = [r for _n, t, r in samples if t >= args.idle]
    print(f"{n} records in {wall:.0f} s wall ({n / wall:,.0f} records/s, {copy} runs); findings "
          f"{sum(st.findings.values())}, early {st.early}, late {st.late}, past window {st.past_window}")
    if filled:
        print(f"RSS once the state filled (stream time >= {args.idle:g}s, {len(filled)} samples): "
              f"{min(filled):.0f}-{max(filled):.0f} MiB; {len(st.traces)} traces held at the end")
    else:
        print("the run ended before the state filled (stream time < --idle): no steady-state figure")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
