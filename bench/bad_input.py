"""Peak memory and time of ``cptrace-otel check`` on hostile input. Figures are printed, not
asserted (the tests assert the bounds that do not depend on the machine: tests/unit/test_bad_input.py).

Cases, each in a fresh subprocess whose peak RSS is read from ``os.wait4`` (``ru_maxrss`` of the child):

* ``check /dev/zero``: a device by path (refused at once: it never ends);
* ``check - < /dev/zero``: NUL bytes on standard input (no record: rejected after the first 64 KiB);
* one record, then an endless line on standard input for ``--seconds`` (default 20): bytes of ``/dev/zero``
  behind a ``[CPTRACE x] a=`` marker, the command stopped with SIGTERM at the end; the line cap keeps it bounded;
* a gzip bomb: one record, then 1 GiB of NULs, about 1 MiB compressed (stops at the ratio cap, with a message).

    python bench/bad_input.py                 # the four cases, --seconds 20
    python bench/bad_input.py --seconds 5
"""

from __future__ import annotations

import argparse
import gzip
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

RECORD = b"[CPTRACE prepare] rank=0 node_id=7 op=1 ts=10\n"
CMD = [sys.executable, "-m", "cptrace_otel.cli", "check", "--no-progress"]


def measure(argv: list[str], stdin=None, seconds: float | None = None, feed=None) -> tuple[str, float, float]:
    """(exit status, wall s, peak RSS MiB) of ``argv``; stopped with SIGTERM after ``seconds`` when given;
    ``feed(pipe)`` writes standard input in a thread when given."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE if feed else stdin, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    if feed:
        threading.Thread(target=feed, args=(p.stdin,), daemon=True).start()
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    deadline = t0 + (seconds if seconds is not None else 1e9)
    while True:   # os.wait4, not Popen.poll: poll would reap the child and lose its rusage
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() >= deadline:
            os.kill(p.pid, signal.SIGTERM)
            deadline = 1e18
        time.sleep(0.05)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    reader.join(5)
    msg = (err[0] if err else b"").decode(errors="replace").strip().splitlines()
    rc = f"exit {p.returncode}" if p.returncode >= 0 else f"killed by {signal.Signals(-p.returncode).name}"
    return rc + (f": {msg[-1][:110]}" if msg else ""), wall, ru.ru_maxrss / 1024


def endless(pipe) -> None:
    try:
        pipe.write(RECORD + b"[CPTRACE x] a=")
        with open("/dev/zero", "rb") as z:
            while True:
                pipe.write(z.read(1 << 20))
    except (BrokenPipeError, ValueError, OSError):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the endless line is fed")
    a = ap.parse_args()
    rows = []
    rows.append(("check /dev/zero",) + measure(CMD + ["/dev/zero"]))
    with open("/dev/zero", "rb") as z:
        rows.append(("check - < /dev/zero",) + measure(CMD + ["-"], stdin=z, seconds=a.seconds))
    rows.append((f"record + endless line on stdin, {a.seconds:g} s",) + measure(CMD + ["-"], seconds=a.seconds,
                                                                               feed=endless))
    with tempfile.TemporaryDirectory() as d:
        bomb = os.path.join(d, "rank0.log.gz")
        with gzip.open(bomb, "wb", compresslevel=9) as g:
            g.write(RECORD)
            zeros = b"\0" * (1 << 24)
            for _ in range(64):
                g.write(zeros)
        size = os.path.getsize(bomb)
        rows.append((f"gzip bomb ({size >> 10} KiB -> 1 GiB of NULs)",) + measure(CMD + [bomb], seconds=120))
    print(f"{'case':44s} {'peak RSS':>10s} {'wall':>8s}  outcome")
    for name, outcome, wall, rss in rows:
        print(f"{name:44s} {rss:7.1f} MiB {wall:7.2f}s  {outcome}")


if __name__ == "__main__":
    main()
