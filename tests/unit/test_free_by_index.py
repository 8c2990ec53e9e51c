"""A ``free`` SGLang makes by index (``node_id=-1``) that breaks an in-flight copy lands in the copy's node trace, and
a checker of that trace alone (a ``serve`` replica) gives ``check``'s finding: H2c of a load split while in flight
(its first h2d ack is the new fragment's, in another trace), H4a/H4b of a d2h copy. The real-SGLang run of the same
shape is tests/sglang_real/test_serve_real.py's ``early_release``; these streams are hand-written, with the real
:class:`RankChecker` and :class:`SpanBuilder`."""

from __future__ import annotations

from cptrace_otel.checks import RankChecker
from cptrace_otel.model.events import Event
from cptrace_otel.model.logline import parse_line
from cptrace_otel.model.spans import SpanBuilder
from cptrace_otel.model.trace_ids import node_trace_id, rank_trace_id
from tests.helpers.checks_util import R
from tests.unit.test_checks_sglang_shapes import CFG, _backed_up

RELOAD = f"[CPTRACE reload] node_id=2 chain=[2] op=5 host={R(40, 47)} dev={R(100, 107)}"
SPLIT = (f"[CPTRACE split] node_id=2 new_id=3 parent=0 pre_len=8 split_len=4 dev_p={R(100, 103)} "
         f"dev_c={R(104, 107)} host_p={R(40, 43)} host_c={R(44, 47)} pend=-1")
ACKS = ["[CPTRACE ack] dir=h2d op=5 node_id=3", "[CPTRACE ack] dir=h2d op=5 node_id=2"]   # SGLang's chain order


def _events(lines: list[str]) -> list[Event]:
    out = []
    for seq, ln in enumerate(lines):
        p = parse_line(ln)
        assert p is not None, ln
        out.append(Event(p.tag, 0, seq, 1000 + seq, 0, p.fields, 2, "test", seq + 1))
    return out


def _placed(lines: list[str], checks: bool = True) -> dict[bytes, list[Event]]:
    """trace id -> the records the builder put in it (the exporter's placement, online checks on or off)."""
    evs = _events(lines)
    b = SpanBuilder("run", "i", checker_factory=(lambda r: RankChecker(r)) if checks else None)
    by_seq = {ev.seq: ev for ev in evs}
    for ev in evs:
        b.add(ev)
    b.close_all()
    out: dict[bytes, list[Event]] = {}
    for sp in b.take():
        for _ts, _tag, attrs in sp.events:
            if "cptrace.seq" in attrs:   # (not a hicache.violation event)
                out.setdefault(sp.trace_id, []).append(by_seq[attrs["cptrace.seq"]])
    return {t: sorted(v, key=lambda e: e.seq) for t, v in out.items()}


def _check(evs: list[Event]) -> list[tuple]:
    ck = RankChecker(0)
    found = [f for ev in evs for f in ck.feed(ev)] + ck.finish()
    return [(f.rule, f.node_id, f.op, f.evidence[-1]) for f in found]


def _freed_early(free: str) -> list[str]:
    return [CFG] + _backed_up(2, 0, (0, 7), (40, 47), 1, [11, 12]) + [RELOAD, SPLIT, free] + ACKS


def test_h2c_of_a_split_load_is_found_in_the_load_trace_alone():
    lines = _freed_early(f"[CPTRACE free] pool=host idx={R(40, 43)} node_id=-1 why=finish")
    whole = _check(_events(lines))
    # reported at the reload node's own ack (the last record), though the fragment's ack ended the window
    assert whole == [("H2c", 2, 5, len(lines) - 1)], whole
    traces = _placed(lines)
    free_seq = lines.index(next(ln for ln in lines if "why=finish" in ln))
    load_trace = traces[node_trace_id("run", 0, 2)]
    assert free_seq in {e.seq for e in load_trace}, "the free is in the load's node trace"
    assert {e.seq for e in load_trace} >= {lines.index(RELOAD), len(lines) - 1}
    assert _check(load_trace) == whole
    # online checks off: nothing decides the owner, the free stays in the rank trace (and the load trace misses it)
    off = _placed(lines, checks=False)
    assert free_seq in {e.seq for e in off[rank_trace_id("run", 0)]}
    assert _check(off[node_trace_id("run", 0, 2)]) == []


def test_a_free_by_index_that_breaks_nothing_stays_in_the_rank_trace():
    lines = _freed_early(f"[CPTRACE free] pool=host idx={R(200, 203)} node_id=-1 why=finish")
    assert _check(_events(lines)) == []
    traces = _placed(lines)
    assert len(lines) - 3 in {e.seq for e in traces[rank_trace_id("run", 0)]}   # (the free, before the two acks)


def test_a_due_h2c_whose_reload_node_ack_never_comes_is_reported_with_the_first_ack():
    lines = _freed_early(f"[CPTRACE free] pool=host idx={R(40, 43)} node_id=-1 why=finish")[:-1]
    assert _check(_events(lines)) == [("H2c", 2, 5, len(lines) - 1)]


def test_a_due_h2c_is_reported_at_the_record_that_ends_its_epoch():
    """A reset between the op's first ack and the reload node's: the due H2c comes with the record of the new epoch,
    named in the load's epoch, with the first ack as its evidence (an epoch's in-flight loads are never dropped)."""
    lines = _freed_early(f"[CPTRACE free] pool=host idx={R(40, 43)} node_id=-1 why=finish")[:-1]
    evs = _events(lines + ["[CPTRACE reset] reason=test"])
    evs[-1].epoch = 1
    ck = RankChecker(0)
    found = [(ev.seq, f.rule, f.epoch, f.evidence[-1]) for ev in evs for f in ck.feed(ev)]
    assert found == [(len(lines), "H2c", 0, len(lines) - 1)], found
    assert ck.finish() == []


def test_h4_of_a_free_by_index_is_found_in_the_copy_trace_alone():
    """A request's finish frees device slots by index (SGLang's ``free`` of a request's KV): one that takes the
    source of an in-flight d2h copy is H4a, one of its host slots H4b, both in the copy's node trace."""
    for pool, rule, idx in (("dev", "H4a", R(0, 3)), ("host", "H4b", R(40, 43))):
        lines = [CFG, f"[CPTRACE insert] node_id=2 parent=0 len=8 dev={R(0, 7)} kind=new",
                 f"[CPTRACE prepare] node_id=2 op=1 len=8 dev={R(0, 7)} host={R(40, 47)} policy=wt",
                 f"[CPTRACE backup] op=1 node_id=2 dev={R(0, 7)} host={R(40, 47)} io=1 h=23 nz=9",
                 f"[CPTRACE free] pool={pool} idx={idx} node_id=-1 why=finish",
                 "[CPTRACE ack] dir=d2h op=1 node_id=2 blen=8 clen=8 pub=[2]"]
        whole = _check(_events(lines))
        assert [w[0] for w in whole] == [rule], (pool, whole)
        node_trace = _placed(lines)[node_trace_id("run", 0, 2)]
        assert 4 in {e.seq for e in node_trace}, pool
        assert _check(node_trace) == whole, pool
        assert _check(_placed(lines, checks=False)[node_trace_id("run", 0, 2)]) == [], pool
