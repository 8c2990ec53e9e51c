"""The SIDE rules (rules_side) on hand-written streams; the real-SGLang runs are tests/sglang_real/test_dsa_real.py."""

from __future__ import annotations

import pytest

from tests.helpers.checks_util import R, check_lines, rules

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=32 policy=wt level=2 sidecars=indexer rank=0 ts=1"


def _stream(cfg: str, backup_extra: str, reload_extra: str, ack_extra: str) -> list[str]:
    return [
        cfg,
        f"[CPTRACE insert] node_id=6 parent=0 len=32 dev={R(512, 543)} kind=new rank=0 ts=2",
        f"[CPTRACE prepare] node_id=6 op=20 len=32 dev={R(512, 543)} host={R(64, 95)} policy=wt rank=0 ts=3",
        f"[CPTRACE backup] op=20 node_id=6 dev={R(512, 543)} host={R(64, 95)} io=1 h=111 nz=4096 hp=[111] "
        f"{backup_extra} rank=0 ts=4",
        "[CPTRACE ack] dir=d2h op=20 node_id=6 blen=32 clen=32 pub=[6] rank=0 ts=5",
        f"[CPTRACE evict] tier=dev node_id=6 kind=backuped dev={R(512, 543)} rank=0 ts=6",
        f"[CPTRACE free] pool=dev idx={R(512, 543)} node_id=6 why=evict rank=0 ts=7",
        f"[CPTRACE reload] node_id=6 chain=[6] op=21 host={R(64, 95)} dev={R(900, 931)} {reload_extra} rank=0 ts=8",
        f"[CPTRACE ack] dir=h2d op=21 node_id=6 h=111 nz=4096 hp=[111] {ack_extra} rank=0 ts=9",
    ]


GOOD_B = "sh_indexer=55 snz_indexer=9 shp_indexer=[55] sp=indexer"
GOOD_A = "sh_indexer=55 snz_indexer=9 shp_indexer=[55]"


def test_a_kv_only_stream_has_no_side_entry_at_all(tmp_path):
    cfg = CFG.replace(" sidecars=indexer", "")
    for level in (1, 2):
        res = check_lines(tmp_path, _stream(cfg, "", "", ""), level=level)
        assert res.findings == [] and not [u for u in res.unchecked if u.code == "SIDE"]


def test_a_sidecar_moved_and_equal_after_the_round_trip_is_clean(tmp_path):
    res = check_lines(tmp_path, _stream(CFG, GOOD_B, "sp=indexer", GOOD_A))
    assert res.findings == [] and res.unchecked == []


@pytest.mark.parametrize("backup_sp,reload_sp,ack,want", [
    ("sp=-", "sp=indexer", "sh_indexer=77 snz_indexer=9 shp_indexer=[77]", {"SIDE-missing", "SIDE-hash"}),
    ("sp=indexer", "sp=-", "sh_indexer=77 snz_indexer=9 shp_indexer=[77]", {"SIDE-missing", "SIDE-hash"}),
    ("sp=indexer", "sp=indexer", "sh_indexer=77 snz_indexer=9 shp_indexer=[77]", {"SIDE-hash"}),
    ("sp=kv", "sp=indexer", GOOD_A, {"SIDE-missing"}),
])
def test_a_sidecar_left_behind_or_changed_is_found(tmp_path, backup_sp, reload_sp, ack, want):
    b = GOOD_B.replace("sp=indexer", backup_sp)
    res = check_lines(tmp_path, _stream(CFG, b, reload_sp, ack))
    assert rules(res) == want
    assert all(f.code == "SIDE" and f.severity == "ERROR" and f.node_id == 6 for f in res.findings)


def test_undecidable_instances_are_counted_not_passed(tmp_path):
    res = check_lines(tmp_path, _stream(CFG, "sh_indexer=-2 snz_indexer=-2", "", "sh_indexer=-2 snz_indexer=-2"))
    assert res.findings == []
    assert {u.rule for u in res.unchecked} == {"SIDE-skipped(no sp)", "SIDE-skipped(no hash)"}


def _l3(prefetched: str) -> list[str]:
    return [
        CFG,
        f"[CPTRACE l3_backup] node_id=6 op=3 keys=[ka,kb] hp=[1,2] shp_indexer=[11,12] host={R(64, 95)} io=1 rank=0 "
        "ts=2",
        "[CPTRACE l3_ack] dir=backup op=3 node_id=6 done=2 rank=0 ts=3",
        f"[CPTRACE l3_prefetch] node_id=0 op=4 keys=[ka,kb] host={R(128, 159)} rank=0 ts=4",
        f"[CPTRACE l3_ack] dir=prefetch op=4 node_id=0 done=2 keys=[ka,kb] hp=[1,2] {prefetched} rank=0 ts=5",
    ]


def test_sidecar_pages_must_come_back_from_l3_as_written(tmp_path):
    assert check_lines(tmp_path, _l3("shp_indexer=[11,12]")).findings == []
    res = check_lines(tmp_path, _l3("shp_indexer=[11,99]"))
    assert rules(res) == {"SIDE-l3"} and "kb.indexer" in res.findings[0].message
    res = check_lines(tmp_path, _l3(""))
    assert res.findings == [] and "SIDE-skipped(no l3 fingerprint)" in {u.rule for u in res.unchecked}
