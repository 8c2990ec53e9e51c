"""Export throughput from one traced process: ours vs the OpenTelemetry SDK path, into the same local receiver.

* ours: a traced process emits N ``cptrace`` records (8 scalar fields, and ``dir=d2h`` on the acks; 500 node ids
  cycling through prepare, backup, ack and evict, so d2h stage spans and node spans both occur) as fast as it can,
  then ``flush()``; the per-rank exporter subprocess runs the online checks, maps, encodes (protobuf) and POSTs
  them (OTLP/HTTP, gzip).
* SDK: a process does the same work through ``TracerProvider`` + ``BatchSpanProcessor`` + ``OTLPSpanExporter``
  (HTTP): one span per 8 records, each record a span event with the same 8 attributes, then ``force_flush()``.
  The queue is raised to 65,536 (the default 2,048 drops about half of a burst; perf-anchors C.3) so both deliver.
* ours runs with ``CPTRACE_RING=0`` (every record through the buffer and the drainer thread); ring: the same with
  ``CPTRACE_RING=1`` (the C gate encodes the records into the shared-memory ring the exporter reads;
  ``--no-ring`` leaves it out).
* receiver: ``tests/otlp_receiver.py`` (decodes every request with opentelemetry-proto and counts what arrived), or
  ``--sink null`` (reads and discards the body).

Reported: events/s delivered (emit start to flush done), the traced process's own CPU seconds per 1,000 events
(``RUSAGE_SELF``: excludes the exporter subprocess, whose CPU is reported separately: over its whole life, and from
the first record to the end of the flush, read from /proc by ``bench/_proc.py``), drops, and the ratio. The 5x
bar and the 100,000 events/s goal are measured into the real Jaeger (``bench/jaeger_export.py``); here the receiver
decodes every request in Python on the same cores, which caps the faster path (``--sink null`` lifts that cap).

    python bench/export_throughput.py [--events 100000] [--sink decode|null] [--protocol http/protobuf|grpc]
                                      [--no-checks] [--acks-without-dir] [--no-ring]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # tests.helpers: the OTLP receivers the tests use too

OURS = textwrap.dedent("""
    import json, os, resource, sys, time
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline
    from bench import _proc
    n, url, proto, checks = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    # the ack of a d2h copy says so (dir=d2h), as SGLang's does: it ends the copy's stage span and pending write
    ACK_DIR = ({}, {}, {"dir": "d2h"}, {}) if sys.argv[5] == "1" else ({},) * 4
    ct.configure(level=1, run_id="bench-exp", endpoint=url, protocol=proto, cp_rank=0, checks=checks)
    ct.cptrace(1, "config", cp_size=1)
    ct.flush(60)  # exporter process started and warm
    workers = _proc.children(os.getpid())
    w0 = [_proc.cpu_s(p) for p in workers]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for i in range(n):
        # a node's d2h round trip (prepare, backup, ack with one op id), then structural records; 500 nodes
        node, cyc = i % 500, i // 500
        k = cyc % 4
        tag = ("prepare", "backup", "ack", "evict")[k]
        ct.cptrace(1, tag, op=cyc - k if k < 3 else cyc, node_id=node, dev=1234, host=5678, io=1,
                   h=8765432101234567 + i, nz=4096, ts=i, **ACK_DIR[k])
    t_emit = time.perf_counter() - t0
    ok = ct.flush(600)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    w1 = [_proc.cpu_s(p) for p in workers]
    # the worker's CPU from the first record to the end of the flush (start-up and exit excluded)
    stream = w1[0] - w0[0] if len(workers) == 1 and None not in (w0[0], w1[0]) else None
    st = pipeline.stats()
    ct.shutdown(60)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"ok": ok, "wall": wall, "emit": t_emit, "cpu": cpu, "dropped": st["dropped"],
                      "worker_cpu": rc.ru_utime + rc.ru_stime, "worker_stream_cpu": stream}))
""")

SDK = textwrap.dedent("""
    import json, resource, sys, time
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    n, url = int(sys.argv[1]), sys.argv[2]
    tp = TracerProvider(resource=Resource.create({"service.name": "sdk-bench"}))
    bsp = BatchSpanProcessor(OTLPSpanExporter(endpoint=url), max_queue_size=65536, schedule_delay_millis=200)
    tp.add_span_processor(bsp)
    tr = tp.get_tracer("bench")
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    span = None
    for i in range(n):
        if i % 8 == 0:
            if span is not None:
                span.end()
            span = tr.start_span("hicache.d2h", attributes={"hicache.node_id": i % 500})
        span.add_event("backup", {"hicache.op": i, "hicache.node_id": i % 500, "hicache.dev": 1234,
                       "hicache.host": 5678, "hicache.io": 1, "hicache.h": 8765432101234567 + i,
                       "hicache.nz": 4096, "hicache.ts": i})
    span.end()
    t_emit = time.perf_counter() - t0
    ok = tp.force_flush(600_000)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    tp.shutdown()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"ok": ok, "wall": wall, "emit": t_emit, "cpu": cpu, "dropped": None, "worker_cpu": 0.0}))
""")


class NullReceiver:
    """Reads each request body and answers 200 (no decoding)."""

    def __init__(self) -> None:
        from tests.helpers import free_port

        self.port = free_port()
        self.bytes = 0

        store = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                store.bytes += len(self.rfile.read(n))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._srv = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"

    def events(self) -> int | None:
        return None

    def stop(self) -> None:
        self._srv.shutdown()


def _run(code: str, argv: list[str], ring: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO)
    env["CPTRACE_RING"] = "1" if ring else "0"   # ours: the deque and drainer path
    with tempfile.TemporaryDirectory() as tmp:
        env["CPTRACE_SPOOL_DIR"] = tmp
        out = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True,
                             timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _count(rx) -> int:
    return sum(len(sp.events) for sp in rx.spans())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sink", choices=["decode", "null"], default="decode")
    ap.add_argument("--protocol", choices=["http/protobuf", "grpc"], default="http/protobuf")
    ap.add_argument("--no-checks", action="store_true", help="turn the online checks off in our exporter")
    ap.add_argument("--acks-without-dir", action="store_true",
                    help="the stream before the d2h acks: acks without dir=d2h, so no copy ever ends by its ack (every "
                         "stage span waits for its timeout, pending writes pile up to the checker's cap)")
    ap.add_argument("--no-ring", action="store_true", help="leave out our run with CPTRACE_RING=1")
    args = ap.parse_args()
    n = args.events
    from cptrace_otel.export import otlp_proto as otlp, worker
    from tests.helpers.otlp_receiver import GrpcReceiver, HttpReceiver

    print("exporter: " + ("C span-event encoder and intake" if otlp.c_encoders_built() and worker.c_intake()
                          else "pure-Python parts (C speedups not fully built)"))

    results = {}
    for name in ("sdk", "ours") + (() if args.no_ring else ("ring",)):
        if args.sink == "null" and not (name != "sdk" and args.protocol == "grpc"):
            rx = NullReceiver()
        elif name != "sdk" and args.protocol == "grpc":
            rx = GrpcReceiver()
        else:
            rx = HttpReceiver()
        try:
            if name != "sdk":
                res = _run(OURS, [str(n), rx.url, args.protocol, "0" if args.no_checks else "1",
                                  "0" if args.acks_without_dir else "1"], ring=name == "ring")
            else:
                res = _run(SDK, [str(n), rx.url])
            got = None if isinstance(rx, NullReceiver) else _count(rx)
            if name != "sdk" and got is not None:
                got -= 1  # the warm-up record
        finally:
            rx.stop()
        res["delivered"] = got
        res["rate"] = n / res["wall"]
        results[name] = res
        print(f"{name:5s}: {res['rate']:9.0f} events/s end to end ({n} events, emit {res['emit']:.2f}s, "
              f"flushed after {res['wall']:.2f}s, ok={res['ok']}); traced process CPU "
              f"{res['cpu'] / n * 1000 * 1e3:.2f} ms per 1,000 events"
              + (f"; exporter process CPU {res['worker_cpu'] / n * 1000 * 1e3:.2f} ms per 1,000 events"
                 + (f" ({res['worker_stream_cpu'] / n * 1e6:.2f} us per event over the stream, start-up and exit "
                    f"excluded)" if res.get("worker_stream_cpu") is not None else "")
                 if name != "sdk" else "")
              + (f"; delivered {got}" if got is not None else "")
              + (f"; dropped {res['dropped']}" if res['dropped'] is not None else ""))
    ratio = results["ours"]["rate"] / results["sdk"]["rate"]
    cpu_ratio = results["sdk"]["cpu"] / max(results["ours"]["cpu"], 1e-9)
    print(f"ratio ours/SDK: {ratio:.1f}x events/s (receiver: {args.sink}; the 5x bar is measured into Jaeger); "
          f"traced-process CPU {cpu_ratio:.1f}x lower")
    if "ring" in results:
        r = results["ring"]
        print(f"ring/SDK: {r['rate'] / results['sdk']['rate']:.1f}x events/s; traced-process CPU "
              f"{results['sdk']['cpu'] / max(r['cpu'], 1e-9):.1f}x lower ({r['cpu'] / n * 1e6:.2f} µs per event, "
              f"ours without the ring {results['ours']['cpu'] / n * 1e6:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
