"""Records lost across the exporter's failures under load: a ``kill -9`` of its worker, a backend outage.

A traced process emits ``--events`` records at ``--rate`` events/s into a local OTLP/HTTP receiver
(``tests/otlp_receiver.py``, decoding every request). Two faults, each on its own run:

* ``kill`` (``--kills`` times, evenly spaced): the traced process SIGKILLs its own exporter worker (the pipeline
  restarts it). Target: 0 records lost uncounted.
* ``outage`` (``--outage S``): ``--outage-at`` seconds after the traced process starts, the receiver stops
  listening (connections refused, as a backend that is down) and comes back on the same port S seconds later; the
  exporter spools and replays. Target: 0 records lost, counted or not.

At the end the traced process flushes (up to 300 s) and prints its ``stats()``. Reported: emitted, received
(distinct records), duplicates, counted as dropped, restarts; ``lost`` = emitted - received; ``lost uncounted`` =
lost - dropped, floored at 0; ``over-counted`` = the records counted as dropped that arrived anyway (records a worker
had delivered but not yet reported safe when it died; they are counted as lost, the safe side).

    python bench/failure_modes.py                                  # both: kill at 15k/s, 30 s outage at 20k/s
    python bench/failure_modes.py --fault kill [--events 50000] [--rate 15000] [--kills 1]
    python bench/failure_modes.py --fault outage [--events 800000] [--rate 20000] [--outage 30] [--outage-at 5]
    [--ring]: the traced process uses the record ring (CPTRACE_RING=1)
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # tests.helpers: the OTLP receiver the tests use too

CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline
    n, rate, kills = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    at = {n * (k + 1) // (kills + 1) for k in range(kills)}
    t0 = time.monotonic()
    for i in range(n):
        if i in at:
            os.kill(pipeline.current().channel.proc.pid, signal.SIGKILL)
        ct.cptrace(1, "evict", node_id=i % 500, i=i, h=i * 2654435761 % (1 << 63), src="bench")
        if i % 100 == 0:
            ahead = i / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    ok = ct.flush(300)
    s = pipeline.stats()
    s["flush"] = ok
    print("STATS " + json.dumps(s, default=str), flush=True)
""")


def _record_ids(rx) -> tuple[int, int]:
    """(distinct, total) values of the ``hicache.i`` attribute over every span event the receiver decoded, read
    straight off the protobuf messages (a million flattened test spans would need gigabytes)."""
    seen = bytearray()
    total = 0
    with rx.lock:
        reqs = list(rx.requests)
    for req in reqs:
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    for ev in sp.events:
                        for kv in ev.attributes:
                            if kv.key == "hicache.i":
                                i = kv.value.int_value
                                if i >= len(seen):
                                    seen.extend(bytes(i + 1 - len(seen) + 65536))
                                seen[i] = 1
                                total += 1
                                break
    return sum(seen), total


def run(events: int, rate: float, kills: int = 0, outage_s: float = 0.0, outage_at_s: float = 5.0,
        ring: bool = False) -> dict:
    from tests.helpers.otlp_receiver import HttpReceiver

    with tempfile.TemporaryDirectory() as tmp, HttpReceiver() as rx:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CPTRACE_"))}
        env.update(PYTHONPATH=str(REPO), CPTRACE_LEVEL="1", CPTRACE_RUN_ID="bench-fault", CPTRACE_CP_RANK="0",
                   CPTRACE_SPOOL_DIR=os.path.join(tmp, "spool"), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.url,
                   CPTRACE_RING="1" if ring else "0")
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(events), str(rate), str(kills)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        window = None
        if outage_s:
            def outage() -> None:
                nonlocal window
                time.sleep(outage_at_s)
                rx.stop()
                t0 = time.monotonic()
                time.sleep(outage_s)
                rx.start()
                window = time.monotonic() - t0

            threading.Thread(target=outage, daemon=True).start()
        out, err = p.communicate(timeout=900)
        stats = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("STATS ")), {})
        received, total = _record_ids(rx)
    dropped = int(stats.get("dropped", 0))
    lost = max(0, events - received)
    return {
        "emitted": events, "rate": rate, "kills": kills, "outage_s": window, "rc": p.returncode,
        "received": received, "duplicates": total - received, "dropped": dropped, "lost": lost,
        "restarts": stats.get("restarts"), "flush": stats.get("flush"),
        "lost_uncounted": max(0, lost - dropped),
        "over_counted": max(0, dropped - lost),
        "stderr_tail": err.strip().splitlines()[-4:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault", choices=("kill", "outage", "both"), default="both")
    ap.add_argument("--events", type=int, help="records emitted (default: 50,000 for kill, 800,000 for outage)")
    ap.add_argument("--rate", type=float, help="events/s (default: 15,000 for kill, 20,000 for outage)")
    ap.add_argument("--kills", type=int, default=1)
    ap.add_argument("--outage", type=float, default=30.0, help="seconds the backend is down")
    ap.add_argument("--outage-at", type=float, default=5.0, help="seconds after the start that it goes down")
    ap.add_argument("--ring", action="store_true", help="the traced process uses the record ring (CPTRACE_RING=1)")
    a = ap.parse_args()
    ok = True
    for fault in (("kill", "outage") if a.fault == "both" else (a.fault,)):
        if fault == "kill":
            n, rate = a.events or 50_000, a.rate or 15_000
            r = run(n, rate, kills=a.kills, ring=a.ring)
        else:
            n, rate = a.events or 800_000, a.rate or 20_000
            r = run(n, rate, outage_s=a.outage, outage_at_s=a.outage_at, ring=a.ring)
        for line in r.pop("stderr_tail"):
            print("  stderr: " + line)
        print(json.dumps(r))
        tail = (f"(received {r['received']:,} of {n:,}, counted as dropped {r['dropped']:,}, over-counted "
                f"{r['over_counted']:,}, duplicates {r['duplicates']})")
        if fault == "kill":
            print(f"records lost uncounted across {a.kills} kill -9 of the worker at {rate:,.0f} events/s: "
                  f"{r['lost_uncounted']} {tail}")
            ok &= r["lost_uncounted"] == 0 and r["duplicates"] == 0
        else:
            print(f"records lost across a {r['outage_s'] or 0:.0f} s backend outage at {rate:,.0f} events/s: "
                  f"{r['lost']} (uncounted {r['lost_uncounted']}) {tail}")
            ok &= r["lost"] == 0 and r["duplicates"] == 0 and r["outage_s"] is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
