"""The L3 tier against the simulator (cptrace_otel.sim.l3_tier): random workloads with storage backups, evictions and
prefetches on 1-3 CP ranks give no finding of any severity; each fault gives exactly the codes its oracle expects
(the rule names and the ranks), with the faulted byte, page or rank really changed in the simulated storage."""

from __future__ import annotations

import pytest

from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.sim.l3_tier import FAULTS, L3Sim


@pytest.mark.parametrize("mode,ranks", [("none", 1), ("replicated", 2), ("sharded", 2), ("sharded", 3)])
def test_healthy_workloads_give_no_finding(mode, ranks):
    l3_records = 0
    for seed in range(8):
        sim = L3Sim(mode, ranks, seed)
        assert sim.run(40) == set()
        evs = sim.emitter.events()
        l3_records += sum(e.tag.startswith("l3_") for e in evs)
        res = Analysis().run(evs)
        assert res.findings == [], (seed, [f.message for f in res.findings][:3])
        assert not [u for u in res.unchecked if u.code == "L3"], (seed, res.unchecked)   # all decided, all keys known
    assert l3_records > 100 * ranks   # backups, queries, prefetches, acks and hits were really exercised


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_gives_its_codes(fault):
    mode = "sharded" if fault in ("no_writer", "same_keys") else "none"
    for seed in range(5):
        sim = L3Sim(mode, 2, seed, fault)
        want = sim.run(40)
        assert FAULTS[fault] <= want   # the fault happened (its storage byte, page or rank really changed)
        res = Analysis().run(sim.emitter.events())
        assert {f.rule for f in res.findings} == want, (seed, [f.message for f in res.findings][:3])
        # the faulted rank; with shared keys any rank may read back another's shard (the first writer's stays)
        assert {f.rank for f in res.findings if not (fault == "same_keys" and f.rule == "L3a")} == {sim.fault_rank}
        assert all(f.code == "L3" and f.severity == "ERROR" for f in res.findings)


def test_flip_and_free_also_under_cp():
    for fault in ("flip", "free_prefetch"):
        sim = L3Sim("sharded", 3, 11, fault)
        want = sim.run(40)
        res = Analysis().run(sim.emitter.events())
        assert {f.rule for f in res.findings} == want == FAULTS[fault]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        L3Sim("ring")
    with pytest.raises(ValueError, match="unknown fault"):
        L3Sim("none", fault="melt")
