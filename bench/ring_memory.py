"""What the record ring keeps resident once it has wrapped: a traced process (the ring on, the default) emits
records until its ring has wrapped about 2.5 times, flushes, and prints its ``RssShmem`` and its exporter worker's
(``/proc/PID/status``) and the memfd's allocated bytes.

    CPTRACE_LEVEL=1 CPTRACE_CP_RANK=0 CPTRACE_CHECKS=0 CPTRACE_FILE=/dev/null python3 bench/ring_memory.py [N]

N records (default 600,000) of about 280 bytes each; it pauses 20 ms every 20,000 so that the worker keeps up. The
worker gives consumed pages back (``export/ringread.py``, ``PUNCH_BYTES``); setting ``PUNCH_FROM`` there above the
ring's size turns that off, for the figure without it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cptrace_otel as ct  # noqa: E402
from cptrace_otel.traced import pipeline  # noqa: E402


def _status(pid: int) -> dict[str, int]:
    """VmRSS and RssShmem of ``pid``, kB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith(("RssShmem", "VmRSS")):
                k, v = ln.split(":")
                out[k] = int(v.split()[0])
    return out


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 600_000
    blob = "x" * 200
    for i in range(n):
        ct.cptrace(1, "evict", node_id=i, s=blob)
        if i % 20000 == 0:
            time.sleep(0.02)
    print("flush", ct.flush(60))
    st = pipeline.current()
    if st is None or st.ring is None:
        print("the record ring is not in use (CPTRACE_RING=0 or the thread exporter?)", file=sys.stderr)
        return 2
    print("ring", pipeline.stats()["ring"])
    print("traced process (kB)", _status(os.getpid()), "worker (kB)", _status(st.channel.proc.pid),
          f"memfd allocated {os.fstat(st.ring.fd).st_blocks * 512 / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
