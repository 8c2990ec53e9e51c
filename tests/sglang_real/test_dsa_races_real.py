"""Two races of SGLang's 2026 reports, re-created on real SGLang 0.5.23 over the DSA pool (dsa_driver.py) on CPU,
each checked offline (``check``) and online (the exporter's checks):

* a partial L3 prefetch of DSA KV without its indexer pages (SGLang #30057, fix #31108): the ``file`` backend's own
  ``LRUFileEvictor`` unlinks a page's indexer object between the prefetch's storage query and its read. SGLang
  0.5.23 as shipped (the fix in place) cuts the prefix short at that page: nothing is wrong and nothing is found.
  Before the fix the KV read's pages were committed whatever the indexer read got: SIDE-l3 at the prefetch's ack.
* the host pin of a load-back released before its ack (SGLang #30321, fix #31427), the sidecar half: the
  indexer's host pages (the KV's slots) freed and reused before the load's copy reads them. H2c finds the release,
  SIDE-hash the indexer pages the load brought back (HASH the KV, where the reuse overwrote it too).
"""

from __future__ import annotations

import pytest

from tests.sglang_real.test_dsa_real import _both, _online  # (the same runner and readers)
from tests.sglang_real.test_sglang_real import _check_json as _check, _records

pytestmark = pytest.mark.sglang

RUN_L3 = """
import json, os
# the file backend under a size cap: SGLang's LRUFileEvictor tracks every object (the cap is never reached)
os.environ["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] = "1G"
from tests.sglang_real import dsa_driver
out = []
for fault in (None, "dsa_l3_idx_evicted", "dsa_l3_idx_evicted_unclamped"):
    out.append(dsa_driver.run_dsa({out!r} + "/" + str(fault), fault=fault, batch=3, checks=True, exact=True,
                                  l3=True, host_ratio=1.5))
print(json.dumps(out))
"""

RUN_PIN = """
import json
from tests.sglang_real import dsa_driver
out = []
for fault in ("dsa_early_release", "dsa_early_release_idx"):
    out.append(dsa_driver.run_dsa({out!r} + "/" + str(fault), fault=fault, batch=3, checks=True, exact=True))
print(json.dumps(out))
"""

NO_BACKUP = {"HASH-skipped(no backup)", "SIDE-skipped(no backup)"}


@pytest.fixture(scope="module")
def l3_runs(tmp_path_factory):
    return _both(tmp_path_factory, RUN_L3, "dsa_l3_race")


def _prefetch_ack(log: str, op: int) -> dict:
    acks = [f for t, f in _records(log) if t == "l3_ack" and f.get("dir") == "prefetch" and f["op"] == op]
    assert len(acks) == 1, acks
    return acks[0]


def _evicted(run: dict) -> dict:
    """The one indexer object SGLang's evictor unlinked, after the query of a prefetch of 2+ pages."""
    hits = run["dsa_fault_hits"]
    assert len(hits) == 1 and hits[0]["outcome"] == "evicted" and hits[0]["gone"] and hits[0]["pages"] >= 2, hits
    return hits[0]


def test_a_healthy_l3_run_under_the_evictor_has_no_finding(l3_runs):
    healthy = l3_runs[0]
    assert healthy["corruption"] == [] and healthy["stats"]["l3_loaded_tokens"] > 0
    rep = _check(healthy["log"])
    assert rep["findings"] == [], rep["findings"][:3]
    assert {u["rule"] for u in rep["unchecked"]} <= NO_BACKUP
    assert _online(healthy["otlp"]) == []


def test_an_indexer_evicted_before_the_read_cuts_the_prefix_short_in_0_5_23(l3_runs):
    """SGLang as shipped clamps the prefetch to the pages whose indexer it read: the page that lost its indexer
    is not committed, the driver sees nothing wrong, and nothing is found (the records say why: ``done``)."""
    healthy, run = l3_runs[0], l3_runs[1]
    hit = _evicted(run)
    ack = _prefetch_ack(run["log"], hit["op"])
    assert ack["done"] == hit["pages"] - 1 and len(ack["keys"]) == hit["pages"] - 1, ack
    assert run["corruption"] == []
    assert run["stats"]["l3_loaded_tokens"] < healthy["stats"]["l3_loaded_tokens"]
    rep = _check(run["log"])
    assert rep["findings"] == [], rep["findings"][:3]
    assert _online(run["otlp"]) == []


def test_the_kv_prefix_committed_without_its_indexer_is_side_l3(l3_runs):
    """Before the fix the KV read's pages were committed: the evicted page's indexer on the host is whatever its
    slots held, the device gets it at the load-back, and SIDE-l3 names that page key at the prefetch's ack."""
    run = l3_runs[2]
    hit = _evicted(run)
    ack = _prefetch_ack(run["log"], hit["op"])
    assert ack["done"] == hit["pages"], ack
    dev = [c for c in run["corruption"] if c["where"] == "device"]
    assert dev and {c["pool"] for c in dev} == {"indexer"}, run["corruption"]
    rep = _check(run["log"])
    assert [(f["rule"], f["op"]) for f in rep["findings"]] == [("SIDE-l3", hit["op"])], rep["findings"]
    assert hit["key"] in rep["findings"][0]["message"] and rep["findings"][0]["certainty"] == "exact"
    assert {u["rule"] for u in rep["unchecked"]} <= NO_BACKUP
    assert set(_online(run["otlp"])) == {"SIDE-l3"}


@pytest.fixture(scope="module")
def pin_runs(tmp_path_factory):
    return _both(tmp_path_factory, RUN_PIN, "dsa_pin")


def _findings(run: dict) -> dict[str, set]:
    rep = _check(run["log"])
    assert rep["unchecked"] == [], rep["unchecked"]
    assert all(f["certainty"] == "exact" for f in rep["findings"]), rep["findings"]
    out: dict[str, set] = {}
    for f in rep["findings"]:
        out.setdefault(f["rule"], set()).add(f["node_id"])
    return out


def test_indexer_and_kv_host_pages_reused_before_the_load_ack(pin_runs):
    """The reuse overwrote both pools' pages: H2c on the load, HASH and SIDE-hash on the node (the healthy DSA
    run of the same configuration, in test_dsa_real.py, has no finding of any severity)."""
    run = pin_runs[0]
    (hit,) = run["dsa_fault_hits"]
    node = hit["node_id"]
    assert {c["pool"] for c in run["corruption"] if c["where"] == "device"} == {"kv", "indexer"}
    assert _findings(run) == {"H2c": {hit["chain"][-1]}, "HASH": {node}, "SIDE-hash": {node}}
    assert set(_online(run["otlp"])) == {"H2c", "HASH", "SIDE-hash"}


def test_only_the_indexer_host_pages_reused_before_the_load_ack(pin_runs):
    """The sidecar half alone: the KV comes back right (no HASH), the indexer does not: SIDE-hash, and H2c on the
    release of the slots both pools share."""
    run = pin_runs[1]
    (hit,) = run["dsa_fault_hits"]
    node = hit["node_id"]
    assert {c["pool"] for c in run["corruption"] if c["where"] == "device"} == {"indexer"}
    assert _findings(run) == {"H2c": {hit["chain"][-1]}, "SIDE-hash": {node}}
    assert set(_online(run["otlp"])) == {"H2c", "SIDE-hash"}
