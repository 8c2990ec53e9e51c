"""The benchmarks in two checkouts in one run: old, new and their ratio for each headline figure.

    python bench/compare_trees.py --baseline 73354a77 [--rounds 3] [--lines 20000] [--events 20000]
                                  [--calls 20000] [--only check,export,hot] [--instructions] [--json OUT]
    python bench/compare_trees.py --baseline-tree ../other-checkout

Each round runs ``bench/check_throughput.py --no-naive``, ``bench/export_throughput.py`` and ``bench/hot_path.py``
once in each tree, interleaved (the order of the two trees alternates from round to round, so drift in the load of
a shared machine falls on both), each tree running ITS OWN copy of the script with ``PYTHONPATH`` = that tree (the
scripts reach into the package's internals, which may differ between the trees). The figures are parsed from what
the scripts print; a figure that cannot be parsed is reported, not guessed. Per figure: the best of the rounds in
each tree (other load on the machine only ever makes a run look worse, so the best run is the one least disturbed),
the ratio new/old, and the change, signed so that + is better (a rate that rose, a cost that fell);
``worse`` marks a change below -5%. Control rows (the upstream-style and SDK baselines and the raw line read, code
that is the same in both trees) show how much the machine itself moved between the runs.

The baseline tree is made as in ``same_behaviour.py`` (a worktree of ``merge-base(REV, HEAD)``, C extensions built
in place and required to load). On a shared VM wall-clock rates swing by 20%: compare the CPU-time figures, and
for ``check`` the instruction counts (``--instructions``, valgrind), which do not depend on the load.

Exit status 0 (the figures are reported; ``--strict``: 1 when a headline figure is worse by more than 5%), 2 when a
benchmark failed to run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _trees import add_tree_args, tree_env, trees  # noqa: E402

TOLERANCE = 0.05
_N = r"(-?[\d,]+(?:\.\d+)?)"


def _num(s: str) -> float:
    return float(s.replace(",", ""))


# A figure: (name, regex with one group, higher is better, control row). Patterns follow the scripts' print lines.
FIGURES: dict[str, list[tuple[str, str, bool, bool]]] = {
    "check": [
        ("check: ours, events/s (CPU time)", rf"^\s+ours\s+\d+ events.*?\(CPU time:\s+{_N} ev/s\)", True, False),
        ("check: ours, events/s (wall)", rf"^\s+ours\s+\d+ events\s+[\d.]+s\s+{_N} ev/s", True, False),
        ("check: parse (reader alone), events/s (CPU time)", rf"^\s+parse\s+\d+ events.*?\(CPU time:\s+{_N} ev/s\)",
         True, False),
        ("check: ours, peak RSS MiB", rf"^\s+ours\s+\d+ events.*?peak RSS\s+{_N} MiB", False, False),
        ("check: ours, instructions/event", rf"^\s+ours\s+{_N} instructions/event", False, False),
        ("check: parse, instructions/event", rf"^\s+parse\s+{_N} instructions/event", False, False),
        ("check: rules, instructions/event", rf"^\s+rules\s+{_N} instructions/event", False, False),
        ("check: raw line read, events/s (CPU time) [control]", rf"^\s+raw\s+\d+ events.*?\(CPU time:\s+{_N} ev/s\)",
         True, True),
    ],
    "export": [
        ("export: ours, events/s end to end", rf"^ours\s*:\s+{_N} events/s end to end", True, False),
        ("export: traced process CPU ms/1k events", rf"^ours\s*:.*?traced process CPU {_N} ms per 1,000", False,
         False),
        ("export: exporter process CPU ms/1k events", rf"^ours\s*:.*?exporter process CPU {_N} ms per 1,000", False,
         False),
        ("export: SDK, events/s end to end [control]", rf"^sdk\s*:\s+{_N} events/s end to end", True, True),
    ],
    "hot": [
        ("hot: enabled cptrace, ns/call wall", rf"^\s+ours \(bounded buffer.*?:\s+{_N} ns/call wall", False, False),
        ("hot: enabled cptrace, ns/call caller CPU", rf"^\s+ours \(bounded buffer.*?wall,\s+{_N} ns/call caller CPU",
         False, False),
        ("hot: trace_enabled() off, ns/call", rf"^\s+upstream \(env re-read\):.*?ours:\s+{_N} ns/call", False, False),
        ("hot: below-level cptrace, ns/call", rf"^\s+empty function, same args:.*?ours:\s+{_N} ns/call", False,
         False),
        ("hot: upstream enabled cptrace, ns/call caller CPU [control]",
         rf"^\s+upstream \(env gate.*?wall,\s+{_N} ns/call caller CPU", False, True),
        ("hot: empty function call, ns/call [control]", rf"^\s+empty function, same args:\s+{_N} ns/call", False,
         True),
    ],
}


def commands(a: argparse.Namespace) -> dict[str, list[str]]:
    return {
        "check": ["check_throughput.py", "--lines", str(a.lines), "--no-naive"]
                 + (["--instructions"] if a.instructions else []),
        "export": ["export_throughput.py", "--events", str(a.events), "--sink", a.sink],
        "hot": ["hot_path.py", "--calls", str(a.calls), "--repeat", str(a.repeat)],
    }


def run_bench(tree: str, argv: list[str], timeout_s: float) -> tuple[str, float]:
    """Run ``tree``'s own copy of a bench script; its stdout and seconds. Exits 2 when it fails."""
    script = os.path.join(tree, "bench", argv[0])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cptrace-bench-cwd-") as cwd:
        r = subprocess.run([sys.executable, script, *argv[1:]], cwd=cwd, env=tree_env(tree), capture_output=True,
                           text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"{script} {' '.join(argv[1:])} failed (exit status {r.returncode}):\n"
                         f"{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r.stdout, time.monotonic() - t0


def parse(bench: str, out: str) -> dict[str, float | None]:
    got: dict[str, float | None] = {}
    for name, pat, _, _ in FIGURES[bench]:
        m = re.search(pat, out, re.M)
        got[name] = _num(m.group(1)) if m else None
    return got


def change(old: float, new: float, higher_better: bool) -> float:
    """Signed relative change, + = better."""
    if old == 0 or new == 0:
        return 0.0
    return new / old - 1.0 if higher_better else old / new - 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the best of them is reported)")
    ap.add_argument("--only", default="check,export,hot", help="benchmarks to run, comma-separated")
    ap.add_argument("--lines", type=int, default=20_000, help="check_throughput.py --lines")
    ap.add_argument("--instructions", action="store_true",
                    help="check_throughput.py --instructions (valgrind instruction counts: load-independent, slow)")
    ap.add_argument("--events", type=int, default=20_000, help="export_throughput.py --events")
    ap.add_argument("--sink", choices=["decode", "null"], default="null",
                    help="export_throughput.py --sink (null: the receiver does not decode, so ours is not capped)")
    ap.add_argument("--calls", type=int, default=20_000, help="hot_path.py --calls")
    ap.add_argument("--repeat", type=int, default=5, help="hot_path.py --repeat")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark run may take")
    ap.add_argument("--json", metavar="OUT", help="also write every figure of every run to this JSON file")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a headline figure is worse by more than 5%%")
    a = ap.parse_args(argv)
    benches = [b.strip() for b in a.only.split(",") if b.strip()]
    unknown = set(benches) - set(FIGURES)
    if unknown:
        ap.error(f"unknown benchmarks {sorted(unknown)} (known: {', '.join(FIGURES)})")
    cmds = commands(a)
    runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    unparsed: list[str] = []
    with trees(a, ("old", "new")) as (old, label, current):
        for rnd in range(a.rounds):
            order = [("old", old), ("new", current)]
            if rnd % 2:
                order.reverse()
            for bench in benches:
                for side, tree in order:
                    out, secs = run_bench(tree, cmds[bench], a.timeout)
                    figs = parse(bench, out)
                    for name, v in figs.items():
                        if v is None:
                            if not (name.endswith("instructions/event") and not a.instructions):
                                unparsed.append(f"round {rnd + 1} {side}: {name}")
                            continue
                        runs[side].setdefault(name, []).append(v)
                    print(f"  round {rnd + 1}/{a.rounds} {bench:<6} {side}: {secs:6.1f} s", flush=True)
    worse = report(runs, sys.stdout)
    for u in unparsed:
        print(f"not found in the output: {u}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"old": label, "new": current, "runs": runs, "unparsed": unparsed}, f, indent=1)
    return 1 if (a.strict and worse) else 0


def report(runs: dict[str, dict[str, list[float]]], out: object) -> list[str]:
    """Print the table; return the headline figures worse than the tolerance."""
    pr: Callable[..., None] = lambda *x: print(*x, file=out)  # noqa: E731
    rows = []
    worse = []
    for bench in FIGURES:
        for name, _, higher, control in FIGURES[bench]:
            o, n = runs["old"].get(name), runs["new"].get(name)
            if not o or not n:
                continue
            best = max if higher else min   # interference from other load only ever makes a run look worse
            mo, mn = best(o), best(n)
            ch = change(mo, mn, higher)
            verdict = "" if control else ("worse" if ch < -TOLERANCE else "ok")
            if verdict == "worse":
                worse.append(name)
            spread = f"{min(n):,.1f}-{max(n):,.1f}" if len(n) > 1 else ""
            rows.append((name, f"{mo:,.1f}", f"{mn:,.1f}", f"{mn / mo:.3f}" if mo else "-", f"{ch:+.1%}", verdict,
                         spread))
    head = ("figure (best of the rounds)", "old", "new", "new/old", "change (+ better)", "", "new: range")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    pr("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)))
    for r in rows:
        pr("  ".join((c.ljust(w) if i == 0 else c.rjust(w)) for i, (c, w) in enumerate(zip(r, widths, strict=False))))
    return worse


if __name__ == "__main__":
    sys.exit(main())
