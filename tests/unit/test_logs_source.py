"""The upstream log reader: fast parser parity with logline, rank/ts/seq/epoch assignment, the real SGLang format,
malformed lines, unreadable files, round trip."""

from __future__ import annotations

import os
import random

import pytest

from cptrace_otel.analyze.sources.logs import LogReadError, LogStats, default_rank, parse_trace_line, read_log_events
from cptrace_otel.model.logline import parse_line, render_line
from tests.helpers.checks_util import FIXTURES, R

REAL = os.path.join(FIXTURES, "real", "sglang_attn_cp3.log")


def _rand_value(rnd: random.Random) -> str:
    pick = rnd.randrange(14)
    n = rnd.randrange(-5, 100000)
    return [str(n), f"0{abs(n)}", "-0", f"{n}.5", "1e5", "(0)", "(none)", "(err:bad)", f"tensor([{n},{n}])",
            f"(cnt={abs(n)},min={n},max={n + 3},first={n},last={n + 3})", f"(cnt=0{abs(n)},min=1,max=2,first=1,last=2)",
            f"[{n},{abs(n)}]", f"[[{n}],[1,2]]",
            rnd.choice(["wt", "d2h", "", "L12:n5", "a=b", "[1,", "1-9:12-20"])][pick]


def test_fast_parser_matches_logline_on_random_lines():
    rnd = random.Random(42)
    for _ in range(3000):
        toks = []
        for i in range(rnd.randrange(0, 10)):
            toks.append(rnd.choice([f"k{i}={_rand_value(rnd)}", f"k{i}={_rand_value(rnd)}", "junk", "=x"]))
        if rnd.random() < 0.5:   # the common shape: ts= last (a fast path), sometimes also earlier or odd
            toks.insert(rnd.randrange(0, len(toks) + 1), rnd.choice(["ts=5", "x=1"]))
            toks.append(rnd.choice([f"ts={rnd.randrange(0, 10**12)}", "ts=0", "ts=007", "ts=-3", "ts=", "ts=1.5"]))
        prefix = rnd.choice(["", "[2026-07-18 03:03:06 ATTN_CP5 TP5] ", "INFO x "])
        tag = rnd.choice(["prepare", "ack", "fwd_hash", "a b", ""])
        line = f"{prefix}[CPTRACE {tag}]" + (" " + " ".join(toks) if toks or rnd.random() < 0.5 else "") + \
            rnd.choice(["", "\n", "\r\n"])
        ref = parse_line(line)
        got = parse_trace_line(line)
        assert (ref is None and got is None) or tuple(ref) == got, line
        if got:
            for k, v in got[2].items():
                assert type(v) is type(ref.fields[k]), (line, k)


def test_real_format_rank_from_prefix_order_from_lines():
    evs = list(read_log_events([REAL]))
    assert [e.tag for e in evs] == ["insert", "prepare", "backup", "free", "insert", "ack"]
    assert {e.rank for e in evs} == {3}
    assert [e.seq for e in evs] == list(range(6))
    assert [e.line_no for e in evs] == [2, 3, 5, 6, 7, 8]
    assert [e.ts for e in evs] == [2, 3, 5, 6, 7, 8]   # no ts= field: the line order
    assert all("rank" not in e.fields and "ts" not in e.fields for e in evs)


def test_rank_field_beats_prefix_and_minus_one_falls_back(tmp_path):
    p = tmp_path / "whatever.log"
    p.write_text("[x ATTN_CP2 TP2] [CPTRACE reset] rank=1 ts=5\n"
                 "[x ATTN_CP2 TP2] [CPTRACE reset] rank=-1 ts=6\n"
                 "[CPTRACE reset] ts=7\n")
    assert [e.rank for e in read_log_events([str(p)])] == [1, 2, 0]
    assert default_rank("/x/run/rank7.log", 0) == 7 and default_rank("/x/cp-3.txt", 0) == 3
    assert default_rank("/x/a.log", 4) == 4


def test_malformed_lines_are_reported_and_the_rest_is_processed():
    seen = []
    st = LogStats()
    path = os.path.join(FIXTURES, "real", "malformed.log")
    evs = list(read_log_events([path], seen.append, st))
    assert [e.tag for e in evs] == ["insert", "prepare", "backup"]
    assert [(m.line_no, m.reason.split(" ")[0]) for m in seen] == [(2, "broken"), (3, "tokens"), (5, "broken")]
    assert all(m.path == path for m in seen)
    assert st.malformed == 3 and st.events == 3 and st.lines == 6
    assert evs[1].fields["policy"] == "wt" and "garbage" in seen[1].reason


def test_unreadable_source_raises_before_any_event(tmp_path):
    with pytest.raises(LogReadError) as ei:
        read_log_events([str(tmp_path / "missing.log")])
    assert "missing.log" in str(ei.value)
    with pytest.raises(LogReadError):
        read_log_events([str(tmp_path)])


def test_round_trip_is_byte_identical():
    for name in ("real/sglang_attn_cp3.log", "domain/h1b_bad.log", "nearmiss/reload_split_node_host_p.log"):
        raw = open(os.path.join(FIXTURES, name), encoding="utf-8").read()
        out = []
        for line in raw.splitlines():
            p = parse_trace_line(line)
            if p is None:
                out.append(line)
                continue
            prefix, tag, fields, bad = p
            assert not bad
            out.append(prefix + render_line(tag, fields))
        assert "\n".join(out) + "\n" == raw


def test_multi_file_merge_keeps_rank_order_and_assigns_epochs(tmp_path):
    a, b = tmp_path / "rank0.log", tmp_path / "rank1.log"
    lines0 = [f"[CPTRACE insert] node_id={i} parent=0 len=16 dev={R(i * 16, i * 16 + 15)} kind=new ts={i * 10}"
              for i in range(1, 1500)]
    lines0.append("[CPTRACE reset] reason=flush ts=99999")
    lines0.append(f"[CPTRACE insert] node_id=1 parent=0 len=16 dev={R(0, 15)} kind=new ts=100000")
    a.write_text("\n".join(lines0) + "\n")
    b.write_text("\n".join(f"[CPTRACE insert] node_id={i} parent=0 len=16 dev={R(0, 15)} kind=new ts={i * 10 + 5}"
                           for i in range(1, 1500)) + "\n" + "[CPTRACE insert] node_id=3 parent=0 len=16 "
                 f"dev={R(0, 15)} kind=new ts=200000\n")
    it = read_log_events([str(a), str(b)])
    assert it.ranks == {0, 1}
    evs = list(it)
    by = {0: [e for e in evs if e.rank == 0], 1: [e for e in evs if e.rank == 1]}
    assert [e.seq for e in by[0]] == list(range(1501)) and [e.seq for e in by[1]] == list(range(1500))
    assert by[0][-1].epoch == 1 and by[0][-2].epoch == 0     # after the reset
    assert by[1][-1].epoch == 1 and by[1][-2].epoch == 0     # node id went backwards
    # ranks stay close in time: never more than ~two read chunks apart
    pos = {id(e): i for i, e in enumerate(evs)}
    lag = max(abs(pos[id(x)] - pos[id(y)]) for x, y in zip(by[0][:1400], by[1][:1400], strict=False))
    assert lag <= 2 * 512 + 2
