"""The drivers are modules of the package ``tests.sglang_real``, started as ``python -m tests.sglang_real.<module>``
from the repository root, with no ``sys.path`` edit anywhere (docs/testing.md): by hand, with nothing on
``PYTHONPATH``, a driver runs again under its SGLang version's folder (``runtime.use_sglang``) and does its run;
a process that cannot be run again says how to start it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.sglang_real import runtime

# what edits sys.path, in code or in the code strings the tests hand to ``python -c``
EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\s*\(|(\[[^\]]*\])?\s*\+?=(?!=))")


def _bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _reaches_the_drivers(path: str) -> bool:
    """A benchmark that imports this package or puts its folder on ``sys.path`` (as they did)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return "tests.sglang_real" in text or '"sglang_real"' in text


def test_no_sys_path_edits_in_the_drivers_tests_and_benchmarks_that_run_them():
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, f) for f in os.listdir(here) if f.endswith(".py") and f != os.path.basename(__file__)]
    bench = os.path.join(runtime.ROOT, "bench")
    files += [p for p in (os.path.join(bench, f) for f in os.listdir(bench) if f.endswith(".py"))
              if _reaches_the_drivers(p)]
    edits = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            edits += [f"{os.path.relpath(path, runtime.ROOT)}:{i}: {line.strip()}"
                      for i, line in enumerate(f, 1) if EDIT.search(line)]
    assert len(files) > 20 and any(f.endswith("sglang_step_cost.py") for f in files), files
    assert edits == [], "\n".join(edits)


def test_the_drivers_are_imported_by_their_package_path_only():
    """A bare ``import runtime`` (or ``from driver import ...``) works only where a path edit put this folder first:
    without one it fails at run time, in whatever branch reaches it (a fault's set-up, a benchmark mode)."""
    here = os.path.dirname(os.path.abspath(__file__))
    mods = sorted(f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith(("test_", "__")))
    bare = re.compile(rf"^\s*(import|from)\s+({'|'.join(mods)})\b")
    files = [os.path.join(here, f) for f in os.listdir(here) if f.endswith(".py")]
    bench = os.path.join(runtime.ROOT, "bench")
    files += [os.path.join(bench, f) for f in os.listdir(bench) if f.endswith(".py")]
    found = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, runtime.ROOT)}:{i}: {line.strip()}"
                      for i, line in enumerate(f, 1) if bare.search(line)]
    assert {"runtime", "driver", "dsa_driver"} <= set(mods)
    assert found == [], "\n".join(found)


def test_the_edit_pattern_sees_the_forms_of_an_edit():
    """(the check above is only as good as this pattern)"""
    for line in ("sys.path.insert(0, HERE)", "sys.path.append(str(ROOT))", "sys.path[:0] = [a, b]", "sys.path = []",
                 "sys.path += [d]", "    sys.path .extend(x)"):
        assert EDIT.search(line), line
    for line in ("if d not in sys.path:", "any(p == want for p in sys.path)", "x = sys.path == y"):
        assert not EDIT.search(line), line


@pytest.mark.sglang
def test_a_driver_started_by_hand_runs_under_its_sglang_version(tmp_path):
    """``python -m tests.sglang_real.driver`` from the root, nothing on ``PYTHONPATH``: a traced run of real SGLang
    0.5.20 (the process ran again with its folder on ``PYTHONPATH``)."""
    runtime.need("0.5.20")
    p = subprocess.run(runtime.module_cmd("driver", "--version", "0.5.20", "--out", str(tmp_path), "--requests", "12"),
                       env=_bare_env(), cwd=runtime.ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["stats"]["admitted"] == 12 and r["corruption"] == [], r
    with open(r["log"], encoding="utf-8") as f:
        assert sum("[CPTRACE" in line for line in f) > 12


def test_a_process_that_cannot_run_again_says_how_to_start_a_driver():
    """``python -c`` has no module to run again: a clear exit, not an ImportError deep in SGLang."""
    p = subprocess.run([sys.executable, "-c", "from tests.sglang_real import runtime; runtime.use_sglang('0.5.20')"],
                       env=_bare_env(), cwd=runtime.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "SGLang 0.5.20 is not on sys.path: start a driver as `python -m tests.sglang_real.MODULE`" in p.stderr
