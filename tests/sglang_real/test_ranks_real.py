"""Several CP ranks on real SGLang: 4 rank processes (gloo on a ``file://`` store), each with its
own stock SGLang HiCache (0.5.20's ``HiRadixCache``, and 0.5.23's ``UnifiedRadixCache``: every test runs for both)
driven on CPU by ``driver.py``, the same request stream on every rank, and the
``config`` record saying ``mode=replicated`` (every rank holds the whole stream's KV in its own cache: the same
tokens, the same KV bytes, the same tree decisions, acks all-reduced over the group).

* Healthy (exact sets, and range summaries only; write_through, and write_back with pages of 4; a reset
  mid-run): ``cptrace-otel check`` over the 4 ranks' logs gives 0 findings of any severity, the cross-rank rules
  C1-C5 ran (none is listed unchecked, and each fires on the same logs once one rank's record is altered), and
  the runs did split, reload (chains of several nodes too) and evict (device and host) on every rank.
* One rank's fault (rank 2): the finding is on rank 2 only, with its code and node, and the driver's content check
  saw the corruption on rank 2 only.

All runs share one subprocess per rank (``driver.run_ranks(matrix=...)``: one SGLang import and one gloo group per
rank for the five runs). Without the SGLang folder the tests skip, unless ``CPTRACE_REQUIRE_SGLANG=1`` (``.ci/run``).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tests.sglang_real import runtime

VERSIONS = runtime.VERSIONS
WORLD, FAULT_RANK = 4, 2
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

# the runs of the matrix, in order; a "fault" applies on FAULT_RANK only. 60 requests are enough: every rank splits,
# reloads (chains of several nodes too) and evicts under the 256-token device pool (asserted from the records).
BASE = {"requests": 60, "dev_tokens": 256, "seed": 1, "policy": "write_through"}
MATRIX = [
    {"exact": True},                                                  # 0: healthy, exact sets, reset mid-run
    {"exact": False},                                                 # 1: healthy, range summaries only
    {"exact": True, "reset": False, "fault": "flip", "nth": 4},       # 2: a host byte flipped on rank 2 (0.5.23: nth 3)
    {"exact": False, "reset": False, "fault": "early_release"},       # 3: host pin released early on rank 2
    {"exact": False, "policy": "write_back", "page_size": 4, "host_ratio": 1.5},   # 4: healthy, write_back, pages of 4
]
# per version: the flip's site whose node this stream reloads later (a host copy never reloaded is invisible to HASH)
FLIP_NTH = {"0.5.20": 4, "0.5.23": 3}
CROSS = ("C1", "C2", "C3", "C4", "C5")


@pytest.fixture(scope="module", params=VERSIONS)
def runs(request, tmp_path_factory) -> list[list[dict]]:
    """``runs[i][r]``: rank ``r``'s driver summary of MATRIX entry ``i``, for each SGLang version."""
    runtime.need(request.param)
    from tests.sglang_real import driver

    out = tmp_path_factory.mktemp("ranks")
    matrix = [{**BASE, **m, **({"nth": FLIP_NTH[request.param]} if m.get("fault") == "flip" else {})}
              for m in MATRIX]
    return driver.run_ranks(request.param, str(out), world=WORLD, fault_rank=FAULT_RANK, matrix=matrix)


_check = runtime.check_json


def _analysis(paths: list[str]):
    """The same check in-process, for what the JSON does not show (the cross-rank bookkeeping)."""
    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events

    an = Analysis(None)
    res = an.run(read_log_events(paths))
    return an, res, list(read_log_events(paths))


def _fmt(d: dict) -> list[str]:
    return [f"{f['severity']} {f['rule']} r{f['rank']} n{f['node_id']} op{f['op']}: {f['message']}"
            for f in d["findings"][:8]]


def _lineage(events, rank: int, nid: int) -> set[int]:
    """``nid`` and the ids split from it on ``rank`` (a split's new id takes the prefix of the node it cut)."""
    out = {nid}
    for e in events:
        if e.rank == rank and e.tag == "split" and e.fields.get("node_id") in out:
            out.add(e.fields["new_id"])
    return out


# -- healthy --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", [0, 1, 4], ids=["exact", "range", "write-back-p4-range"])
def test_healthy_four_ranks_have_no_finding_and_the_cross_rank_rules_ran(runs, i):
    ranks = runs[i]
    assert [r["corruption"] for r in ranks] == [[]] * WORLD
    assert all(r["stats"]["admitted"] == BASE["requests"] and r["stats"]["resets"] == 1 for r in ranks)
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    assert d["findings"] == [], _fmt(d)
    assert d["stats"]["ranks"] == list(range(WORLD))
    cross_unchecked = [u for u in d["unchecked"] if u["code"] in CROSS]
    undecidable = [u for u in cross_unchecked if u["kind"] == "undecidable"]
    assert [u for u in cross_unchecked if u not in undecidable] == [], cross_unchecked
    if MATRIX[i]["exact"]:
        assert undecidable == [], undecidable

    an, res, events = _analysis(logs)
    assert res.findings == []
    cr = an.cross
    assert not cr.disabled and cr.mode == "replicated" and cr.ranks == set(range(WORLD)) and cr._saw_hash
    # every rank split, reloaded and evicted (device and host), and the streams cross the reset (two epochs)
    per = {r: Counter(e.tag if e.tag != "evict" else f"evict-{e.fields.get('tier')}" for e in events if e.rank == r)
           for r in range(WORLD)}
    for r, c in per.items():
        assert c["split"] and c["reload"] and c["evict-dev"] and c["evict-host"] and c["reset"] == 1, (r, c)
    assert any(len(e.fields["chain"]) > 1 for e in events if e.tag == "reload"), "no chain reload of several nodes"
    assert {e.epoch for e in events} >= {0, 1}


def _mutate(src: str, dst: str, tag: str, edit) -> int:
    """Copy log ``src`` to ``dst`` with ``edit(line)`` applied to the first ``[CPTRACE tag]`` line it changes
    (``edit`` returns the new line, ``""`` to drop it, or None to leave it); returns the node id it changed."""
    done = None
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            if done is None and f"[CPTRACE {tag}]" in line:
                new = edit(line)
                if new is not None:
                    done = int(re.search(r" node_id=(\d+)", line).group(1))
                    line = new
            g.write(line)
    assert done is not None, (tag, src)
    return done


def _bump(field: str):
    def edit(line: str) -> str:
        return re.sub(rf" {field}=(\d+)", lambda m: f" {field}={int(m.group(1)) + 1}", line, count=1)
    return edit


def _bump_cnt(field: str):
    def edit(line: str) -> str:
        return re.sub(rf" {field}=\(cnt=(\d+)", lambda m: f" {field}=(cnt={int(m.group(1)) + 1}", line, count=1)
    return edit


# one record of rank 1 of the healthy exact run altered: the cross-rank rule that reads it fires
ALTER = [
    ("C1", "split", lambda line: ""),                                   # a split the other ranks made, missing
    ("C2", "ack", lambda line: "" if " dir=d2h" in line else None),     # an ack round that differs
    ("C3", "backup", lambda line: re.sub(r" io=1", " io=0", line) if " io=1" in line else None),
    ("C4", "reload", _bump_cnt("host")),                                # a load of another length
    ("C5", "backup", _bump("h")),                                       # a backup of other bytes
]


@pytest.mark.parametrize("code,tag,edit", ALTER, ids=[a[0] for a in ALTER])
def test_the_cross_rank_rules_judge_these_logs(runs, tmp_path, code, tag, edit):
    """The 0 of the healthy run is not the rules' silence: the same logs with one record of rank 1 altered give
    the cross-rank finding of that record (other rules may follow from the same edit; this one must be there)."""
    logs = [r["log"] for r in runs[0]]
    altered = str(tmp_path / "rank-1.log")
    _mutate(logs[1], altered, tag, edit)
    d = _check([logs[0], altered, *logs[2:]])
    assert code in {f["code"] for f in d["findings"]}, _fmt(d)
    # C1's C twin (the default where it was built) and its Python twin judge the real streams alike
    from cptrace_otel.checks import cross_base

    paths = [logs[0], altered, *logs[2:]]
    with_c = [f.to_dict() for f in _analysis(paths)[1].findings]
    with cross_base.python_lockstep():
        assert [f.to_dict() for f in _analysis(paths)[1].findings] == with_c


# -- one rank's fault -----------------------------------------------------------------------------------------------

def _faulty(runs, i: int):
    ranks = runs[i]
    assert [len(r["fault_hits"]) > 0 for r in ranks] == [r == FAULT_RANK for r in range(WORLD)]
    assert [bool(r["corruption"]) for r in ranks] == [r == FAULT_RANK for r in range(WORLD)], \
        [r["corruption"][:2] for r in ranks]
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    _, _, events = _analysis(logs)
    assert d["findings"] and {f["rank"] for f in d["findings"]} == {FAULT_RANK}, _fmt(d)
    assert not {f["code"] for f in d["findings"]} & set(CROSS), _fmt(d)
    hit = ranks[FAULT_RANK]["fault_hits"][0]
    seen = {n for c in ranks[FAULT_RANK]["corruption"] for n in c["nodes"]}
    return d, events, hit, seen


def test_flipped_host_byte_on_one_rank_is_hash_on_that_rank(runs):
    """A byte of rank 2's host copy flipped after its copy (a backup whose node is reloaded later): HASH on
    rank 2, on the node whose host copy holds the flipped slot, the node whose reloaded KV the driver saw wrong.

    No cross-rank rule fires, and none should: C5 in mode ``replicated`` compares the ranks' ``backup`` hashes, which
    are taken from the device KV at the backup, before the flip, and are equal; the tree, the copies and their
    lengths are the same on every rank (C1-C4). The flip is a single rank's content fault, which the rank's own
    HASH (backup against reload) decides."""
    d, events, hit, seen = _faulty(runs, 2)
    assert {f["code"] for f in d["findings"]} == {"HASH"}, _fmt(d)
    assert all(f["certainty"] == "exact" for f in d["findings"])
    owners = {e.fields["node_id"] for e in events
              if e.rank == FAULT_RANK and e.tag == "prepare" and e.fields["host"].first == hit["host_slot"]}
    lineage = set().union(*(_lineage(events, FAULT_RANK, n) for n in owners))
    hashes = {f["node_id"] for f in d["findings"]}
    assert owners and hashes <= lineage, (owners, _fmt(d))
    assert hashes & set().union(*(_lineage(events, FAULT_RANK, n) for n in seen)), (seen, _fmt(d))


def test_host_pin_released_early_on_one_rank_is_h2c_on_that_rank(runs):
    """The shape of SGLang #31427 on rank 2 only (range summaries): the load's host pages freed before its h2d
    ack and reused. H2c (exact) on rank 2's load, named by its last node; HASH on rank 2 where the reused pages
    came back; the driver saw the node's KV come back wrong on rank 2 only.

    No cross-rank rule fires: the free changes which host slots rank 2 hands out next, but mode ``replicated``
    compares no host slots across ranks (only counts, C4, which are equal), the tree decisions stay the same (C1,
    the acks are all-reduced: C2), and C5 compares ``backup`` hashes, taken from the device KV, which are right on
    every rank; the wrong bytes show only in rank 2's reloads, which its HASH compares with its backups."""
    d, events, hit, seen = _faulty(runs, 3)
    chain, first = hit["chain"], hit["node_id"]
    h2c = [f for f in d["findings"] if f["rule"] == "H2c"]
    assert [f["node_id"] for f in h2c] == [chain[-1]] and h2c[0]["certainty"] == "exact", _fmt(d)
    assert {f["node_id"] for f in d["findings"] if f["code"] == "HASH"} & _lineage(events, FAULT_RANK, first)
    assert {f["code"] for f in d["findings"]} <= {"H2", "HASH", "ZERO"}, _fmt(d)
    assert first in seen, seen
