"""Real SGLang 0.5.23 over a hybrid full + sliding-window tree (``UnifiedRadixCache`` with the FULL and SWA
components, an ``SWAKVPool`` and SGLang's own SWA host pool; swa_driver.py) on CPU: the hybrid cache is traced, its
SWA round trips are recorded (``swa`` records), a healthy run has no finding of any severity, offline (``check``)
and online (the exporter's checks), and a byte flipped in the SWA host copy before a load-back is found by SWA-hash
(the full-attention KV, and so HASH, are right)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_real import runtime
from tests.sglang_real.test_dsa_real import _both, _online  # (the same run harness and online-finding reader)
from tests.sglang_real.test_sglang_real import _check_json as _check, _py, _records

pytestmark = pytest.mark.sglang
RUN = """
import json
from tests.sglang_real import swa_driver
out = []
for policy, fault in (("write_through", None), ("write_through", "swa_flip"), ("write_back", None)):
    out.append(swa_driver.run({out!r} + "/" + policy + str(fault), fault=fault, policy=policy, checks=True,
                              exact=True))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> list[dict]:
    return _both(tmp_path_factory, RUN, "swa")


def test_the_hybrid_tree_is_traced_with_its_swa_round_trips(runs: list[dict]) -> None:
    healthy = runs[0]
    st = healthy["stats"]
    # the run exercised what the SWA component does: loads, tombstones, the window's reads checked
    assert healthy["corruption"] == [] and st["loads"] > 0 and st["swa_tombstones"] > 0 and st["swa_checked"] > 0
    recs = _records(healthy["log"])
    tags = {t for t, _ in recs}
    assert {"config", "insert", "backup", "reload", "evict", "swa"} <= tags, tags
    d2h = [f for t, f in recs if t == "swa" and f["dir"] == "d2h"]
    h2d = [f for t, f in recs if t == "swa" and f["dir"] == "h2d"]
    assert d2h and h2d
    for f in d2h + h2d:   # real per-page fingerprints of the SWA rows, one per token (page size 1)
        assert isinstance(f["hp"], list) and f["hp"] and all(type(x) is int and x > 0 for x in f["hp"]), f
        assert f["nodes"], f
    # the full-attention KV is fingerprinted from its own pool (not the -2 sentinel of an unknown layout)
    assert all(f["h"] > 0 for t, f in recs if t == "backup")


@pytest.mark.parametrize("i", [0, 2], ids=["write_through", "write_back"])
def test_a_healthy_hybrid_run_has_no_finding_of_any_severity(runs: list[dict], i: int) -> None:
    healthy = runs[i]
    assert healthy["corruption"] == [] and healthy["stats"]["loads"] > 0
    rep = _check(healthy["log"])
    assert rep["findings"] == [] and rep["unchecked"] == [], (rep["findings"][:3], rep["unchecked"])
    assert _online(healthy["otlp"]) == []
    assert {f["dir"] for t, f in _records(healthy["log"]) if t == "swa"} == {"d2h", "h2d"}


def test_a_flipped_swa_host_copy_is_found(runs: list[dict]) -> None:
    """One byte of the SWA host copy flipped before a load-back reads it: the model's window reads it wrong (the
    driver sees it in the SWA pool only), and SWA-hash names that load, offline and online; nothing else."""
    fault = runs[1]
    hits = fault["swa_fault_hits"]
    assert len(hits) == 1
    assert {c["where"] for c in fault["corruption"]} == {"device-swa"}, fault["corruption"]
    rep = _check(fault["log"])
    assert {f["rule"] for f in rep["findings"]} == {"SWA-hash"}, rep["findings"][:3]
    f = rep["findings"][0]
    assert f["severity"] == "ERROR" and f["certainty"] == "exact"
    assert f"host slot {hits[0]['host_slot']}" in f["message"], f["message"]
    assert set(_online(fault["otlp"])) == {"SWA-hash"}


def test_a_hybrid_tree_that_gets_l3_storage_stops_being_traced(tmp_path: Any) -> None:
    """A hybrid SWA tree is traced from its build (its ``config`` record); SGLang's runtime attach of the ``file``
    storage backend ends that with one warning naming why (SWA stores its trailing pages under keys no record
    follows)."""
    runtime.need("0.5.23")
    r = attach_l3_after_build(tmp_path, "swa_driver", "build_swa")
    assert r["built"] == [] and r["tags"] == ["config"], r
    assert len(r["msgs"]) == 1 and "hybrid SWA tree with an L3 storage backend" in r["msgs"][0], r


def attach_l3_after_build(tmp_path: Any, module: str, builder: str) -> dict:
    """A hybrid tree built by ``tests.sglang_real.<module>.<builder>`` under the instrumentation (level 2), then
    SGLang's runtime attach of the ``file`` storage backend, in a child: the instrumentation's warnings at the build
    (``built``) and in all (``msgs``), and the tags of the records written (``tags``)."""
    return _py(f"""
import json, logging, os
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append(rec.getMessage())
logging.getLogger("cptrace_otel.sglang").addHandler(H())
import cptrace_otel
cptrace_otel.configure(level=2, file={str(tmp_path / "o.jsonl")!r}, log_file={str(tmp_path / "r.log")!r},
                       exporter="thread")
from cptrace_otel.traced.sglang import SGLangInstrumentor
SGLangInstrumentor().instrument()
from tests.sglang_real import l3_driver, {module}
cache, kv, alloc = {module}.{builder}("write_through", 1, 160, 3.0, None, None)
built = list(msgs)
os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = {str(tmp_path / "store")!r}
os.makedirs(os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"])
l3_driver.attach_file_storage(cache)
assert cptrace_otel.flush(30)
with open({str(tmp_path / "r.log")!r}) as f:
    tags = [line.split("[CPTRACE ")[1].split("]")[0] for line in f if "[CPTRACE " in line]
print(json.dumps({{"built": built, "msgs": msgs, "tags": tags}}))
""", version="0.5.23")
