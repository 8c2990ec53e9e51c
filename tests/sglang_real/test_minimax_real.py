"""What the instrumentation does not fingerprint, measured on real SGLang 0.5.23 on CPU: MiniMax's sparse KV pool
(``MiniMaxSparseKVPool``: its KV in a ``main_pool``, the sparse layers' K-only indexer in ``index_k_pool``), assembled
by SGLang's own ``_MiniMaxSparseStrategy`` (an MHA host pool as the anchor, ``MHATokenToKOnlyPoolHost`` as the
``indexer`` sidecar on the KV's indices). Neither pool's layout is one the fingerprints know (the KV is not in the
pool's own ``k_buffer``/``v_buffer``/``kv_buffer``, the indexer is not DSA's ``index_k_with_scale_buffer``): every
backup and load carries the ``-2`` sentinels, and ``check`` counts each reload as HASH-skipped and SIDE-skipped,
never as passed. What the copy ops move is still judged: a backup that leaves the indexer out is SIDE-missing."""

from __future__ import annotations

import pytest

from cptrace_otel.model import semconv as sc
from tests.sglang_real.test_dsa_real import _both, _online  # (the same runner and readers)
from tests.sglang_real.test_sglang_real import _check_json as _check, _records

pytestmark = pytest.mark.sglang

RUN = """
import functools, json
from tests.sglang_real import runtime
runtime.apply_cpu_answers()
from tests.sglang_real import driver, dsa_driver
import sglang.srt.mem_cache.pool_host.mha as mha
runtime._unpinned(mha.MHATokenToKOnlyPoolHost, 4)   # (its pin_memory is its 4th argument)


def make_pool(dev_tokens, page_size):
    import torch
    from sglang.srt.mem_cache.memory_pool import MiniMaxSparseKVPool

    # layer 0 dense, layer 1 sparse with a K-only index (sparse_disable_index_value)
    return MiniMaxSparseKVPool(size=dev_tokens, page_size=page_size, dtype=torch.float32, head_num=driver.HEADS,
                               head_dim=driver.DIM, idx_head_dim=8, dense_layer_ids=[0], sparse_layer_ids=[1],
                               disable_value_sparse_layer_ids=[1], device="cpu", start_layer=0,
                               end_layer=driver.LAYERS)


class MiniMaxDriver(driver.Driver23):
    # the forward's KV and the driver's checks go to the main pool, whose layout is driver.py's MHA one
    def __init__(self, cache, kv, *a):
        super().__init__(cache, kv.main_pool, *a)


out = []
for fault in (None, "dsa_no_idx_backup"):
    box = {{}}

    def make_driver(cache, *a):
        box["hits"] = dsa_driver.install_fault(cache, fault)
        return MiniMaxDriver(cache, *a)

    r = driver.run("0.5.23", {out!r} + "/" + str(fault), page_size=4, requests=60, dev_tokens=96, batch=3,
                   builder=functools.partial(driver.build23, make_kv=make_pool), make_driver=make_driver,
                   checks=True, exact=True)
    r["dsa_fault_hits"] = box["hits"]
    out.append(r)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _both(tmp_path_factory, RUN, "minimax")


def test_minimax_pools_carry_the_sentinels_and_every_reload_is_counted_unchecked(runs):
    healthy, _ = runs
    assert healthy["corruption"] == [] and healthy["stats"]["loads"] > 0
    recs = _records(healthy["log"])
    assert [f[sc.SIDECARS] for t, f in recs if t == "config"] == ["indexer"]
    side_h = sc.side_field(sc.SIDE_H, "indexer")
    copies = [f for t, f in recs if t == "backup" or (t == "ack" and f.get("dir") == "h2d")]
    assert copies and all(f["h"] == -2 and f[side_h] == -2 for f in copies), copies[:2]
    rep = _check(healthy["log"])
    assert rep["findings"] == [], rep["findings"][:3]
    reloaded = len([f for t, f in recs if t == "ack" and f.get("dir") == "h2d"])
    by_code: dict[str, int] = {}
    for u in rep["unchecked"]:   # (HASH's reason depends on whether the node was split since its backup)
        assert u["rule"].startswith("HASH-skipped(") or u["rule"] == "SIDE-skipped(no hash)", u
        by_code[u["code"]] = by_code.get(u["code"], 0) + u["count"]
    assert by_code == {"HASH": reloaded, "SIDE": reloaded}, rep["unchecked"]
    assert _online(healthy["otlp"]) == []


def test_a_minimax_backup_without_its_indexer_is_side_missing(runs):
    _, fault = runs
    assert fault["dsa_fault_hits"]
    rep = _check(fault["log"])
    rules = [f["rule"] for f in rep["findings"]]
    assert set(rules) == {"SIDE-missing"} and len(rules) == len(fault["dsa_fault_hits"]), rules
    assert set(_online(fault["otlp"])) == {"SIDE-missing"}
