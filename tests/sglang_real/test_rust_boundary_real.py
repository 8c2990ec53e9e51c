"""The records written at the Python boundary of 0.5.23's Rust tree core (the default,
``cptrace_otel.traced.sglang._rust23``), on real SGLang code on CPU: SGLang builds its default ``RustUnifiedTreeCore``
(asserted), the instrumentation keeps it and traces it, and ``check`` reads the records back as a user runs it.

* Healthy runs (write_through and write_back, pages of 1 and 4, a reset mid-run, copies that complete steps later):
  the driver's KV content checks see no corruption, the checker reports no finding, and it checked the nodes the
  records name (backups, reloads and splits inferred from the paths all present). ``insert`` is written (new: one
  per insert that added a leaf; revive: a walked node the records left without device copy): the checker books
  every node at its insert, with its device slots, so the rules that read it (H1a's latest slots, H4a's reuse of a
  copy's source, C1's structural tuples, CANARY's owner) read the Rust core's nodes as the Python core's.
* The injected faults of tests/sglang_real (``runtime.Faults``, injected at 0.5.23's sites through the tree core's
  boundary) found with the code the Python core's runs give, on the node the fault hit or the fragments split from
  it.

One subprocess runs every case (one SGLang import), with the torch the Rust core loads with.
"""

from __future__ import annotations

import json

import pytest

from tests.sglang_real import runtime
from tests.sglang_real.test_rules_real import _fmt, _lineage

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200)]

HEALTHY = [{"policy": "write_through", "seed": 1, "requests": 200, "exact": True},
           {"policy": "write_back", "seed": 3, "requests": 150, "dev_tokens": 256, "host_ratio": 1.5},
           {"policy": "write_through", "page_size": 4, "seed": 2, "requests": 200, "max_lag": 5}]
# the Python core's fault runs (test_rules_real.py's FAULTS23): write_through, seed 1, 200 requests, exact sets
FAULTS = [("flip", {"nth": 2}), ("unpinned", {"dev_tokens": 96}), ("midchain", {}), ("early_release", {}),
          ("split_no_rewrite", {})]
RUNS = """
import json, sys
from tests.sglang_real import rust_driver
out = []
for i, kw in enumerate(json.loads(sys.argv[2])):
    r = rust_driver.run(sys.argv[1] + "/" + str(i), sglang_selects=True, **kw)
    out.append({"core": r["stats"]["tree_core"], "corruption": r["corruption"], "hits": r["fault_hits"],
                "stats": r["stats"], "log": r["log"]})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runtime.need("0.5.23", rust=True)
    matrix = HEALTHY + [{"policy": "write_through", "seed": 1, "requests": 200, "exact": True, "fault": f, **kw}
                        for f, kw in FAULTS]
    summaries = runtime.run_json(RUNS, str(tmp_path_factory.mktemp("rust")), json.dumps(matrix),
                                 env=runtime.rust_default_env(), timeout=1100)
    from cptrace_otel.analyze.engine import Analysis

    out = []
    for s in summaries:
        events = runtime.log_events([s["log"]])
        out.append((s, Analysis(None).run(events), events))
    return out


def _count(events, tag: str) -> int:
    return sum(e.tag == tag for e in events)


@pytest.mark.parametrize("i", range(len(HEALTHY)), ids=[f"{h['policy']}-p{h.get('page_size', 1)}" for h in HEALTHY])
def test_healthy_rust_core_run_has_no_finding(runs, i):
    summary, res, events = runs[i]
    assert summary["core"] == "RustUnifiedTreeCore", summary["core"]
    assert summary["corruption"] == [] and summary["stats"]["loads"] > 0, summary["stats"]
    assert res.findings == [], _fmt(res)
    for tag in ("prepare", "backup", "reload", "evict", "free", "rid_map"):
        assert _count(events, tag) > 0, tag
    assert res.stats["nodes"] > 0, res.stats
    # every backup is acknowledged and every evict's free is attributed to its node
    assert _count(events, "backup") == sum(e.tag == "ack" and e.fields.get("dir") == "d2h" for e in events) \
        or summary["stats"]["resets"], summary["stats"]
    evicted = {e.fields["node_id"] for e in events if e.tag == "evict" and e.fields.get("tier") == "dev"}
    freed = {e.fields["node_id"] for e in events if e.tag == "free" and e.fields.get("why") == "evict"}
    assert evicted and evicted <= freed, sorted(evicted - freed)[:5]


@pytest.mark.parametrize("i", range(len(HEALTHY)), ids=[f"{h['policy']}-p{h.get('page_size', 1)}" for h in HEALTHY])
def test_inserts_are_written_at_the_boundary(runs, i):
    """Every node a record names was booked by its ``insert`` (new) or cut from one (``split``) before, with the
    device slots the insert gave it; walked evicted nodes get their ``insert kind=revive`` before their next
    eviction, and a revive names a node whose device copy an ``evict tier=dev kind=backuped`` took."""
    events = runs[i][2]
    new = [e for e in events if e.tag == "insert" and e.fields.get("kind") == "new"]
    revive = [e for e in events if e.tag == "insert" and e.fields.get("kind") == "revive"]
    assert new and revive, (len(new), len(revive))
    assert all(e.fields["dev"].cnt == e.fields["len"] for e in new + revive)
    known: set = set()
    gone: set = set()
    for e in events:
        f = e.fields
        if e.tag == "insert":
            assert f["kind"] == "new" or f["node_id"] in gone, f
            known.add(f["node_id"])
            gone.discard(f["node_id"])
        elif e.tag == "split":
            assert f["node_id"] in known, f
            known.add(f["new_id"])
            if f["node_id"] in gone:
                gone.add(f["new_id"])
        elif e.tag == "reset":
            known.clear()
            gone.clear()
        elif e.tag in ("prepare", "evict", "reload"):
            assert f["node_id"] in known, (e.tag, f)
            if e.tag == "evict" and f.get("tier") == "dev":
                gone.add(f["node_id"])
            elif e.tag == "reload":
                gone.difference_update(f.get("chain") or ())
                gone.discard(f["node_id"])


def test_splits_inside_rust_are_inferred(runs):
    """Splits happen inside Rust; the healthy runs' records carry them (``inf=1``) before a record names a fragment,
    and a reload of a fragment is compared with its share of the backup made before the split (HASH over the
    fragment's pages: the lineage the inferred splits rebuild is the tree's)."""
    splits = [e for _, _, ev in runs[:len(HEALTHY)] for e in ev if e.tag == "split"]
    assert splits and all(e.fields.get("inf") == 1 for e in splits), len(splits)
    compared = 0
    for _, res, events in runs[:len(HEALTHY)]:
        frags = {e.fields["new_id"] for e in events if e.tag == "split"}
        skipped = {n for u in res.unchecked if u.rule.startswith("HASH-skipped") for n in u.examples}
        compared += sum(1 for e in events if e.tag == "ack" and e.fields.get("dir") == "h2d"
                        and e.fields["node_id"] in frags and e.fields["node_id"] not in skipped)
    assert compared > 0, "no reload of a split fragment was compared"


@pytest.mark.parametrize("j", range(len(FAULTS)), ids=[f for f, _ in FAULTS])
def test_injected_fault_is_found_on_the_rust_core(runs, j):
    summary, res, events = runs[len(HEALTHY) + j]
    fault = FAULTS[j][0]
    assert summary["core"] == "RustUnifiedTreeCore", summary["core"]
    assert summary["hits"] and summary["hits"][0]["kind"] == fault, summary["hits"]
    hit = summary["hits"][0]
    codes = {f.code for f in res.findings}
    if fault == "flip":
        owners = {e.fields["node_id"] for e in events
                  if e.tag == "prepare" and e.fields["host"].first == hit["host_slot"]}
        hashes = {f.node_id for f in res.findings if f.code == "HASH"}
        assert codes == {"HASH"} and hashes & set().union(*(_lineage(events, n) for n in owners)), _fmt(res)
        assert summary["corruption"], "the driver did not see the flipped byte"
    elif fault == "unpinned":
        h4a = [f for f in res.findings if f.rule == "H4a"]
        assert [f.node_id for f in h4a] == [hit["node_id"]] and h4a[0].certainty == "exact", _fmt(res)
        assert codes <= {"H4", "HASH"}, _fmt(res)
    elif fault == "midchain":
        hashes = {f.node_id for f in res.findings if f.code == "HASH"}
        assert codes == {"HASH"} and _lineage(events, hit["node_id"]) & hashes, _fmt(res)
        assert summary["corruption"], "the driver did not see the corrupted middle node"
    elif fault == "early_release":
        h2c = [f for f in res.findings if f.rule == "H2c"]
        assert [f.node_id for f in h2c] == [hit["chain"][-1]] and h2c[0].certainty == "exact", _fmt(res)
        assert {f.node_id for f in res.findings if f.code == "HASH"} & _lineage(events, hit["node_id"]), _fmt(res)
        assert codes <= {"H2", "HASH", "ZERO"}, _fmt(res)
    else:
        assert [(f.rule, f.node_id) for f in res.findings] == [("H1b", hit["node_id"])], _fmt(res)
