"""FOREIGN: an L3 page this trace never wrote, judged by what its writer left (cptrace_otel.checks.rules_l3): the
metadata beside the object (``l3_ack dir=prefetch`` ``wfp``/``wid``) or an earlier run given to the same ``check``;
the storage identity's string form (cptrace_otel.model.l3); the metadata files of the ``file`` backend
(cptrace_otel.traced.sglang._l3_meta) on real files. Real SGLang: tests/sglang_real/test_l3_real.py."""

from __future__ import annotations

import json
import os
import time

from hypothesis import given, strategies as st

from cptrace_otel.model.l3 import IDENT_FIELDS, ident_diff, ident_parse, ident_str
from cptrace_otel.traced.sglang import _l3_meta
from tests.helpers.checks_util import R, check_lines, rules

K = ["a1f0_m_0_1", "b2e1_m_0_1"]
KEYS = f"[{','.join(K)}]"
CFG = ("[CPTRACE config] cp_size=1 cp_rank=0 page_size=4 level=2 layout=layer_first model=org/m kv_dtype={dt} "
       "rank=0 ts=0")


def _fetch(wid: list[str] | None, wfp: list[int] | None = None, hp: tuple[int, int] = (701, 702),
           dtype: str = "bfloat16") -> list[str]:
    """A run that never writes L3 fetches two pages: its config, then query, prefetch, ack (with the writer's
    claims where given) and hit."""
    claims = ""
    if wid is not None:
        claims += " wid=[" + ",".join(wid) + "]"
    if wfp is not None:
        claims += f" wfp=[{','.join(map(str, wfp))}]"
    return [
        CFG.format(dt=dtype),
        f"[CPTRACE l3_query] op=9 rid=req7 keys={KEYS} hit=2 rank=0 ts=1",
        f"[CPTRACE l3_prefetch] op=9 rid=req7 node_id=0 keys={KEYS} host={R(32, 39)} rank=0 ts=2",
        f"[CPTRACE l3_ack] dir=prefetch op=9 node_id=0 done=2 keys={KEYS} hp=[{hp[0]},{hp[1]}]{claims} rank=0 ts=3",
        f"[CPTRACE l3_hit] node_id=5 op=9 keys={KEYS} host={R(32, 39)} rank=0 ts=4",
    ]


def _skipped(res) -> int:
    return sum(u.count for u in res.unchecked if u.rule == "L3a-skipped(no backup)")


SAME = "org/m|bfloat16|layer_first|4"


def test_metadata_of_the_same_identity_and_fingerprint_resolves_the_hit(tmp_path):
    res = check_lines(tmp_path, _fetch([SAME, SAME], [701, 702]))
    assert res.findings == [] and _skipped(res) == 0


def test_metadata_of_another_kv_dtype_is_foreign(tmp_path):
    res = check_lines(tmp_path, _fetch(["org/m|float16|layer_first|4", SAME], [701, 702]))
    (f,) = res.findings
    assert (f.code, f.rule, f.node_id, f.op, f.severity) == ("FOREIGN", "FOREIGN", 0, 9, "ERROR")
    assert "kv_dtype float16 (this run: bfloat16)" in f.message and K[0] in f.message and "1 of 2" in f.message


def test_the_same_identity_with_another_fingerprint_is_l3a(tmp_path):
    res = check_lines(tmp_path, _fetch([SAME, SAME], [701, 555]))
    assert rules(res) == {"L3a"} and "555" in res.findings[0].message


def test_no_claim_stays_skipped_and_unnamed_fields_are_not_compared(tmp_path):
    res = check_lines(tmp_path, _fetch(None))
    assert res.findings == [] and _skipped(res) == 1   # (one per record)
    res = check_lines(tmp_path, _fetch(["|bfloat16||", "org/m|||"], [-1, -1]))   # fields the writer left unnamed
    assert res.findings == [] and _skipped(res) == 0


def test_an_earlier_runs_backups_judge_a_later_runs_fetch(tmp_path, capsys):
    """Two runs in two folders given to one ``check``: the earlier run's L3 backups judge the later run's fetch of
    keys it never wrote; alone, the later run only counts them as never written."""
    from cptrace_otel import cli

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "rank-0.log").write_text("\n".join([
        CFG.format(dt="float32"),
        f"[CPTRACE l3_backup] node_id=1 op=3 keys={KEYS} hp=[701,702] host={R(64, 71)} io=1 rank=0 ts=5",
        "[CPTRACE l3_ack] dir=backup op=3 node_id=1 done=2 rank=0 ts=6"]) + "\n")
    (b / "rank-0.log").write_text("\n".join(_fetch(None, dtype="bfloat16")) + "\n")

    def check(*paths) -> dict:
        capsys.readouterr()
        cli.main(["check", "--json", "--no-progress", *map(str, paths)])
        return json.loads(capsys.readouterr().out)

    alone = check(b / "rank-0.log")
    assert alone["findings"] == [] and [u["count"] for u in alone["unchecked"]] == [1]
    both = check(a / "rank-0.log", b / "rank-0.log")
    (f,) = both["findings"]
    assert f["rule"] == "FOREIGN" and "kv_dtype float32 (this run: bfloat16)" in f["message"], f
    assert "the backups of run" in f["message"] and both["stats"]["runs"] == 2
    assert check(b / "rank-0.log", a / "rank-0.log")["findings"] == []   # the later run read first: nothing before it


@given(st.dictionaries(st.sampled_from(IDENT_FIELDS), st.text(alphabet=st.characters(blacklist_characters="|"),
                                                              min_size=1), max_size=4),
       st.text(min_size=1))
def test_the_identity_string_round_trips(ident, model):
    assert ident_parse(ident_str(ident)) == ident
    with_bar = {**ident, "model": model + "|x"}   # a model path holding "|" still parses
    assert ident_parse(ident_str(with_bar)) == with_bar
    assert ident_diff(ident, ident) == [] and ident_parse(42) == {} and ident_parse("a|b") == {}


# -- the metadata files, on real files -------------------------------------------------------------------------------
IDENT = {"model": "org/m", "kv_dtype": "bfloat16", "layout": "layer_first", "page_size": 4}


def _store(root, keys: list[str]) -> None:
    for k in keys:
        (root / f"{k}.bin").write_bytes(os.urandom(64))


def test_metadata_is_written_for_the_objects_a_backup_wrote_and_read_back(tmp_path):
    t0 = time.time_ns()
    _store(tmp_path, K)
    assert _l3_meta.write(str(tmp_path), K, [701, 702], IDENT, t0) == 2
    assert _l3_meta.read(str(tmp_path), K) == ([701, 702], [ident_str(IDENT)] * 2)
    assert sorted(os.listdir(tmp_path)) == sorted([f"{k}{s}" for k in K for s in (".bin", ".cptrace")])


def test_an_object_older_than_the_backup_gets_no_metadata(tmp_path):
    """SGLang skips the write of a key already stored: the object is an earlier writer's, not this backup's."""
    _store(tmp_path, K)
    later = time.time_ns() + 10 * _l3_meta.MTIME_SLACK_NS
    assert _l3_meta.write(str(tmp_path), K, [701, 702], IDENT, later) == 0
    assert _l3_meta.read(str(tmp_path), K) is None


def test_metadata_outlived_by_a_rewrite_of_its_object_is_ignored_and_kept_over_a_skipped_write(tmp_path):
    t0 = time.time_ns()
    _store(tmp_path, K)
    _l3_meta.write(str(tmp_path), K, [701, 702], IDENT, t0)
    other = {**IDENT, "kv_dtype": "float16"}
    # another run's backup of the same keys, whose write SGLang skipped (the objects are unchanged): kept
    assert _l3_meta.write(str(tmp_path), K, [1, 2], other, t0) == 0
    assert _l3_meta.read(str(tmp_path), K) == ([701, 702], [ident_str(IDENT)] * 2)
    (tmp_path / f"{K[0]}.bin").write_bytes(os.urandom(80))   # an untraced writer replaced the first object
    assert _l3_meta.read(str(tmp_path), K) == ([-1, 702], ["", ident_str(IDENT)])
    (tmp_path / f"{K[1]}.cptrace").write_text('{"fp": 7, "id"')   # one being written
    assert _l3_meta.read(str(tmp_path), K) is None
