"""The rules compiled with mypyc against the same rules interpreted: speed, instructions and identical findings.

Builds, in a temporary folder (never in the source tree), a copy of ``cptrace_otel`` whose rule package
(``cptrace_otel/checks``, every per-rank and cross-rank rule with their state) and engine loop
(``cptrace_otel/analyze/engine.py``) are compiled by mypyc, the mypy project's compiler, from the same sources. Then,
over the log of bench/check_throughput.py, each measurement a fresh process pinned to one core, ``pure`` (this tree)
and ``mypyc`` (the copy) alternating:

* ``check`` end to end (events/s, wall and CPU), and the two rule stages apart (per-rank ``RankChecker.feed_fast``
  and cross-rank ``CrossRank.feed`` over the same events read once beforehand: CPU seconds of each stage);
* with ``--instructions``: CPU instructions per event under valgrind (noise-free), reader alone and the whole check;
* the ``check --json`` output of both, which must be byte-identical (exit 1 if not).

The sources need edits to compile, and the copy gets them (:func:`_edit`; none changes what the code does, the
sources here keep none of them): mypyc compiles mixins only as traits (``mypy_extensions.trait``); it rejects
``if TYPE_CHECKING`` in a class body and a ``for`` over ``reversed()`` of a list of unannotated tuples (an internal
error); a native subclass of ``OrderedDict`` (``lineage.Bounded``) corrupts it (a segfault at its first ``pop``), so it
stays a Python class; and a method declared on a trait as a ``Callable`` attribute (``CrossRuleBase._ready``) is
compiled as a slot that is never set ("attribute undefined" at the first cross-rank join), so it is declared as a
method; and a compiled variable holds only its declared type, so the two places that assign ``None`` to a variable
typed non-optional under ``# type: ignore[assignment]`` (C2's open round, the fence's window at an eviction) raise
``TypeError`` compiled and get an optional variable, ``check -j``'s stand-in checkers need the engine's dict of
checkers typed ``Any``, and a swap after mypy's ``len()`` narrowing of a tuple (``ranges._runs_intersect``) needs the
length in a variable.

    python bench/compiled_rules.py --lines 200000 --rounds 3
    python bench/compiled_rules.py --lines 20000 --rounds 1 --instructions
    python bench/compiled_rules.py --build-dir /tmp/rules-mypyc --keep-build ...   # reuse a build (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what mypyc compiles: every rule module with its state, and the engine loop that feeds them
TARGETS = ["cptrace_otel/checks/", "cptrace_otel/analyze/engine.py"]
_MIXIN = re.compile(r"^(class (?:\w+\((?:Rank|Cross)RuleBase\)|(?:Rank|Cross)RuleBase):)", re.M)


_FUT = "from __future__ import annotations\n"
# (why, old, new): plain replacements in the copy; each must apply somewhere, or build() stops (the sources moved on)
_PLAIN = [
    ("mypyc's internal error on reversed() of a list of unannotated tuples",
     "in reversed(later):", "in later[::-1]:"),
    # methods of the class that mixes the rules in, declared as attributes: a trait's attribute is a slot, never set
    ("CrossRuleBase._ready is CrossRank's method", "    _ready: Callable[[], bool]",
     "    def _ready(self) -> bool: raise NotImplementedError\n"),
    ("CrossRuleBase._decide is JoinRules' method", "    _decide: Callable[[tuple, bool], None]",
     "    def _decide(self, key: tuple, final: bool) -> None: raise NotImplementedError\n"),
    ("(the ignore it no longer needs)", "self._decide(key, final=False)  # type: ignore[call-arg]",
     "self._decide(key, final=False)"),
    # mypy narrows ``b: tuple`` to ``tuple[object]`` under ``len(b) == 1``, and the compiled swap then checks ``a``
    # against that narrowed type (a TypeError on any run of several slots)
    ("ranges._runs_intersect's swap after len() narrowing", "    if len(b) == 1:\n        a, b = b, a",
     "    nb1 = len(b)\n    if nb1 == 1:\n        a, b = b, a"),
    # check -j hands the analysis a stand-in per rank (parallel._RankDone); compiled, the declared value type is
    # checked at each read
    ("engine's checkers hold check -j's stand-ins", "self.checkers: dict[int, RankChecker] = {}",
     "self.checkers: dict[int, Any] = {}"),
    # None assigned over ``type: ignore[assignment]`` to a variable typed non-optional: compiled, a TypeError
    ("C2's open round may be None", "        if type(rk) is int:\n            cur = self._keyed_part(",
     "        cur: list | None\n        if type(rk) is int:\n            cur = self._keyed_part("),
    ("(its ignores it no longer needs)", "cur = self._cur_round.get(r)  # type: ignore[assignment]",
     "cur = self._cur_round.get(r)"),
    ("", "cur[3].add(op if type(op) is int else None)  # type: ignore[index]",
     "cur[3].add(op if type(op) is int else None)"),
    ("", "cur[4].add(nid)  # type: ignore[index]", "cur[4].add(nid)"),
    ("the fence's window at an eviction may be None",
     "            w = self.by_node.get((ev.epoch, nid)) if type(nid) is int else None  # type: ignore[assignment]\n"
     "            if w is not None and w.live:\n                self._end(w, r, ts)",
     "            wn = self.by_node.get((ev.epoch, nid)) if type(nid) is int else None\n"
     "            if wn is not None and wn.live:\n                self._end(wn, r, ts)"),
    # a native subclass of OrderedDict corrupts it (a segfault at its first pop): it stays a Python class
    ("lineage.Bounded stays a Python class", "\nclass Bounded(OrderedDict):",
     "\n@mypyc_attr(native_class=False)\nclass Bounded(OrderedDict):"),
]


def _edit(src: str, applied: set[str] | None = None) -> str:
    """The copy's edits for mypyc (the old text of each :data:`_PLAIN` edit made is added to ``applied``): those of
    :data:`_PLAIN`; the rule mixins (and their bases) become traits; a class body's ``if TYPE_CHECKING:``
    declarations become plain methods that raise (the class that mixes them in defines them earlier in its MRO)."""
    applied = applied if applied is not None else set()
    for _why, old, new in _PLAIN:
        if old in src:
            src = src.replace(old, new)
            applied.add(old)
    if "@mypyc_attr(" in src:
        src = src.replace(_FUT, _FUT + "\nfrom mypy_extensions import mypyc_attr\n", 1)
    if _MIXIN.search(src):
        src = _MIXIN.sub(r"@trait\n\1", src)
        src = src.replace(_FUT, _FUT + "\nfrom mypy_extensions import trait\n", 1)
    lines = src.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("    if TYPE_CHECKING:"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith("        ") or not lines[j]):
                j += 1
            body = [ln[4:].replace(": ...", ": raise NotImplementedError") for ln in lines[i + 1:j]]
            return "\n".join(lines[:i] + body + lines[j:])
    return src


def build(dest: Path) -> float:
    """Copy the package (with its built C speedups) to ``dest``, edit the rule modules for mypyc, compile
    :data:`TARGETS` in place there; returns the build's seconds. Raises on a build error (its output printed)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "cptrace_otel", dest / "cptrace_otel", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")   # the mypy settings mypyc type-checks with
    applied: set[str] = set()
    for p in [*sorted((dest / "cptrace_otel" / "checks").rglob("*.py")), dest / "cptrace_otel/analyze/engine.py"]:
        s = p.read_text()
        t = _edit(s, applied)
        if t != s:
            p.write_text(t)
    missed = [why or old for why, old, _new in _PLAIN if old not in applied]
    if missed:
        raise RuntimeError(f"edits that found nothing to edit (the sources changed: update _PLAIN): {missed}")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mypyc", *TARGETS], cwd=dest, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(f"mypyc failed (exit {r.returncode})")
    return time.perf_counter() - t0


def _stages(paths: list[str]) -> dict:
    """CPU seconds of the per-rank and the cross-rank rules over the same events, each stage fed alone."""
    from cptrace_otel.analyze.sources.logs import read_log_events
    from cptrace_otel.checks import rank_checker
    from cptrace_otel.checks.crossrank import CrossRank
    from cptrace_otel.checks.rank_checker import RankChecker

    out: dict = {"compiled": not rank_checker.__file__.endswith(".py")}
    events = list(read_log_events(paths))
    checkers: dict[int, RankChecker] = {}
    c0 = time.process_time()
    for ev in events:
        chk = checkers.get(ev.rank)
        if chk is None:
            chk = checkers[ev.rank] = RankChecker(ev.rank)
        chk.feed_fast(ev)
    for chk in checkers.values():
        chk.finish()
    out["per_rank_s"] = time.process_time() - c0
    events = list(read_log_events(paths))   # afresh: a stage may have annotated the events
    cross = CrossRank()
    cross.expect_ranks(sorted({ev.rank for ev in events}))
    c0 = time.process_time()
    for ev in events:
        cross.feed(ev)
    cross.finish()
    out["cross_rank_s"] = time.process_time() - c0
    out["events"] = len(events)
    return out


def _child(kind: str, paths: list[str]) -> None:
    if kind == "stages":
        print(json.dumps(_stages(paths)))
    elif kind == "parse":   # the reader alone, after the imports of check_throughput's "imports" baseline
        from cptrace_otel.analyze import engine, result_output  # noqa: F401
        from cptrace_otel.analyze.sources import logs, otlpfile  # noqa: F401
        from cptrace_otel.commands import check  # noqa: F401

        print(sum(1 for _ in logs.read_log_events(paths)))
    elif kind == "json":   # check --json's output as the command prints it
        from cptrace_otel import cli
        sys.exit(cli.main(["check", "--json", "--no-progress", *paths]))


def _run(tree: Path, args: list[str], pin: bool = True, wrap: list[str] | None = None
         ) -> subprocess.CompletedProcess:
    """``python ARGS`` with ``tree``'s package first on the path (in ``tree``), pinned to one core if ``pin``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [*(wrap or []), sys.executable, *args]
    if pin and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0]), *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)


def _instructions(tree: Path, kind: str, paths: list[str]) -> int:
    """Instructions (valgrind cachegrind ``I refs``) of bench/check_throughput.py's child ``kind`` run on ``tree``
    (``parse``: this script's, which imports what check_throughput's ``imports`` baseline does, so that the two
    subtract: compiled modules import with other costs than interpreted ones)."""
    script = __file__ if kind == "parse" else str(ROOT / "bench" / "check_throughput.py")
    r = _run(tree, [script, "--child", kind, *paths], pin=False,
             wrap=["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"])
    return int(re.search(r"I\s+refs:\s+([\d,]+)", r.stderr).group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000, help="trace lines of the generated 2-rank log")
    ap.add_argument("--rounds", type=int, default=3, help="pure/mypyc alternations")
    ap.add_argument("--instructions", action="store_true", help="also count instructions per event (valgrind)")
    ap.add_argument("--build-dir", default=None, help="where to build (default: a temporary folder)")
    ap.add_argument("--keep-build", action="store_true", help="reuse --build-dir's build if there is one, keep it")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child, a.paths)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import check_throughput as ct

    tmp = Path(tempfile.mkdtemp(prefix="cptrace-mypyc-"))
    bdir = Path(a.build_dir) if a.build_dir else tmp / "build"
    try:
        if a.keep_build and (bdir / "cptrace_otel").exists():
            print(f"reusing the build in {bdir}")
        else:
            print(f"mypyc build of {' '.join(TARGETS)}: {build(bdir):.0f} s", flush=True)
        paths = ct.generate(str(tmp / "rank{rank}.log"), a.lines // 2, 2)
        trees = {"pure": ROOT, "mypyc": bdir}
        me = str(Path(__file__).resolve())
        outs = {k: _run(t, [me, "--child", "json", *paths], pin=False) for k, t in trees.items()}
        same = outs["pure"].stdout == outs["mypyc"].stdout and outs["pure"].returncode == outs["mypyc"].returncode
        print(f"check --json, pure vs mypyc: {'byte-identical' if same else 'DIFFERENT'} "
              f"({len(outs['pure'].stdout)} bytes, exit {outs['pure'].returncode} / {outs['mypyc'].returncode})")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; each row one process on one core")
        rows: dict[str, list[dict]] = {"pure": [], "mypyc": []}
        for i in range(a.rounds):
            for k, t in trees.items():
                r = _run(t, [str(ROOT / "bench" / "check_throughput.py"), "--child", "ours", *paths])
                s = _run(t, [me, "--child", "stages", *paths])
                d = json.loads(r.stdout.strip().splitlines()[-1]) | json.loads(s.stdout.strip().splitlines()[-1])
                rows[k].append(d)
                print(f"  round {i + 1} {k:<5} check {d['events_per_s']:>9,.0f} ev/s "
                      f"(CPU {d['cpu_events_per_s']:>9,.0f})"
                      f"  per-rank {d['per_rank_s']:.2f} s  cross-rank {d['cross_rank_s']:.2f} s CPU  "
                      f"compiled={d['compiled']}", flush=True)
        best = {k: max(d["cpu_events_per_s"] for d in v) for k, v in rows.items()}
        print(f"best CPU events/s: pure {best['pure']:,.0f}, mypyc {best['mypyc']:,.0f} "
              f"({best['mypyc'] / best['pure']:.2f}x); load average {os.getloadavg()[0]:.1f}")
        for part in ("per_rank_s", "cross_rank_s"):
            p, m = (min(d[part] for d in rows[k]) for k in ("pure", "mypyc"))
            print(f"  {part[:-2]}: {p:.2f} s -> {m:.2f} s CPU ({p / m:.2f}x)")
        if a.instructions:
            if not shutil.which("valgrind"):
                print("  (--instructions: valgrind not found, skipped)")
            for k, t in trees.items() if shutil.which("valgrind") else ():
                per = {kind: (_instructions(t, kind, paths) - _instructions(t, "imports", paths))
                       / rows[k][0]["events"] for kind in ("parse", "ours")}
                print(f"  {k:<5} instructions/event (valgrind, net of start-up and imports): reader {per['parse']:,.0f}"
                      f", check {per['ours']:,.0f}, rules {per['ours'] - per['parse']:,.0f}", flush=True)
        return 0 if same else 1
    finally:
        if not a.keep_build:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
