"""What tracing costs a GIL-bound scheduler loop, end to end: off vs upstream vs ours, each a fresh process.

The traced process runs a loop of calibrated pure-Python work (SGLang's scheduler is one Python thread) that emits a
record after each slice of work, sized so that the untraced loop emits ``rate`` records/s; the records cycle through
prepare / backup / ack / evict of 500 nodes with 1 or 16 fields (ints and short strings).

* off: the same loop without tracing calls.
* upstream: the seed's ``cptrace`` semantics written to a ``logging.FileHandler`` (env gate re-read per call, upstream
  ``_fmt`` rendering, ``logger.info``; our own few lines in ``bench/hot_path.py``'s ``make_upstream``).
* ours: ``cptrace_otel.cptrace`` with its default exporter subprocess writing OTLP JSON lines to a file.

Printed per (rate, fields), medians over ``--repeat`` runs: the loop's wall-time increase per record over off (the
cost to the scheduler: caller, drainer thread and everything else in the process, as GIL time it takes), the traced
process's CPU per record over off (``RUSAGE_SELF``, all its threads, measured after a flush so the drainer's work
is in), the exporter process's CPU per record (``RUSAGE_CHILDREN`` after shutdown), and the ratio upstream/ours of
the wall cost. Figures are reported, not asserted (machines vary); run it on a quiet machine.

    python bench/scheduler_cost.py [--rates 1000,10000,50000] [--fields 1,16] [--seconds 1.5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAGS = ("prepare", "backup", "ack", "evict")


def work(n: int) -> int:
    """Pure-Python work of ``n`` iterations (holds the GIL throughout, like a scheduler step)."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def calibrate() -> float:
    """Iterations of :func:`work` per second on this machine (best of a few tries)."""
    n = 200_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        work(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def _fields(i: int, nfields: int) -> dict:
    node = i % 500
    if nfields == 1:
        return {"node_id": node}
    return {"op": i // 500, "node_id": node, "dev": 1234, "host": 5678, "io": 1, "h": 8765432101234567 + i,
            "nz": 4096, "ts": i, "blen": 64, "clen": 64, "pub": 3, "hh": 123456789, "layer": i % 61,
            "rid": "req-7f3a", "dir": "d2h", "stage": "attn_kv"}


def child(mode: str, records: int, iters: int, nfields: int, tmp: str) -> dict:
    """One run in this (fresh) process; returns its figures."""
    emit = None
    if mode == "upstream":
        sys.path.insert(0, str(REPO / "bench"))
        os.environ["SGLANG_CP_HICACHE_KV_TRACE"] = "1"
        from hot_path import make_upstream

        emit, _enabled, handler = make_upstream(os.path.join(tmp, "upstream.log"))
    elif mode == "ours":
        import cptrace_otel as ct

        ct.configure(level=1, run_id="bench-sched", file=os.path.join(tmp, "ours-{pid}.otlp.jsonl"))
        ct.cptrace(1, "config", cp_size=1)  # starts the drainer and the exporter process
        ct.flush(60)
        emit = ct.cptrace
    args = [(TAGS[(i // 500) % 4], _fields(i, nfields)) for i in range(records)]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if emit is None:
        for tag, f in args:
            work(iters)
    else:
        for tag, f in args:
            work(iters)
            emit(1, tag, **f)
    wall = time.perf_counter() - t0
    out = {"wall": wall, "ok": True, "dropped": 0}
    if mode == "ours":
        from cptrace_otel.traced import pipeline

        out["ok"] = ct.flush(300)
        out["dropped"] = pipeline.stats()["dropped"]
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if mode == "ours":
        ct.shutdown(60)
    elif mode == "upstream":
        handler.close()
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out["exporter_cpu"] = rc.ru_utime + rc.ru_stime
    return out


def _run(mode: str, records: int, iters: int, nfields: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE"))}
    env["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        env["CPTRACE_SPOOL_DIR"] = tmp
        cmd = [sys.executable, __file__, "--child", mode, str(records), str(iters), str(nfields), tmp]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child ({mode}) failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,10000,50000", help="records/s of the untraced loop")
    ap.add_argument("--fields", default="1,16", help="fields per record")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one untraced run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; medians are printed")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        mode, records, iters, nfields, tmp = args.child
        print(json.dumps(child(mode, int(records), int(iters), int(nfields), tmp)))
        return 0

    per_s = calibrate()
    print(f"scheduler loop cost per record (medians of {args.repeat}; each run a fresh process; "
          f"work calibrated at {per_s / 1e6:.1f} M iterations/s)")
    print(f"{'rate/s':>7} {'fields':>6} | {'wall cost us/rec':>16} {'':>6} {'ratio':>6} | "
          f"{'traced CPU us/rec':>17} {'':>6} | {'exporter CPU us/rec':>19} | notes")
    print(f"{'':>7} {'':>6} | {'upstream':>9} {'ours':>6} {'':>6} {'up/us':>6} | {'upstream':>9} {'ours':>7} "
          f"{'':>6} | {'ours':>19} |")
    ok = True
    for rate in [int(r) for r in args.rates.split(",")]:
        for nfields in [int(f) for f in args.fields.split(",")]:
            records = max(100, int(rate * args.seconds))
            iters = max(1, int(per_s / rate))
            runs: dict[str, list[dict]] = {"off": [], "upstream": [], "ours": []}
            for _ in range(args.repeat):
                for mode in runs:  # interleaved, so a load change on the machine hits every mode alike
                    runs[mode].append(_run(mode, records, iters, nfields))

            def med(mode: str, key: str) -> float:
                return statistics.median(r[key] for r in runs[mode])

            def per_rec(mode: str, key: str) -> float:
                return (med(mode, key) - med("off", key)) / records * 1e6

            up_w, our_w = per_rec("upstream", "wall"), per_rec("ours", "wall")
            up_c, our_c = per_rec("upstream", "cpu"), per_rec("ours", "cpu")
            exp_c = med("ours", "exporter_cpu") / records * 1e6
            achieved = records / med("off", "wall")
            dropped = max(r["dropped"] for r in runs["ours"])
            flushed = all(r["ok"] for r in runs["ours"])
            ok &= flushed and dropped == 0
            ratio = f"{up_w / our_w:5.1f}x" if our_w > 0 else "  n/a"
            print(f"{rate:7d} {nfields:6d} | {up_w:9.2f} {our_w:6.2f} {'':>6} {ratio:>6} | {up_c:9.2f} {our_c:7.2f} "
                  f"{'':>6} | {exp_c:19.2f} | off ran {achieved:.0f} rec/s; flushed={flushed} dropped={dropped}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
