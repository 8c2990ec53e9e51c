"""The cross-rank stage and ``check`` with C1's C twin (``_speedups/lockstep.c``) against the Python twin alone.

Over bench/check_throughput.py's 2-rank log (replicated, level 2), each measurement a fresh process pinned to one
core, the two twins alternating round by round:

* ``stage``: the cross-rank rules alone (``CrossRank.feed`` over every record, then ``finish``), fed the same events
  read once before the clock starts: CPU seconds and events per CPU second;
* ``check``: ``cptrace-otel check -j 1`` end to end (reading, per-rank and cross-rank rules), CPU seconds.

Then the ratio (Python twin / C twin) of each, and whether both twins gave the same findings and ``check --json``
output (exit 1 if not).

    python bench/cross_rank_twins.py --lines 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator


@contextlib.contextmanager
def _twin(which: str) -> Iterator[None]:
    from cptrace_otel.checks import cross_base

    if which == "c":
        if cross_base.lockstep_c() is None:
            raise SystemExit("the C twin (_speedups/_lockstep) is not built")
        yield
    else:
        with cross_base.python_lockstep():
            yield


def _child(kind: str, which: str, paths: list[str]) -> dict:
    import gc

    with _twin(which):
        if kind == "stage":
            from cptrace_otel.analyze.sources.logs import read_log_events
            from cptrace_otel.checks.crossrank import CrossRank

            events = list(read_log_events(paths))
            gc.set_threshold(50_000, 20, 20)   # as the commands run (cptrace_otel/commands)
            cross = CrossRank()
            cross.expect_ranks(sorted({ev.rank for ev in events}))
            c0 = time.process_time()
            for ev in events:
                cross.feed(ev)
            found = cross.finish()
            cpu = time.process_time() - c0
            return {"cpu_s": cpu, "events": len(events), "out": json.dumps([f.to_dict() for f in found])}
        from cptrace_otel import cli

        buf = io.StringIO()
        c0 = time.process_time()
        with contextlib.redirect_stdout(buf):
            cli.main(["check", "--json", "--no-progress", "-j", "1", *paths])
        return {"cpu_s": time.process_time() - c0, "out": buf.getvalue()}


def _run(kind: str, which: str, paths: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, which, *paths]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0]), *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000, help="log lines per rank (2 ranks)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(a.child[0], a.child[1], a.paths)))
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from check_throughput import generate

    with tempfile.TemporaryDirectory() as d:
        paths = generate(os.path.join(d, "rank{rank}.log"), a.lines)
        res: dict[tuple[str, str], list[dict]] = {}
        for _ in range(a.rounds):
            for kind in ("stage", "check"):
                for which in ("py", "c"):
                    res.setdefault((kind, which), []).append(_run(kind, which, paths))
    same = True
    print(f"{a.lines} lines, {a.rounds} rounds alternated, load average {os.getloadavg()[0]:.1f} (1 min)")
    print(f"{'':8} {'Python twin':>24} {'C twin':>24} {'ratio':>7}")
    for kind in ("stage", "check"):
        py, c = res[(kind, "py")], res[(kind, "c")]
        same &= len({r["out"] for r in py + c}) == 1
        bp, bc = min(r["cpu_s"] for r in py), min(r["cpu_s"] for r in c)
        unit = ""
        if kind == "stage":
            n = py[0]["events"]
            unit = f" ({n / bp / 1e3:.0f}k -> {n / bc / 1e3:.0f}k ev/CPU-s)"
        print(f"{kind:8} {bp:>22.3f} s {bc:>22.3f} s {bp / bc:>6.2f}x{unit}")
        rounds = [", ".join(f"{r['cpu_s']:.3f}" for r in x) for x in (py, c)]
        print(f"{'':8} every round: {rounds[0]} | {rounds[1]}")
    print("findings and check --json output:", "the same" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
