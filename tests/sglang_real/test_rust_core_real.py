"""sglang 0.5.23's default tree core, the Rust one (``RustUnifiedTreeCore``), on real SGLang code on CPU.

The Rust core loads only with torch 2.11-2.14; with another torch SGLang falls back to its Python core without a
word, so these tests run SGLang with the torch deploy/sglang/install puts in ``.sglang/torch-2.14``
(``runtime.sglang_env(..., rust=True)``) and assert which core SGLang really built. What they pin down is what
docs/deploy.md ("Versions") states: the instrumentation sets ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`` where
it is unset, so an instrumented cache runs the Python core where SGLang would have taken the Rust one; an explicit
``=rust`` is kept, runs as without tracing, and gets one warning and no record (so no false finding).
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


def test_unset_sglang_takes_the_rust_core_and_instrument_gives_the_python_one(tmp_path):
    """With the variable unset SGLang's own selection builds the Rust core here (so this machine can tell the two
    apart); after ``instrument()`` the same selection builds the Python core and the run is traced. Both runs of the
    same request stream are clean by the driver's KV content checks and make the same cache decisions."""
    r = _rust_py(f"""
stock = rust_driver.run({str(tmp_path / "stock")!r}, sglang_selects=True, instrument=False, requests=80)
before = os.environ.get({VAR!r})
traced = rust_driver.run({str(tmp_path / "traced")!r}, sglang_selects=True, requests=80)
print(json.dumps({{"stock": summary(stock), "traced": summary(traced), "before": before,
                  "after": os.environ.get({VAR!r}), "msgs": msgs}}))
""")
    stock, traced = r["stock"], r["traced"]
    assert r["before"] is None and r["after"] == "python", r
    assert stock["core"] == "RustUnifiedTreeCore", stock
    assert traced["core"] == "UnifiedTreeCore", traced
    for s in (stock, traced):
        assert s["corruption"] == [] and s["admitted"] == 80 and s["audited"] > 0, s
    assert (stock["loads"], stock["audited"]) == (traced["loads"], traced["audited"]), r
    assert stock["records"] == 0 and traced["records"] > 0, r
    assert not any("tree core" in m and "not the Python" in m for m in r["msgs"]), r["msgs"]


def test_explicit_rust_core_runs_untraced_with_one_warning_and_no_record(tmp_path):
    """``=rust`` chosen by the user is kept: SGLang builds the Rust core, the request stream runs clean by the
    driver's KV content checks (device prefixes after every match and load-back, host copies at rest through the
    core's boundary), and the instrumentation writes one warning and no record at all. The same driver on the same
    core sees a host copy corrupted after its write (the ``flip`` fault), so its clean answer means something."""
    r = _rust_py(f"""
ok = rust_driver.run({str(tmp_path / "ok")!r}, requests=80)
first = list(msgs)
bad = rust_driver.run({str(tmp_path / "flip")!r}, requests=80, instrument=False, fault="flip")
print(json.dumps({{"ok": summary(ok), "bad": summary(bad), "msgs": first}}))
""", **{VAR: "rust"})
    ok, bad = r["ok"], r["bad"]
    assert ok["core"] == bad["core"] == "RustUnifiedTreeCore", r
    assert ok["corruption"] == [] and ok["admitted"] == 80 and ok["loads"] > 0 and ok["audited"] > 0, ok
    assert len(r["msgs"]) == 1 and "its tree core is RustUnifiedTreeCore, not the Python UnifiedTreeCore" in \
        r["msgs"][0], r["msgs"]
    assert ok["records"] == 0, ok
    assert bad["hits"] and bad["corruption"], bad
