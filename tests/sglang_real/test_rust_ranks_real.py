"""Several CP ranks over 0.5.23's Rust tree core (the default, traced at its boundary): 2 rank processes (gloo on a
``file://`` store), each with the ``RustUnifiedTreeCore`` SGLang selects (asserted), driven on CPU by
``rust_driver.py`` with the same request stream, the ``config`` record saying ``mode=replicated`` (every rank holds
the whole stream's KV in its own cache).

* Healthy (exact sets, a reset mid-run): ``cptrace-otel check`` over both ranks' logs gives 0 findings of any
  severity, and no cross-rank rule is left unchecked: the ranks' Rust cores number their nodes alike, so C1's
  structural tuples (``insert``, inferred ``split``, ``prepare``, ``evict``, ``reload``) line up.
* C1 reads ``insert`` on the Rust core: one rank's log with one ``insert`` dropped is a C1 divergence.
* One rank's fault (a flipped host byte on rank 1): HASH on rank 1 only, seen by the driver's content check there.

One subprocess per rank runs every case (one SGLang import and one gloo group per rank), with the torch the Rust core
loads with.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

from tests.sglang_real import driver, runtime
from tests.sglang_real.test_ranks_real import _fmt, _mutate

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

WORLD, FAULT_RANK = 2, 1
BASE = {"requests": 60, "dev_tokens": 256, "seed": 1, "policy": "write_through"}
MATRIX = [{"exact": True},                                              # 0: healthy, exact sets, reset mid-run
          {"exact": True, "reset": False, "fault": "flip", "nth": 3}]   # 1: a host byte flipped on rank 1
CROSS = ("C1", "C2", "C3", "C4", "C5")
RANK = """
import json, sys
from tests.sglang_real import rust_driver
out, world, rank, store, matrix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
res = []
for i, kw in enumerate(matrix):
    r = rust_driver.run(f"{out}/{i}", sglang_selects=True, world=world, rank=rank, store=store, **kw)
    res.append({"core": r["stats"]["tree_core"], "corruption": r["corruption"], "hits": r["fault_hits"],
                "stats": r["stats"], "log": r["log"]})
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[list[dict]]:
    """``runs[i][r]``: rank ``r``'s summary of MATRIX entry ``i``."""
    runtime.need("0.5.23", rust=True)
    out = tmp_path_factory.mktemp("rust-ranks")
    env = runtime.rust_default_env()
    # (the ranks' exporter pipeline writes its OTLP file here, not under the repository's cptrace-out/)
    env["CPTRACE_FILE"] = f"{out}/otlp/rank-{{rank}}-{{pid}}.otlp.jsonl"
    store = tempfile.mktemp(prefix="cptrace-gloo-", dir=str(out))
    procs = []
    for r in range(WORLD):
        mine = [{k: v for k, v in {**BASE, **m}.items() if k not in ("fault", "nth") or r == FAULT_RANK}
                for m in MATRIX]
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(out), str(WORLD), str(r), store,
                                       json.dumps(mine)], env=env, cwd=runtime.ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = driver.rank_summaries(procs, timeout=800)
    return [[outs[r][i] for r in range(WORLD)] for i in range(len(MATRIX))]


def test_healthy_ranks_on_the_rust_core_have_no_finding_and_the_cross_rank_rules_ran(runs):
    ranks = runs[0]
    assert [r["core"] for r in ranks] == ["RustUnifiedTreeCore"] * WORLD
    assert [r["corruption"] for r in ranks] == [[]] * WORLD
    assert all(r["stats"]["loads"] > 0 and r["stats"]["resets"] == 1 for r in ranks), [r["stats"] for r in ranks]
    d = runtime.check_json([r["log"] for r in ranks])
    assert d["findings"] == [], _fmt(d)
    assert d["stats"]["ranks"] == list(range(WORLD))
    assert [u for u in d["unchecked"] if u["code"] in CROSS] == [], d["unchecked"]


def test_c1_reads_the_inserts_of_the_rust_core(runs, tmp_path):
    """Rank 1's log without its first ``insert`` (the node's other records kept): its tree no longer matches rank
    0's, and C1 says so."""
    ranks = runs[0]
    bad = str(tmp_path / "rank-1.log")
    _mutate(ranks[1]["log"], bad, "insert", lambda line: "")
    d = runtime.check_json([ranks[0]["log"], bad])
    assert "C1" in {f["code"] for f in d["findings"]}, _fmt(d)


def test_a_flipped_host_byte_on_one_rank_is_hash_on_that_rank_only(runs):
    ranks = runs[1]
    assert ranks[FAULT_RANK]["hits"] and ranks[FAULT_RANK]["corruption"], ranks[FAULT_RANK]["hits"]
    assert [r["corruption"] for r in ranks if r is not ranks[FAULT_RANK]] == [[]] * (WORLD - 1)
    d = runtime.check_json([r["log"] for r in ranks])
    assert d["findings"] and {(f["code"], f["rank"]) for f in d["findings"]} == {("HASH", FAULT_RANK)}, _fmt(d)
