"""What tracing costs a GIL-bound scheduler loop, end to end: off vs upstream vs ours, each a fresh process.

The traced process runs a loop of calibrated pure-Python work (SGLang's scheduler is one Python thread) that emits a
record after each slice of work, sized so that the untraced loop emits ``rate`` records/s; the records cycle through
prepare / backup / ack / evict of 500 nodes with 1 field (``node_id``) or 16 (ints and short strings, one op id per
round and ``dir=d2h``, so each copy's ack ends it).

* off: the same loop without tracing calls.
* upstream: the seed's ``cptrace`` semantics written to a ``logging.FileHandler`` (env gate re-read per call, upstream
  ``_fmt`` rendering, ``logger.info``; our own few lines in ``bench/hot_path.py``'s ``make_upstream``).
* ours: ``cptrace_otel.cptrace`` with its default exporter subprocess writing OTLP JSON lines to a file, with
  ``CPTRACE_RING=0``: every record through the buffer and the drainer thread (the path before the ring).
* ring: the same with ``CPTRACE_RING=1`` (records encoded by the C gate into the shared-memory ring the
  exporter reads; ``--no-ring`` leaves it out).

* floor (``--floor``): the same calls to ``cptrace_otel.cptrace`` below its level (the C gate returns at once): what
  the timer around a call and the call itself cost with no tracing work, the part of the ``caller`` figure that no
  tracing implementation can remove at such a call site.

The calls are shaped like SGLang's call sites (``cptrace_otel/traced/sglang/_sites.py``: ``cptrace(1, "backup",
node_id=n, ...)``), the same for every mode: the emitting loop is generated per field count with literal keyword
arguments whose values are locals unpacked from a precomputed tuple before the timer starts, so each call is a
vectorcall with a constant tuple of keyword names. ``--call-form dict`` calls ``emit(1, tag, **fields)`` with a dict
per record instead (the benchmark's earlier form: CPython then builds the keyword names and values from the dict on
every call, which costs the caller more in every mode).

Printed per (rate, fields), medians over ``--repeat`` runs, per record: the CPU time inside the tracing calls on the
loop's thread (``thread_time_ns`` around each call, the timer's own cost subtracted; CPU time, so that a call is not
charged for a preemption by another process), the CPU of the process's other
threads from loop start to flush (our drainer: work that takes the GIL from the loop), their sum as the cost to the
scheduler with the ratio upstream/ours, our exporter process's CPU (from /proc, first record to flush, its start-up
excluded), and the loop's wall-time increase over off. The direct figures are used for the cost because the
wall-time difference of two runs carries the noise of the whole loop's work (at 1k records/s, 1 ms of work per record:
1% of jitter is 10 µs per record); on a quiet machine the two agree. Figures are reported, not asserted.

    python bench/scheduler_cost.py [--rates 1000,10000,50000] [--fields 1,16] [--seconds 1.5] [--min-records 6000]
                                   [--repeat 3] [--no-ring] [--call-form literal|dict]
                                   [--floor]

``--shape step`` is a scheduler's step instead: ~50 µs (``--step-us``, calibrated; ``0``: the records back to back)
of the caller's own Python work that walks a working set larger than the caches (20,000 small request objects,
strided, with small allocations), then 4 records of 8 fields (5 ints, 3 short strings) built as a dict and passed
as ``**fields``. Every mode (off, upstream, ``ours`` = the buffer path, ring, floor, and ``--variant LABEL:K=V,...``:
the ring with other settings, e.g. ``CPTRACE_RING_BYTES=8388608``, or ``BENCH_PAUSE_EXPORTER=1``, the exporter process
stopped while the loop runs) runs in a fresh process, after ``--warm-steps`` of the same shape, flushed (the steady
state of a long-running scheduler). The loop alternates blocks of 50 steps with and without the calls; the cost is
the median difference of the loop thread's CPU between neighbouring blocks (``paired``: what the calls cost the
thread, in them and in the caller's own work after them), plus the other threads' CPU over off; the exporter
process's CPU is printed beside it and summed with it (``total``), and the whole process's CPU over off as a cross
check. Minor page faults per record over off show what the ring's pages cost.

    python bench/scheduler_cost.py --shape step [--step-us 50,0] [--steps 20000] [--warm-steps 20000] [--repeat 3]
                                   [--modes upstream,ours,ring,floor] [--variant LABEL:K=V,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _proc  # (bench/: this script's own directory, first on sys.path)

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
    # one op id per round of the four tags, and dir=d2h: each node's copy is prepared, backed up and acked
    return {"op": i // 2000, "node_id": node, "dev": 1234, "host": 5678, "io": 1, "h": 8765432101234567 + i,
            "nz": 4096, "ts": i, "blen": 64, "clen": 64, "pub": 3, "hh": 123456789, "layer": i % 61,
            "rid": "req-7f3a", "dir": "d2h", "stage": "attn_kv"}


def _loop(nfields: int, form: str, traced: bool) -> Callable[..., int]:
    """The emitting loop ``loop(args, work, iters, emit, pc) -> CPU ns in the calls``, compiled for this field count
    (the keys of :func:`_fields`): ``literal`` passes ``key=key`` keyword arguments of locals unpacked from each
    record's values before the timer (a call site's shape), ``dict`` passes ``**fields`` of a dict per record;
    ``traced=False`` is the untraced loop (the same unpacking, no call)."""
    keys = list(_fields(0, nfields))
    if form == "literal":
        head = "    for tag, vals in args:\n        " + ", ".join(keys) + ", = vals\n"
        call = "emit(1, tag, " + ", ".join(f"{k}={k}" for k in keys) + ")"
    else:
        head = "    for tag, f in args:\n"
        call = "emit(1, tag, **f)"
    src = "def loop(args, work, iters, emit, pc):\n    in_calls = 0\n" + head + "        work(iters)\n"
    if traced:
        src += f"        a = pc()\n        {call}\n        in_calls += pc() - a\n"
    src += "    return in_calls\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<scheduler_cost loop: {nfields} fields, {form}>", "exec"), ns)
    return ns["loop"]


def _timer_pair_ns() -> float:
    """What a ``thread_time_ns()`` pair around a call adds (subtracted from the measured time in the calls)."""
    pc = time.thread_time_ns
    best = float("inf")
    for _ in range(5):
        s = 0
        for _ in range(20000):
            a = pc()
            s += pc() - a
        best = min(best, s / 20000)
    return best


def _worker_pid() -> int | None:
    from cptrace_otel.traced import pipeline

    ch = getattr(pipeline.current(), "channel", None)
    proc = getattr(ch, "proc", None)
    return getattr(proc, "pid", None)


def _emitter(mode: str, tmp: str) -> tuple[Any, Any]:
    """This (fresh) process's ``cptrace`` for ``mode`` (None for off) and the upstream mode's log handler."""
    emit, handler = None, None
    if mode == "upstream":
        sys.path.insert(0, str(REPO / "bench"))
        os.environ["SGLANG_CP_HICACHE_KV_TRACE"] = "1"
        from hot_path import make_upstream

        emit, _enabled, handler = make_upstream(os.path.join(tmp, "upstream.log"))
    elif mode == "floor":
        import cptrace_otel as ct

        ct.configure(level=0, run_id="bench-sched")
        emit = ct.cptrace
    elif mode in ("ours", "ring"):
        import cptrace_otel as ct

        ct.configure(level=1, run_id="bench-sched", file=os.path.join(tmp, "ours-{pid}.otlp.jsonl"))
        ct.cptrace(1, "config", cp_size=1)  # starts the drainer and the exporter process
        ct.flush(60)
        emit = ct.cptrace
    return emit, handler


def child(mode: str, records: int, iters: int, nfields: int, tmp: str, form: str = "literal") -> dict:
    """One run in this (fresh) process; returns its figures."""
    emit, handler = _emitter(mode, tmp)
    # literal: each record's values as a tuple, unpacked into locals in the loop (outside the timed call)
    args = [(TAGS[(i // 500) % 4], _fields(i, nfields) if form == "dict" else tuple(_fields(i, nfields).values()))
            for i in range(records)]
    loop = _loop(nfields, form, emit is not None)
    wpid = _worker_pid() if mode in ("ours", "ring") else None
    w0 = _proc.cpu_s(wpid) if wpid else None   # the exporter's start-up is not the records' cost
    pc = time.thread_time_ns   # CPU time: a call is not charged for the time its thread was preempted
    timer = _timer_pair_ns()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m0 = time.thread_time()
    t0 = time.perf_counter()
    in_calls = loop(args, work, iters, emit, pc)
    wall = time.perf_counter() - t0
    out = {"wall": wall, "ok": True, "dropped": 0, "in_calls": max(0.0, (in_calls - timer * records) / 1e9)}
    w1 = None
    if mode in ("ours", "ring"):
        import cptrace_otel as ct
        from cptrace_otel.traced import pipeline

        out["ok"] = ct.flush(300)
        out["dropped"] = pipeline.stats()["dropped"]
        w1 = _proc.cpu_s(wpid) if wpid else None
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    main_cpu = time.thread_time() - m0
    _close(mode, handler)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out["main_cpu"] = main_cpu
    out["others_cpu"] = max(0.0, out["cpu"] - main_cpu)   # the drainer and every other thread of the process
    # the exporter's CPU from the first record to the flush (its start-up excluded), else its whole life
    out["exporter_cpu"] = w1 - w0 if w0 is not None and w1 is not None else rc.ru_utime + rc.ru_stime
    return out


def _close(mode: str, handler: Any) -> None:
    if mode in ("ours", "ring"):
        import cptrace_otel as ct

        ct.shutdown(60)
    elif mode == "upstream":
        handler.close()


def _run(mode: str, records: int, iters: int, nfields: int, form: str) -> dict:
    return _spawn(mode, ["--child", mode, str(records), str(iters), str(nfields), "{tmp}", form])


def _spawn(mode: str, child_args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    """Run this script as ``child_args`` (``{tmp}`` replaced by a fresh directory) in a fresh process, the
    environment cleared of tracing settings but for ``mode``'s path and ``env_extra``; its figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE"))}
    env["PYTHONPATH"] = str(REPO)
    env["CPTRACE_RING"] = "1" if mode == "ring" else "0"   # ours: the deque and drainer path
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory() as tmp:
        env["CPTRACE_SPOOL_DIR"] = tmp
        cmd = [sys.executable, __file__, *(a.replace("{tmp}", tmp) for a in child_args)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child ({mode}) failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the scheduler-step shape (--shape step) ----------------------------------------------------------------------
STEP_RECORDS = 4   # records per step
STEP_MODES = ("off", "upstream", "ours", "ring", "floor")
PAUSE_EXPORTER = "BENCH_PAUSE_EXPORTER"   # a --variant setting: the exporter process stopped while the loop runs


class _Req:
    """A request as a scheduler keeps it: the working set a step walks."""

    __slots__ = ("toks", "out", "age")

    def __init__(self, i: int) -> None:
        self.toks = list(range(i, i + 16))
        self.out: list[int] = []
        self.age = 0


def step_work(reqs: list[_Req], j: int, k: int) -> int:
    """One step's own work: ``k`` requests read and updated, strided over a working set larger than the caches (as
    a scheduler walks its queues), with small allocations; returns where the next step starts."""
    n = len(reqs)
    acc = 0
    for _ in range(k):
        r = reqs[j]
        r.age += 1
        acc += r.toks[r.age & 15]
        out = r.out
        out.append(acc & 0xFF)
        if len(out) > 8:
            r.out = []
        j = (j + 7919) % n
    return j


STEP_BLOCK = 50   # steps per block of the paired measurement


def step_loop(emit: Any, reqs: list[_Req], steps: int, k: int, start: int = 0) -> None:
    """``steps`` steps of :func:`step_work`, each followed by :data:`STEP_RECORDS` records of 8 fields (5 ints, 3
    short strings) built as a dict and passed as ``**fields``; with ``emit`` None the dicts are built and not
    passed (off: the caller's own work is the same in every mode)."""
    rids = [f"req-{i:04x}" for i in range(64)]
    for s in range(start, start + steps):
        j = step_work(reqs, s, k) if k else s
        for t in range(STEP_RECORDS):
            f = {"op": s, "node_id": (j + t) % 500, "dev": 1234 + t, "host": 5678 + t, "h": 8765432101234567 + s,
                 "rid": rids[s & 63], "dir": "d2h", "stage": "attn_kv"}
            if emit is not None:
                emit(1, TAGS[t], **f)


def step_blocks(emit: Any, reqs: list[_Req], steps: int, k: int) -> list[int]:
    """``steps`` steps in blocks of :data:`STEP_BLOCK`, alternately with ``emit`` and without (ABBA, so that neither
    kind always follows the other); per pair, the loop thread's CPU ns of the traced block minus the untraced one's.
    Both blocks of a pair run within a few ms of each other, so a change of the machine's load hits both: the median
    is the tracing calls' cost to the thread (in the calls, and in the caller's own work after them) where the
    difference of two processes' totals carries the noise of all their work."""
    tt = time.thread_time_ns
    out = []
    for i, b in enumerate(range(0, steps - 2 * STEP_BLOCK + 1, 2 * STEP_BLOCK)):
        order = (emit, None) if i % 2 == 0 else (None, emit)
        c0 = tt()
        step_loop(order[0], reqs, STEP_BLOCK, k, b)
        c1 = tt()
        step_loop(order[1], reqs, STEP_BLOCK, k, b + STEP_BLOCK)
        c2 = tt()
        out.append((c1 - c0) - (c2 - c1) if i % 2 == 0 else (c2 - c1) - (c1 - c0))
    return out


def step_calibrate(reqs: list[_Req]) -> float:
    """Seconds per request of :func:`step_work` on this machine (best of a few tries)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        step_work(reqs, 0, 20000)
        best = min(best, time.perf_counter() - t0)
    return best / 20000


def _reqs() -> list[_Req]:
    return [_Req(i) for i in range(20000)]   # ~14 MB of small objects


def step_child(mode: str, steps: int, k: int, tmp: str, warm: int = 0) -> dict:
    """One step-shape run in this (fresh) process: the whole process's CPU (every thread) from the first step to the
    flush, the loop thread's, the exporter process's (from /proc, its start-up excluded) and minor faults; after
    ``warm`` steps of the same shape, flushed (a long-running scheduler's steady state: the ring has been written
    before, as it has after its first few seconds)."""
    emit, handler = _emitter(mode, tmp)
    reqs = _reqs()
    if warm:
        step_loop(emit, reqs, warm, k)
        if mode in ("ours", "ring"):
            import cptrace_otel as ct

            ct.flush(300)
    wpid = _worker_pid() if mode in ("ours", "ring") else None
    w0 = _proc.cpu_s(wpid) if wpid else None
    pause = bool(wpid) and os.environ.get(PAUSE_EXPORTER) == "1"
    if pause:   # (the A/B of the exporter process's concurrent work: it reads the ring after the loop)
        os.kill(wpid, signal.SIGSTOP)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m0 = time.thread_time()
    t0 = time.perf_counter()
    pairs = step_blocks(emit, reqs, steps, k)
    wall = time.perf_counter() - t0
    main_cpu = time.thread_time() - m0
    if pause:
        os.kill(wpid, signal.SIGCONT)
    out: dict[str, Any] = {"ok": True, "dropped": 0, "exporter_cpu": 0.0,
                           "paired": statistics.median(pairs) / (STEP_BLOCK * STEP_RECORDS) / 1e9 if pairs else 0.0}
    if mode in ("ours", "ring"):
        import cptrace_otel as ct
        from cptrace_otel.traced import pipeline

        out["ok"] = ct.flush(300)
        out["dropped"] = pipeline.stats()["dropped"]
        w1 = _proc.cpu_s(wpid) if wpid else None
        out["exporter_cpu"] = w1 - w0 if w0 is not None and w1 is not None else float("nan")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    _close(mode, handler)
    out.update(wall=wall, main_cpu=main_cpu, cpu=(r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
               minflt=r1.ru_minflt - r0.ru_minflt, nivcsw=r1.ru_nivcsw - r0.ru_nivcsw)
    return out


def step_main(args: argparse.Namespace) -> int:
    """The step shape's table: per record, each mode's cost over off, medians of ``--repeat`` interleaved runs."""
    per_req = step_calibrate(_reqs())
    variants = [(m, m, {}) for m in STEP_MODES if m == "off" or m in args.modes.split(",")]
    for v in args.variant:   # label:K=V,K=V -> the ring with these settings
        label, _, kvs = v.partition(":")
        variants.append((label, "ring", dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))
    print(f"scheduler steps: {STEP_RECORDS} records of 8 fields (3 short strings) as **fields after each step of "
          f"the caller's own work; per record, µs, medians of {args.repeat} (min-max); load average "
          f"{os.getloadavg()[0]:.2f} at start; {args.warm_steps} steps run and flushed before each measured run")
    print("  paired = the loop thread's CPU in blocks of steps with records minus in the blocks between them without "
          "(step_blocks, median);\n  others = the CPU of the traced process's other threads (drainer) over off; "
          "traced = paired + others: the traced process's cost;\n  exporter = our exporter process's CPU; total = "
          "traced + exporter; whole = the traced process's whole CPU over off (a cross-check,\n  noisy: the "
          "difference of two processes' totals); faults = minor page faults over off; wall = the loop's wall time "
          "over off;\n  ratio = upstream's traced / this mode's")
    ok = True
    for us in [float(x) for x in args.step_us.split(",")]:
        k = int(us * 1e-6 / per_req) if us > 0 else 0
        runs: dict[str, list[dict]] = {label: [] for label, _m, _e in variants}
        for _ in range(args.repeat):
            for label, mode, env in variants:   # interleaved, so a load change hits every mode alike
                runs[label].append(_spawn(mode, ["--step-child", mode, str(args.steps), str(k), "{tmp}",
                                                 str(args.warm_steps)], env))
        n = args.steps // 2 * STEP_RECORDS   # (half the steps are traced: step_blocks)
        for rs in runs.values():
            for r in rs:
                r["others"] = r["cpu"] - r["main_cpu"]

        def over(label: str, key: str, runs: dict = runs, n: int = n) -> list[float]:
            base = statistics.median(r[key] for r in runs["off"])
            return [(r[key] - base) / n for r in runs[label]]

        def traced(label: str, runs: dict = runs) -> float:
            return statistics.median(r["paired"] for r in runs[label]) + statistics.median(over(label, "others"))

        def fig(xs: list[float], scale: float = 1e6) -> str:
            return f"{statistics.median(xs) * scale:5.2f} ({min(xs) * scale:.2f}-{max(xs) * scale:.2f})"

        up = traced("upstream") if "upstream" in runs else float("nan")
        print(f"\nstep of {us:g} µs of own work ({k} requests), {args.steps} steps ({n} records) a run; "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"{'mode':>10} | {'paired':>18} | {'others':>6} | {'traced':>6} | {'exporter':>8} | {'total':>6} | "
              f"{'whole':>18} | {'faults':>6} | {'wall':>6} | {'ratio':>6} | notes")
        for label, _mode, _env in variants:
            if label == "off":
                continue
            t = traced(label)
            exp = statistics.median(r["exporter_cpu"] for r in runs[label]) / n * 1e6
            dropped = max(r["dropped"] for r in runs[label])
            flushed = all(r["ok"] for r in runs[label])
            ok &= flushed and dropped == 0
            faults, wall = statistics.median(over(label, "minflt")), statistics.median(over(label, "wall")) * 1e6
            print(f"{label:>10} | {fig([r['paired'] for r in runs[label]]):>18} | "
                  f"{statistics.median(over(label, 'others')) * 1e6:6.2f} | {t * 1e6:6.2f} | {exp:8.2f} | "
                  f"{t * 1e6 + exp:6.2f} | {fig(over(label, 'cpu')):>18} | {faults:6.3f} | {wall:6.2f} | "
                  f"{up / t if t > 0 else float('nan'):5.1f}x | flushed={flushed} dropped={dropped}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,10000,50000", help="records/s of the untraced loop")
    ap.add_argument("--fields", default="1,16", help="fields per record")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one untraced run")
    ap.add_argument("--min-records", type=int, default=6000,
                    help="records per run at least (low rates run longer, so the per-record figure is not noise)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; medians are printed")
    ap.add_argument("--no-ring", action="store_true", help="leave out the ring mode (CPTRACE_RING=1)")
    ap.add_argument("--floor", action="store_true", help="also time the same calls below the level (the floor)")
    ap.add_argument("--call-form", choices=("literal", "dict"), default="literal",
                    help="literal: call-site-shaped keyword arguments (default); dict: emit(1, tag, **fields)")
    ap.add_argument("--shape", choices=("flat", "step"), default="flat",
                    help="flat: one record per slice of calibrated work (the table above); step: a scheduler's "
                         "steps, 4 records of 8 fields as **fields after each (its own table)")
    ap.add_argument("--step-us", default="50,0", help="step: µs of the caller's own work per step (0: back to back)")
    ap.add_argument("--steps", type=int, default=20000, help="step: steps per run")
    ap.add_argument("--modes", default=",".join(STEP_MODES[1:]), help="step: the modes compared with off")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:K=V,...",
                    help="step: also the ring with these environment settings (an A/B toggle), as row LABEL")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("--warm-steps", type=int, default=20000,
                    help="step: steps of the same shape run and flushed before the measured ones (steady state)")
    ap.add_argument("--step-child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step_child:
        mode, steps, k, tmp, warm = args.step_child
        print(json.dumps(step_child(mode, int(steps), int(k), tmp, int(warm))))
        return 0
    if args.shape == "step":
        return step_main(args)
    if args.child:
        mode, records, iters, nfields, tmp, form = args.child
        print(json.dumps(child(mode, int(records), int(iters), int(nfields), tmp, form)))
        return 0

    per_s = calibrate()
    print(f"scheduler loop: what tracing costs per record, µs (medians of {args.repeat}; each run a fresh process; "
          f"work calibrated at {per_s / 1e6:.1f} M iterations/s; calls: {args.call_form})")
    print("  caller = CPU time inside the calls on the loop's thread; others = CPU of the process's other threads (our "
          "drainer), loop start to flush;\n  cost = caller + others (the GIL time tracing takes from the loop); "
          "ratio = upstream / ours; exporter = CPU of our exporter process;\n  wall = the loop's wall-time "
          "increase over off (noisy where other processes load the machine)")
    print(f"{'rate/s':>7} {'fields':>6} | {'caller up':>9} {'ours':>6} | {'others':>6} | {'cost up':>8} {'ours':>6} "
          f"{'ratio':>6} | {'exporter':>8} | {'wall up':>8} {'ours':>7} | "
          f"{'ring: caller':>12} {'others':>6} {'cost':>6} {'ratio':>6} {'exporter':>8} {'wall':>6} | notes")
    ok = True
    for rate in [int(r) for r in args.rates.split(",")]:
        for nfields in [int(f) for f in args.fields.split(",")]:
            records = max(args.min_records, int(rate * args.seconds))
            iters = max(1, int(per_s / rate))
            runs: dict[str, list[dict]] = {"off": [], "upstream": [], "ours": []}
            if not args.no_ring:
                runs["ring"] = []
            if args.floor:
                runs["floor"] = []
            for _ in range(args.repeat):
                for mode in runs:  # interleaved, so a load change on the machine hits every mode alike
                    runs[mode].append(_run(mode, records, iters, nfields, args.call_form))

            def med(mode: str, key: str, runs: dict = runs, records: int = records) -> float:
                return statistics.median(r[key] for r in runs[mode]) / records * 1e6

            def cost(mode: str, runs: dict = runs, records: int = records) -> float:
                return statistics.median(r["in_calls"] + r["others_cpu"] for r in runs[mode]) / records * 1e6

            up, ours = cost("upstream"), cost("ours")
            ratio = f"{up / ours:5.1f}x" if ours > 0 else "  n/a"
            achieved = records / statistics.median(r["wall"] for r in runs["off"])
            dropped = max(r["dropped"] for m in ("ours", "ring") for r in runs.get(m, ()))
            flushed = all(r["ok"] for m in ("ours", "ring") for r in runs.get(m, ()))
            ring = "" if args.no_ring else (
                f"{med('ring', 'in_calls'):12.2f} {med('ring', 'others_cpu'):6.2f} {cost('ring'):6.2f} "
                f"{up / cost('ring'):5.1f}x {med('ring', 'exporter_cpu'):8.2f} "
                f"{med('ring', 'wall') - med('off', 'wall'):6.2f} | ")
            if args.floor:
                ring += f"floor {med('floor', 'in_calls'):.2f}; "
            ok &= flushed and dropped == 0
            print(f"{rate:7d} {nfields:6d} | {med('upstream', 'in_calls'):9.2f} {med('ours', 'in_calls'):6.2f} | "
                  f"{med('ours', 'others_cpu'):6.2f} | {up:8.2f} {ours:6.2f} {ratio:>6} | "
                  f"{med('ours', 'exporter_cpu'):8.2f} | {med('upstream', 'wall') - med('off', 'wall'):8.2f} "
                  f"{med('ours', 'wall') - med('off', 'wall'):7.2f} | {ring}off ran {achieved:.0f} rec/s; "
                  f"{records} records; flushed={flushed} dropped={dropped}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
