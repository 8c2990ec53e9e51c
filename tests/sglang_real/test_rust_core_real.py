"""sglang 0.5.23's default tree core, the Rust one (``RustUnifiedTreeCore``), on real SGLang code on CPU.

The Rust core loads only with torch 2.11-2.14; with another torch SGLang falls back to its Python core without a
word, so these tests run SGLang with the torch deploy/sglang/install puts in ``.sglang/torch-2.14``
(``runtime.sglang_env(..., rust=True)``) and assert which core SGLang really built. What they pin down is what
docs/deploy.md ("Versions") states: the instrumentation keeps the tree core SGLang selects (the variable stays unset),
so an instrumented cache runs the Rust core as without tracing and is traced at its Python boundary; the option
``CPTRACE_SGLANG_TREE_CORE=python`` sets ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`` where it is unset; what the
boundary cannot trace gets one warning naming that option, and never partial records (so no false finding).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang
VAR = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
PRELUDE = """
import json, logging, os
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append(rec.getMessage())
logging.getLogger("cptrace_otel.sglang").addHandler(H())
from tests.sglang_real import rust_driver
def records(r):
    if not os.path.exists(r["log"]):
        return 0
    with open(r["log"]) as f:
        return sum("[CPTRACE" in line for line in f)
def summary(r):
    return {"core": r["stats"]["tree_core"], "corruption": r["corruption"][:5], "records": records(r),
            "admitted": r["stats"]["admitted"], "loads": r["stats"]["loads"],
            "audited": r["stats"]["host_audited"], "hits": r["fault_hits"]}
"""


def _rust_py(code: str, timeout: int = 600, **env: str) -> dict:
    """Run ``code`` after :data:`PRELUDE` with 0.5.23 and the torch its Rust core loads with; its last stdout line is
    JSON. The variable is unset unless ``env`` sets it (whatever the caller's environment says)."""
    runtime.need("0.5.23", rust=True)
    e = runtime.sglang_env("0.5.23", rust=True)
    e.pop(VAR, None)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=timeout, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_default_keeps_the_rust_core_and_traces_it_at_its_boundary(tmp_path):
    """With the variable unset SGLang's own selection builds the Rust core here, with and without ``instrument()``:
    the traced run is the stock run (same loads, same host copies, both clean by the driver's KV content checks)
    plus records, ``insert`` among them, that ``check`` finds clean; the variable stays unset and no warning says
    the cache is not traced. The option ``CPTRACE_SGLANG_TREE_CORE=python`` (a second process: SGLang reads the
    variable per cache) builds the Python core instead, for the same run."""
    r = _rust_py(f"""
stock = rust_driver.run({str(tmp_path / "stock")!r}, sglang_selects=True, instrument=False, requests=80)
traced = rust_driver.run({str(tmp_path / "traced")!r}, sglang_selects=True, requests=80)
print(json.dumps({{"stock": summary(stock), "traced": summary(traced), "log": traced["log"],
                  "after": os.environ.get({VAR!r}), "msgs": msgs}}))
""")
    py = _rust_py(f"""
traced = rust_driver.run({str(tmp_path / "python")!r}, sglang_selects=True, requests=80)
print(json.dumps({{"traced": summary(traced), "after": os.environ.get({VAR!r}), "msgs": msgs}}))
""", CPTRACE_SGLANG_TREE_CORE="python")
    stock, traced = r["stock"], r["traced"]
    assert r["after"] is None, r
    assert stock["core"] == traced["core"] == "RustUnifiedTreeCore", r
    for s in (stock, traced, py["traced"]):
        assert s["corruption"] == [] and s["admitted"] == 80 and s["audited"] > 0, s
    assert (stock["loads"], stock["audited"]) == (traced["loads"], traced["audited"]), r
    assert stock["records"] == 0 and traced["records"] > 0, r
    assert not any("not traced" in m for m in r["msgs"]), r["msgs"]
    d = runtime.check_json([r["log"]])
    assert d["findings"] == [] and d["stats"]["nodes"] > 0, runtime.fmt_findings(d)
    with open(r["log"]) as f:
        assert sum("[CPTRACE insert]" in line for line in f) > 0
    assert py["after"] == "python" and py["traced"]["core"] == "UnifiedTreeCore", py
    assert (py["traced"]["loads"], py["traced"]["records"] > 0) == (stock["loads"], True), py


def test_what_the_rust_boundary_cannot_trace_warns_with_the_python_option(tmp_path):
    """On the Rust core the audit of host copies at rest is not run, with one warning naming
    ``CPTRACE_SGLANG_TREE_CORE=python``, while every other record is written (the hybrid SWA and Mamba trees are
    traced: test_hybrid_rust_real.py)."""
    au = _rust_py(f"""
r = rust_driver.run({str(tmp_path / "audit")!r}, sglang_selects=True, requests=60, audit_mbps=50.0)
print(json.dumps({{"run": summary(r), "msgs": msgs}}))
""")
    assert au["run"]["core"] == "RustUnifiedTreeCore" and au["run"]["records"] > 0, au
    warned = [m for m in au["msgs"] if "audit of host copies at rest" in m]
    assert len(warned) == 1 and "CPTRACE_SGLANG_TREE_CORE=python" in warned[0], au["msgs"]


def test_the_rust_boundary_is_wrapped_when_sglang_imports_it_and_unwrapped_with_the_rest():
    """``instrument()`` never imports the Rust core's adapter (that loads its extension): its sites are armed when
    SGLang imports it, at once where it already has, wrapped while tracing is on (at once where it is, else when it
    turns on; unwrapped when it turns off), and ``uninstrument()`` removes them with the rest."""
    r = _rust_py("""
import sys
import cptrace_otel
from cptrace_otel.traced.sglang import SGLangInstrumentor
from cptrace_otel.traced.sglang._rust23 import ADAPTER, RUST_SITES23
def wrapped():
    cls = sys.modules[ADAPTER].RustUnifiedTreeCore
    return [hasattr(getattr(cls, attr.split(".")[1]), "__wrapped__") for _, attr, _ in RUST_SITES23]
cptrace_otel.reload_config(level=1)
inst = SGLangInstrumentor()
inst.instrument()
imported_by_instrument = ADAPTER in sys.modules
import sglang.srt.mem_cache.rust_tree_core.adapter
after_import = wrapped()
inst.uninstrument()
after_un = wrapped()
cptrace_otel.reload_config(level=0)
inst.instrument()
at0 = wrapped()
cptrace_otel.reload_config(level=2)
again = wrapped()
cptrace_otel.reload_config(level=0)
off = wrapped()
print(json.dumps({"by_instrument": imported_by_instrument, "import": after_import, "un": after_un, "at0": at0,
                  "again": again, "off": off, "msgs": msgs}))
""")
    assert r["by_instrument"] is False, r
    assert r["import"] and all(r["import"]) and r["again"] == r["import"], r
    assert not any(r["un"]) and not any(r["at0"]) and not any(r["off"]), r
    assert r["msgs"] == [], r["msgs"]


def test_a_cache_built_at_level_0_is_traced_when_tracing_turns_on(tmp_path):
    """A Rust-core cache built and run while tracing is off (no hot site wrapped: SGLang's own methods) gets records
    once the level rises mid-run (the sites are wrapped then, the cache's state was attached at its build), as
    before the hot sites were wrapped lazily: from the middle of its life, so no ``config`` record (written at the
    build, at level 1 or more) and no warning; level 0 again unwraps them, and the run stays the stock run."""
    log = str(tmp_path / "rise" / "rank-0.log")
    r = _rust_py(f"""
import sys
import cptrace_otel
from tests.sglang_real import driver
from cptrace_otel.traced.sglang._rust23 import ADAPTER, RUST_SITES23
def wrapped():
    cls = sys.modules[ADAPTER].RustUnifiedTreeCore
    return [hasattr(getattr(cls, attr.split(".")[1]), "__wrapped__") for _, attr, _ in RUST_SITES23]
seen = {{}}
class Rise(rust_driver.BoundaryDriver23):
    admits = 0
    def admit(self, reqs):
        Rise.admits += 1
        if Rise.admits == 12:
            seen["lines_at_0"] = records({{"log": {log!r}}})
            seen["at0"] = wrapped()
            cptrace_otel.configure(level=2, file={str(tmp_path / "rise" / "rank-0.otlp.jsonl")!r}, log_file={log!r},
                                   exporter="thread")
            seen["on"] = wrapped()
        return super().admit(reqs)
driver.POOL["tree_core"] = ""
r = driver.run("0.5.23", {str(tmp_path / "rise")!r}, level=0, requests=80, stream=rust_driver.request_stream,
               make_driver=Rise)
cptrace_otel.reload_config(level=0)
seen["off"] = wrapped()
stock = rust_driver.run({str(tmp_path / "stock")!r}, sglang_selects=True, instrument=False, requests=80)
print(json.dumps({{"run": summary(r), "stock": summary(stock), "seen": seen, "msgs": msgs}}))
""")
    run, stock, seen = r["run"], r["stock"], r["seen"]
    assert run["core"] == "RustUnifiedTreeCore" and run["corruption"] == [], r
    assert (run["loads"], run["audited"]) == (stock["loads"], stock["audited"]), r
    assert seen["lines_at_0"] == 0 and not any(seen["at0"]) and all(seen["on"]) and not any(seen["off"]), seen
    assert run["records"] > 0 and not any("not traced" in m for m in r["msgs"]), r
    with open(log) as f:
        lines = f.read()
    assert "[CPTRACE insert]" in lines and "[CPTRACE config]" not in lines
