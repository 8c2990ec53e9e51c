"""REST-hash (rules_rest) on hand-written streams; the real-SGLang runs are tests/sglang_real/test_rest_real.py."""

from __future__ import annotations

import pytest

from tests.helpers.checks_util import R, check_lines, rules

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wt level=2 rank=0 ts=1"


def _stream(*tail: str, acked: bool = True) -> list[str]:
    return [
        CFG,
        f"[CPTRACE insert] node_id=6 parent=0 len=32 dev={R(512, 543)} kind=new rank=0 ts=2",
        f"[CPTRACE prepare] node_id=6 op=20 len=32 dev={R(512, 543)} host={R(64, 95)} policy=wt rank=0 ts=3",
        f"[CPTRACE backup] op=20 node_id=6 dev={R(512, 543)} host={R(64, 95)} io=1 h=111 nz=4096 hp=[11,12] "
        "rank=0 ts=4",
        *(["[CPTRACE ack] dir=d2h op=20 node_id=6 blen=32 clen=32 pub=[6] rank=0 ts=5"] if acked else []),
        *tail,
    ]


def _audit(h: int, hp: str, host: str = R(64, 95), nid: int = 6) -> str:
    return f"[CPTRACE audit] node_id={nid} host={host} h={h} nz=4096 hp={hp} rank=0 ts=9"


def test_an_intact_copy_at_rest_is_clean_and_a_stream_without_audits_has_no_rest_entry(tmp_path):
    res = check_lines(tmp_path, _stream(_audit(111, "[11,12]")))
    assert res.findings == [] and res.unchecked == []
    for level in (1, 2):
        res = check_lines(tmp_path, _stream(), level=level)
        assert not [u for u in res.unchecked if u.code == "REST"]


def test_a_changed_copy_at_rest_is_rest_hash_on_its_node(tmp_path):
    res = check_lines(tmp_path, _stream(_audit(999, "[11,99]"), _audit(999, "[11,99]")))
    assert rules(res) == {"REST-hash"} and len(res.findings) == 1   # one finding per corrupted copy, not per audit
    f = res.findings[0]
    assert (f.code, f.node_id, f.op, f.severity) == ("REST", 6, 20, "ERROR")


def test_after_a_split_each_fragment_compares_its_pages(tmp_path):
    split = (f"[CPTRACE split] node_id=6 new_id=7 parent=0 pre_len=32 split_len=16 dev_p={R(512, 527)} "
             f"dev_c={R(528, 543)} host_p={R(64, 79)} host_c={R(80, 95)} pend=-1 lock=0 rank=0 ts=6")
    ok = check_lines(tmp_path, _stream(split, _audit(5, "[11]", R(64, 79), 7), _audit(6, "[12]", R(80, 95))))
    assert ok.findings == [] and ok.unchecked == []
    bad = check_lines(tmp_path, _stream(split, _audit(5, "[11]", R(64, 79), 7), _audit(6, "[13]", R(80, 95))))
    assert [(f.rule, f.node_id) for f in bad.findings] == [("REST-hash", 6)]


@pytest.mark.parametrize("lines,acked,skip", [
    ((_audit(999, "[1,2]", nid=8),), True, "REST-skipped(no backup)"),
    ((_audit(999, "[1,2]"),), False, "REST-skipped(not at rest)"),
    ((f"[CPTRACE free] pool=host idx={R(64, 95)} node_id=6 why=dup rank=0 ts=8", _audit(999, "[1,2]")), True,
     "REST-skipped(not at rest)"),
    ((_audit(999, "[1,2]", R(200, 231)),), True, "REST-skipped(moved)"),
    ((_audit(-2, "x"),), True, "REST-skipped(no hash)"),
])
def test_a_copy_not_at_rest_or_not_comparable_is_counted_never_judged(tmp_path, lines, acked, skip):
    res = check_lines(tmp_path, _stream(*lines, acked=acked))
    assert res.findings == []
    assert [u.rule for u in res.unchecked if u.code == "REST"] == [skip]


# REST-l3: an audit tier=l3 of the stored objects of an acked l3_backup
_L3B = ("[CPTRACE l3_backup] node_id=6 op=3 keys=[ka,kb] hp=[21,22] host=" + R(64, 95) + " io=1 rank=0 ts=6",
        "[CPTRACE l3_ack] dir=backup op=3 node_id=6 done=2 rank=0 ts=7")


def _l3_audit(hp: str, keys: str = "[ka,kb]", nid: int = 6) -> str:
    return f"[CPTRACE audit] tier=l3 node_id={nid} op=3 keys={keys} hp={hp} rank=0 ts=9"


def test_an_intact_l3_object_at_rest_is_clean_and_a_changed_one_is_rest_l3_on_its_node(tmp_path):
    ok = check_lines(tmp_path, _stream(*_L3B, _l3_audit("[21,22]")))
    assert ok.findings == [] and not [u for u in ok.unchecked if u.code == "REST"]
    bad = check_lines(tmp_path, _stream(*_L3B, _l3_audit("[21,99]"), _l3_audit("[21,99]")))
    assert rules(bad) == {"REST-l3"} and len(bad.findings) == 1   # one finding per changed object, not per audit
    f = bad.findings[0]
    assert (f.code, f.node_id, f.op, f.severity) == ("REST", 6, 3, "ERROR") and "kb" in f.message
    # a second write of the same key with other bytes (the backend may keep either): both are the key's
    rewrite = ("[CPTRACE l3_backup] node_id=9 op=4 keys=[kb] hp=[99] host=" + R(96, 111) + " io=1 rank=0 ts=8",)
    assert check_lines(tmp_path, _stream(*_L3B, *rewrite, _l3_audit("[21,99]"))).findings == []


@pytest.mark.parametrize("audit,skip", [
    (_l3_audit("[21,-1]"), "REST-skipped(l3 gone)"),
    (_l3_audit("[-2,22]"), "REST-skipped(l3 unreadable)"),
    (_l3_audit("[21,22]", "[ka,kz]"), "REST-skipped(l3 never written)"),
    (_l3_audit("x"), "REST-skipped(no hash)"),
])
def test_an_l3_object_not_comparable_is_counted_never_judged(tmp_path, audit, skip):
    res = check_lines(tmp_path, _stream(*_L3B, audit))
    assert res.findings == []
    assert [u.rule for u in res.unchecked if u.code == "REST"] == [skip]


def test_a_backup_that_wrote_fewer_pages_leaves_the_rest_never_written(tmp_path):
    short = (_L3B[0], "[CPTRACE l3_ack] dir=backup op=3 node_id=6 done=1 rank=0 ts=7")
    res = check_lines(tmp_path, _stream(*short, _l3_audit("[21,99]")))
    assert res.findings == []
    assert [u.rule for u in res.unchecked if u.code == "REST"] == ["REST-skipped(l3 never written)"]
