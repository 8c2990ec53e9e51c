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
    pkg.mkdir(parents=True, exist_ok=True)
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


# -- the switch's values, its cost at every start, a broken install ------------------------------------
PROBE = ("import sys\n"
         "print('pkg', 'cptrace_otel' in sys.modules, 'cptrace_otel.traced.api' in sys.modules)\n"
         "print('finder', any(getattr(f, 'cptrace_alias', False) for f in sys.meta_path))\n"
         "print('modules', len(sys.modules))\n"
         "try:\n import sglang.srt.mem_cache.cp_hicache_trace as t\n print('alias', t.__name__)\n"
         "except ImportError:\n print('alias absent')\n")


def _probe(tmp_path, switch, **env_more):
    env = _env(tmp_path, switch)
    env.update(env_more)
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    return lines, p.stderr


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
@pytest.mark.parametrize("value", ["", "0", " 0", "false", "False", "FALSE", "no", "off", " Off "])
def test_plain_off_values_are_off_silently(tmp_path, value):
    got, err = _probe(tmp_path, value)
    assert got["finder"] == "False" and got["alias"] == "absent" and got["pkg"] == "False False"
    assert err == ""


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "On"])
def test_on_values_alias_without_importing_the_package_at_start(tmp_path, value):
    off, _ = _probe(tmp_path, "0")
    got, err = _probe(tmp_path, value)
    assert err == ""
    assert got["pkg"] == "False False"   # nothing of cptrace_otel imported at start ...
    assert got["finder"] == "True"
    # ... only the shim file itself (and what the finder needs) beside what an off start loads
    assert int(got["modules"]) - int(off["modules"]) <= 3, (got["modules"], off["modules"])
    assert got["alias"] == "cptrace_otel.traced.api"   # imported when the aliased name is


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
@pytest.mark.parametrize("value", ["maybe", "2", "enable"])
def test_an_unknown_value_is_off_with_one_warning_line(tmp_path, value):
    got, err = _probe(tmp_path, value)
    assert got["finder"] == "False" and got["alias"] == "absent"
    assert len(err.splitlines()) == 1 and "CPTRACE_SGLANG" in err and "off" in err


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
def test_a_missing_package_warns_one_line(tmp_path):
    env = _env(tmp_path, "1")
    env["PYTHONPATH"] = str(tmp_path / "fake")   # the .pth is there, the package is not
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    if "alias cptrace_otel" in p.stdout:
        pytest.skip("cptrace_otel is installed in this interpreter's site-packages: it cannot be missing here")
    assert p.returncode == 0, p.stderr
    assert len(p.stderr.splitlines()) == 1 and "cannot be loaded" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(not site.ENABLE_USER_SITE, reason="user site-packages disabled in this interpreter")
def test_a_broken_install_warns_once_one_line_and_sglang_still_imports(tmp_path):
    """The package is there but raises at import (a missing dependency, a bad file): the start is silent, the
    import of the aliased name warns once, one line, and resolves as it would without the switch."""
    broken = tmp_path / "broken"
    (broken / "cptrace_otel" / "traced").mkdir(parents=True)
    (broken / "cptrace_otel" / "__init__.py").write_text("raise ImportError('simulated broken install')\n")
    (broken / "cptrace_otel" / "traced" / "__init__.py").write_text("")
    (broken / "cptrace_otel" / "traced" / "sglang_shim.py").write_text(open(sglang_shim.__file__).read())
    env = _env(tmp_path, "1")
    env["PYTHONPATH"] = os.pathsep.join([str(broken), str(tmp_path / "fake")])
    code = PROBE + "try:\n import sglang.srt.mem_cache.cp_hicache_trace\nexcept ImportError:\n pass\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "alias absent" in p.stdout
    assert len(p.stderr.splitlines()) == 1 and "simulated broken install" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
