"""Real SGLang 0.5.23 over a DSA KV pool on CPU (dsa_driver.py's ``LayerwiseDsaDriver``): a layer-wise load-back
whose layers complete under the forward (SGLang's ``start_loading``, ``LayerDoneCounter.set_consumer``/
``wait_until`` and ``LayerLoadingEvent.complete``, driven as the scheduler and the GPU stream would), read by
SGLang's own getters (the indexer's ``get_index_k_with_scale_buffer``, attention's ``get_key_buffer``/
``get_value_buffer``). The level-2 records of the steps, their layers' completions and the first reads, and rule
LOAD-early, offline (``check``) and online (the exporter's checks, the same rule code): a healthy run, and the
indexer read that skips the per-layer wait (the GLM-5 + L2 HiCache report, SGLang #22811)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_real.test_dsa_real import RUN, _both, _online  # (the same runner and readers)
from tests.sglang_real.test_sglang_real import _check_json as _check, _records

pytestmark = pytest.mark.sglang
RUN_LW = RUN.replace('(None, "dsa_no_idx_backup")', '(None, "dsa_idx_no_wait")').replace(
    "exact=True)", "exact=True, layerwise=True)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> list[dict]:
    return _both(tmp_path_factory, RUN_LW, "layerwise")


def test_a_layerwise_load_back_is_recorded_per_step_layer_and_reader(runs):
    healthy, _ = runs
    assert healthy["corruption"] == [] and healthy["stats"]["loads"] > 0 and healthy["stats"]["layer_reads"] > 0
    recs = _records(healthy["log"])
    starts = [f for t, f in recs if t == "ld_start"]
    layers = [f for t, f in recs if t == "ld_layer"]
    reads = [f for t, f in recs if t == "ld_read"]
    reload_ops = {f["op"] for t, f in recs if t == "reload"}
    assert starts and all(set(f["ops"]) <= reload_ops and f["op"] == f["ops"][0] for f in starts)
    steps = {f["op"]: f for f in starts}
    # every step's every layer completed once, and read once per reader (never per token or per call)
    for op, f in steps.items():
        assert sorted(x["layer"] for x in layers if x["op"] == op) == list(range(f["layers"]))
        got = sorted((x["layer"], x["reader"]) for x in reads if x["op"] == op)
        assert got == sorted((layer, r) for layer in range(f["layers"]) for r in ("indexer", "kv")), (op, got)
    # healthy: each read after the wait for its layer
    assert all(x["waited"] >= x["layer"] for x in reads)
    # the read and wait sites are hooked only while a step is in flight: none is left once every load was acked
    assert healthy["stats"]["hooks_left"] == []


def test_a_healthy_layerwise_run_has_no_finding_of_any_severity(runs):
    healthy, _ = runs
    rep = _check(healthy["log"])
    assert rep["findings"] == [] and rep["unchecked"] == [], (rep["findings"][:3], rep["unchecked"])
    assert _online(healthy["otlp"]) == []


def test_an_indexer_read_that_skips_the_layer_wait_is_found(runs):
    """SGLang #22811: the indexer reads layer 0 of a loading node before its load completed (attention still
    waits). The driver sees the stale indexer pages at the read; LOAD-early names the step and the reader, once
    per step, in ``check`` and online; nothing else fires (the load itself is right: HASH and SIDE hold)."""
    _, fault = runs
    assert fault["dsa_fault_hits"]
    stale = [c for c in fault["corruption"] if c["where"] == "read"]
    assert stale and {c["pool"] for c in stale} == {"indexer"}
    assert [c for c in fault["corruption"] if c["where"] != "read"] == []
    rep = _check(fault["log"])
    assert {f["rule"] for f in rep["findings"]} == {"LOAD-early"}, rep["findings"][:3]
    assert all(f["severity"] == "ERROR" and f["certainty"] == "exact" and f["message"].startswith("indexer read")
               for f in rep["findings"])
    early_steps = {f["op"] for f in rep["findings"]}
    recs = _records(fault["log"])
    bad = {f["op"] for t, f in recs if t == "ld_read" and f["reader"] == "indexer" and f["waited"] < f["layer"]}
    assert early_steps == bad and len(bad) == len(rep["findings"])
    assert rep["unchecked"] == []
    assert set(_online(fault["otlp"])) == {"LOAD-early"}
