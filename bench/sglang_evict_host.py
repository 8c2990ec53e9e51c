"""``HiRadixCache.evict_host`` over N host leaves on real SGLang 0.5.20 (CPU): stock, instrumented at level 0 (the
wrappers in place, tracing off) and at level 2, side by side in one run, each in its own process, ``--runs`` times
alternately; prints the median seconds of the ``evict_host`` call itself and the ratio to stock.

The instrumentation finds the node each ``cache_controller.evict_host(x.host_value)`` evicts in an index built once
per ``evict_host`` call (it used to scan every evictable host leaf per evicted node: quadratic).

    python3 -m bench.sglang_evict_host [--leaves 20000] [--runs 3]     (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from tests.sglang_real import runtime  # (where deploy/sglang/install put the wheels)

SIDES = {"stock": [], "level 0": ["--instrument", "--level", "0"], "level 2": ["--instrument", "--level", "2"]}


def one(leaves: int, extra: list[str]) -> float:
    p = subprocess.run(runtime.module_cmd("oddcalls", "--version", "0.5.20", "--evict-host", str(leaves), "--no-count",
                                          *extra),
                       env=runtime.sglang_env("0.5.20"), cwd=runtime.ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["leaves"] == leaves and res["left"] == 0, res
    return float(res["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leaves", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    why = runtime.missing_reason("0.5.20")
    if why:
        raise SystemExit(why)
    times: dict[str, list[float]] = {k: [] for k in SIDES}
    for _ in range(a.runs):
        for name, extra in SIDES.items():
            times[name].append(one(a.leaves, extra))
    base = statistics.median(times["stock"])
    print(f"evict_host over {a.leaves} host leaves, sglang 0.5.20, median of {a.runs} runs (seconds of the call)")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:8s} {m:8.3f} s   x{m / base:5.2f} of stock   (runs: {', '.join(f'{t:.3f}' for t in ts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
