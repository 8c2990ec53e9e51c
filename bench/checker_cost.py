"""CPU cost of the online checks alone: :class:`~cptrace_otel.checks.rank_checker.RankChecker` fed in memory.

The streams (built before the clock starts, so the figure is the checker's only):

* ``export``: the record stream of ``bench/export_throughput.py`` (500 node ids cycling through prepare, backup,
  ack dir=d2h and evict, 8 int fields each) as the exporter worker hands it to the checker (``Event`` objects with
  the fields its intake builds, level 1, the checker's level forced to the traced process's level 1, as
  ``checker_factory(cfg.checks, cfg.level)`` does in the worker); ``--level 2`` runs the level-2 rules too;
* ``check``: the clean 2-rank upstream log of ``bench/check_throughput.py`` (``generate``, seed 7), read with the log
  reader, one checker per rank, level inferred (as ``cptrace-otel check`` and ``ingest`` do);
* ``--logs FILE...``: any trace logs (e.g. a healthy real-SGLang run of ``tests/sglang_real/driver.py``), read and
  fed the same way.

Reported per stream: events, findings (a checksum of their codes, nodes and refs, to compare two checkouts), CPU
µs/event (best of ``--repeat`` runs, ``time.process_time``). ``--instructions`` also runs each stream once more in
a child under ``valgrind --tool=cachegrind`` with and without the feeding loop and prints the difference per event:
CPU instructions per event, noise-free (the box is shared; keep ``--events`` small, valgrind is ~50x slower).
``--profile`` prints a cProfile of one run grouped by module (rank_checker handlers, each rules_* mixin, state,
ranges), with the shares of the checker's own time.

    python bench/checker_cost.py [--events 100000] [--lines 200000] [--logs a.log ...] [--level 2]
                                 [--repeat 3] [--profile] [--instructions]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # the package from PYTHONPATH first (compare checkouts: PYTHONPATH=other/tree)
sys.path.append(str(REPO / "bench"))


def export_events(n: int) -> list:
    """The records of ``bench/export_throughput.py`` (its OURS child), as the worker's intake makes them."""
    from cptrace_otel.model.events import Event

    out = [Event("config", 0, 0, 0, 0, {"cp_size": 1}, 1, "live", 0)]
    for i in range(n):
        node, cyc = i % 500, i // 500
        k = cyc % 4
        tag = ("prepare", "backup", "ack", "evict")[k]
        f = {"op": cyc - k if k < 3 else cyc, "node_id": node, "dev": 1234, "host": 5678, "io": 1,
             "h": 8765432101234567 + i, "nz": 4096, "ts": i}
        if k == 2:
            f["dir"] = "d2h"
        out.append(Event(tag, 0, i + 1, i, 0, f, 1, "live", 0))
    return out


def log_events(paths: list[str]) -> list:
    from cptrace_otel.analyze.sources.logs import read_log_events

    return list(read_log_events(paths))


def check_events(lines: int, tmp: str) -> list:
    from check_throughput import generate

    return log_events(generate(os.path.join(tmp, "gen-rank{rank}.log"), lines // 2, 2))


def gc_as_worker() -> None:
    """The collector as the exporter worker sets it (``export/worker.py``): what is there is frozen, a high gen-0
    threshold. (Here the whole stream is held in memory, which the worker never does: without this, collections
    would walk it and be charged to the checker.)"""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def feed(events: list, level: int | None) -> tuple[int, list]:
    """Feed ``events`` to one checker per rank (as the span builder and the engine do); all findings, in order."""
    from cptrace_otel.checks.rank_checker import RankChecker

    checkers: dict = {}
    found: list = []
    for ev in events:
        fd = checkers.get(ev.rank)
        if fd is None:
            fd = checkers[ev.rank] = RankChecker(ev.rank, level).feed_fast
        r = fd(ev)
        if r:
            found.extend(r)
    for fd in checkers.values():
        ck = fd.__self__
        found.extend(ck.finish())
        found.extend(ck.unchecked())
    return len(events), found


def digest(found: list) -> str:
    h = hashlib.sha256()
    for f in found:
        h.update(repr(sorted((k, repr(v)) for k, v in vars(f).items()) if hasattr(f, "__dict__")
                      else repr(f)).encode())
    return h.hexdigest()[:16]


def _streams(a: argparse.Namespace, tmp: str) -> dict:
    out = {}
    if a.events:
        out["export"] = (lambda: export_events(a.events), a.level)
    if a.lines:
        out["check"] = (lambda: check_events(a.lines, tmp), None)
    for i, p in enumerate(a.logs):   # each log its own stream (two runs' logs may both be rank 0)
        out[f"log{i}"] = (lambda p=p: log_events([p]), None)
    return out


def _child(a: argparse.Namespace, name: str, with_feed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build, level = _streams(a, tmp)[name]
        events = build()
        from cptrace_otel.checks import rank_checker  # noqa: F401  (imports are not the checker's per-event cost)
        gc_as_worker()
        if with_feed:
            feed(events, level)


def _instructions(argv: list[str], name: str, with_feed: bool) -> int | None:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable,
           __file__, *argv, "--child", f"{name}:{int(with_feed)}"]
    err = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    for line in err.splitlines():
        if "I   refs:" in line or "I refs:" in line:
            return int(line.split(":")[1].replace(",", "").split()[0])
    return None


def _profile(events: list, level: int | None) -> None:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    feed(events, level)
    pr.disable()
    st = pstats.Stats(pr)
    by_mod: dict = defaultdict(float)
    by_fn: dict = defaultdict(float)
    for (fn, line, name), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        mod = os.path.basename(fn) if "cptrace_otel" in fn or fn.startswith("<") else fn
        if "checker_cost" in fn:
            mod = "harness loop"
        by_mod[mod] += tt
        by_fn[f"{os.path.basename(fn)}:{line}({name})"] += tt
    tot = sum(by_mod.values()) or 1.0
    print("    cProfile, own time by module (share of the whole run, profiler overhead included):")
    for mod, t in sorted(by_mod.items(), key=lambda x: -x[1])[:14]:
        print(f"      {100 * t / tot:5.1f}%  {mod}")
    print("    top functions:")
    for fn, t in sorted(by_fn.items(), key=lambda x: -x[1])[:12]:
        print(f"      {100 * t / tot:5.1f}%  {fn}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="export stream length (0: leave it out)")
    ap.add_argument("--lines", type=int, default=200_000, help="check stream length, 2 ranks (0: leave it out)")
    ap.add_argument("--logs", nargs="*", default=[], help="trace logs, each fed as one more stream")
    ap.add_argument("--level", type=int, default=1, help="the export stream's checker level (the worker's: 1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        name, wf = a.child.split(":")
        _child(a, name, wf == "1")
        return 0
    base = [x for x in argv if x not in ("--profile", "--instructions")]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (build, level) in _streams(a, tmp).items():
            events = build()
            gc_as_worker()
            best = None
            for _ in range(a.repeat):
                c0 = time.process_time()
                n, found = feed(events, level)
                dt = time.process_time() - c0
                best = dt if best is None else min(best, dt)
            print(f"{name:6s}: {n} events, {len(found)} findings+unchecked (digest {digest(found)}), "
                  f"{best / n * 1e6:.3f} µs CPU/event (best of {a.repeat})", flush=True)
            if a.instructions and shutil.which("valgrind"):
                i1 = _instructions(base, name, True)
                i0 = _instructions(base, name, False)
                if i1 is not None and i0 is not None:
                    print(f"        {(i1 - i0) / n:,.0f} instructions/event (valgrind, feeding loop only)", flush=True)
            if a.profile:
                _profile(events, level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
