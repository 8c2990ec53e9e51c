"""Per-rank rules H1-H4, ZERO, HASH: the Bad/Good examples of each rule (docs/domain.md §4), extra positive cases per
rule, level-1 unchecked behaviour, epochs and bounded state."""

from __future__ import annotations

import os

import pytest

from cptrace_otel.checks import Finding, RankChecker
from cptrace_otel.model.events import Event
from tests.helpers.checks_util import FIXTURES, R, check_files, check_lines, rules

DOMAIN = os.path.join(FIXTURES, "domain")

# fixture -> (rules, (code, rank, node_id, op) of the main finding)
BAD = {
    "h1b_bad.log": ({"H1b"}, ("H1", 0, 3, 7)),
    "h2c_bad.log": ({"H2c", "ZERO@reload"}, ("H2", 0, 5, 12)),
    "h3_bad.log": ({"H3"}, ("H3", 1, 5, None)),
    "h4_bad.log": ({"H4a"}, ("H4", 0, 6, 20)),
    "zero_bad.log": ({"ZERO@backup"}, ("ZERO", 0, 6, 20)),
    "hash_bad.log": ({"HASH"}, ("HASH", 0, 6, 21)),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_domain_bad_example_is_found(name):
    res = check_files([os.path.join(DOMAIN, name)])
    exp_rules, main = BAD[name]
    assert rules(res) == exp_rules
    got = {(f.code, f.rank, f.node_id, f.op) for f in res.findings}
    assert main in got
    f = next(f for f in res.findings if (f.code, f.rank, f.node_id, f.op) == main)
    assert f.certainty == "exact" and f.severity == "ERROR"
    # the finding completes at the record that proves it: the last line of each Bad example
    n_lines = len(open(os.path.join(DOMAIN, name)).read().splitlines())
    assert f.line_no == n_lines and f.evidence[-1] == n_lines - 1


@pytest.mark.parametrize("name", sorted(n.replace("_bad", "_good") for n in BAD))
def test_domain_good_example_is_silent(name):
    res = check_files([os.path.join(DOMAIN, name)])
    assert res.findings == []


def _lifecycle(node=1, dev=(512, 543), host=(64, 95), op=1, h=111):
    return [
        f"[CPTRACE insert] node_id={node} parent=0 len={dev[1] - dev[0] + 1} dev={R(*dev)} kind=new",
        f"[CPTRACE prepare] node_id={node} op={op} len={dev[1] - dev[0] + 1} dev={R(*dev)} host={R(*host)} policy=wt",
        f"[CPTRACE backup] op={op} node_id={node} dev={R(*dev)} host={R(*host)} io=1 h={h} nz=4096",
    ]


def test_h1a_swapped_host_halves(tmp_path):
    lines = _lifecycle(3, (100, 163), (0, 63)) + [
        "[CPTRACE ack] dir=d2h op=1 node_id=3 blen=64 clen=64 pub=[3]",
        # the suffix's host pages went to the new prefix node
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=16 dev_p={R(100, 115)} dev_c={R(116, 163)} "
        f"host_p={R(48, 63)} host_c={R(0, 47)} pend=-1",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id) for f in res.findings] == [("H1a", 3)]
    assert "host" in res.findings[0].message


def test_h1a_backuped_prefix_lost_its_host(tmp_path):
    lines = _lifecycle(3, (100, 163), (0, 63)) + [
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=16 dev_p={R(100, 115)} dev_c={R(116, 163)} "
        f"host_p=(none) host_c={R(16, 63)} pend=1",
    ]
    assert rules(check_lines(tmp_path, lines)) == {"H1a"}


def test_h1a_correct_split_of_unbackuped_node_is_silent(tmp_path):
    lines = [f"[CPTRACE insert] node_id=3 parent=0 len=64 dev={R(100, 163)} kind=new",
             f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=16 dev_p={R(100, 115)} "
             f"dev_c={R(116, 163)} host_p=(none) host_c=(none) pend=-1"]
    assert check_lines(tmp_path, lines).findings == []


def test_h1b_without_pub_uses_clen(tmp_path):
    lines = _lifecycle(3, (100, 163), (0, 63)) + [
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=16 dev_p={R(100, 115)} dev_c={R(116, 163)} "
        f"host_p={R(0, 15)} host_c={R(16, 63)} pend=1",
        "[CPTRACE ack] dir=d2h op=1 node_id=3 blen=64 clen=48",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("H1b", 3, 1)]
    assert res.findings[0].evidence[-1] == 4


def test_h2a_stale_host_after_split(tmp_path):
    lines = _lifecycle(3, (100, 163), (0, 63)) + [
        "[CPTRACE ack] dir=d2h op=1 node_id=3 blen=64 clen=64 pub=[3]",
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=32 dev_p={R(100, 131)} dev_c={R(132, 163)} "
        f"host_p={R(0, 31)} host_c={R(32, 63)} pend=-1",
        f"[CPTRACE evict] tier=dev node_id=3 kind=backuped dev={R(132, 163)}",
        # the suffix node 3 is reloaded from its old, whole host range
        f"[CPTRACE reload] node_id=3 chain=[3] op=2 host={R(0, 63)} dev={R(900, 963)}",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("H2a", 3, 2)]


def test_h2a_reload_of_split_created_node_with_wrong_half_mentions_h1c(tmp_path):
    lines = _lifecycle(3, (100, 163), (0, 63)) + [
        "[CPTRACE ack] dir=d2h op=1 node_id=3 blen=64 clen=64 pub=[3]",
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=32 dev_p={R(100, 131)} dev_c={R(132, 163)} "
        f"host_p={R(0, 31)} host_c={R(32, 63)} pend=-1",
        f"[CPTRACE evict] tier=dev node_id=4 kind=backuped dev={R(100, 131)}",
        f"[CPTRACE reload] node_id=4 chain=[4] op=2 host={R(32, 63)} dev={R(900, 931)}",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id) for f in res.findings] == [("H2a", 4)]
    assert "H1c" in res.findings[0].message


def test_h2a_reload_after_host_eviction_and_of_unbackuped_node(tmp_path):
    lines = _lifecycle(1) + [
        "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1]",
        f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(512, 543)}",
        f"[CPTRACE evict] tier=host node_id=1 kind=host host={R(64, 95)}",
        f"[CPTRACE reload] node_id=1 chain=[1] op=2 host={R(64, 95)} dev={R(900, 931)}",
        f"[CPTRACE insert] node_id=2 parent=0 len=32 dev={R(0, 31)} kind=new",
        f"[CPTRACE reload] node_id=2 chain=[2] op=3 host={R(96, 127)} dev={R(200, 231)}",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("H2a", 1, 2), ("H2a", 2, 3)]
    assert "gone" in res.findings[0].message and "not backuped" in res.findings[1].message


def test_h2b_reload_before_backup_ack(tmp_path):
    lines = ["[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wb level=2"] + _lifecycle(1) + [
        f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(512, 543)}",
        f"[CPTRACE reload] node_id=1 chain=[1] op=2 host={R(64, 95)} dev={R(900, 931)}",
        "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1]",
    ]
    res = check_lines(tmp_path, lines)
    assert ("H2b", 1, 2) in {(f.rule, f.node_id, f.op) for f in res.findings}
    assert ("H4a", 1, 1) in {(f.rule, f.node_id, f.op) for f in res.findings}  # evicted while in flight


def test_level_set_by_the_analysis_reaches_the_level_2_rules():
    """A rank's level recorded by its source (the exporter's, as ``check`` of OTLP files and ``watch`` set it on the
    checker before the rank's first record) enables the level-2 rules at once, before any level-2 record: the
    reload of a node whose backup is still unacknowledged is H2b, as with a ``config level=2`` record."""
    from cptrace_otel.model.logline import Rng

    def run(configure) -> set:
        chk = RankChecker(0)
        configure(chk)
        dev, host = Rng(32, 512, 543, 512, 543), Rng(32, 64, 95, 64, 95)
        recs = [("insert", {"node_id": 1, "len": 32, "dev": dev, "kind": "new"}),
                ("prepare", {"node_id": 1, "op": 1, "len": 32, "dev": dev, "host": host}),
                ("backup", {"node_id": 1, "op": 1, "dev": dev, "host": host, "io": 1}),
                ("evict", {"tier": "dev", "node_id": 1, "kind": "backuped", "dev": dev}),
                ("reload", {"node_id": 1, "chain": [1], "op": 2, "host": host, "dev": Rng(32, 900, 931, 900, 931)})]
        out = set()
        for i, (tag, f) in enumerate(recs):
            out |= {(x.rule, x.node_id, x.op) for x in chk.feed(Event(tag, 0, i, i, 0, f, 1))}
        assert chk.level == 2
        return out

    def by_source(chk):
        chk.config_level = 2

    def by_record(chk):
        chk.feed(Event("config", 0, -1, 0, 0, {"level": 2, "mode": "none"}, 1))

    assert ("H2b", 1, 2) in run(by_source)
    assert run(by_source) == run(by_record)


def test_h4b_host_slots_reused_during_backup(tmp_path):
    lines = ["[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wt level=2"] + _lifecycle(1) + [
        f"[CPTRACE free] pool=host idx={R(64, 95)} node_id=-1 why=dup",
        f"[CPTRACE insert] node_id=2 parent=0 len=32 dev={R(0, 31)} kind=new",
        f"[CPTRACE prepare] node_id=2 op=2 len=32 dev={R(0, 31)} host={R(80, 111)} policy=wt",
        "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1]",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("H4b", 1, 1)]
    assert res.findings[0].evidence == [2, 4, 7]  # prepare, the free that breached it, the ack


def test_h4_interval_overlap_is_undecidable_not_a_finding(tmp_path):
    """The real allocator scatters slots after frees: a free whose summary's hull covers the copy's source but
    proves nothing (no shared member, too few slots to force an overlap) is counted as undecidable for H4a, not
    reported; the same breach proven (a shared member, or exact sets) is an ERROR."""
    sparse = "(cnt=2,min=500,max=600,first=500,last=600)"
    lines = ["[CPTRACE config] level=2"] + _lifecycle(1) + [
        f"[CPTRACE free] pool=dev idx={sparse} node_id=-1 why=finish",
        "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1]",
    ]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    und = [u for u in res.unchecked if u.kind == "undecidable"]
    assert [(u.rule, u.code, u.count, u.examples) for u in und] == [("H4a", "H4", 1, [1])]
    # the same with exact sets that do not intersect: silent, nothing undecidable
    ex = list(lines)
    ex[-2] = f"[CPTRACE free] pool=dev idx={sparse} idx_x=500:600 node_id=-1 why=finish"
    ex[1] = ex[1] + " devx=512-543"
    ex[3] = ex[3] + " devx=512-543"
    res = check_lines(tmp_path, ex)
    assert res.findings == [] and not [u for u in res.unchecked if u.kind == "undecidable"]
    # ... and exact sets that do: an exact ERROR
    ex[-2] = f"[CPTRACE free] pool=dev idx={sparse} idx_x=500:520 node_id=-1 why=finish"
    res = check_lines(tmp_path, ex)
    assert [(f.rule, f.certainty, f.severity) for f in res.findings] == [("H4a", "exact", "ERROR")]
    # a summary that names a slot of the copy (its first) proves the overlap without exact sets
    lines[-2] = "[CPTRACE free] pool=dev idx=(cnt=2,min=520,max=600,first=520,last=600) node_id=-1 why=finish"
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.certainty) for f in res.findings] == [("H4a", "exact")]


def test_h2c_interval_overlap_is_undecidable_and_reported(tmp_path):
    """A free pool=host whose summary cannot be told apart from a pending load's scattered host slots: no H2c
    finding, one undecidable H2c instance in the check's text and JSON reports."""
    import json

    from cptrace_otel.analyze.result_output import to_json, to_text

    host = "(cnt=8,min=0,max=40,first=0,last=40)"   # scattered: 8 slots over 41
    lines = ["[CPTRACE config] level=2",
             "[CPTRACE insert] node_id=5 parent=0 len=8 dev=(cnt=8,min=100,max=107,first=100,last=107) kind=new",
             f"[CPTRACE prepare] node_id=5 op=1 len=8 dev=(cnt=8,min=100,max=107,first=100,last=107) host={host} "
             "policy=wt",
             f"[CPTRACE backup] op=1 node_id=5 dev=(cnt=8,min=100,max=107,first=100,last=107) host={host} io=1 h=7 "
             "nz=9",
             "[CPTRACE ack] dir=d2h op=1 node_id=5 blen=8 clen=8 pub=[5]",
             "[CPTRACE evict] tier=dev node_id=5 kind=backuped dev=(cnt=8,min=100,max=107,first=100,last=107)",
             f"[CPTRACE reload] node_id=5 chain=[5] op=2 host={host} dev=(cnt=8,min=200,max=207,first=200,last=207)",
             "[CPTRACE free] pool=host idx=(cnt=4,min=10,max=30,first=10,last=30) node_id=-1 why=dup",
             "[CPTRACE ack] dir=h2d op=2 node_id=5 h=7 nz=9"]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    und = [u for u in res.unchecked if u.kind == "undecidable"]
    assert [(u.rule, u.rank, u.count) for u in und] == [("H2c", 0, 1)]
    text = to_text(res)
    assert "UNDECIDED H2c" in text and "1x" in text
    obj = json.loads(to_json(res))
    assert {"rule": "H2c", "kind": "undecidable", "count": 1}.items() <= next(
        u for u in obj["unchecked"] if u["rule"] == "H2c").items()
    # the same free naming a slot of the load (10 is not known to be the load's, but 40 is): proven, an ERROR
    lines[-2] = "[CPTRACE free] pool=host idx=(cnt=4,min=10,max=40,first=10,last=40) node_id=-1 why=dup"
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.certainty, f.severity) for f in res.findings] == [("H2c", "exact", "ERROR")]


def test_h4_open_when_ack_never_arrives(tmp_path):
    lines = ["[CPTRACE config] level=2"] + _lifecycle(1) + [
        f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(512, 543)}",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.severity) for f in res.findings] == [("H4-open", "WARN")]
    # no breach, no ack: nothing to say
    assert check_lines(tmp_path, ["[CPTRACE config] level=2"] + _lifecycle(1)).findings == []


def test_zero_at_reload_sync_and_empty_range_is_not_zero(tmp_path):
    lines = _lifecycle(1) + [
        f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(512, 543)}",
        f"[CPTRACE reload] node_id=1 chain=[1] op=2 host={R(64, 95)} dev={R(900, 931)} sync=1 h=111 nz=0",
        "[CPTRACE backup] op=3 node_id=9 dev=(0) host=(0) io=1 h=0 nz=0",
        "[CPTRACE backup] op=4 node_id=9 dev=(cnt=4,min=0,max=3,first=0,last=3) host=(0) io=1 h=-1 nz=-1",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id) for f in res.findings] == [("ZERO@reload", 1)]


def test_hash_across_split_uses_per_page_hashes(tmp_path):
    base = _lifecycle(3, (100, 163), (0, 63))
    base[2] += " hp=[11,12,13,14]"
    lines = base + [
        "[CPTRACE ack] dir=d2h op=1 node_id=3 blen=64 clen=64 pub=[3]",
        f"[CPTRACE split] node_id=3 new_id=4 parent=0 pre_len=64 split_len=32 dev_p={R(100, 131)} dev_c={R(132, 163)} "
        f"host_p={R(0, 31)} host_c={R(32, 63)} pend=-1",
        f"[CPTRACE evict] tier=dev node_id=3 kind=backuped dev={R(132, 163)}",
        f"[CPTRACE reload] node_id=3 chain=[3] op=2 host={R(32, 63)} dev={R(900, 931)}",
        "[CPTRACE ack] dir=h2d op=2 node_id=3 h=5 hp=[13,99] nz=10",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("HASH", 3, 2)]
    assert "page 1" in res.findings[0].message
    # without hp on the reload side: not a pass, a counted skip
    lines[-1] = "[CPTRACE ack] dir=h2d op=2 node_id=3 h=5 nz=10"
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    skip = [u for u in res.unchecked if u.rule == "HASH-skipped(split)"]
    assert skip and skip[0].kind == "skip" and skip[0].count == 1 and skip[0].examples == [3]


def test_level_1_reports_level_2_rules_unchecked(tmp_path):
    # the H4 Bad example without its level-2 records (free, ack): nothing to find, and H4 is not passed silently
    lines = ["[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wt level=1"] + _lifecycle(6) + [
        f"[CPTRACE evict] tier=dev node_id=6 kind=backuped dev={R(512, 543)}",
    ]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    lv = {u.rule: u for u in res.unchecked if u.kind == "level"}
    assert set(lv) == {"H1b", "H2b", "H2c", "H3", "H4"}
    assert all(u.need_level == 2 and u.rank == 0 for u in lv.values())


@pytest.mark.parametrize("name", ["h1b_bad.log", "h2c_bad.log", "h3_bad.log", "h4_bad.log"])
def test_forced_level_1_turns_level_2_findings_into_unchecked(name):
    res = check_files([os.path.join(DOMAIN, name)], level=1)
    assert not any(f.code in ("H1", "H2", "H3", "H4") and f.rule not in ("H1a", "H2a") for f in res.findings)
    assert {"H1b", "H2b", "H2c", "H3", "H4"} <= {u.rule for u in res.unchecked if u.kind == "level"}


def test_level_inferred_from_records_without_config(tmp_path):
    res = check_lines(tmp_path, _lifecycle(1))
    assert res.stats["levels"] == {0: 1}
    res = check_lines(tmp_path, _lifecycle(1) + ["[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1]"])
    assert res.stats["levels"] == {0: 2} and not [u for u in res.unchecked if u.kind == "level"]


def test_reset_starts_a_new_epoch_with_fresh_ids(tmp_path):
    lines = ["[CPTRACE config] level=2"] + _lifecycle(1) + ["[CPTRACE reset] reason=flush"] + [
        # node 1 again, in a new epoch: its pending copy is gone, so this is a brand new lifecycle
        *_lifecycle(1, op=5),
        "[CPTRACE ack] dir=d2h op=5 node_id=1 blen=32 clen=32 pub=[1]",
    ]
    res = check_lines(tmp_path, lines)
    assert res.findings == []


def test_node_ids_going_backwards_start_a_new_epoch(tmp_path):
    lines = ["[CPTRACE config] level=2"] + _lifecycle(5) + _lifecycle(2, op=2) + [
        f"[CPTRACE free] pool=dev idx={R(512, 543)} node_id=2 why=evict",
        "[CPTRACE ack] dir=d2h op=2 node_id=2 blen=32 clen=32 pub=[2]",
    ]
    res = check_lines(tmp_path, lines)
    assert [(f.rule, f.epoch, f.node_id) for f in res.findings] == [("H4a", 1, 2)]


def test_state_is_bounded_by_live_nodes():
    """3,000 complete lifecycles leave no per-node or per-op state behind."""
    chk = RankChecker(0, level=2)
    seq = 0

    def ev(tag, **f):
        nonlocal seq
        seq += 1
        return Event(tag, 0, seq, seq, 0, f, 1)

    from cptrace_otel.model.logline import Rng
    for i in range(1, 3001):
        d = Rng(32, (i % 50) * 32, (i % 50) * 32 + 31, (i % 50) * 32, (i % 50) * 32 + 31)
        h = Rng(32, 10_000 + (i % 40) * 32, 10_000 + (i % 40) * 32 + 31, 10_000 + (i % 40) * 32,
                10_000 + (i % 40) * 32 + 31)
        for e in (ev("insert", node_id=i, parent=0, len=32, dev=d, kind="new"),
                  ev("compose", key=f"L0:n{i}", node_id=i, layer=0, src=d, gen=1, hit=0),
                  ev("prepare", node_id=i, op=i, len=32, dev=d, host=h, policy="wt"),
                  ev("backup", op=i, node_id=i, dev=d, host=h, io=1, h=i, nz=1),
                  ev("ack", dir="d2h", op=i, node_id=i, blen=32, clen=32, pub=[i]),
                  ev("evict", tier="dev", node_id=i, kind="backuped", dev=d),
                  ev("free", pool="dev", idx=d, node_id=i, why="evict"),
                  ev("reload", node_id=i, chain=[i], op=100000 + i, host=h, dev=d),
                  ev("ack", dir="h2d", op=100000 + i, node_id=i, h=i, nz=1),
                  ev("evict", tier="dev", node_id=i, kind="backuped", dev=d),
                  ev("evict", tier="host", node_id=i, kind="host", host=h),
                  ev("free", pool="host", idx=h, node_id=i, why="evict")):
            assert chk.feed(e) == [], e
    st = chk.st
    assert st.nodes == {} and st.writes == {} and st.loads == {} and st.fills == {}
    assert st.writes_by_node == {} and st.loads_by_node == {} and st.fills_by_node == {}
    assert len(st.dead) <= st.dead.cap and len(st.closed_loads) <= st.MAX_CLOSED
    assert len(st.closed_by_node) <= st.MAX_CLOSED
    assert chk.finish() == [] and chk.nodes_total == 3000


def test_finding_severity_follows_certainty():
    f = Finding("H4", "H4a", 0, 0, 1, 1, "interval", [1], "m")
    assert f.severity == "WARN"
    assert Finding("H4", "H4a", 0, 0, 1, 1, "exact", [1], "m").severity == "ERROR"


def test_checker_never_raises_on_odd_records():
    """The exporter disables online checks after an exception: odd values must be tolerated, not crash."""
    import random

    from cptrace_otel.checks.crossrank import CrossRank
    from cptrace_otel.model.logline import Rng
    rnd = random.Random(3)
    tags = ["config", "reset", "rid_map", "insert", "split", "prepare", "backup", "ack", "evict", "free", "reload",
            "compose", "store", "fwd_hash", "weird"]
    keys = ["node_id", "new_id", "op", "len", "pre_len", "split_len", "dev", "host", "dev_p", "dev_c", "host_p",
            "host_c", "idx", "src", "chain", "pub", "blen", "clen", "h", "nz", "hp", "hs", "dir", "tier", "kind",
            "pool", "hit", "key", "sync", "level", "mode", "io", "devx", "hostx", "idx_x", "cp_size", "round",
            "io_rank"]
    vals = [lambda: rnd.randrange(-3, 6), lambda: "(none)", lambda: "(0)", lambda: "(err:x)", lambda: "d2h",
            lambda: "h2d", lambda: "dev", lambda: "host", lambda: [rnd.randrange(0, 5)], lambda: [], lambda: "1-3:5",
            lambda: Rng(rnd.randrange(0, 4), 0, rnd.randrange(0, 8), 0, 3), lambda: Rng(2, "a", 1, 1, 1),
            lambda: [1, [2]], lambda: 1.5, lambda: "shared", lambda: [rnd.randrange(0, 3), "x"], lambda: 10 ** 30]
    for trial in range(9):
        chk, cross = RankChecker(0, level=[None, 1, 2][trial % 3]), CrossRank()
        for seq in range(2000):
            f = {k: rnd.choice(vals)() for k in rnd.sample(keys, rnd.randrange(0, 8))}
            ev = Event(rnd.choice(tags), rnd.randrange(0, 2), seq, seq, 0, f, rnd.randrange(1, 4))
            chk.feed(ev)
            cross.feed(ev)
        chk.finish()
        chk.unchecked()
        cross.finish()
        cross.unchecked()


def test_findings_on_a_merged_write_name_the_prepare_op(tmp_path):
    """Two writes (ops 1 and 2) start as one merged op 3 (SGLang ``merge_ops``): one backup and one ack per node,
    all with op=3. ZERO@backup, H1b and H4 at the ack name each write by its prepare's op, as H4-open does, not by
    the merged id (before the fix they named op 3, so the same write had two names)."""
    lines = [
        f"[CPTRACE insert] node_id=1 parent=0 len=16 dev={R(0, 15)} kind=new",
        f"[CPTRACE insert] node_id=2 parent=0 len=8 dev={R(16, 23)} kind=new",
        f"[CPTRACE prepare] node_id=1 op=1 len=16 dev={R(0, 15)} host={R(0, 15)} policy=wt",
        f"[CPTRACE prepare] node_id=2 op=2 len=8 dev={R(16, 23)} host={R(16, 23)} policy=wt",
        f"[CPTRACE backup] op=3 node_id=1 dev={R(0, 15)} host={R(0, 15)} io=1 h=5 nz=100",
        f"[CPTRACE backup] op=3 node_id=2 dev={R(16, 23)} host={R(16, 23)} io=1 h=0 nz=0",
        # node 1 split while the merged copy is in flight; its pages are then freed before the ack
        f"[CPTRACE split] node_id=1 new_id=3 parent=0 pre_len=16 split_len=8 dev_p={R(0, 7)} dev_c={R(8, 15)} "
        f"host_p={R(0, 7)} host_c={R(8, 15)} pend=1",
        f"[CPTRACE free] pool=dev idx={R(8, 15)} node_id=1 why=evict",
        "[CPTRACE ack] dir=d2h op=3 node_id=1 blen=16 clen=8 pub=[1]",
        "[CPTRACE ack] dir=d2h op=3 node_id=2 blen=8 clen=8 pub=[2]",
    ]
    res = check_lines(tmp_path, lines, level=2)
    got = {(f.rule, f.node_id, f.op) for f in res.findings}
    assert got == {("ZERO@backup", 2, 2), ("H1b", 1, 1), ("H4a", 1, 1)}, [f.message for f in res.findings]
    # without the ack, the breached write is H4-open at the end of the stream: the same op
    res = check_lines(tmp_path, lines[:-2], level=2)
    assert {(f.rule, f.node_id, f.op) for f in res.findings} == {("ZERO@backup", 2, 2), ("H4-open", 1, 1)}
