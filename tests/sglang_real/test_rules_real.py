"""The rules on real SGLang: stock SGLang 0.5.20's HiCache (``HiRadixCache``, its
controller, pools and allocator) and 0.5.23's (``UnifiedRadixCache``, ``HybridCacheController``) driven on CPU by
``driver.py`` with the instrumentation on, its records read back the way ``cptrace-otel check`` reads log files.

* Healthy runs, every write policy, page sizes 1 and 4, batched admission, copies that complete steps later, a reset
  mid-run: the driver's own content check sees no corruption, and the checker reports no finding of any severity,
  with exact sets and with range summaries only (whose undecidable overlaps are counted, not reported).
* Injected faults: each is found with its code on the node the fault hit, and the driver saw the corruption it
  caused (where the fault corrupts content).

Each run is a subprocess (SGLang on ``sys.path`` for its version, see ``runtime.sglang_env``); without the SGLang
folder the tests skip, unless ``CPTRACE_REQUIRE_SGLANG=1`` (``.ci/run``), where they fail.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.sglang_real import runtime

VERSION = "0.5.20"
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]


def _need() -> None:
    runtime.need(VERSION)


def drive(out: str, **kw) -> tuple[dict, object, list]:
    """One driver run in a subprocess; returns its summary, the check's result and the run's events."""
    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events

    _need()
    args = runtime.module_cmd("driver", "--version", VERSION, "--out", out)
    for k, v in kw.items():
        if v is True:
            args.append("--" + k.replace("_", "-"))
        elif v is not None and v is not False:
            args += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(args, env=runtime.sglang_env(VERSION), cwd=runtime.ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    events = list(read_log_events([summary["log"]]))
    res = Analysis(None).run(events)
    return summary, res, events


def _fmt(res) -> list[str]:
    return [f"{f.severity} {f.rule} n{f.node_id} op{f.op}: {f.message}" for f in res.findings[:5]]


def _inflight_splits(events) -> int:
    """Splits of a node whose load had no h2d ack yet (what the simulator's first reading never did)."""
    from cptrace_otel.sim.volume import Coverage

    cov = Coverage(0)
    for _ in cov.watch(events):
        pass
    return cov.inflight_splits


# -- healthy runs ---------------------------------------------------------------------------------------------------

HEALTHY = [(pol, ps, exact) for pol in ("write_through", "write_through_selective", "write_back") for ps in (1, 4)
           for exact in (False, True)]


def assert_healthy(summary, res, exact: bool) -> None:
    """A healthy run of 200 requests with a reset mid-run (either version): the driver saw no corruption, loads
    happened, no finding, nothing undecidable with exact sets, and every reload carried its hash."""
    assert summary["corruption"] == [], summary["corruption"][:3]
    st = summary["stats"]
    assert st["loads"] and st["resets"] == 1 and st["admitted"] == 200, st
    assert res.findings == [], _fmt(res)
    und = {u.rule: u.count for u in res.unchecked if u.kind == "undecidable"}
    if exact:
        assert und == {}, und
    assert not [u for u in res.unchecked if u.rule == "HASH-skipped(no reload hash)"], res.unchecked


@pytest.mark.parametrize("policy,page_size,exact", HEALTHY,
                         ids=[f"{p}-p{ps}-{'exact' if x else 'range'}" for p, ps, x in HEALTHY])
def test_healthy_real_run_has_no_finding(tmp_path, policy, page_size, exact):
    """200 requests in batches of up to 4, copies completing up to 3 steps later, a reset mid-run."""
    seed = 1 + HEALTHY.index((policy, page_size, exact)) // 2   # the same run range-only and with exact sets
    summary, res, _ = drive(str(tmp_path), policy=policy, page_size=page_size, seed=seed, requests=200,
                            exact=exact)
    assert_healthy(summary, res, exact)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_healthy_real_run_with_large_batches_and_late_copies(tmp_path, policy):
    """Batches of up to 8, copies up to 5 steps late: loads pile up, and later requests of a batch split nodes
    whose load is still in flight (the split is applied to the load; no HASH)."""
    splits = 0
    for seed, exact in ((11, False), (12, True)):
        summary, res, events = drive(str(tmp_path / f"s{seed}"), policy=policy, page_size=4, seed=seed,
                                     requests=200, batch=8, max_lag=5, exact=exact)
        assert summary["corruption"] == []
        assert res.findings == [], (seed, exact, _fmt(res))
        splits += _inflight_splits(events)
    assert splits, "no split of a node whose load was in flight: the runs did not meet what they are for"


# -- injected faults ------------------------------------------------------------------------------------------------

def _fault(tmp_path, fault: str, exact: bool, **kw):
    summary, res, events = drive(str(tmp_path), policy="write_through", page_size=kw.pop("page_size", 1),
                                 seed=kw.pop("seed", 1), requests=200, fault=fault, exact=exact, **kw)
    assert summary["fault_hits"], f"fault {fault} never reached an eligible site"
    return summary, res, events


def _lineage(events, nid: int) -> set[int]:
    """``nid`` and the ids split from it (a split's new id takes the prefix of the node it cut)."""
    out = {nid}
    for e in events:
        if e.tag == "split" and e.fields.get("node_id") in out:
            out.add(e.fields["new_id"])
    return out


def assert_flip(summary, res, events) -> None:
    """A byte of a host copy flipped after its device->host copy, the node later reloaded: HASH only, on the node
    whose host copy holds the flipped slot, one the driver saw corrupt."""
    slot = summary["fault_hits"][0]["host_slot"]
    seen = {n for c in summary["corruption"] for n in c["nodes"]}
    assert seen, "the driver did not see the flipped byte"
    hashes = [f for f in res.findings if f.code == "HASH"]
    assert hashes and {f.code for f in res.findings} == {"HASH"}, _fmt(res)
    owners = {e.fields["node_id"] for e in events if e.tag == "prepare" and e.fields["host"].first == slot}
    assert owners and {f.node_id for f in hashes} <= set().union(*(_lineage(events, n) for n in owners)), \
        (owners, _fmt(res))
    assert {f.node_id for f in hashes} & set().union(*(_lineage(events, n) for n in seen))


def assert_unpinned(summary, res, events) -> None:
    """H4a (exact) on the unpinned node; the HASH findings that follow are the foreign bytes coming back in later
    reloads; the driver saw the node's host copy hold the wrong KV."""
    nid = summary["fault_hits"][0]["node_id"]
    h4a = [f for f in res.findings if f.rule == "H4a"]
    assert [f.node_id for f in h4a] == [nid] and h4a[0].certainty == "exact", _fmt(res)
    assert {f.code for f in res.findings} <= {"H4", "HASH"}, _fmt(res)
    assert nid in {n for c in summary["corruption"] for n in c["nodes"]}, summary["corruption"]


def assert_midchain(summary, res, events) -> None:
    hit = summary["fault_hits"][0]
    mid = hit["node_id"]
    assert mid != hit["chain"][-1]   # not the node SGLang's load ack names
    assert any(mid in c["nodes"] for c in summary["corruption"]), summary["corruption"]
    hashes = {f.node_id for f in res.findings if f.code == "HASH"}
    listed = {n for u in res.unchecked if u.rule.startswith("HASH-skipped") for n in u.examples}
    assert _lineage(events, mid) & (hashes | listed), (_fmt(res), res.unchecked)
    assert _lineage(events, mid) & hashes, "per-chain-node ack records: the middle node is compared"
    assert {f.code for f in res.findings} == {"HASH"}, _fmt(res)


def assert_early_release(summary, res, events) -> None:
    """H2c (exact) on the load, named by its last node as its ack is; HASH on the node whose pages were reused; the
    driver saw that node's KV come back wrong."""
    hit = summary["fault_hits"][0]
    chain, first = hit["chain"], hit["node_id"]
    h2c = [f for f in res.findings if f.rule == "H2c"]
    assert [f.node_id for f in h2c] == [chain[-1]] and h2c[0].certainty == "exact", _fmt(res)
    assert {f.node_id for f in res.findings if f.code == "HASH"} & _lineage(events, first), _fmt(res)
    assert {f.code for f in res.findings} <= {"H2", "HASH", "ZERO"}, _fmt(res)
    assert any(first in c["nodes"] for c in summary["corruption"]), summary["corruption"]


def assert_split_no_rewrite(summary, res, events) -> None:
    """H1b on the node, nothing else; what the driver sees is the bookkeeping's consequence: the split-off prefix is
    no longer pending, and its host copy is read before the copy that fills it completed."""
    hit = summary["fault_hits"][0]
    assert [(f.rule, f.node_id) for f in res.findings] == [("H1b", hit["node_id"])], _fmt(res)
    assert hit["new_id"] in {n for c in summary["corruption"] for n in c["nodes"]}, summary["corruption"]


@pytest.mark.parametrize("exact", [False, True], ids=["range", "exact"])
def test_byte_flipped_in_a_host_copy_is_hash(tmp_path, exact):
    """The 4th backup of this stream (the earlier sites' nodes are never reloaded, and a host copy that never comes
    back is invisible to HASH, which compares a backup with a reload)."""
    assert_flip(*_fault(tmp_path, "flip", exact, nth=4))


@pytest.mark.parametrize("exact", [False, True], ids=["range", "exact"])
def test_unpinned_write_through_backup_is_h4a(tmp_path, exact):
    """A write-through backup whose node is not pinned while its copy is in flight (4 steps), under device pressure
    (96 device slots): the node is evicted and its pages reused before the copy reads them."""
    assert_unpinned(*_fault(tmp_path, "unpinned", exact, dev_tokens=96))


@pytest.mark.parametrize("exact", [False, True], ids=["range", "exact"])
def test_host_slot_corrupted_mid_chain_is_hash_never_silent(tmp_path, exact):
    assert_midchain(*_fault(tmp_path, "midchain", exact))


@pytest.mark.parametrize("exact", [False, True], ids=["range", "exact"])
def test_host_pin_released_before_the_load_ack_is_h2c(tmp_path, exact):
    """The shape of SGLang #31427: the chain's first node's host pages are freed after the load is issued and
    reused by another writer before the copy reads them."""
    assert_early_release(*_fault(tmp_path, "early_release", exact))


@pytest.mark.parametrize("exact", [False, True], ids=["range", "exact"])
def test_split_during_a_pending_write_without_rewriting_it_is_h1b(tmp_path, exact):
    """The shape of #27072: a split while the node's write is pending does not rewrite the pending entry, so the
    ack publishes the suffix's fragments only."""
    assert_split_no_rewrite(*_fault(tmp_path, "split_no_rewrite", exact))


# -- sglang 0.5.23 (UnifiedRadixCache + HybridCacheController) -------------------------------------------------------
# The same runs and the same assertions; each group runs in one driver process (``--matrix``: one SGLang import for
# all its runs), which keeps 0.5.23's share of the CI time to about two minutes on two cores.

V23 = "0.5.23"
LARGE = [(pol, seed, exact) for pol in ("write_through", "write_back") for seed, exact in ((11, False), (12, True))]
# the fault runs (write_through, seed 1, 200 requests): flip's 2nd backup is a node this stream reloads later;
# unpinned needs device pressure (96 slots) to evict the node while its copy is in flight
FAULTS23 = [("flip", {"nth": 2}), ("unpinned", {"dev_tokens": 96}), ("midchain", {}), ("early_release", {}),
            ("split_no_rewrite", {})]
ASSERT = {"flip": assert_flip, "unpinned": assert_unpinned, "midchain": assert_midchain,
          "early_release": assert_early_release, "split_no_rewrite": assert_split_no_rewrite}


def drive_matrix(out: str, version: str, matrix: list[dict]) -> list:
    """Every run of ``matrix`` in one driver process; per run ``(summary, analysis, events)``."""
    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events

    runtime.need(version)
    args = runtime.module_cmd("driver", "--version", version, "--out", out, "--matrix", json.dumps(matrix))
    p = subprocess.run(args, env=runtime.sglang_env(version), cwd=runtime.ROOT, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out_runs = []
    for summary in json.loads(p.stdout.strip().splitlines()[-1]):
        events = list(read_log_events([summary["log"]]))
        out_runs.append((summary, Analysis(None).run(events), events))
    return out_runs


@pytest.fixture(scope="module")
def healthy23(tmp_path_factory):
    m = [{"policy": pol, "page_size": ps, "exact": exact, "requests": 200,
          "seed": 1 + HEALTHY.index((pol, ps, exact)) // 2} for pol, ps, exact in HEALTHY]
    m += [{"policy": pol, "page_size": 4, "seed": seed, "exact": exact, "requests": 200, "batch": 8, "max_lag": 5}
          for pol, seed, exact in LARGE]
    return drive_matrix(str(tmp_path_factory.mktemp("healthy23")), V23, m)


@pytest.mark.parametrize("i", range(len(HEALTHY)),
                         ids=[f"{p}-p{ps}-{'exact' if x else 'range'}" for p, ps, x in HEALTHY])
def test_healthy_real_run_has_no_finding_0_5_23(healthy23, i):
    summary, res, _ = healthy23[i]
    assert_healthy(summary, res, exact=HEALTHY[i][2])


def test_healthy_real_run_with_large_batches_and_late_copies_0_5_23(healthy23):
    splits = 0
    for (pol, seed, exact), (summary, res, events) in zip(LARGE, healthy23[len(HEALTHY):], strict=False):
        assert summary["corruption"] == []
        assert res.findings == [], (pol, seed, exact, _fmt(res))
        splits += _inflight_splits(events)
    splits += sum(_inflight_splits(ev) for _, _, ev in healthy23[:len(HEALTHY)])
    assert splits, "no split of a node whose load was in flight: the runs did not meet what they are for"


@pytest.fixture(scope="module")
def faults23(tmp_path_factory):
    m = [{"policy": "write_through", "seed": 1, "requests": 200, "fault": f, "exact": exact, **kw}
         for f, kw in FAULTS23 for exact in (False, True)]
    return drive_matrix(str(tmp_path_factory.mktemp("faults23")), V23, m)


@pytest.mark.parametrize("i", range(2 * len(FAULTS23)),
                         ids=[f"{f}-{x}" for f, _ in FAULTS23 for x in ("range", "exact")])
def test_injected_fault_is_found_0_5_23(faults23, i):
    """Each fault of the 0.5.20 tests above, injected at 0.5.23's own sites (``runtime.Faults._install23_*``),
    found with the same code on the same node, the driver seeing the corruption. 0.5.23 holds the host pin of a
    load to its ack (the fix of #31427): early_release frees and reuses the pages behind it, as that bug did."""
    summary, res, events = faults23[i]
    fault = FAULTS23[i // 2][0]
    assert summary["fault_hits"] and summary["fault_hits"][0]["kind"] == fault, summary["fault_hits"]
    ASSERT[fault](summary, res, events)
