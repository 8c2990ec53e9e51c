"""MAMBA-hash (rules_mamba) on hand-written streams; the real-SGLang runs are tests/sglang_real/test_mamba_real.py."""

from __future__ import annotations

from tests.helpers.checks_util import check_lines

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=1 policy=wt level=2 rank=0 ts=1"


def _mamba(dir: str, op: int, node: int, host: int, dev: int, h: int, extra: str = "") -> str:
    return (f"[CPTRACE mamba] dir={dir} op={op} node_id={node} hostx={host} devx={dev} page=1 {extra}h={h} nz=1 "
            f"hp=[{h}]")


def _stream(*lines: str) -> list[str]:
    return [CFG] + [f"{ln} rank=0 ts={i + 2}" for i, ln in enumerate(lines)]


def test_a_round_trip_that_brings_back_the_backed_up_state_is_clean(tmp_path):
    """The load restores into another device slot than the backup read from: compared by content."""
    res = check_lines(tmp_path, _stream(_mamba("d2h", 3, 7, 40, 5, 111), _mamba("h2d", 9, 7, 40, 12, 111, "cow=1 ")))
    assert res.findings == [] and res.unchecked == []


def test_a_changed_state_is_found(tmp_path):
    res = check_lines(tmp_path, _stream(_mamba("d2h", 3, 7, 40, 5, 111), _mamba("h2d", 9, 7, 40, 12, 222, "cow=1 ")))
    assert [(f.code, f.rule, f.node_id, f.op) for f in res.findings] == [("MAMBA", "MAMBA-hash", 7, 9)]
    assert "host slot 40" in res.findings[0].message and "node 7" in res.findings[0].message


def test_the_latest_backup_into_a_host_slot_is_the_one_compared(tmp_path):
    """Host slot 40 freed from node 7 and reused by node 8's backup: a load of it must bring back node 8's state."""
    lines = _stream(_mamba("d2h", 3, 7, 40, 5, 111), _mamba("d2h", 4, 8, 40, 6, 333), _mamba("h2d", 9, 8, 40, 2, 333))
    assert check_lines(tmp_path, lines).findings == []
    res = check_lines(tmp_path, _stream(_mamba("d2h", 3, 7, 40, 5, 111), _mamba("d2h", 4, 8, 40, 6, 333),
                                        _mamba("h2d", 9, 8, 40, 2, 111)))
    assert [f.rule for f in res.findings] == ["MAMBA-hash"] and "node 8" in res.findings[0].message


def test_a_split_parent_without_state_gives_no_finding(tmp_path):
    """A split of node 7 (new parent 20, which has no Mamba state on either tier) then a load of the parent's KV:
    the parent has no mamba record at all; node 7's own round trip is still compared (and clean)."""
    res = check_lines(tmp_path, _stream(
        "[CPTRACE insert] node_id=7 parent=0 len=8 dev=(cnt=8,min=0,max=7,first=0,last=7)",
        _mamba("d2h", 3, 7, 40, 5, 111),
        "[CPTRACE split] node_id=7 new_id=20 parent=0 pre_len=8 split_len=4 dev_p=(cnt=4,min=0,max=3,first=0,last=3) "
        "dev_c=(cnt=4,min=4,max=7,first=4,last=7) host_p=(none) host_c=(none)",
        _mamba("h2d", 9, 7, 40, 12, 111, "cow=0 ")))
    assert [f for f in res.findings if f.code == "MAMBA"] == []
    assert [u for u in res.unchecked if u.code == "MAMBA"] == []


def test_a_slot_never_backed_up_is_counted_not_passed(tmp_path):
    res = check_lines(tmp_path, _stream(_mamba("d2h", 3, 7, 40, 5, 111), _mamba("h2d", 9, 8, 41, 12, 111)))
    assert res.findings == [] and [u.rule for u in res.unchecked] == ["MAMBA-skipped(no backup)"]


def test_a_record_whose_slots_and_hashes_do_not_line_up_is_counted(tmp_path):
    bad = "[CPTRACE mamba] dir=h2d op=9 node_id=7 hostx=40 devx=12 page=1 h=1 nz=1 hp=[1,2]"
    res = check_lines(tmp_path, _stream(_mamba("d2h", 3, 7, 40, 5, 111), bad))
    assert res.findings == [] and [u.rule for u in res.unchecked] == ["MAMBA-skipped(no hash)"]


def test_a_stream_without_mamba_records_has_no_mamba_entry(tmp_path):
    res = check_lines(tmp_path, [CFG])
    assert not [u for u in res.unchecked if u.code == "MAMBA"]
