"""Throughput of ``cptrace-otel check`` over a long simulated shared-mode run: 16 ranks, 10,000 records per rank.

The run is the volume negative control's (``cptrace_otel.sim.volume.volume_workload``, no fault): page reuse, stores
by each page's next owner, followers ahead of the IO rank in time, rounds logged in different orders, splits of
reloaded nodes. It is checked at two sizes (by default 5,000 and 10,000 records per rank) in a fresh process pinned
to one core (``check_throughput``'s ``ours`` measurement); the C5 store fence's work follows the resident nodes, not
the stores read, so the time per event stays flat between the two sizes (a fence over all stores would double it).

    python bench/check_shared_volume.py                      # 5,000 and 10,000 records per rank, 16 ranks
    python bench/check_shared_volume.py --records 10000 20000 --ranks 16
    python bench/check_shared_volume.py --instructions       # + CPU instructions per event (valgrind; load-free)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from check_throughput import _instructions, _run_child, calibrate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, nargs="+", default=[5_000, 10_000], help="records per rank of each run")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--mode", default="shared")
    ap.add_argument("--policy", default="wt")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instructions", action="store_true",
                    help="also count check's CPU instructions per event under valgrind (net of imports; minutes)")
    a = ap.parse_args(argv)
    from cptrace_otel.sim.volume import volume_workload

    cal = calibrate()
    print(f"calibration: sum(range(1000)) = {cal:.1f} us on this core (about 7 us on a current desktop core); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    base = tempfile.mkdtemp(prefix="cptrace-bench-volume-")
    rows = []
    try:
        for n in a.records:
            t0 = time.perf_counter()
            sim = volume_workload(a.seed, a.mode, a.ranks, a.policy, n)
            paths = sim.emitter.write(os.path.join(base, f"r{n}"))
            size = sum(os.path.getsize(p) for p in paths) / 2**20
            per_rank = min(len(x) for x in sim.emitter.lines)
            del sim
            print(f"simulated {a.mode}/{a.policy}: {a.ranks} ranks x {per_rank} records ({size:.0f} MiB) in "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
            r = _run_child("ours", paths)
            us = 1e6 * r["seconds"] / (r["events"] or 1)
            print(f"  check  {r['events']:>9} events  {r['seconds']:7.2f}s  {r['events_per_s']:>10,.0f} ev/s "
                  f"(CPU time: {r['cpu_events_per_s']:>10,.0f} ev/s)  {us:.1f} us/event  peak RSS "
                  f"{r['peak_rss_mib']:.1f} MiB  findings={r['findings']}", flush=True)
            if a.instructions and shutil.which("valgrind"):
                i = _instructions("ours", paths) - _instructions("imports", paths)
                r["instructions_per_event"] = i / (r["events"] or 1)
                print(f"  check  {r['instructions_per_event']:>10,.0f} instructions/event (valgrind, net of "
                      "start-up and imports)", flush=True)
            rows.append((per_rank, r))
        if len(rows) >= 2:
            (n1, r1), (n2, r2) = rows[0], rows[-1]
            cpu1 = r1["events"] / r1["cpu_events_per_s"] if r1["cpu_events_per_s"] else 0.0
            cpu2 = r2["events"] / r2["cpu_events_per_s"] if r2["cpu_events_per_s"] else 0.0
            print(f"CPU time per event at {n2} vs {n1} records per rank: {cpu2 / r2['events'] * 1e6:.1f} vs "
                  f"{cpu1 / r1['events'] * 1e6:.1f} us ({(cpu2 / r2['events']) / (cpu1 / r1['events']):.2f}x; "
                  "flat = linear in the records)")
            if "instructions_per_event" in r1 and "instructions_per_event" in r2:
                i1, i2 = r1["instructions_per_event"], r2["instructions_per_event"]
                print(f"instructions per event at {n2} vs {n1} records per rank: {i2:,.0f} vs {i1:,.0f} "
                      f"({i2 / i1:.2f}x)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
