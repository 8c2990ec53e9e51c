"""What ``CPTRACE_SGLANG`` costs every Python start: the ``.pth`` line runs in each interpreter (pip's too).

Writes this tree's ``cptrace_otel_sglang.pth`` into a private user site (``PYTHONUSERBASE``), then starts
``python -c <probe>`` ``--runs`` times with the switch off (``0``) and on (``1``), alternating, and prints the median
start time, the modules loaded at start and whether ``cptrace_otel`` was imported.

    python bench/shim_start.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = "import sys; print(len(sys.modules), 'cptrace_otel' in sys.modules)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=21)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from cptrace_otel.traced import sglang_shim

    with tempfile.TemporaryDirectory() as base:
        site = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": base})
        os.makedirs(site)
        sglang_shim.write_pth(site)
        env = dict(os.environ, PYTHONUSERBASE=base, PYTHONPATH=str(REPO))
        times: dict[str, list[float]] = {"0": [], "1": []}
        seen: dict[str, str] = {}
        for _ in range(a.runs):
            for switch in ("0", "1"):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-c", PROBE], env=dict(env, CPTRACE_SGLANG=switch),
                                     capture_output=True, text=True, check=True).stdout
                times[switch].append(time.perf_counter() - t0)
                seen[switch] = out.strip()
    for switch in ("0", "1"):
        mods, imported = seen[switch].split()
        print(f"CPTRACE_SGLANG={switch}: median start {statistics.median(times[switch]) * 1e3:.1f} ms, "
              f"{mods} modules at start, cptrace_otel imported: {imported}")
    print(f"cost of the switch: {(statistics.median(times['1']) - statistics.median(times['0'])) * 1e3:+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
