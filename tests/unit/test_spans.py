"""SpanBuilder: the trace model of docs/ARCHITECTURE.md (ids, stage spans, closing, rid links, checks stamping)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cptrace_otel.model import semconv as sc
from cptrace_otel.model.attrs import event_attributes, fields_to_attributes
from cptrace_otel.model.events import Event
from cptrace_otel.model.logline import Rng, parse_value
from cptrace_otel.model.spans import MAX_EVENTS, STATUS_ERROR, SpanBuilder
from cptrace_otel.model.trace_ids import lane_span_id, node_trace_id, rank_trace_id, request_trace_id

S = 1_000_000_000


class Feeder:
    def __init__(self, builder: SpanBuilder, rank: int = 0) -> None:
        self.b, self.rank, self.seq, self.epoch = builder, rank, 0, 0

    def __call__(self, tag: str, ts: int, **fields):
        ev = Event(tag, self.rank, self.seq, ts, self.epoch, fields, 1, "test", 0)
        self.seq += 1
        sp = self.b.add(ev)
        if tag == "reset":
            self.epoch += 1
        return sp


def test_trace_ids_are_deterministic_and_keyed() -> None:
    a = node_trace_id("run", 0, 7)
    assert a == node_trace_id("run", 0, 7) and len(a) == 16
    assert len({a, node_trace_id("run", 1, 7), node_trace_id("run", 0, 8), node_trace_id("other", 0, 7)}) == 4
    assert rank_trace_id("run", 0) != rank_trace_id("run", 1)
    assert request_trace_id("run", "r1") != request_trace_id("run", "r2")
    # two processes (different instances, different ranks) put a node's records in the same trace
    b0, b1 = SpanBuilder("run", "host:1"), SpanBuilder("run", "host:2")
    s0 = Feeder(b0, 0)("evict", S, node_id=7, tier="dev")
    s1 = Feeder(b1, 1)("evict", S, node_id=7, tier="dev")
    assert s0.trace_id == s1.trace_id == a
    assert s0.span_id != s1.span_id


def test_d2h_stage_span_closed_by_its_ack() -> None:
    b = SpanBuilder("run", "i")
    f = Feeder(b)
    sp = f("prepare", 10, node_id=3, op=1, len=4, dev=Rng(4, 0, 3, 0, 3))
    assert f("backup", 11, node_id=3, op=1, h=99, nz=4) is sp
    assert f("ack", 12, dir="d2h", node_id=3, op=1) is sp
    assert b.take() == []  # a closed stage span waits for its lane
    b.close_all()
    lane, done = b.take()
    assert done is sp and sp.parent == lane.span_id == lane_span_id("run", 0, 3, 0) and lane.parent == b""
    assert lane.kind == sc.SPAN_NODE and lane.name == "rank 0 \u00b7 node" and sp.name == "rank 0 \u00b7 d2h"
    assert (lane.start, lane.end) == (10, 12) and lane.events == []
    assert sp.kind == sc.SPAN_D2H and sp.attrs[sc.STAGE_CLOSED] == "tag"
    assert sp.attrs[sc.NODE_ID] == 3 and sp.attrs[sc.RANK] == 0
    assert (sp.start, sp.end) == (10, 12)
    assert [e[1] for e in sp.events] == ["prepare", "backup", "ack"]
    a = sp.events[0][2]
    assert a["hicache.dev.cnt"] == 4 and a["hicache.len"] == 4
    assert (a[sc.SEQ], a[sc.EPOCH], a[sc.LEVEL]) == (0, 0, 1)
    assert sp.trace_id == node_trace_id("run", 0, 3)


def test_h2d_and_node_spans_and_timeouts() -> None:
    b = SpanBuilder("run", "i", span_timeout_s=1.0)
    f = Feeder(b)
    h2d = f("reload", 0, node_id=5, op=9, chain=[5])
    node = f("evict", 1, node_id=5, tier="host")
    assert h2d.kind == sc.SPAN_H2D and node.kind == sc.SPAN_NODE and node is not h2d
    assert f("ack", 2, dir="h2d", node_id=5, op=9) is h2d
    assert b.take() == []
    # an ack that matches no open stage span still becomes exactly one event (on the node span: the lane)
    assert f("ack", 3, dir="h2d", node_id=5, op=77) is node
    assert h2d.parent == node.span_id
    b.expire(S // 2)
    assert b.take() == []
    b.expire(S + 1)  # open one second: closed by timeout, sent with its closed child
    assert b.take() == [node, h2d] and node.attrs[sc.STAGE_CLOSED] == "timeout"
    # a later record more than the timeout after a span's start closes it too (replays have no wall clock)
    n2 = f("evict", 5 * S, node_id=6)
    f("evict", 7 * S, node_id=8)
    assert n2 in b.take()
    b.close_all()
    assert [s.attrs[sc.STAGE_CLOSED] for s in b.take()] == ["flush"]
    assert b.open_spans == 0


def test_records_without_node_go_to_rank_trace_and_reset_closes_spans() -> None:
    b = SpanBuilder("run", "i")
    f = Feeder(b, rank=2)
    cfg = f("config", 0, cp_size=2, cp_rank=2, mode="replicated")
    free = f("free", 1, pool="dev", idx="(0)", node_id=-1)
    assert cfg is free and cfg.kind == sc.SPAN_RANK and cfg.trace_id == rank_trace_id("run", 2)
    node = f("evict", 2, node_id=1)
    f("reset", 3)
    closed = b.take()
    assert node in closed and node.attrs[sc.STAGE_CLOSED] == "reset"
    # after the reset the same node id is a different trace (new epoch)
    again = f("evict", 4, node_id=1)
    assert again.trace_id == node_trace_id("run", 1, 1) != node.trace_id


def test_rid_map_links_request_trace_and_fwd_hash_goes_there() -> None:
    b = SpanBuilder("run", "i")
    f = Feeder(b, rank=1)
    node = f("rid_map", 0, rid="req-7", node_id=4, hit="host")
    assert node.kind == sc.SPAN_NODE and node.attrs[sc.RID] == "req-7"
    fh = f("fwd_hash", 1, rid="req-7", nreq=1, layer=0, stage="attn", h=5, nz=6, rows=7, cprank=1)
    assert fh.kind == sc.SPAN_REQUEST and fh.trace_id == request_trace_id("run", "req-7")
    assert fh.attrs[sc.RID] == "req-7"
    assert fh.links == [(node.trace_id, node.span_id, {sc.RANK: 1, sc.NODE_ID: 4, "hicache.hit": "host"})]
    assert [e[1] for e in fh.events] == ["fwd_hash"]  # rid_map itself is one event, on the node span
    assert [e[1] for e in node.events] == ["rid_map"]


def test_every_record_exactly_one_event_and_limits() -> None:
    rng = random.Random(1)
    b = SpanBuilder("run", "i", span_timeout_s=0.5)
    f = Feeder(b)
    tags = ["prepare", "backup", "ack", "reload", "evict", "insert", "split", "free", "config", "rid_map",
            "fwd_hash", "compose"]
    n = 5000
    for i in range(n):
        tag = rng.choice(tags)
        fields = {"node_id": rng.randrange(-1, 20), "op": rng.randrange(3), "dir": rng.choice(["d2h", "h2d"]),
                  "rid": f"r{rng.randrange(5)}", "i": i}
        f(tag, i * 1_000_000, **fields)
    # one hot node: the span is cut at MAX_EVENTS
    for i in range(MAX_EVENTS + 10):
        f("compose", n * 1_000_000, node_id=99, i=n + i)
    b.close_all()
    spans = b.take()
    got = sorted(a["hicache.i"] for sp in spans for _, _, a in sp.events)
    assert got == list(range(n + MAX_EVENTS + 10))
    assert all(len(sp.events) <= MAX_EVENTS for sp in spans)
    assert any(sp.attrs[sc.STAGE_CLOSED] == "limit" for sp in spans)
    assert len({sp.span_id for sp in spans}) == len(spans)
    assert b.events == n + MAX_EVENTS + 10 and b.spans == len(spans)


@dataclasses.dataclass
class FakeFinding:
    code: str
    rule: str
    certainty: str
    evidence: list
    message: str


class FakeChecker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.backup_h: dict[int, int] = {}
        self.backup_seq: dict[int, int] = {}

    def feed(self, ev: Event):
        if ev.tag == "backup":
            self.backup_h[ev.fields["node_id"]] = ev.fields["h"]
            self.backup_seq[ev.fields["node_id"]] = ev.seq
        if ev.tag == "ack" and ev.fields.get("dir") == "h2d":
            h0 = self.backup_h.get(ev.fields["node_id"])
            if h0 is not None and h0 != ev.fields["h"]:
                return [FakeFinding("HASH", "HASH", "exact", [self.backup_seq[ev.fields["node_id"]], ev.seq],
                                    f"reload hash {ev.fields['h']} != {h0}")]
        return []

    def finish(self):
        return [FakeFinding("H4", "H4-open", "interval", [0], "still open")]

    def unchecked(self):
        return []


def test_findings_are_stamped_on_the_span_holding_the_event() -> None:
    b = SpanBuilder("run", "i", checker_factory=FakeChecker)
    f = Feeder(b)
    f("prepare", 0, node_id=1, op=1)
    f("backup", 1, node_id=1, op=1, h=10)
    f("ack", 2, dir="d2h", node_id=1, op=1)
    f("reload", 3, node_id=1, op=2)
    h2d = f("ack", 4, dir="h2d", node_id=1, op=2, h=11)
    b.close_all()
    lane, ok, bad = b.take()
    assert sc.VIOLATION not in ok.attrs and ok.status_code == 0 and sc.VIOLATION not in lane.attrs
    assert bad is h2d and bad.attrs[sc.VIOLATION] == "HASH" and bad.attrs[sc.VIOLATION_RULES] == "HASH"
    assert bad.status_code == STATUS_ERROR and "reload hash 11" in bad.status_message
    viol = [e for e in bad.events if e[1] == sc.EVENT_VIOLATION]
    assert len(viol) == 1 and viol[0][0] == 4
    assert viol[0][2][sc.V_CODE] == "HASH" and viol[0][2][sc.V_EVIDENCE] == "1,4"
    assert b.findings == 1
    # the HASH span links to the backup's span (seq 1, in ``ok``), and the event names the evidence records
    assert bad.attrs["cptrace.violation.HASH"] is True
    assert bad.links == [(ok.trace_id, ok.span_id, {sc.LINK_KIND: "evidence", sc.V_CODE: "HASH",
                                                    sc.V_EVIDENCE: "1"})]
    assert viol[0][2][sc.V_EVIDENCE_DESC] == "seq 1 backup op=1 rank 0, seq 4 ack op=2 rank 0"
    assert bad.status_message == ("HASH: reload hash 11 != 10 [evidence: seq 1 backup op=1 rank 0, "
                                  "seq 4 ack op=2 rank 0]")
    # end of stream: a late finding lands on the open span that holds its evidence (seq 0 is closed: rank span)
    f("evict", 5, node_id=1)
    b.finish()
    late = [s for s in b.take() if sc.VIOLATION in s.attrs]
    assert len(late) == 1 and late[0].attrs[sc.VIOLATION] == "H4" and late[0].kind == sc.SPAN_RANK


def test_a_failing_checker_is_switched_off_not_fatal(capsys: pytest.CaptureFixture) -> None:
    class Broken:
        def __init__(self, rank: int) -> None:
            pass

        def feed(self, ev):
            raise RuntimeError("rule bug")

    b = SpanBuilder("run", "i", checker_factory=Broken)
    f = Feeder(b)
    f("evict", 0, node_id=1)
    f("evict", 1, node_id=1)
    b.close_all()
    assert sum(len(s.events) for s in b.take()) == 2
    assert "online checks disabled" in capsys.readouterr().err


def test_real_rank_checker_can_be_plugged_in() -> None:
    checks = pytest.importorskip("cptrace_otel.checks")
    b = SpanBuilder("run", "i", checker_factory=lambda r: checks.RankChecker(r, 2))
    f = Feeder(b)
    f("config", 0, cp_size=1, cp_rank=0, mode="none", page_size=1, policy="wt", level=2)
    f("insert", 1, node_id=1, parent=0, len=4, dev=Rng(4, 0, 3, 0, 3), kind="new")
    f("prepare", 2, node_id=1, op=1, len=4, dev=Rng(4, 0, 3, 0, 3), host=Rng(4, 100, 103, 100, 103), policy="wt")
    f("backup", 3, node_id=1, op=1, dev=Rng(4, 0, 3, 0, 3), host=Rng(4, 100, 103, 100, 103), io=1, h=0, nz=0)
    b.finish()
    assert sum(len(s.events) for s in b.take()) >= 4


def _spans_of(events: list[Event], factory, batch: int, monkeypatch: pytest.MonkeyPatch, timeout_s: float,
              take_every: int) -> list[bytes]:
    """The OTLP bytes of the spans one builder per rank makes of ``events``, its checks run every ``batch``
    records; MAX_SEQ_REFS small, so the evidence references are cleared inside the batches too."""
    import copy

    from cptrace_otel.export.otlp_proto import encode_requests
    from cptrace_otel.model import span_checks, spans as spans_mod

    monkeypatch.setattr(spans_mod, "CHECK_BATCH", batch)
    monkeypatch.setattr(span_checks, "MAX_SEQ_REFS", 16)
    builders: dict[int, SpanBuilder] = {}
    out: list = []
    for i, ev in enumerate(copy.deepcopy(events)):
        b = builders.get(ev.rank)
        if b is None:
            b = builders[ev.rank] = SpanBuilder("run", f"i{ev.rank}", timeout_s, factory)
        b.add(ev)
        if i % take_every == take_every - 1:
            out += b.take()
    for b in builders.values():
        b.finish()
        out += b.take()
    assert sum(b.findings for b in builders.values()) == sum(len(s.findings) for s in out)
    return list(encode_requests([({"service.name": "x"}, out)]))


@pytest.mark.parametrize("kind", ["H1_ack", "H2_stale", "H2_release", "H3_noinval", "H4_nolock", "HASH_flip",
                                  "ZERO_race"])
def test_checks_run_in_batches_stamp_the_spans_as_checked_per_record(kind: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """SpanBuilder runs the online checks over batches of records (CHECK_BATCH): the spans, their findings,
    violation events, status and evidence links are byte for byte those of checks run as each record is placed
    (a batch of one), on fault runs whose findings are stamped on spans closed inside a batch; with spans that time
    out and batches taken in between."""
    from cptrace_otel.checks.rank_checker import checker_factory
    from cptrace_otel.sim.workload import run_fault

    events = run_fault(kind, "replicated", ranks=2).emitter.events()
    for timeout_s, take_every in ((1.0, 1 << 30), (0.00002, 7)):
        one = _spans_of(events, checker_factory(True, 3), 1, monkeypatch, timeout_s, take_every)
        assert any(sc.EVENT_VIOLATION.encode() in body for body in one), "no finding stamped: the test proves nothing"
        for batch in (3, 512):
            assert _spans_of(events, checker_factory(True, 3), batch, monkeypatch, timeout_s, take_every) == one


def test_a_checker_failing_inside_a_batch_stops_the_checks_where_it_did(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """A checker that raises at its 5th record: the records before it keep their findings, the ones after are not
    checked, whether the checks run per record or in a batch."""
    from cptrace_otel.checks.rank_checker import RankChecker
    from cptrace_otel.sim.workload import run_fault

    class Flaky(RankChecker):
        n = 0

        def feed_fast(self, ev):
            Flaky.n += 1
            if Flaky.n == 5:
                raise RuntimeError("rule bug")
            return super().feed_fast(ev)

    events = run_fault("HASH_flip", "none").emitter.events()
    got = []
    for batch in (1, 512):
        Flaky.n = 0
        got.append(_spans_of(events, lambda r: Flaky(r, 3), batch, monkeypatch, 1.0, 1 << 30))
        assert capsys.readouterr().err.count("online checks disabled") == 1
    assert got[0] == got[1]


@pytest.mark.parametrize("seed", range(3))
def test_event_attributes_equal_fields_to_attributes(seed: int) -> None:
    rng = random.Random(seed)
    vals = ["(cnt=3,min=1,max=5,first=1,last=5)", "[1,[2,3]]", "abc", "-7", "007", "1.5", "(none)", "(0)",
            "(err:boom)", "nan", "-inf", str(1 << 70), "(cnt=2,min=0.5,max=1.5,first=0.5,last=1.5)"]
    for _ in range(300):
        fields = {}
        for j in range(rng.randrange(1, 10)):
            v = rng.choice(vals + [rng.randrange(-10**6, 10**6), rng.random(), 1 << 64])
            fields[f"k{j}"] = parse_value(v) if isinstance(v, str) else v
        a, n = event_attributes(fields)
        ref = fields_to_attributes(fields)
        assert list(a.items()) == list(ref.items())
        assert all(type(a[k]) is type(ref[k]) for k in a)
        assert n > 0
