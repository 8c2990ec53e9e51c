"""Real SGLang 0.5.23 over a hybrid full + Mamba tree (``UnifiedRadixCache`` with the FULL and MAMBA components, a
``HybridLinearKVPool``, a ``MambaPool`` and SGLang's own ``MambaPoolHost``; mamba_driver.py) on CPU: the hybrid cache
is traced, its Mamba round trips are recorded (``mamba`` records), a healthy run has no finding of any severity,
offline (``check``) and online (the exporter's checks), and a byte flipped in a Mamba host state before its load-back
is found by MAMBA-hash (the full-attention KV, and so HASH, are right). With L3 storage such a tree gets one warning
and no record (on the Rust tree core it is traced: test_hybrid_rust_real.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_real import runtime
from tests.sglang_real.test_dsa_real import _both, _online  # (the same run harness and online-finding reader)
from tests.sglang_real.test_sglang_real import _check_json as _check, _py, _records
from tests.sglang_real.test_swa_real import attach_l3_after_build  # (the same L3-attach probe)

pytestmark = pytest.mark.sglang
RUN = """
import json
from tests.sglang_real import mamba_driver
out = []
for policy, fault in (("write_through", None), ("write_through", "mamba_flip"), ("write_back", None)):
    out.append(mamba_driver.run({out!r} + "/" + policy + str(fault), fault=fault, policy=policy, checks=True,
                                exact=True))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> list[dict]:
    return _both(tmp_path_factory, RUN, "mamba")


def test_the_hybrid_tree_is_traced_with_its_mamba_round_trips(runs: list[dict]) -> None:
    healthy = runs[0]
    st = healthy["stats"]
    # the run exercised what the Mamba component does: states loaded back from the host, checked at the forward
    assert healthy["corruption"] == [] and st["mamba_loaded"] > 0 and st["mamba_checked"] > 0, st
    assert st["mamba_host_checked"] > 0, st
    recs = _records(healthy["log"])
    tags = {t for t, _ in recs}
    assert {"config", "insert", "backup", "evict", "mamba"} <= tags, tags
    d2h = [f for t, f in recs if t == "mamba" and f["dir"] == "d2h"]
    h2d = [f for t, f in recs if t == "mamba" and f["dir"] == "h2d"]
    assert d2h and len(h2d) == st["mamba_loaded"], (len(h2d), st)
    for f in d2h + h2d:   # one real fingerprint per state slot
        assert f["page"] == 1 and isinstance(f["hp"], list) and len(f["hp"]) == 1 and f["hp"][0] > 0, f
    assert all(f["cow"] == 1 for f in h2d), h2d[:3]   # every load also filled its request's own slot
    # the full-attention KV is fingerprinted from its own pool (not the -2 sentinel of an unknown layout); a backup
    # that moves no KV is a node's incremental Mamba backup (its KV is on the host already), with its mamba record
    backups = [f for t, f in recs if t == "backup"]
    assert all(f["h"] > 0 for f in backups if f["dev"] != "(0)")
    assert {f["op"] for f in backups if f["dev"] == "(0)"} <= {f["op"] for f in d2h}


@pytest.mark.parametrize("i", [0, 2], ids=["write_through", "write_back"])
def test_a_healthy_hybrid_run_has_no_finding_of_any_severity(runs: list[dict], i: int) -> None:
    healthy = runs[i]
    assert healthy["corruption"] == [] and healthy["stats"]["mamba_loaded"] > 0, healthy["stats"]
    rep = _check(healthy["log"])
    assert rep["findings"] == [] and rep["unchecked"] == [], (rep["findings"][:3], rep["unchecked"])
    assert _online(healthy["otlp"]) == []
    assert {f["dir"] for t, f in _records(healthy["log"]) if t == "mamba"} == {"d2h", "h2d"}


def test_a_flipped_mamba_host_state_is_found(runs: list[dict]) -> None:
    """One byte of a Mamba host state flipped before a load-back reads it: the request starts from a wrong state and
    the host audit sees the copy wrong (the driver, in the Mamba pools only), and MAMBA-hash names that node's
    loads, offline and online; nothing else."""
    fault = runs[1]
    hits = fault["mamba_fault_hits"]
    assert len(hits) == 1
    where = {c["where"] for c in fault["corruption"]}
    assert "device-mamba" in where and where <= {"device-mamba", "host-mamba"}, fault["corruption"]
    rep = _check(fault["log"])
    assert {f["rule"] for f in rep["findings"]} == {"MAMBA-hash"}, rep["findings"][:3]
    f = rep["findings"][0]
    assert f["severity"] == "ERROR" and f["certainty"] == "exact"
    assert f"host slot {hits[0]['host_slot']}" in f["message"], f["message"]
    assert f["node_id"] in hits[0]["nodes"], (f, hits)
    assert set(_online(fault["otlp"])) == {"MAMBA-hash"}


def test_a_hybrid_mamba_tree_that_gets_l3_storage_stops_being_traced(tmp_path: Any) -> None:
    """A hybrid Mamba tree is traced from its build (its ``config`` record); SGLang's runtime attach of the ``file``
    storage backend ends that with one warning naming why (the state goes to storage under its own key, which no
    record follows)."""
    runtime.need("0.5.23")
    r = attach_l3_after_build(tmp_path, "mamba_driver", "build_mamba")
    assert r["built"] == [] and r["tags"] == ["config"], r
    assert len(r["msgs"]) == 1 and "hybrid Mamba tree with an L3 storage backend" in r["msgs"][0], r


def test_a_tree_with_swa_and_mamba_components_is_refused() -> None:
    """FULL + SWA + MAMBA (``_MambaSwaStrategy``'s trees) is not traced: ``untraceable`` names the component set
    (read here from a real FULL + Mamba cache whose component list is swapped; the FULL + Mamba one is traced)."""
    runtime.need("0.5.23")
    r = _py("""
import json
from sglang.srt.mem_cache.unified_cache.components import ComponentType as C
from cptrace_otel.traced.sglang._sites23 import untraceable
from tests.sglang_real import mamba_driver
cache, kv, alloc = mamba_driver.build_mamba("write_through", 1, 160, 3.0, None, None)
ok = untraceable(cache)
cache.tree_components = (C.FULL, C.SWA, C.MAMBA)
print(json.dumps({"ok": ok, "three": untraceable(cache)}))
""", version="0.5.23")
    assert r["ok"] is None, r
    assert "components ['FULL', 'SWA', 'MAMBA']" in r["three"] and "FULL with MAMBA are traced" in r["three"], r
