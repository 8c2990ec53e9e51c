"""Trace model v2 (spans.py): lanes per rank, stage spans under them, continuations, nothing dangling, every stage
record in its stage span, findings linked to their evidence and searchable by one code."""

from __future__ import annotations

import random
import re

from cptrace_otel.model import semconv as sc
from cptrace_otel.model.events import Event
from cptrace_otel.model.spans import SpanBuilder, violation_attributes
from cptrace_otel.model.trace_ids import lane_span_id

S = 1_000_000_000
NAME = re.compile(r"^rank \d+ \u00b7 (node|d2h|h2d|process|request)$")
STAGE_OF = {"prepare": sc.SPAN_D2H, "backup": sc.SPAN_D2H, "reload": sc.SPAN_H2D}


def misplaced(spans) -> list:
    """Records of a stage instance that are not in a span of that stage on their own rank."""
    bad = []
    for sp in spans:
        for _, tag, a in sp.events:
            want = STAGE_OF.get(tag)
            if tag == "ack":
                want = {"d2h": sc.SPAN_D2H, "h2d": sc.SPAN_H2D}.get(a.get("hicache.dir"))
            if want is not None and (sp.kind != want or a.get(sc.RANK, sp.rank) != sp.rank):
                bad.append((sp.name, tag, a.get(sc.SEQ)))
    return bad


def run_ranks(ranks: int, seed: int, timeout_s: float) -> list:
    """16 rank builders; copies whose ack comes after up to 3 timeouts (a loaded machine), interleaved nodes."""
    rng = random.Random(seed)
    spans = []
    for rank in range(ranks):
        b = SpanBuilder("run", f"h:{rank}", span_timeout_s=timeout_s)
        recs = []
        for node in range(40):
            t = rng.randrange(0, 5 * S)
            lat = rng.randrange(0, int(3 * timeout_s * S))
            recs += [(t, "insert", {"node_id": node}), (t + 1, "prepare", {"node_id": node, "op": node}),
                     (t + 2 + lat // 2, "backup", {"node_id": node, "op": node}),
                     (t + 3 + lat, "ack", {"node_id": node, "op": node, "dir": "d2h"}),
                     (t + 4 + lat, "evict", {"node_id": node}),
                     (t + 5 + lat, "reload", {"node_id": node, "op": 1000 + node}),
                     (t + 6 + 2 * lat, "ack", {"node_id": node, "op": 1000 + node, "dir": "h2d"})]
        recs.sort(key=lambda r: r[0])
        for seq, (ts, tag, f) in enumerate(recs):
            b.add(Event(tag, rank, seq, ts, 0, f, 2, "t", 0))
            if rng.random() < 0.05:
                b.expire(ts)
        b.close_all()
        spans += b.take()
        assert b.open_spans == 0
    return spans


def test_sixteen_ranks_under_load_no_record_misplaced_nothing_dangles_nothing_too_long() -> None:
    timeout = 0.05
    spans = run_ranks(16, 3, timeout)
    assert misplaced(spans) == []
    assert any(sp.attrs.get(sc.CONTINUES) for sp in spans)  # the load did cut stage spans
    ids = {(sp.trace_id, sp.span_id) for sp in spans}
    assert len(ids) == len(spans)                                   # every span sent once
    assert all(sp.parent == b"" or (sp.trace_id, sp.parent) in ids for sp in spans)  # nothing dangles
    assert all(NAME.match(sp.name) for sp in spans)                 # bounded names: rank and stage only
    assert all(sp.end - sp.start < timeout * S for sp in spans if sp.kind == sc.SPAN_NODE)
    for sp in spans:
        if sp.parent:                                               # a child hangs under its own rank's lane
            lane = next(p for p in spans if p.span_id == sp.parent)
            assert lane.kind == sc.SPAN_NODE and lane.rank == sp.rank
            if sp.kind == sc.SPAN_NODE:  # a later lane segment, under the first one
                assert lane.parent == b"" and sp.parent == lane_span_id("run", 0, sp.attrs[sc.NODE_ID], sp.rank)
            else:
                assert lane.start <= sp.start and sp.end <= lane.end
        if sp.attrs.get(sc.CONTINUES):
            assert sp.links and sp.links[0][2] == {sc.LINK_KIND: "continues"}
            assert (sp.trace_id, sp.links[0][1]) in ids
    roots = {(sp.trace_id, sp.rank) for sp in spans if not sp.parent}
    assert len(roots) == sum(1 for sp in spans if not sp.parent)  # one top-level row per rank and node trace


def test_first_lane_segment_id_is_computable_and_later_segments_differ() -> None:
    b = SpanBuilder("run", "x", span_timeout_s=1.0)
    b.add(Event("insert", 3, 0, 0, 2, {"node_id": 9}, 2, "t", 0))
    b.add(Event("evict", 3, 1, 2 * S, 2, {"node_id": 9}, 2, "t", 0))
    b.close_all()
    first, second = b.take()
    assert first.span_id == lane_span_id("run", 2, 9, 3) and second.span_id == lane_span_id("run", 2, 9, 3, 1)
    assert first.trace_id == second.trace_id and first.name == second.name == "rank 3 \u00b7 node"
    assert first.parent == b"" and second.parent == first.span_id


def test_violation_attributes_one_boolean_per_code() -> None:
    assert violation_attributes(["HASH", "H2", "HASH"]) == {
        sc.VIOLATION: "H2,HASH", "cptrace.violation.H2": True, "cptrace.violation.HASH": True}


def test_every_finding_message_is_in_the_status_and_has_its_event() -> None:
    import dataclasses

    @dataclasses.dataclass
    class F:
        code: str
        rule: str
        certainty: str
        evidence: list
        message: str

    class Two:
        def __init__(self, rank: int) -> None:
            pass

        def feed(self, ev):
            if ev.tag == "ack":
                return [F("H2", "H2", "exact", [ev.seq], "released too early"),
                        F("HASH", "HASH", "exact", [0, ev.seq], "reload hash differs")]
            return []

    b = SpanBuilder("run", "x", checker_factory=Two)
    b.add(Event("prepare", 2, 0, 1, 0, {"node_id": 4, "op": 8}, 2, "t", 0))
    b.add(Event("reload", 2, 1, 2, 0, {"node_id": 4, "op": 9}, 2, "t", 0))
    sp = b.add(Event("ack", 2, 2, 3, 0, {"node_id": 4, "op": 9, "dir": "h2d"}, 2, "t", 0))
    b.close_all()
    b.take()
    assert sp.status_message == (
        "H2: released too early [evidence: seq 2 ack op=9 rank 2]; "
        "HASH: reload hash differs [evidence: seq 0 prepare op=8 rank 2, seq 2 ack op=9 rank 2]")
    assert [e[2][sc.V_CODE] for e in sp.events if e[1] == sc.EVENT_VIOLATION] == ["H2", "HASH"]
    assert sp.attrs[sc.VIOLATION] == "H2,HASH" and sp.attrs["cptrace.violation.H2"] is True
    assert sp.attrs["cptrace.violation.HASH"] is True
    (link,) = sp.links  # to the d2h span holding seq 0
    assert link[2] == {sc.LINK_KIND: "evidence", sc.V_CODE: "HASH", sc.V_EVIDENCE: "0"}
