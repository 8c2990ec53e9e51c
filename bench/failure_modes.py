"""Records lost without being counted across a ``kill -9`` of the exporter worker under load.

A traced process emits ``--events`` records at ``--rate`` events/s into a local OTLP/HTTP receiver
(``tests/otlp_receiver.py``, decoding every request); ``--kills`` times, evenly spaced, it SIGKILLs its own exporter
worker (the pipeline restarts it). At the end it flushes and prints its ``stats()``. Reported:

* emitted, received (distinct records), duplicates, counted as dropped, restarts;
* ``lost uncounted`` = emitted - received - dropped, floored at 0 (the target: 0);
* ``over-counted`` = the records counted as dropped that arrived anyway (records a worker had delivered but not yet
  reported safe when it died; they are counted as lost, the safe side).

    python bench/failure_modes.py [--events 50000] [--rate 15000] [--kills 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    import cptrace_otel as ct
    from cptrace_otel import pipeline
    n, rate, kills = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    at = {n * (k + 1) // (kills + 1) for k in range(kills)}
    t0 = time.monotonic()
    for i in range(n):
        if i in at:
            os.kill(pipeline._state.channel.proc.pid, signal.SIGKILL)
        ct.cptrace(1, "evict", node_id=i % 500, i=i, h=i * 2654435761 % (1 << 63), src="bench")
        if i % 100 == 0:
            ahead = i / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    ok = ct.flush(120)
    s = pipeline.stats()
    s["flush"] = ok
    print("STATS " + json.dumps(s, default=str), flush=True)
""")


def run(events: int, rate: float, kills: int) -> dict:
    from otlp_receiver import HttpReceiver

    with tempfile.TemporaryDirectory() as tmp, HttpReceiver() as rx:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CPTRACE_"))}
        env.update(PYTHONPATH=str(REPO), CPTRACE_LEVEL="1", CPTRACE_RUN_ID="bench-kill", CPTRACE_CP_RANK="0",
                   CPTRACE_SPOOL_DIR=os.path.join(tmp, "spool"), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.url)
        p = subprocess.run([sys.executable, "-c", CHILD, str(events), str(rate), str(kills)], env=env,
                           capture_output=True, text=True, timeout=600)
        stats = next((json.loads(line[6:]) for line in p.stdout.splitlines() if line.startswith("STATS ")), {})
        seen = [e.attrs["hicache.i"] for sp in rx.spans() for e in sp.events if "hicache.i" in e.attrs]
    received = len(set(seen))
    dropped = int(stats.get("dropped", 0))
    return {
        "emitted": events, "rate": rate, "kills": kills, "rc": p.returncode,
        "received": received, "duplicates": len(seen) - received, "dropped": dropped,
        "restarts": stats.get("restarts"), "flush": stats.get("flush"),
        "lost_uncounted": max(0, events - received - dropped),
        "over_counted": max(0, dropped - (events - received)),
        "stderr_tail": p.stderr.strip().splitlines()[-3:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=15_000)
    ap.add_argument("--kills", type=int, default=1)
    a = ap.parse_args()
    r = run(a.events, a.rate, a.kills)
    for line in r.pop("stderr_tail"):
        print("  stderr: " + line)
    print(json.dumps(r))
    print(f"records lost uncounted across {a.kills} kill -9 of the worker at {a.rate:,.0f} events/s: "
          f"{r['lost_uncounted']} (received {r['received']:,} of {a.events:,}, counted as dropped {r['dropped']:,}, "
          f"over-counted {r['over_counted']:,}, duplicates {r['duplicates']})")
    return 0 if r["lost_uncounted"] == 0 and r["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
