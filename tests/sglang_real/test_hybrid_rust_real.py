"""Real SGLang 0.5.23's hybrid trees, FULL + SWA (swa_driver.py) and FULL + Mamba (mamba_driver.py), on its default
tree core, the Rust one (``RustUnifiedTreeCore``, SGLang's own selection under the torch it loads with), traced at the
core's Python boundary (``_rust23``: the components' transfers of ``commit_backup`` / ``commit_load_back``): a
healthy run has no finding of any severity, offline (``check``) and online (the exporter's checks), under
write-through and write-back; a byte flipped in a host copy before a load-back is found by SWA-hash / MAMBA-hash
only; and the ``swa`` / ``mamba`` records equal the Python core's on the same stream, but for the node ids (each
core numbers its own nodes) and the op ids (the controller's counter runs on over a process's runs): each renamed
one to one throughout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.sglang_real import runtime
from tests.sglang_real.test_dsa_real import _online
from tests.sglang_real.test_sglang_real import _check_json as _check, _records

pytestmark = pytest.mark.sglang
VAR = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
RUN = """
import json, sys
from tests.sglang_real import mamba_driver, swa_driver
drivers = {{"swa": swa_driver, "mamba": mamba_driver}}
out = []
for name, policy, fault in json.loads(sys.argv[1]):
    out.append(drivers[name].run({out!r} + "/" + name + policy + str(fault), fault=fault, policy=policy, checks=True,
                                 exact=True, boundary=True))
print(json.dumps(out))
"""
RUST = [("swa", "write_through", None), ("swa", "write_through", "swa_flip"), ("swa", "write_back", None),
        ("mamba", "write_through", None), ("mamba", "write_through", "mamba_flip"), ("mamba", "write_back", None)]
PYTHON = [("swa", "write_through", None), ("mamba", "write_through", None)]   # the same streams, the Python core


def _runs(out: str, which: list, **env: str) -> list[dict]:
    runtime.need("0.5.23", rust=True)
    e = runtime.rust_default_env()
    e.update(env)
    p = subprocess.run([sys.executable, "-c", RUN.format(out=out), json.dumps(which)], env=e, capture_output=True,
                       text=True, timeout=600, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    runs = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(r["flushed"] and os.path.exists(r["log"]) and os.path.exists(r["otlp"]) for r in runs), p.stderr[-4000:]
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict:
    rust = _runs(str(tmp_path_factory.mktemp("rust")), RUST)
    py = _runs(str(tmp_path_factory.mktemp("python")), PYTHON, **{VAR: "python"})
    return {"rust": dict(zip(RUST, rust, strict=True)), "python": dict(zip(PYTHON, py, strict=True))}


HEALTHY = [k for k in RUST if k[2] is None]


@pytest.mark.parametrize("key", HEALTHY, ids=[f"{n}-{p}" for n, p, _ in HEALTHY])
def test_a_healthy_hybrid_run_on_the_rust_core_has_no_finding(runs: dict, key: tuple) -> None:
    r = runs["rust"][key]
    name = key[0]
    st = r["stats"]
    assert st["tree_core"] == "RustUnifiedTreeCore" and r["corruption"] == [], (st, r["corruption"])
    assert st["loads"] > 0 and st["host_audited"] > 0, st
    if name == "mamba":
        assert st["mamba_loaded"] > 0 and st["mamba_checked"] > 0, st
    else:
        assert st["swa_checked"] > 0, st
    recs = _records(r["log"])
    assert {"config", "insert", "backup", "reload", "evict", name} <= {t for t, _ in recs}
    assert {f["dir"] for t, f in recs if t == name} == {"d2h", "h2d"}
    rep = _check(r["log"])
    assert rep["findings"] == [] and rep["unchecked"] == [], (rep["findings"][:3], rep["unchecked"])
    assert _online(r["otlp"]) == []


@pytest.mark.parametrize("key", [k for k in RUST if k[2]], ids=["swa_flip", "mamba_flip"])
def test_a_flipped_host_copy_is_found_on_the_rust_core(runs: dict, key: tuple) -> None:
    """The byte flipped before the first load-back that moves the component's host copy: the driver sees the
    component's device state wrong, and SWA-hash / MAMBA-hash names that host slot, offline and online; nothing
    else (the full-attention KV is right)."""
    r = runs["rust"][key]
    name = key[0]
    rule = "SWA-hash" if name == "swa" else "MAMBA-hash"
    (hit,) = r[f"{name}_fault_hits"]
    assert {c["where"] for c in r["corruption"]} == {f"device-{name}"}, r["corruption"]
    rep = _check(r["log"])
    assert {f["rule"] for f in rep["findings"]} == {rule}, rep["findings"][:3]
    assert any(f"host slot {hit['host_slot']}" in f["message"] for f in rep["findings"]), rep["findings"][:3]
    assert set(_online(r["otlp"])) == {rule}


def _component_records(log: str, tag: str) -> list[dict]:
    return [f for t, f in _records(log) if t == tag]


@pytest.mark.parametrize("key", PYTHON, ids=["swa", "mamba"])
def test_the_rust_cores_hybrid_records_equal_the_python_cores(runs: dict, key: tuple) -> None:
    """The same stream on both cores: the same loads, and the same ``swa`` / ``mamba`` records in the same order
    (direction, host and device slots, fingerprints), their node and op ids renamed one to one."""
    rust, py = runs["rust"][key], runs["python"][key]
    assert py["stats"]["tree_core"] == "UnifiedTreeCore" and py["corruption"] == [], py["stats"]
    assert rust["stats"]["loads"] == py["stats"]["loads"]
    a, b = _component_records(rust["log"], key[0]), _component_records(py["log"], key[0])
    assert a and len(a) == len(b)
    rename: dict[int, int] = {}
    ops: dict[int, int] = {}
    for x, y in zip(a, b, strict=True):
        ids_x, ids_y = [x.pop("node_id"), *x.pop("nodes", [])], [y.pop("node_id"), *y.pop("nodes", [])]
        op_x, op_y = x.pop("op"), y.pop("op")
        assert len(ids_x) == len(ids_y) and x == y, (x, y)
        assert ops.setdefault(op_x, op_y) == op_y, (op_x, op_y)
        for i, j in zip(ids_x, ids_y, strict=True):
            assert rename.setdefault(i, j) == j, (i, j, rename[i])
    assert len(set(rename.values())) == len(rename) and len(set(ops.values())) == len(ops)


def test_the_component_books_name_no_python_node() -> None:
    """What the SWA and Mamba records read of a node is its id only (so a Rust node by id serves): no other node
    attribute in their modules' code."""
    here = os.path.join(runtime.ROOT, "cptrace_otel", "traced", "sglang")
    for mod in ("_swa23.py", "_mamba23.py"):
        with open(os.path.join(here, mod)) as f:
            src = f.read()
        assert set(re.findall(r"\bnode\.(\w+)", src)) <= {"id"}, mod
