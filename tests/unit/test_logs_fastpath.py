"""The log reader's inlined fast path (``_file_chunks``) gives the same fields, tags, ranks, ts and malformed
reports as the reference parser :func:`cptrace_otel.model.logline.parse_line` on odd but legal and broken lines."""

from __future__ import annotations

from cptrace_otel.analyze.sources.logs import LogStats, read_log_events
from cptrace_otel.model.logline import parse_line

LINES = [
    "[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE insert] node_id=1 len=64 kind=new rank=0 ts=100",
    "[CPTRACE insert] node_id=2 len=64 kind=new ts=101",                       # no prefix, no rank=
    "[CPTRACE prepare] node_id=2 op=1 dev=(cnt=2,min=0,max=1,first=0,last=1) ts=102 rank=0",  # ts not last
    "[CPTRACE prepare] node_id=3 op=2 ts=0103",                                # ts not canonical
    "[CPTRACE prepare] node_id=3 op=2 ts=-5",
    "[CPTRACE backup] ts=7 node_id=3 op=2 ts=104",                             # duplicate ts: last wins
    "[CPTRACE backup] node_id=3 bogus op=2 ts=105",                            # token without '='
    "[CPTRACE backup] node_id=3 =x op=2 ts=106",                               # empty key
    "[CPTRACE backup]node_id=3 ts=107",                                        # no space after the tag
    "[CPTRACE ] node_id=3 ts=108",                                             # empty tag
    "[CPTRACE ba-d] node_id=3 ts=109",                                         # tag not \\w+
    "[CPTRACEx] node_id=3 ts=110",                                             # broken marker
    "[CPTRACE evict] ts=111",                                                  # nothing but ts
    "[CPTRACE evict]  tier=dev\tnode_id=4  ts=112",                            # extra whitespace
    "[CPTRACE ack] dir=d2h op=1 pub=[1,2] hp=[] h=-1 node_id=04 ts=113\r",     # CR line ending
    "noise [CPTRACE free] pool=dev idx=(none) why=evict ts=114",
    "[CPTRACE free] pool=dev idx=(0) why=evict ts= 115",                       # empty ts value
    "[CPTRACE compose] key=L0:n4 node_id=4 src=(err:boom) hit=0 rank=-1 ts=116",
    "unrelated line ts=1",
    "[CPTRACE free] pool=dev idx=(0) why=evict ts=117",                        # last line, no newline
]


def test_fast_path_matches_reference_parser(tmp_path):
    p = tmp_path / "rank0.log"
    p.write_text("\n".join(LINES), encoding="utf-8")
    bad: list = []
    st = LogStats()
    evs = list(read_log_events([str(p)], bad.append, st))
    want = []
    for no, line in enumerate(LINES, 1):
        pl = parse_line(line)
        if pl is not None:
            want.append((no, pl.tag, pl.fields))
    got = [(e.line_no, e.tag, e.fields) for e in evs]
    assert got == want
    for e in evs:
        ts = e.fields.get("ts")
        assert e.ts == (ts if type(ts) is int else e.line_no)
        assert e.rank == 0
    bad_lines = {m.line_no for m in bad}
    assert {7, 8} <= bad_lines                       # tokens without '='
    assert {9, 10, 11, 12} <= bad_lines              # broken markers and tags
    assert all(LINES[n - 1].find("CPTRACE") >= 0 for n in bad_lines)
    assert st.events == len(evs)
