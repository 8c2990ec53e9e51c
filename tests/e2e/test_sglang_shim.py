"""CPTRACE_SGLANG=1: ``sglang.srt.mem_cache.cp_hicache_trace`` resolves to cptrace_otel in spawned children.

The ``.pth`` file is written into a private user site (``PYTHONUSERBASE``), which every child interpreter inherits
and processes at start, as site-packages would be for an installed package."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig

import pytest

from cptrace_otel.traced import sglang_shim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


PARENT = r"""
import multiprocessing as mp, sys

def child(q):
    import sglang.srt.mem_cache.cp_hicache_trace as t
    import cptrace_otel.traced.api as api
    q.put((t is api, t.cptrace is api.cptrace, t.trace_level()))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=child, args=(q,)) for _ in range(2)]
    for p in ps: p.start()
    got = [q.get(timeout=60) for _ in ps]
    for p in ps: p.join(60)
    print(got)
"""


def _env(tmp_path, switch):
    base = tmp_path / "userbase"
    env = dict(os.environ)
    env["PYTHONUSERBASE"] = str(base)
    usersite = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(base)})
    os.makedirs(usersite, exist_ok=True)
    sglang_shim.write_pth(usersite)
    fake = tmp_path / "fake"
    pkg = fake / "sglang" / "srt" / "mem_cache"
    pkg.mkdir(parents=True)
    for d in (fake / "sglang", fake / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, str(fake)])
    env["CPTRACE_LEVEL"] = "2"
    if switch is None:
        env.pop("CPTRACE_SGLANG", None)
    else:
        env["CPTRACE_SGLANG"] = switch
    return env


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
def test_spawned_children_resolve_the_alias(tmp_path):
    script = tmp_path / "parent.py"   # a file: spawn children re-import the parent's __main__ by path
    script.write_text(PARENT)
    p = subprocess.run([sys.executable, str(script)], env=_env(tmp_path, "1"), capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[(True, True, 2), (True, True, 2)]"


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
def test_switch_off_costs_nothing(tmp_path):
    code = ("import sys\n"
            "print('cptrace_otel' in sys.modules)\n"
            "try:\n import sglang.srt.mem_cache.cp_hicache_trace\nexcept ImportError:\n print('absent')\n")
    p = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, None), capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "absent"]
