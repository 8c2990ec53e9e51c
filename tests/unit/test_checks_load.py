"""LOAD-early (rules_load) on hand-written streams; the real-SGLang runs are
tests/sglang_real/test_layerwise_real.py."""

from __future__ import annotations

import pytest

from tests.helpers.checks_util import R, check_lines

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=32 policy=wt level=2 rank=0 ts=1"


def _stream(reads: list[str], after_ack: list[str] = (), layers: tuple[int, ...] = (0, 1)) -> list[str]:
    """A node backed up, evicted and loaded back by a two-layer step (op 21); ``reads`` between the step's start
    and its ack (after its ``ld_layer`` records), ``after_ack`` after it."""
    ts = iter(range(2, 100))
    lines = [
        CFG,
        f"[CPTRACE insert] node_id=6 parent=0 len=32 dev={R(512, 543)} kind=new",
        f"[CPTRACE prepare] node_id=6 op=20 len=32 dev={R(512, 543)} host={R(64, 95)} policy=wt",
        f"[CPTRACE backup] op=20 node_id=6 dev={R(512, 543)} host={R(64, 95)} io=1 h=111 nz=4096 hp=[111]",
        "[CPTRACE ack] dir=d2h op=20 node_id=6 blen=32 clen=32 pub=[6]",
        f"[CPTRACE evict] tier=dev node_id=6 kind=backuped dev={R(512, 543)}",
        f"[CPTRACE free] pool=dev idx={R(512, 543)} node_id=6 why=evict",
        f"[CPTRACE reload] node_id=6 chain=[6] op=21 host={R(64, 95)} dev={R(900, 931)}",
        "[CPTRACE ld_start] op=21 ops=[21] nodes=[6] slot=0 layers=2",
        *[f"[CPTRACE ld_layer] op=21 layer={x}" for x in layers],
        *reads,
        "[CPTRACE ack] dir=h2d op=21 node_id=6 h=111 nz=4096 hp=[111]",
        *after_ack,
    ]
    return [ln if ln.startswith("[CPTRACE config]") else f"{ln} rank=0 ts={next(ts)}" for ln in lines]


def _read(layer: int, reader: str, waited: int, op: int = 21) -> str:
    return f"[CPTRACE ld_read] op={op} node_id=6 layer={layer} reader={reader} waited={waited}"


GOOD = [_read(0, "indexer", 0), _read(0, "kv", 0), _read(1, "indexer", 1), _read(1, "kv", 1)]


def test_reads_after_each_layer_completed_and_was_waited_for_are_clean(tmp_path):
    res = check_lines(tmp_path, _stream(GOOD))
    assert res.findings == [] and res.unchecked == []


def test_a_stream_without_layerwise_records_has_no_load_entry(tmp_path):
    for level in (1, 2):
        res = check_lines(tmp_path, [ln for ln in _stream([]) if "ld_" not in ln], level=level)
        assert res.findings == [] and not [u for u in res.unchecked if u.code == "LOAD"]


@pytest.mark.parametrize("reads,layers,why", [
    ([_read(0, "indexer", -1), *GOOD], (0, 1), "had not waited for it"),     # the read skipped the wait
    ([_read(1, "indexer", 0), _read(1, "kv", 1)], (0, 1), "had not waited for it"),
    ([_read(1, "indexer", 1)], (0,), "had not completed that layer"),        # no completion before the read
])
def test_a_read_before_its_layer_loaded_is_found_once_per_step_and_reader(tmp_path, reads, layers, why):
    res = check_lines(tmp_path, _stream(reads, layers=layers))
    assert [(f.rule, f.code, f.severity, f.op, f.node_id) for f in res.findings] == [
        ("LOAD-early", "LOAD", "ERROR", 21, 6)]
    assert why in res.findings[0].message and res.findings[0].message.startswith("indexer read")


def test_reads_after_the_load_was_acked_are_not_judged(tmp_path):
    res = check_lines(tmp_path, _stream(GOOD, after_ack=[_read(1, "kv", -1)]))
    assert res.findings == []


def test_a_read_of_a_step_the_trace_never_started_is_counted(tmp_path):
    res = check_lines(tmp_path, _stream(GOOD, after_ack=[_read(0, "kv", -1, op=99)]))
    assert res.findings == []
    assert [(u.rule, u.count) for u in res.unchecked] == [("LOAD-skipped(no start)", 1)]
