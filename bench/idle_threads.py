"""What the traced process's tracing threads cost per second when no records come: CPU per thread, idle.

A fresh process (``CPTRACE_RING`` as in the environment; ``--ring`` / ``--no-ring`` set it) configures tracing to a
file, emits ``--records`` records (so the drainer, the watchdog, the ack reader and the exporter process are all
running), flushes, and then sits idle for ``--seconds``. Printed: the CPU each of its threads other than the main
one took over the idle period (Linux ``/proc/self/task/*/schedstat``, nanoseconds; by thread name), their sum per
second, and the exporter process's CPU per second over the same period (``/proc/<pid>/schedstat``). These fixed costs
are what ``bench/scheduler_cost.py`` charges to every record at low rates (at 1k records/s, 1 ms of CPU per second
is 1 µs per record). Figures are reported, not asserted.

    python bench/idle_threads.py [--seconds 10] [--records 2000] [--ring | --no-ring]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ns(path: str) -> int:
    """CPU nanoseconds on the CPU of the task whose schedstat is ``path`` (0 if it is gone)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _threads() -> dict[int, str]:
    """This process's threads other than the calling one: native id -> name."""
    me = threading.get_native_id()
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None and t.native_id != me}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="idle period measured")
    ap.add_argument("--records", type=int, default=2000, help="records emitted before the idle period")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ring", dest="ring", action="store_const", const="1", help="CPTRACE_RING=1")
    g.add_argument("--no-ring", dest="ring", action="store_const", const="0", help="CPTRACE_RING=0")
    args = ap.parse_args(argv)
    if args.ring is not None:
        os.environ["CPTRACE_RING"] = args.ring
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("CPTRACE_SPOOL_DIR", tmp)
        ct.configure(level=1, run_id="bench-idle", file=os.path.join(tmp, "idle-{pid}.otlp.jsonl"))
        ct.cptrace(1, "config", cp_size=1)
        for i in range(args.records):
            ct.cptrace(1, "backup", node_id=i % 500, op=i)
        ok = ct.flush(60)
        time.sleep(0.5)   # let the post-flush lingering end
        st = pipeline.current()
        ring = st is not None and st.ring is not None
        wpid = getattr(getattr(getattr(st, "channel", None), "proc", None), "pid", None)
        threads = _threads()
        t0 = {tid: _ns(f"/proc/self/task/{tid}/schedstat") for tid in threads}
        w0 = _ns(f"/proc/{wpid}/schedstat") if wpid else 0
        m0 = time.monotonic()
        time.sleep(args.seconds)
        dt = time.monotonic() - m0
        t1 = {tid: _ns(f"/proc/self/task/{tid}/schedstat") for tid in threads}
        w1 = _ns(f"/proc/{wpid}/schedstat") if wpid else 0
        ct.shutdown(30)
    print(f"idle {dt:.1f} s after {args.records} records (ring={'on' if ring else 'off'}, flushed={ok}); "
          "CPU per second of idle, µs:")
    total = 0.0
    for tid, name in sorted(threads.items(), key=lambda kv: kv[1]):
        us = (t1[tid] - t0[tid]) / 1e3 / dt
        total += us
        print(f"  {name:<24} {us:9.1f}")
    print(f"  {'threads, total':<24} {total:9.1f}")
    if wpid:
        print(f"  {'exporter process':<24} {(w1 - w0) / 1e3 / dt:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
