"""Records lost on the exit paths, with real processes, real signals and real exporter workers (the
children are tests/helpers/exit_children.py; tests/e2e/test_exit_paths.py asserts the same cases).

* ``storm``: SIGTERM storms (``--signals`` signals 1 ms apart) while the main thread is inside ``flush()`` or
  ``shutdown()``, with and without an application handler, both exporters, ``--runs`` each: hangs, application
  handler runs, records lost.
* ``early``: ``os._exit`` one second after the first of 30,000 records while the rank is unknown: records delivered.
* ``fork``: a plain ``os.fork`` child emits 5,000 records over about a second and ends with ``os._exit``.
* ``stuck``: exit while the drainer is stuck on a value (50 rendered, 49 queued): delivered, counted, uncounted.
* ``restart``: the exporter worker SIGKILLed after 10,000 of 30,000 records at 15,000/s: records sharing a seq.

    python bench/exit_losses.py [--case storm|early|fork|stuck|restart|all] [--runs 3] [--signals 200]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # tests.helpers: the children the tests run too

from tests.helpers.exit_children import (  # noqa: E402
    child_env,
    early_exit_child,
    fork_child,
    restart_child,
    storm,
    storm_child,
    stuck_render_child,
    wait_delivered,
)


def _run(code: str, tmp: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=child_env(tmp, **env), capture_output=True, text=True,
                          timeout=300)


def case_storm(runs: int, signals: int) -> None:
    for exporter in ("process", "thread"):
        for frame in ("flush", "shutdown"):
            for app in (True, False):
                hung = lost = app_ran = 0
                emitted = 0
                for _ in range(runs):
                    with tempfile.TemporaryDirectory() as tmp:
                        r = storm(storm_child(frame, app), tmp, signals, CPTRACE_CP_RANK="0",
                                  CPTRACE_EXPORTER=exporter)
                    hung += r.rc == "HUNG"
                    app_ran += r.app_ran
                    emitted += r.emitted
                    lost += len(set(range(r.emitted)) - r.got)
                print(f"storm {exporter:7s} in {frame:8s} {'app handler' if app else 'no handler '}: {runs} runs, "
                      f"hung {hung}, app handler ran {app_ran if app else '-'}, lost {lost} of {emitted}",
                      flush=True)


def case_early(runs: int) -> None:
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            _run(early_exit_child(30000, 1.0), tmp)
            print(f"os._exit at 1 s, rank unknown: {len(wait_delivered(tmp, 30000, 30))} of 30000 delivered",
                  flush=True)


def case_fork(runs: int) -> None:
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            _run(fork_child(5000), tmp, CPTRACE_CP_RANK="0")
            got = wait_delivered(tmp, 5001, 20)
            print(f"fork child ending with os._exit: {len([i for i in got if i >= 1])} of 5000 delivered",
                  flush=True)


def case_stuck(runs: int) -> None:
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            p = _run(stuck_render_child(50, 49), tmp, CPTRACE_CP_RANK="0")
            stats = json.loads(p.stdout.split("STATS ", 1)[1]) if "STATS " in p.stdout else {}
            got = wait_delivered(tmp, 50, 20)
            counted = int(stats.get("dropped", 0))
            print(f"exit with a stuck render (100 records): delivered {len(got)}, counted {counted}, uncounted "
                  f"{100 - len(got) - counted}", flush=True)


def case_restart(runs: int) -> None:
    from tests.helpers.otlp_receiver import HttpReceiver

    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp, HttpReceiver() as rx:
            _run(restart_child(), tmp, CPTRACE_CP_RANK="0", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.url)
            evs = [e for sp in rx.spans() for e in sp.events if "hicache.i" in e.attrs]
            by_seq: dict[int, set] = collections.defaultdict(set)
            for e in evs:
                by_seq[e.attrs["cptrace.seq"]].add(e.attrs["hicache.i"])
            shared = sum(len(v) for v in by_seq.values() if len(v) > 1)
            print(f"worker killed under load (OTLP/HTTP): {len({e.attrs['hicache.i'] for e in evs})} of 30000 "
                  f"delivered, {shared} records share a seq with another record", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="all", choices=["storm", "early", "fork", "stuck", "restart", "all"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--signals", type=int, default=200)
    a = ap.parse_args()
    cases = ["storm", "early", "fork", "stuck", "restart"] if a.case == "all" else [a.case]
    for c in cases:
        if c == "storm":
            case_storm(a.runs, a.signals)
        else:
            globals()["case_" + c](a.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
