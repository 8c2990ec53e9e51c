"""SWA-hash (rules_swa) on hand-written streams, and a property over random slot layouts; the real-SGLang runs are
tests/sglang_real/test_swa_real.py."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cptrace_otel.checks.rules_swa import page_keys
from tests.helpers.checks_util import check_lines

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=1 policy=wt level=2 rank=0 ts=1"


def _runs(xs: list[int]) -> str:
    return ":".join(str(x) for x in xs)


def _stream(host: list[int], wrote: list[int], loaded: list[int], load_host: list[int] | None = None) -> list[str]:
    """A backup writing SWA host slots ``host`` with per-token fingerprints ``wrote``, then a load-back reading
    ``load_host`` (default: the same slots) that brought back ``loaded``."""
    lh = host if load_host is None else load_host
    lines = [
        f"[CPTRACE swa] dir=d2h op=3 node_id=7 nodes=[7] hostx={_runs(host)} devx={_runs(host)} page=1 h=1 nz=1 "
        f"hp=[{','.join(map(str, wrote))}]",
        f"[CPTRACE swa] dir=h2d op=9 node_id=8 nodes=[7] hostx={_runs(lh)} devx={_runs(lh)} page=1 h=1 nz=1 "
        f"hp=[{','.join(map(str, loaded))}]",
    ]
    return [CFG] + [f"{ln} rank=0 ts={i + 2}" for i, ln in enumerate(lines)]


def test_a_round_trip_that_brings_back_what_was_written_is_clean(tmp_path):
    res = check_lines(tmp_path, _stream([4, 5, 9], [11, 12, 13], [11, 12, 13]))
    assert res.findings == [] and res.unchecked == []


def test_a_window_that_loads_only_part_of_the_backup_is_clean(tmp_path):
    """The window dropped the first token: the load reads slots 5 and 9 only (nothing is said of slot 4)."""
    res = check_lines(tmp_path, _stream([4, 5, 9], [11, 12, 13], [12, 13], load_host=[5, 9]))
    assert res.findings == [] and res.unchecked == []


def test_a_changed_page_is_found(tmp_path):
    res = check_lines(tmp_path, _stream([4, 5, 9], [11, 12, 13], [11, 99, 13]))
    assert [(f.code, f.rule, f.node_id, f.op) for f in res.findings] == [("SWA", "SWA-hash", 8, 9)]
    assert "host slot 5" in res.findings[0].message


def test_a_page_never_backed_up_is_counted_not_passed(tmp_path):
    res = check_lines(tmp_path, _stream([4, 5], [11, 12], [11, 12, 50], load_host=[4, 5, 6]))
    assert res.findings == [] and [u.rule for u in res.unchecked] == ["SWA-skipped(no backup)"]


def test_a_stream_without_swa_records_has_no_swa_entry(tmp_path):
    res = check_lines(tmp_path, [CFG])
    assert not [u for u in res.unchecked if u.code == "SWA"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=40, unique=True), st.integers(1, 4), st.data())
def test_page_keys_key_each_page_by_its_first_host_slot(slots, per, data):
    n_pages = -(-len(slots) // per)
    hp = data.draw(st.lists(st.integers(1, 2**62), min_size=n_pages, max_size=n_pages))
    got = page_keys({"hostx": _runs(slots), "hp": hp, "page": per})
    assert got == [(slots[i * per], hp[i]) for i in range(n_pages)]
    assert page_keys({"hostx": _runs(slots), "hp": hp + [1], "page": per}) is None   # more pages than slots
    assert page_keys({"hostx": _runs(slots), "hp": hp}) is None   # no page size: nothing to line them up with


def _split_write(swa_nodes: str | None) -> list[str]:
    """A write of node 127 split (128 its prefix) before its ack, whose ``pub`` also names node 69; with
    ``swa_nodes`` the write's SWA transfer named those nodes (a hybrid SWA backup covers its ancestors' windows)."""
    lines = [
        *([f"[CPTRACE swa] dir=d2h op=873 node_id=127 nodes={swa_nodes} hostx=100-101 devx=1-2 page=1 h=1 nz=1 "
           "hp=[5,6]"] if swa_nodes else []),
        "[CPTRACE prepare] node_id=127 op=873 len=6 dev=(cnt=6,min=10,max=15,first=10,last=15) "
        "host=(cnt=6,min=20,max=25,first=20,last=25) policy=wt parent=69 pbk=1 hostx=20-25 devx=10-15",
        "[CPTRACE split] node_id=127 new_id=128 parent=69 pre_len=6 split_len=2 inf=1",
        "[CPTRACE ack] dir=d2h op=873 node_id=127 blen=6 clen=4 pub=[69,128,127]",
    ]
    return [CFG] + [f"{ln} rank=0 ts={i + 2}" for i, ln in enumerate(lines)]


def test_a_split_write_whose_swa_transfer_covered_other_nodes_publishes_them_without_h1b(tmp_path):
    """SGLang's ack publishes the nodes an SWA backup covered beside the write's lineage fragments: H1b still
    checks that the fragments cover the write (6 of 6 here), and takes node 69 for one of those nodes."""
    res = check_lines(tmp_path, _split_write("[69,127]"))
    assert res.findings == [], res.findings
    stray = check_lines(tmp_path, _split_write(None))   # no SWA transfer named it: a stray of the lineage
    assert [f.rule for f in stray.findings] == ["H1b"], stray.findings
