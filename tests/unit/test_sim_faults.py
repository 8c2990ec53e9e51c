"""Fault plans and the oracle: nth-site targeting, scopes, parsing, and what each plan records."""

from __future__ import annotations

import pytest

from cptrace_otel.sim.faults import FAULTS, LEVEL_NEEDED, FaultPlan, Oracle, parse_faults
from cptrace_otel.sim.workload import run_fault


def test_plan_hits_exactly_the_nth_eligible_site_on_its_rank():
    p = FaultPlan("HASH_flip", rank=1, nth=2)
    assert p.scope == "rank"
    assert [p.hit(0), p.hit(1), p.hit(0), p.hit(1), p.hit(1)] == [False, False, False, True, False]
    q = FaultPlan("H1_ack", nth=1)
    assert q.scope == "all" and q.hit(0) and q.hit(1) and not q.hit(0)
    q.active = False
    assert not q.applies(0)


def test_unknown_fault_and_bad_scope_are_rejected():
    with pytest.raises(ValueError):
        FaultPlan("NOPE")
    with pytest.raises(ValueError):
        FaultPlan("H1_ack", scope="some")


def test_parse_faults_forms():
    assert parse_faults("none") == [] and parse_faults("") == []
    a, b, c = parse_faults("H1_ack,HASH_flip@0#3,ZERO_race", ranks=4)
    assert (a.kind, a.scope) == ("H1_ack", "all")
    assert (b.kind, b.rank, b.nth, b.scope) == ("HASH_flip", 0, 3, "rank")
    assert (c.kind, c.rank, c.scope) == ("ZERO_race", 3, "rank")     # one-rank faults default to the last rank
    with pytest.raises(ValueError):
        parse_faults("HASH_flip@5", ranks=2)
    with pytest.raises(ValueError):
        parse_faults("H9")


def test_oracle_filters_by_level_and_dedupes():
    o = Oracle()
    o.expect("H1", "H1b", 0, 3, 7, "H1_ack")
    o.expect("H1", "H1b", 0, 3, 7, "H1_ack")
    o.expect("ZERO", "ZERO@backup", 1, 4, 2, "ZERO_nostore")
    assert len(o.entries) == 2
    assert o.codes(1) == {"ZERO"} and o.codes(2) == {"H1", "ZERO"}
    assert LEVEL_NEEDED["H1b"] == 2 and LEVEL_NEEDED["H1a"] == 1


def test_every_fault_has_a_scenario_that_reaches_its_site_in_every_applicable_mode():
    for kind, spec in FAULTS.items():
        for mode in spec.modes:
            sim = run_fault(kind, mode, level=2)
            assert [i for i in sim.oracle.injected if i[0] == kind], (kind, mode)
            assert sim.oracle.entries, (kind, mode)
            assert {e.code for e in sim.oracle.entries} <= spec.structural | spec.content | {"C5"}


def test_c1_div_rank_never_backs_the_node_up_so_the_trees_diverge_at_the_fault():
    """C1_div: the failing rank's host pool keeps refusing the node, so that rank never logs the prepare its peers
    logged (even when a later hit would have retried it before any other structural record, as in this workload),
    and the structural streams first differ at the peers' prepare, the index the simulator records."""
    from cptrace_otel.sim.workload import random_workload

    tags = ("insert", "split", "prepare", "evict", "reload", "reset")
    sim = random_workload(0, "replicated", 2, "wt", faults=[FaultPlan("C1_div", rank=1, nth=1)])
    (_, rank, nid, op), = sim.oracle.injected
    ev = sim.emitter.events()
    prepares = {r: [e.fields["op"] for e in ev if e.rank == r and e.tag == "prepare" and e.fields["node_id"] == nid]
                for r in (0, 1)}
    assert rank == 1 and prepares == {0: [op], 1: []}
    streams = {r: [(e.tag, e.fields.get("node_id"), e.fields.get("len")) for e in ev
                   if e.rank == r and e.epoch == 0 and e.tag in tags] for r in (0, 1)}
    first = next(i for i, (a, b) in enumerate(zip(*streams.values(), strict=False)) if a != b)
    assert streams[0][first] == ("prepare", nid, streams[0][first][2])
    assert max(e.epoch for e in ev) == 0 and sim.diverged_at == first   # (a reset would clear it)
