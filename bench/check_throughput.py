"""Throughput and memory of ``cptrace-otel check`` over upstream log lines.

Generates a clean, realistic upstream log (2 ranks, replicated mode, level 2: insert, prepare, backup, d2h ack,
splits with fragment publication, evictions, frees, reloads, h2d acks, compose fills/hits, host evictions; pools
recycle slots so the number of live nodes stays bounded while the file grows), then in one process per measurement:

* baseline A, raw read: iterate the lines and split them (the floor of any Python reader);
* baseline B, upstream-style naive analyzer: ``logline.parse_line`` on every line, all events loaded into a list,
  then checked (what a private "load everything, then join" analyzer does: memory grows with the file);
* ours: ``cptrace-otel check`` (streaming fast parser + per-rank rules + cross-rank rules);
* parse: our reader alone (the events built, no rules), which splits ours into reading and checking.

Each measurement runs in a fresh subprocess (the package's bytecode cached, as an installed package has it:
``_proc.installed_env``) pinned to one core (``taskset`` when present) and reports events/s
(wall and CPU time) and peak RSS (VmHWM). Two file lengths show that our peak RSS does not grow with the file, the
baseline's does.

    python bench/check_throughput.py                 # 0.5M and 2M lines
    python bench/check_throughput.py --lines 200000 400000 --keep /tmp/bench-logs
    python bench/check_throughput.py --lines 20000 --no-naive --instructions   # + valgrind instruction counts
    python bench/check_throughput.py --lines 400000 --no-naive --jobs 2   # check -j 1 vs -j 2 on 2 cores, ratio
    python bench/check_throughput.py --lines 400000 1600000 --no-naive --jobs 1 --otlp   # + OTLP JSON lines

``--otlp`` also writes the same records as OTLP JSON lines (``cptrace-otel ingest --file``: the file sink's format)
and checks them three times: with the C reader of those lines and the C packer of the sorted runs on disk
(``otlp``), with the C reader and the runs pickled (``otlp-pickled``), and with the Python twins of both
(``otlp-py``), and prints the ratios.

``--jobs N`` (default 2) adds ``ours-j1`` and ``ours-jN``: ``check -j 1`` and ``check -j N`` each pinned to the same
N cores, and prints their ratio (wall) with the CPU time of each (workers included) and the load average: on a
shared machine the ratio says little unless the load is below the number of cores.

Wall-clock figures on a shared VM swing by +-20% between runs; ``--instructions`` also runs raw and ours once more
under ``valgrind --tool=cachegrind`` (when installed) and prints CPU instructions per event, net of interpreter
start-up and imports, for the raw read, our reader alone (``parse``: events built, no rules) and ours, and their
difference (the rules): a noise-free figure to compare two versions of the checker with (keep the file small, the
run is ~50x slower).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import _proc  # (bench/: this script's own directory, first on sys.path)

# this checkout's package, in this process and in the children it starts, whatever is installed (an editable
# install of another checkout would otherwise be the one measured: an A/B of two trees measured one of them twice)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _r(lo: int, n: int) -> str:
    return f"(cnt={n},min={lo},max={lo + n - 1},first={lo},last={lo + n - 1})"


def _x(lo: int, n: int) -> str:
    return f"{lo}-{lo + n - 1}"


class _Pool:
    """Page-granular FIFO free list of fixed-size blocks (one block per node, so slots get reused promptly)."""

    def __init__(self, blocks: int, block: int, base: int) -> None:
        self.free = [base + i * block for i in range(blocks)]
        self.block = block

    def alloc(self) -> int | None:
        return self.free.pop(0) if self.free else None

    def release(self, lo: int) -> None:
        self.free.append(lo)


def generate(path_fmt: str, n_lines: int, ranks: int = 2, seed: int = 7) -> list[str]:
    """Write ``n_lines`` lines per rank (same structural stream on every rank, as replicated CP) and return paths."""
    rnd = random.Random(seed)
    lines: list[str] = []
    ts = [1_000_000_000]

    def emit(tag: str, body: str) -> None:
        ts[0] += 1000
        lines.append((f"[CPTRACE {tag}] {body}", ts[0]))

    emit("config", "cp_size=2 cp_rank=0 mode=replicated page_size=16 policy=wt level=2")
    dev = _Pool(256, 64, 0)
    host = _Pool(256, 64, 100_000)
    nid = 0
    op = 0
    live: list[dict] = []          # device-resident, backed-up nodes
    host_only: list[dict] = []     # device-evicted nodes with a host copy
    while len(lines) < n_lines:
        # a new request: insert a 64-token node, back it up (write_through), ack
        d = dev.alloc()
        if d is None:
            if not live:
                break
            n = live.pop(0)
            emit("evict", f"tier=dev node_id={n['id']} kind=backuped dev={_r(n['dev'], 64)}")
            emit("free", f"pool=dev idx={_r(n['dev'], 64)} idx_x={_x(n['dev'], 64)} node_id={n['id']} why=evict")
            dev.release(n["dev"])
            n["dev"] = None
            host_only.append(n)
            continue
        h = host.alloc()
        if h is None:
            n = host_only.pop(0)
            emit("evict", f"tier=host node_id={n['id']} kind=host host={_r(n['host'], 64)}")
            emit("free", f"pool=host idx={_r(n['host'], 64)} node_id={n['id']} why=evict")
            host.release(n["host"])
            dev.release(d)
            continue
        nid += 1
        op += 1
        hv = rnd.getrandbits(62)
        emit("rid_map", f"rid=r{nid} node_id={nid} hit=miss dlen=0 hlen=0")
        emit("insert", f"node_id={nid} parent=0 len=64 dev={_r(d, 64)} devx={_x(d, 64)} kind=new")
        emit("compose", f"key=L0:n{nid} node_id={nid} layer=0 src={_r(d, 64)} gen=1 hit=0")
        emit("compose", f"key=L0:n{nid} node_id={nid} layer=0 src={_r(d, 64)} gen=1 hit=1")
        emit("prepare", f"node_id={nid} op={op} len=64 dev={_r(d, 64)} host={_r(h, 64)} policy=wt parent=0 pbk=1 "
                        f"hostx={_x(h, 64)} devx={_x(d, 64)}")
        emit("backup", f"op={op} node_id={nid} dev={_r(d, 64)} host={_r(h, 64)} io=1 h={hv} nz=8192 "
                       f"hp=[{hv % 1000},{hv % 997},{hv % 991},{hv % 983}]")
        emit("ack", f"dir=d2h op={op} node_id={nid} blen=64 clen=64 pub=[{nid}] hh={hv}")
        live.append({"id": nid, "dev": d, "host": h, "h": hv})
        # sometimes reload an evicted node (a host hit)
        if host_only and rnd.random() < 0.5:
            n = host_only.pop(0)
            d2 = dev.alloc()
            if d2 is not None:
                op += 1
                emit("rid_map", f"rid=q{op} node_id={n['id']} hit=host dlen=0 hlen=64")
                emit("reload", f"node_id={n['id']} chain=[{n['id']}] op={op} host={_r(n['host'], 64)} "
                               f"dev={_r(d2, 64)} hostx={_x(n['host'], 64)} devx={_x(d2, 64)}")
                emit("ack", f"dir=h2d op={op} node_id={n['id']} h={n['h']} nz=8192")
                emit("compose", f"key=L0:n{n['id']} node_id={n['id']} layer=0 src={_r(d2, 64)} gen=3 hit=0")
                n["dev"] = d2
                live.append(n)
            else:
                host_only.append(n)
    paths = []
    for r in range(ranks):
        p = path_fmt.format(rank=r)
        with open(p, "w") as fh:
            pre = f"[2026-07-18 03:03:06 ATTN_CP{r} TP{r}] "
            for ln, t in lines:   # rank= and ts= last, as the upstream tracer's common fields (docs/domain.md §3.2)
                fh.write(f"{pre}{ln.replace('cp_rank=0', f'cp_rank={r}')} rank={r} ts={t}\n")
        paths.append(p)
    return paths


# -- measurements (each runs in its own process) --------------------------------------------------------------------

def _peak_rss_mib() -> float:
    """Peak RSS of this process image: VmHWM (reset by exec, unlike ``ru_maxrss``, which a child inherits from
    the parent it was forked from, here the generator holding the whole log)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(kind: str, paths: list[str]) -> dict:
    t0 = time.perf_counter()
    c0 = time.process_time()
    if kind in ("startup", "imports"):   # the baselines subtracted from instruction counts (raw, ours)
        if kind == "imports":
            from cptrace_otel.analyze import engine, result_output as report  # noqa: F401
            from cptrace_otel.analyze.sources import logs, otlpfile  # noqa: F401
            from cptrace_otel.commands import check as check_cmd
        n, findings = 0, None
    elif kind == "raw":
        n = 0
        for p in paths:
            with open(p, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if "[CPTRACE" in line:
                        line.split()
                        n += 1
        findings = None
    elif kind == "parse":   # our reader alone (events built, no rules): splits ours into parsing and checking
        from cptrace_otel.analyze.sources.logs import read_log_events
        n = sum(1 for _ in read_log_events(paths))
        findings = None
    elif kind == "naive":
        from cptrace_otel.analyze.engine import Analysis
        from cptrace_otel.model.events import Event
        from cptrace_otel.model.logline import parse_line, parse_prefix
        events = []
        for i, p in enumerate(paths):
            with open(p, encoding="utf-8", errors="replace") as fh:
                for ln, line in enumerate(fh, 1):
                    pl = parse_line(line)
                    if pl is None:
                        continue
                    r = pl.fields.get("rank")
                    if not isinstance(r, int) or r < 0:
                        r = parse_prefix(pl.prefix).cp_rank or i
                    events.append(Event(pl.tag, r, len(events), pl.fields.get("ts", ln), 0, pl.fields, 1, p, ln))
        events.sort(key=lambda e: (e.ts, e.rank))
        n = len(events)
        res = Analysis().run(events)
        findings = len(res.findings)
    else:   # ours: one process; ours-jN: ``check -j N`` (N worker processes, their CPU time counted too);
        # otlp: ``check`` over the OTLP JSON lines; otlp-pickled: the same with the sorted runs' chunks pickled (the C
        # packer switched off); otlp-py: with the Python twins of both (the C reader switched off too)
        import contextlib
        import io
        from types import SimpleNamespace

        from cptrace_otel._speedups import twin_off
        from cptrace_otel.analyze.sources import otlpfile, sortedruns
        from cptrace_otel.commands import check as check_cmd
        jobs = int(kind.rsplit("-j", 1)[1]) if "-j" in kind else 1
        buf = io.StringIO()
        with contextlib.ExitStack() as twins:
            if kind == "otlp-py":
                twins.enter_context(twin_off(vars(otlpfile), "C_READER"))
            if kind in ("otlp-py", "otlp-pickled"):
                twins.enter_context(twin_off(vars(sortedruns), "C_RUNS"))
            rc = check_cmd.run(SimpleNamespace(paths=paths, json=True, level=None, jaeger_url=None, run_id=None,
                                               jobs=jobs), buf, io.StringIO())
        obj = json.loads(buf.getvalue())
        n = obj["stats"]["events"]
        findings = len(obj["findings"]) if rc in (0, 1) else f"rc={rc}"
    dt = time.perf_counter() - t0
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)   # the workers of -j (none otherwise)
    cpu = time.process_time() - c0 + kids.ru_utime + kids.ru_stime
    return {"kind": kind, "events": n, "seconds": dt, "cpu_s": cpu,
            "worker_rss_mib": kids.ru_maxrss / 1024.0,   # the largest child's peak (a -j worker)
            "events_per_s": n / dt if dt else 0.0,
            "cpu_events_per_s": n / cpu if cpu else 0.0, "peak_rss_mib": _peak_rss_mib(), "findings": findings}


def calibrate() -> float:
    """Microseconds for ``sum(range(1000))`` (best of 5): ~7 us on a current 4-5 GHz desktop core. Lets a reader
    scale this machine's figures (shared, throttled CI hosts are often 3-5x slower)."""
    import timeit
    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def _run_child(kind: str, paths: list[str], cores: int = 1) -> dict:
    """``kind`` measured in a fresh process pinned to ``cores`` CPUs (the first ones this process may use)."""
    cmd = [sys.executable, __file__, "--child", kind, *paths]
    if shutil.which("taskset"):
        mine = sorted(os.sched_getaffinity(0))[:cores]
        cmd = ["taskset", "-c", ",".join(map(str, mine)), *cmd]
    # (started as an installed package is: its bytecode cached, which -j's workers would otherwise each compile)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=_env()).stdout
    return json.loads(out.strip().splitlines()[-1])


@functools.cache
def _env() -> dict[str, str]:
    env = _proc.installed_env()
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _instructions(kind: str, paths: list[str]) -> int | None:
    """Instructions the child ``kind`` executes (valgrind cachegrind ``I refs``), or None without valgrind."""
    if not shutil.which("valgrind"):
        return None
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--child", kind, *paths]
    err = subprocess.run(cmd, check=True, capture_output=True, text=True, env=_env()).stderr
    for line in err.splitlines():
        if "I   refs:" in line or "I refs:" in line:
            return int(line.split(":")[1].replace(",", "").split()[0])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[500_000, 2_000_000],
                    help="total trace lines (all ranks together) of each generated run")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--keep", default=None, help="folder to keep the generated logs in")
    ap.add_argument("--no-naive", action="store_true", help="skip the load-everything baseline (slow, memory-hungry)")
    ap.add_argument("--instructions", action="store_true",
                    help="also count CPU instructions per event of raw and ours under valgrind (slow; small files)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="also run check -j 1 and -j N side by side, pinned to N cores (1: skip; default 2)")
    ap.add_argument("--otlp", action="store_true",
                    help="also check the same records as OTLP JSON lines (cptrace-otel ingest --file), with the C "
                         "reader and packer, with the runs on disk pickled, and with the Python twins of both "
                         "(otlp, otlp-pickled, otlp-py)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_measure(a.child, a.paths)))
        return 0
    cal = calibrate()
    print(f"calibration: sum(range(1000)) = {cal:.1f} us on this core (about 7 us on a current desktop core; "
          f"scale factor ~{cal / 7:.1f}x); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    from cptrace_otel.analyze.sources import logs

    print("log parser: " + ("C (_speedups._logreader)" if logs.c_reader() is not None
                            else "pure Python (C speedups not built)"))
    base = a.keep or tempfile.mkdtemp(prefix="cptrace-bench-")
    os.makedirs(base, exist_ok=True)
    rows = []
    try:
        for total in a.lines:
            t0 = time.perf_counter()
            paths = generate(os.path.join(base, f"n{total}-rank{{rank}}.log"), total // a.ranks, a.ranks)
            size = sum(os.path.getsize(p) for p in paths) / 2**20
            print(f"generated {total} lines ({size:.0f} MiB, {a.ranks} ranks) in {time.perf_counter() - t0:.1f}s",
                  flush=True)
            kinds = ["raw", "parse", "ours"] + ([] if a.no_naive else ["naive"])
            res = {k: _run_child(k, paths) for k in kinds}
            if a.jobs > 1:   # -j 1 and -j N side by side, each pinned to the same N cores
                for k in ("ours-j1", f"ours-j{a.jobs}"):
                    res[k] = _run_child(k, paths, a.jobs)
                    kinds.append(k)
            for k in kinds:
                r = res[k]
                print(f"  {k:<6} {r['events']:>9} events  {r['seconds']:7.2f}s  {r['events_per_s']:>10,.0f} ev/s "
                      f"(CPU time: {r['cpu_events_per_s']:>10,.0f} ev/s)  peak RSS {r['peak_rss_mib']:7.1f} MiB  "
                      f"findings={r['findings']}", flush=True)
            if "naive" in res:
                print(f"  ours / naive: {res['ours']['events_per_s'] / res['naive']['events_per_s']:.2f}x speed, "
                      f"{res['naive']['peak_rss_mib'] / res['ours']['peak_rss_mib']:.2f}x less peak memory")
            print(f"  ours / raw line read: {res['ours']['events_per_s'] / res['raw']['events_per_s']:.3f}x")
            if a.jobs > 1:
                one, par = res["ours-j1"], res[f"ours-j{a.jobs}"]
                print(f"  -j {a.jobs} / -j 1 on {a.jobs} cores: {par['events_per_s'] / one['events_per_s']:.2f}x "
                      f"wall ({one['seconds']:.2f}s -> {par['seconds']:.2f}s), CPU time "
                      f"{one['cpu_s']:.2f}s -> {par['cpu_s']:.2f}s; peak RSS {one['peak_rss_mib']:.1f} MiB -> "
                      f"{par['peak_rss_mib']:.1f} MiB (check's process), largest worker "
                      f"{par['worker_rss_mib']:.1f} MiB; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
            if a.instructions:
                if not shutil.which("valgrind"):
                    print("  (--instructions: valgrind not found, skipped)")
                else:
                    per = {}
                    for k, base in (("raw", "startup"), ("parse", "imports"), ("ours", "imports")):
                        i = _instructions(k, paths) - _instructions(base, paths)
                        per[k] = i / (res["ours"]["events"] or 1)
                        print(f"  {k:<6} {per[k]:>10,.0f} instructions/event (valgrind, net of start-up and imports)",
                              flush=True)
                    print(f"  rules  {per['ours'] - per['parse']:>10,.0f} instructions/event (ours - parse: per-rank "
                          "and cross-rank rules, report)", flush=True)
            if a.otlp:   # the same records as OTLP JSON lines (the file sink's format), read by check
                otlp = os.path.join(base, f"n{total}.otlp.jsonl")
                subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", *paths, "--file", otlp,
                                "--no-progress"], check=True, capture_output=True, env=_env())
                print(f"  OTLP JSON lines: {os.path.getsize(otlp) / 2**20:.0f} MiB (cptrace-otel ingest --file)",
                      flush=True)
                for k in ("otlp-py", "otlp-pickled", "otlp"):
                    r = res[k] = _run_child(k, [otlp])
                    print(f"  {k:<12} {r['events']:>9} events  {r['seconds']:7.2f}s  {r['events_per_s']:>10,.0f} ev/s "
                          f"(CPU time: {r['cpu_events_per_s']:>10,.0f} ev/s)  peak RSS {r['peak_rss_mib']:7.1f} MiB  "
                          f"findings={r['findings']}", flush=True)
                print(f"  otlp / otlp-py (C reader and packer / their Python twins): "
                      f"{res['otlp']['events_per_s'] / res['otlp-py']['events_per_s']:.2f}x; "
                      f"otlp / otlp-pickled (the packer alone): "
                      f"{res['otlp']['events_per_s'] / res['otlp-pickled']['events_per_s']:.2f}x; "
                      f"otlp / ours (log lines): {res['otlp']['events_per_s'] / res['ours']['events_per_s']:.2f}x",
                      flush=True)
                os.remove(otlp)
            rows.append((total, res))
        if len(rows) >= 2:
            (n1, r1), (n2, r2) = rows[0], rows[-1]
            print(f"peak RSS, ours: {r1['ours']['peak_rss_mib']:.1f} MiB at {n1} lines -> "
                  f"{r2['ours']['peak_rss_mib']:.1f} MiB at {n2} lines ({n2 / n1:.1f}x the lines)")
            if "otlp" in r1 and "otlp" in r2:
                print(f"peak RSS, otlp: {r1['otlp']['peak_rss_mib']:.1f} MiB -> {r2['otlp']['peak_rss_mib']:.1f} MiB")
            if "naive" in r1 and "naive" in r2:
                print(f"peak RSS, naive: {r1['naive']['peak_rss_mib']:.1f} MiB -> "
                      f"{r2['naive']['peak_rss_mib']:.1f} MiB")
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
