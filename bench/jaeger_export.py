"""Sustained export into the real Jaeger: cptrace-otel against the OpenTelemetry SDK path, one run, same machine.

Needs Jaeger running (``deploy/jaeger/up``; OTLP on 127.0.0.1:4318, query on 127.0.0.1:16686).

Workload (identical for both paths): node lifecycles of 20 records each (insert, prepare, backup, ack d2h, then 4 x
(evict, free, reload, ack h2d)), typed fields as SGLang's call sites pass them (ints, ``rng()`` strings, lists).

Phase 1, throughput (each path in a fresh traced subprocess, emitting as fast as it can, then flushing):
* ours: ``cptrace_otel.cptrace`` (bounded buffer -> exporter worker subprocess -> OTLP/HTTP protobuf + gzip);
* SDK: ``TracerProvider`` + ``BatchSpanProcessor`` + ``OTLPSpanExporter`` (HTTP), the same stage spans with one span
  event per record (attributes via the same schema), trace ids = our node trace ids; the BSP queue is raised so that
  it does not drop (its default drops the oldest spans silently). ``sdk`` converts each record's fields to typed
  attributes inside the timed loop (what a user of the SDK pays); ``sdk-pre`` builds them before the clock starts
  (an SDK-favourable bound).
Reported per path: events/s end to end (first call -> everything delivered), hot-path µs per call, CPU seconds per
1,000 events of the traced process itself (and of our exporter worker, which runs in its own process), and the events
Jaeger returns for the run (read back through /api/traces; must equal the events emitted). Ratio ours / SDK. Then the
CPU µs per event of each process on the path (``bench/_proc.py``, from /proc): the traced process, our worker from
the first record to the end of the flush (and over its whole life, start-up included), and Jaeger (the process
listening on the OTLP port, from the child's start to 1.5 s after its flush, less Jaeger's idle rate), with the event
rate their sum allows on this machine's cores: what bounds the path when the cores are shared.

Phase 2, steady: ours at a fixed 20,000 events/s for 60 s, then flush; events lost = emitted - returned by Jaeger.

    python bench/jaeger_export.py                       # 200k events per path, steady 20k ev/s x 60 s
    python bench/jaeger_export.py --events 100000 --steady-rate 20000 --steady-s 30 --json out.json

The memory store keeps ``max_traces`` (default 200,000) traces: one run creates ~events/20 node traces per phase, so
run it on a freshly started Jaeger (``deploy/jaeger/down; deploy/jaeger/up``) or raise ``JAEGER_MAX_TRACES``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid

import _proc  # (bench/: this script's own directory, first on sys.path)

EVENTS_PER_NODE = 20
CYCLES = 4


def _r(lo: int, n: int) -> str:
    return f"(cnt={n},min={lo},max={lo + n - 1},first={lo},last={lo + n - 1})"


def node_records(n: int) -> list[tuple[int, str, dict]]:
    """The 20 records of node ``n``: a clean lifecycle (no invariant broken)."""
    dev, host = _r((n * 64) % 1_000_000, 64), _r((n * 64) % 2_000_000, 64)
    h = 1_000_003 * n
    out = [
        (1, "insert", {"node_id": n, "parent": 0, "len": 64, "dev": dev, "kind": "new"}),
        (1, "prepare", {"node_id": n, "op": n, "len": 64, "dev": dev, "host": host, "policy": "wt"}),
        (1, "backup", {"op": n, "node_id": n, "dev": dev, "host": host, "io": 1, "h": h, "nz": 4096}),
        (2, "ack", {"dir": "d2h", "op": n, "node_id": n, "blen": 64, "clen": 64, "pub": [n]}),
    ]
    for c in range(CYCLES):
        dev2 = _r((n * 64 + (c + 1) * 7919) % 1_000_000, 64)
        op = 10_000_000 + n * CYCLES + c
        out += [
            (1, "evict", {"tier": "dev", "node_id": n, "kind": "backuped", "dev": dev}),
            (2, "free", {"pool": "dev", "idx": dev, "node_id": n, "why": "evict"}),
            (1, "reload", {"node_id": n, "chain": [n], "op": op, "host": host, "dev": dev2}),
            (2, "ack", {"dir": "h2d", "op": op, "node_id": n, "h": h, "nz": 4096}),
        ]
        dev = dev2
    return out


# -- traced processes ---------------------------------------------------------------------------------------------
def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def child_ours(n_events: int, rate: float) -> dict:
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline

    nodes = n_events // EVENTS_PER_NODE
    recs = [r for n in range(1, nodes + 1) for r in node_records(n)]  # built before timing: the caller's data
    cptrace = ct.cptrace
    cptrace(1, "config", cp_size=1, cp_rank=0, mode="none", page_size=1, policy="wt")  # starts the pipeline
    ct.flush(30)
    workers = _proc.children(os.getpid())   # the exporter worker, started and warm
    w0 = [_proc.cpu_s(p) for p in workers]
    c0, t0 = _cpu_self(), time.perf_counter()
    emit_s = 0.0
    if rate <= 0:
        for level, tag, f in recs:
            cptrace(level, tag, **f)
        emit_s = time.perf_counter() - t0
    else:
        i, total = 0, len(recs)
        while i < total:
            due = min(total, int((time.perf_counter() - t0) * rate) + 1)
            e0 = time.perf_counter()
            while i < due:
                level, tag, f = recs[i]
                cptrace(level, tag, **f)
                i += 1
            emit_s += time.perf_counter() - e0
            time.sleep(0.002)
    t_emitted = time.perf_counter()
    ok = ct.flush(timeout_s=300)
    t1 = time.perf_counter()
    c1 = _cpu_self()
    w1 = [_proc.cpu_s(p) for p in workers]
    # the worker's CPU from the first record to the end of the flush (its start-up and exit excluded)
    stream = (sum(b - a for a, b in zip(w0, w1, strict=False) if a is not None and b is not None)
              if len(workers) == 1 else None)
    st = pipeline.stats()
    cw0 = _cpu_children()
    ct.shutdown(60)
    worker_cpu = _cpu_children() - cw0
    return {"events": len(recs), "wall_s": t1 - t0, "emit_wall_s": t_emitted - t0, "emit_s": emit_s,
            "cpu_s": c1 - c0, "worker_cpu_s": worker_cpu, "worker_stream_cpu_s": stream,
            "flushed": ok, "dropped": st.get("dropped", 0),
            "stats": {k: v for k, v in st.items() if k != "worker"}, "worker": st.get("worker", {})}


def child_sdk(n_events: int, run_id: str, queue: int, preconverted: bool = False) -> dict:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    from cptrace_otel.model import semconv as sc
    from cptrace_otel.model.attrs import fields_to_attributes
    from cptrace_otel.model.config import from_env
    from cptrace_otel.model.logline import parse_value
    from cptrace_otel.model.trace_ids import node_trace_id

    class NodeIds(RandomIdGenerator):
        trace_id = 1

        def generate_trace_id(self) -> int:
            return self.trace_id

    cfg = from_env()
    ids = NodeIds()
    provider = TracerProvider(resource=Resource.create(cfg.resource()), id_generator=ids)
    bsp = BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.endpoint or "http://127.0.0.1:4318/v1/traces"),
                             max_queue_size=queue, schedule_delay_millis=200, max_export_batch_size=2048)
    provider.add_span_processor(bsp)
    tracer = provider.get_tracer(sc.SCOPE_NAME)
    nodes = n_events // EVENTS_PER_NODE
    recs = [node_records(n) for n in range(1, nodes + 1)]
    tids = [int.from_bytes(node_trace_id(run_id, 0, n), "big") for n in range(1, nodes + 1)]
    seq = 0

    def convert(f: dict) -> dict:
        # what an SDK user must do per record: typed fields -> the same attribute schema as ours
        return fields_to_attributes({k: (parse_value(v) if isinstance(v, str) else v) for k, v in f.items()})

    if preconverted:  # the SDK-favourable bound: attribute dicts built before the clock starts
        pre = {id(f): convert(f) for node in recs for _, _, f in node}

    def attrs(level: int, f: dict) -> dict:
        nonlocal seq
        seq += 1
        a = dict(pre[id(f)]) if preconverted else convert(f)
        a[sc.SEQ] = seq
        a[sc.EPOCH] = 0
        a[sc.LEVEL] = level
        return a

    c0, t0 = _cpu_self(), time.perf_counter()
    for n, (node, tid) in enumerate(zip(recs, tids, strict=False), start=1):
        ids.trace_id = tid
        span_attrs = {sc.NODE_ID: n, sc.RANK: cfg.cp_rank}
        node_span = tracer.start_span(sc.SPAN_NODE, attributes=span_attrs)
        d2h = tracer.start_span(sc.SPAN_D2H, attributes=span_attrs)
        h2d = None
        for level, tag, f in node:
            ts = time.time_ns()
            if tag in ("prepare", "backup") or (tag == "ack" and f["dir"] == "d2h"):
                d2h.add_event(tag, attrs(level, f), ts)
                if tag == "ack":
                    d2h.end(ts)
            elif tag == "reload":
                h2d = tracer.start_span(sc.SPAN_H2D, attributes=span_attrs, start_time=ts)
                h2d.add_event(tag, attrs(level, f), ts)
            elif tag == "ack":
                h2d.add_event(tag, attrs(level, f), ts)
                h2d.end(ts)
            else:
                node_span.add_event(tag, attrs(level, f), ts)
        node_span.end()
    emit_s = time.perf_counter() - t0
    ok = provider.force_flush(timeout_millis=300_000)
    t1 = time.perf_counter()
    c1 = _cpu_self()
    dropped = getattr(getattr(bsp, "_batch_processor", bsp), "_dropped_spans", None)
    provider.shutdown()
    return {"events": seq, "wall_s": t1 - t0, "emit_wall_s": emit_s, "emit_s": emit_s, "cpu_s": c1 - c0,
            "worker_cpu_s": 0.0, "flushed": ok, "dropped": dropped}


# -- driver -------------------------------------------------------------------------------------------------------
def run_child(kind: str, n_events: int, run_id: str, service: str, args: argparse.Namespace, rate: float = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(CPTRACE_LEVEL="2", CPTRACE_RUN_ID=run_id, CPTRACE_CP_RANK="0", OTEL_SERVICE_NAME=service,
               OTEL_EXPORTER_OTLP_ENDPOINT=args.otlp, PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__), "_child", kind, str(n_events), run_id, str(rate),
           str(args.sdk_queue)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{kind} child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["stderr_tail"] = out.stderr[-500:]
    return res


def count_in_jaeger(query: str, run_id: str, nodes: int, batch: int = 40) -> tuple[int, int]:
    """(record events, traces found) for the node traces of ``run_id`` as Jaeger's /api/traces returns them."""
    from cptrace_otel.model.trace_ids import node_trace_id

    ids = [node_trace_id(run_id, 0, n).hex() for n in range(1, nodes + 1)]
    events = found = 0
    for i in range(0, len(ids), batch):
        qs = "&".join(f"traceID={t}" for t in ids[i:i + batch])
        with urllib.request.urlopen(f"{query}/api/traces?{qs}", timeout=120) as r:
            data = json.loads(r.read())["data"] or []
        found += len(data)
        for tr in data:
            for sp in tr["spans"]:
                for lg in sp["logs"]:
                    name = next((f["value"] for f in lg["fields"] if f["key"] == "event"), "")
                    if name != "hicache.violation":
                        events += 1
    return events, found


def _fmt(r: dict) -> str:
    ev = r["events"]
    return (f"{ev / r['wall_s']:>10,.0f} ev/s end-to-end | hot path {1e6 * r['emit_s'] / ev:6.2f} us/call | "
            f"traced-process CPU {1000 * r['cpu_s'] / ev:.4f} s/1k ev"
            + (f" (+ exporter worker {1000 * r['worker_cpu_s'] / ev:.4f})" if r.get("worker_cpu_s") else "")
            + f" | Jaeger returned {r['returned']:,}/{ev:,}")


def _fmt_cpu(r: dict) -> str:
    """CPU per event of each process on the path: the traced process, our worker (over the stream, and its whole
    life with start-up), Jaeger (from the first record to 1.5 s after the flush, less its idle rate); and the event
    rate those would allow if the machine's cores did nothing else."""
    ev = r["events"]
    us = {"traced": 1e6 * r["cpu_s"] / ev}
    txt = f"traced {us['traced']:.2f}"
    if r.get("worker_stream_cpu_s") is not None:
        us["worker"] = 1e6 * r["worker_stream_cpu_s"] / ev
        txt += (f", exporter worker {us['worker']:.2f} over the stream "
                f"({1e6 * r['worker_cpu_s'] / ev:.2f} with start-up)")
    if r.get("jaeger_cpu_s") is not None:
        us["jaeger"] = 1e6 * r["jaeger_cpu_s"] / ev
        txt += f", Jaeger {us['jaeger']:.2f}"
    total = sum(us.values())
    cpus = os.cpu_count() or 1
    return (f"CPU per event (us): {txt}; sum {total:.2f} -> {cpus} cores cap the path at "
            f"{cpus * 1e6 / total:,.0f} ev/s" + (f" (Jaeger alone at {cpus * 1e6 / us['jaeger']:,.0f})"
                                                 if us.get("jaeger") else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        kind, n, run_id, rate, queue = argv[1], int(argv[2]), argv[3], float(argv[4]), int(argv[5])
        res = child_ours(n, rate) if kind == "ours" else child_sdk(n, run_id, queue, kind == "sdk-pre")
        print(json.dumps(res))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000, help="events per path in the throughput phase")
    p.add_argument("--steady-rate", type=float, default=20_000)
    p.add_argument("--steady-s", type=float, default=60)
    p.add_argument("--skip-steady", action="store_true")
    p.add_argument("--skip-sdk", action="store_true")
    p.add_argument("--sdk-queue", type=int, default=1 << 20, help="BSP max_queue_size (large: no silent drops)")
    p.add_argument("--otlp", default="http://127.0.0.1:4318")
    p.add_argument("--query", default="http://127.0.0.1:16686")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    try:
        urllib.request.urlopen(args.query + "/api/services", timeout=5).read()
    except OSError as e:
        print(f"Jaeger query service unreachable at {args.query} ({e}); start it with deploy/jaeger/up",
              file=sys.stderr)
        return 3
    tag = uuid.uuid4().hex[:8]
    n = args.events - args.events % EVENTS_PER_NODE
    out: dict = {"events_per_path": n, "cpus": os.cpu_count()}
    from cptrace_otel.export import otlp_proto as otlp, worker

    enc = ("C span-event encoder and intake" if otlp.c_encoders_built() and worker.c_intake() is not None
           else "pure-Python parts (C speedups not fully built)")
    print(f"jaeger_export: {n:,} events per path ({EVENTS_PER_NODE}/node), Jaeger {args.query}, {os.cpu_count()} CPUs, "
          f"{enc}")
    jpid = _proc.listener(urllib.parse.urlsplit(args.otlp).port or 4318)
    idle = None   # Jaeger's CPU seconds per second when nothing is sent (subtracted from each run's)
    if jpid is not None:
        j0 = _proc.cpu_s(jpid)
        time.sleep(2.0)
        j1 = _proc.cpu_s(jpid)
        idle = (j1 - j0) / 2.0 if j0 is not None and j1 is not None else None
    print(f"  Jaeger process: {jpid if jpid is not None else 'not found (its CPU is not reported)'}"
          + (f", idle CPU {100 * idle:.1f}% of a core" if idle is not None else ""))

    def jaeger_cpu(kind: str, n_ev: int, run_id: str, rate: float = 0) -> dict:
        j0, t0 = (_proc.cpu_s(jpid) if jpid is not None else None), time.perf_counter()
        r = run_child(kind, n_ev, run_id, run_id, args, rate=rate)
        time.sleep(1.5)  # Jaeger's batch processor (200 ms) and store
        j1, t1 = (_proc.cpu_s(jpid) if jpid is not None else None), time.perf_counter()
        r["jaeger_cpu_s"] = (max(0.0, j1 - j0 - (idle or 0.0) * (t1 - t0)) if j0 is not None and j1 is not None
                             else None)
        return r

    paths = ["ours"] + ([] if args.skip_sdk else ["sdk", "sdk-pre"])
    for kind in paths:
        run_id = f"bench-{kind}-{tag}"
        r = jaeger_cpu(kind, n, run_id)
        r["returned"], r["traces"] = count_in_jaeger(args.query, run_id, n // EVENTS_PER_NODE)
        out[kind] = r
        print(f"  {kind:7s}: {_fmt(r)}  (flushed={r['flushed']}, dropped={r['dropped']})")
        print(f"           {_fmt_cpu(r)}")
    if "sdk" in out:
        o, s = out["ours"], out["sdk"]
        out["ratio_events_per_s"] = (o["events"] / o["wall_s"]) / (s["events"] / s["wall_s"])
        out["ratio_cpu_traced"] = (s["cpu_s"] / s["events"]) / (o["cpu_s"] / o["events"])
        out["ratio_cpu_total"] = (s["cpu_s"] / s["events"]) / ((o["cpu_s"] + o["worker_cpu_s"]) / o["events"])
        print(f"  ratio ours/SDK: {out['ratio_events_per_s']:.1f}x events/s (bar 5x); traced-process CPU per event "
              f"{out['ratio_cpu_traced']:.1f}x less; including our exporter worker {out['ratio_cpu_total']:.1f}x less")
        p = out["sdk-pre"]
        out["ratio_events_per_s_vs_preconverted"] = (o["events"] / o["wall_s"]) / (p["events"] / p["wall_s"])
        out["ratio_cpu_traced_vs_preconverted"] = (p["cpu_s"] / p["events"]) / (o["cpu_s"] / o["events"])
        print(f"  ratio ours/SDK with attributes pre-built (SDK-favourable bound): "
              f"{out['ratio_events_per_s_vs_preconverted']:.1f}x events/s; traced-process CPU per event "
              f"{out['ratio_cpu_traced_vs_preconverted']:.1f}x less")
    print(f"  goal 100k events/s from one traced process: ours {out['ours']['events'] / out['ours']['wall_s']:,.0f}")
    if not args.skip_steady:
        ns = int(args.steady_rate * args.steady_s)
        ns -= ns % EVENTS_PER_NODE
        run_id = f"bench-steady-{tag}"
        r = jaeger_cpu("ours", ns, run_id, rate=args.steady_rate)
        r["returned"], r["traces"] = count_in_jaeger(args.query, run_id, ns // EVENTS_PER_NODE)
        r["lost"] = r["events"] - r["returned"]
        out["steady"] = r
        print(f"  steady {args.steady_rate:,.0f} ev/s x {args.steady_s:.0f} s: emitted {r['events']:,} in "
              f"{r['emit_wall_s']:.1f} s, delivered by {r['wall_s']:.1f} s; Jaeger returned {r['returned']:,}; "
              f"lost {r['lost']:,}; dropped in process {r['dropped']}; traced-process CPU "
              f"{1000 * r['cpu_s'] / r['events']:.4f} s/1k ev, worker {1000 * r['worker_cpu_s'] / r['events']:.4f}")
        print(f"           {_fmt_cpu(r)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
