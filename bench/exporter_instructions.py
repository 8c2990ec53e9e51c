"""CPU instructions per event of the exporter worker's in-process work, phase by phase, in one or more checkouts:
load-independent figures (valgrind cachegrind ``I refs``) for a machine whose CPU times swing with other people's load.

The work is what the worker does to a batch stream, in-process (no pipes, no HTTP): the C intake turns compact items
into Events, the span builder (``SpanBuilder``, with or without the online checks) places them, every 2,048 finished
spans are encoded (``otlp_proto.encode_requests``) and gzipped (level 1, as ``otlp_http`` does). Streams: ``jaeger``
(``bench/jaeger_export.py``'s node lifecycles, 20 records per node) or ``bench`` (``bench/export_throughput.py``'s).
Each phase is the difference between two runs of the child (the one that stops after the phase minus the one that
stops before it), divided by the events, so imports and setup cancel out:

    intake, span building (no checks), encoding, gzip, online checks, total

    python bench/exporter_instructions.py [--stream jaeger|bench] [--events 20000] [--tree DIR ...]

Each ``--tree`` (default: this checkout) runs with ``PYTHONPATH`` = that tree, its span builder constructed as that
tree's exporter constructs it. Needs valgrind; about 10 runs of 20-40 s per tree.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("setup", "intake", "add", "encode", "nochecks", "checks")


def child(stream: str, n: int, mode: str) -> None:
    import gc
    import gzip

    from cptrace_otel.checks.rank_checker import checker_factory
    from cptrace_otel.export import otlp_proto as otlp, worker as W
    from cptrace_otel.model.records import MAX_VALUE_CHARS, render_other
    from cptrace_otel.model.spans import SpanBuilder

    gc.freeze()
    gc.set_threshold(100_000, 50, 100)   # as the worker's main()
    t0 = 1_700_000_000_000_000_000
    if stream == "jaeger":
        sys.path.insert(0, HERE)
        from jaeger_export import node_records

        recs = [r for k in range(1, n // 20 + 1) for r in node_records(k)]
        items = [(t0 + i * 5000, lvl, tag, {k: (v if type(v) in (int, str, float) else render_other(v, None, None))
                                            for k, v in f.items()}) for i, (lvl, tag, f) in enumerate(recs)]
        level = 2
    else:
        items = []
        for i in range(n):
            node, cyc = i % 500, i // 500
            k = cyc % 4
            f = dict(op=cyc - k if k < 3 else cyc, node_id=node, dev=1234, host=5678, io=1, h=8765432101234567 + i,
                     nz=4096, ts=i, **({}, {}, {"dir": "d2h"}, {})[k])
            items.append((t0 + i * 5000, 1, ("prepare", "backup", "ack", "evict")[k], f))
        level = 1
    try:   # the exporter's own compressor (ISA-L where installed), else what it used before
        from cptrace_otel.export.otlp_http import gzip_level1

        gz = gzip_level1()
    except ImportError:
        def gz(body: bytes) -> bytes:
            return gzip.compress(body, 1)
    kw = {"sizer": otlp.sizer} if "sizer" in inspect.signature(SpanBuilder).parameters else {}  # type: ignore
    b = SpanBuilder("bench", "i", 1.0, checker_factory(mode == "checks", level), track_traces=False, **kw)
    if mode == "setup":
        return
    epochs: dict = {}
    for i in range(0, len(items), 500):
        evs = W._intake(items[i:i + 500], i, 0, epochs, MAX_VALUE_CHARS, W._value, W.Exporter._item_event)
        if mode == "intake":
            continue
        for ev in evs:
            b.add(ev)
        last = i + 500 >= len(items)
        if b.finished_spans >= 2048 or last:
            if last:
                b.close_all()
            spans = b.take()
            if mode == "add":
                continue
            for body in otlp.encode_requests([({"service.name": "x"}, spans)]):
                if mode != "encode":
                    gz(body)


def instructions(tree: str, stream: str, n: int, mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(PYTHONPATH=tree, CPTRACE_REQUIRE_SPEEDUPS="1")
    py = os.path.realpath(sys.executable)   # the interpreter itself, not a shim script
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", py,
                          os.path.abspath(__file__), "_child", stream, str(n), mode],
                         env=env, cwd="/", capture_output=True, text=True, timeout=3600)
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"child {mode} in {tree} failed:\n{out.stderr[-3000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", choices=["jaeger", "bench"], default="jaeger")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--tree", action="append", help="a checkout to measure (repeatable; default: this one)")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("valgrind not found: instruction counts need it", file=sys.stderr)
        return 2
    n = args.events - args.events % 20
    for tree in args.tree or [os.path.dirname(HERE)]:
        c = {m: instructions(os.path.abspath(tree), args.stream, n, m) for m in MODES}
        phases = {"intake": ("setup", "intake"), "span building": ("intake", "add"), "encoding": ("add", "encode"),
                  "gzip": ("encode", "nochecks"), "online checks": ("nochecks", "checks"), "total": ("setup", "checks")}
        per = {k: (c[b] - c[a]) / n for k, (a, b) in phases.items()}
        print(f"{tree} ({args.stream} stream, {n:,} events): instructions per event: "
              + ", ".join(f"{k} {v:,.0f}" for k, v in per.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
