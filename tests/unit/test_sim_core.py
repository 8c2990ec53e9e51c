"""The simulated HiRadix cache on its own (no checker): splits, lineage, locks, evict/reload, copies that read
their source at completion, lockstep acks, CP modes, level gating, and the emitted record grammar."""

from __future__ import annotations

import functools
import operator

import numpy as np
import pytest

from cptrace_otel.model.logline import Rng, parse_line, parse_prefix
from cptrace_otel.sim.core import Simulation
from cptrace_otel.sim.faults import FaultPlan
from cptrace_otel.sim.workload import P, Tokens


def recs(sim: Simulation, tag: str, rank: int = 0) -> list[dict]:
    out = []
    for line in sim.emitter.lines[rank]:
        pl = parse_line(line)
        if pl.tag == tag:
            out.append(pl.fields)
    return out


def mk(**kw) -> Simulation:
    opts = dict(mode="none", ranks=1, policy="wt", level=3, page_size=P, dev_pages=8, host_pages=16)
    opts.update(kw)
    return Simulation(**opts)


def test_split_gives_the_new_id_to_the_prefix_and_the_old_id_keeps_the_suffix():
    sim, t = mk(), Tokens()
    a = t(4)
    sim.request(a)
    sim.step()
    sim.request(a[:2 * P] + t(1))
    (sp,) = recs(sim, "split")
    assert sp["node_id"] == 1 and sp["new_id"] == 2 and sp["pre_len"] == 16 and sp["split_len"] == 8
    assert sp["dev_p"] == Rng(8, 0, 7, 0, 7) and sp["dev_c"] == Rng(8, 8, 15, 8, 15)
    assert sp["host_p"].first == 0 and sp["host_c"].last == 15
    rk = sim.ranks_[0]
    p, c = rk.nodes[2], rk.nodes[1]
    assert c.parent is p and p.parent is rk.root and len(p) == 8 and len(c) == 8
    assert c.start == 8 and p.start == 0


def test_a_parameter_changed_takes_effect_at_once_and_a_pool_size_at_the_reset():
    """The ranks' parts hold the simulation's settings, not a copy: a demo segment sets copy delays and pool sizes,
    a test may change a delay mid-run; the pools are made anew at a reset."""
    sim, t = mk(d_w=1), Tokens()
    sim.d_w, sim.dev_pages = 3, 12
    assert sim.cfg.d_w == 3 and sim.ranks_[0].dev.n_pages == 8
    sim.request(t(2))
    sim.step()
    sim.step()
    assert [r for r in recs(sim, "ack") if r["dir"] == "d2h"] == []   # d_w=3: not yet
    sim.step()
    assert [r["op"] for r in recs(sim, "ack") if r["dir"] == "d2h"] == [1]
    sim.reset()
    assert sim.ranks_[0].dev.n_pages == 12


def test_pending_write_is_rewritten_to_the_fragments_prefix_first():
    sim, t = mk(d_w=2), Tokens()
    a = t(4)
    sim.request(a)
    sim.request(a[:P] + t(1))      # split at 4 while op 1 is in flight
    sim.finish()
    (ack,) = [r for r in recs(sim, "ack") if r["dir"] == "d2h" and r["op"] == 1]
    assert ack["node_id"] == 1 and ack["blen"] == 16 and ack["clen"] == 12 and ack["pub"] == [2, 1]


def test_h1_ack_fault_publishes_only_the_suffix():
    sim, t = mk(d_w=2, faults=[FaultPlan("H1_ack")]), Tokens()
    a = t(4)
    sim.request(a)
    sim.request(a[:P] + t(1))
    sim.finish()
    (ack,) = [r for r in recs(sim, "ack") if r["dir"] == "d2h" and r["op"] == 1]
    assert ack["pub"] == [1] and ack["clen"] < ack["blen"]
    assert [(e.code, e.node_id, e.op) for e in sim.oracle.expected(2)] == [("H1", 1, 1)]


def test_lock_ref_propagates_to_the_root_and_write_through_holds_until_the_ack():
    sim, t = mk(d_w=2), Tokens()
    a = t(2)
    sim.request(a, dur=5)
    sim.request(a + t(1), dur=5)
    rk = sim.ranks_[0]
    parent, child = rk.nodes[1], rk.nodes[2]
    # parent: its own request + the child's request (propagated) + its write lock + the child's write lock
    assert parent.lock_ref == 4 and child.lock_ref == 2
    sim.step()
    sim.step()
    assert parent.lock_ref == 2 and child.lock_ref == 1      # both writes acked
    sim.finish()
    assert parent.lock_ref == 0 and child.lock_ref == 0


def test_evict_and_reload_use_new_device_slots_and_bring_back_the_bytes():
    sim, t = mk(), Tokens()
    a = t(3)
    sim.request(a)
    sim.step()
    rk = sim.ranks_[0]
    n = rk.nodes[1]
    before = rk.gather(n.value).copy()
    old_dev = n.value.copy()
    sim.evict_all()
    assert n.value is None and n.host_value is not None
    sim.request(t(2))               # takes the freed pages first
    sim.request(a)                  # host hit: reload
    (rl,) = recs(sim, "reload")
    assert rl["chain"] == [1] and rl["dev"].cnt == 12
    assert n.value.tolist() != old_dev.tolist()      # new slots, not the ones it had
    sim.finish()
    assert np.array_equal(rk.gather(n.value), before)
    h2d = [r for r in recs(sim, "ack") if r["dir"] == "h2d"]
    bk = recs(sim, "backup")[0]
    assert h2d[0]["h"] == bk["h"] and h2d[0]["hp"] == bk["hp"] and h2d[0]["nz"] > 0


def test_a_copy_reads_its_source_when_it_completes_not_when_issued():
    # H4_nolock: the node is evicted and its pages reused before its d2h copy completes -> the host holds the new
    # owner's bytes, while the backup record hashed the node's own bytes at issue.
    sim, t = mk(dev_pages=4, d_w=2, faults=[FaultPlan("H4_nolock")]), Tokens()
    a, u = t(4), t(4)
    sim.request(a)
    rk = sim.ranks_[0]
    n = rk.nodes[1]
    own = rk.gather(n.value).copy()
    host = n.host_value.copy()
    sim.request(u)                  # evicts a (no lock), stores u into the same pages
    foreign = rk.gather(rk.nodes[2].value).copy()
    sim.step()
    sim.step()
    assert np.array_equal(rk.host.data[host], foreign)
    assert not np.array_equal(rk.host.data[host], own)
    assert n.bk is not None and np.array_equal(n.bk, own)


def test_without_the_fault_the_lock_keeps_the_node_and_the_backup_is_faithful():
    sim, t = mk(dev_pages=4, d_w=2), Tokens()
    a, u = t(4), t(4)
    sim.request(a)
    rk = sim.ranks_[0]
    n = rk.nodes[1]
    own = rk.gather(n.value).copy()
    host = n.host_value.copy()
    sim.request(u)                  # cannot evict a (locked): u is not cached
    assert n.value is not None and 2 not in rk.nodes
    sim.finish()
    assert np.array_equal(rk.host.data[host], own)


def test_write_back_backs_up_at_eviction_and_flushes_before_the_free():
    sim, t = mk(policy="wb"), Tokens()
    a = t(2)
    sim.request(a)
    assert recs(sim, "prepare") == []
    sim.evict_all()
    tags = [parse_line(x).tag for x in sim.emitter.lines[0]]
    i_prep, i_ack, i_evict = tags.index("prepare"), tags.index("ack"), tags.index("evict")
    assert i_prep < i_ack < i_evict


def test_acks_pop_the_minimum_ready_count_across_ranks():
    sim, t = mk(mode="replicated", ranks=2, d_w=1), Tokens()
    sim.request(t(2))
    _rk0, rk1 = sim.ranks_
    for rk in sim.ranks_:
        rk.start_writing()                   # the step's queued write starts (step() would do it first)
    rk1.write_q[0].complete_at = 99          # rank 1's copy is slow
    sim.step()
    assert recs(sim, "ack", 0) == [] and recs(sim, "ack", 1) == []
    rk1.write_q[0].complete_at = sim.clock.tick + 1
    sim.step()
    assert len(recs(sim, "ack", 0)) == 1 and len(recs(sim, "ack", 1)) == 1
    assert recs(sim, "ack", 0)[0]["round"] == recs(sim, "ack", 1)[0]["round"]


@pytest.mark.parametrize("mode", ["replicated", "sharded", "dcp", "layersplit", "shared"])
def test_cp_modes_keep_trees_in_lockstep_and_differ_in_content(mode):
    sim, t = mk(mode=mode, ranks=2), Tokens()
    a = t(2)
    sim.request(a)
    sim.finish()
    b0, b1 = recs(sim, "backup", 0)[0], recs(sim, "backup", 1)[0]
    assert b0["node_id"] == b1["node_id"] and b0["dev"] == b1["dev"] and b0["host"] == b1["host"]
    if mode in ("replicated", "shared"):
        assert b0["h"] == b1["h"]
    else:
        assert b0["h"] != b1["h"]
    if mode == "shared":
        assert (b0["io"], b1["io"]) == (1, 0) and b0["hs"] == [b0["h"], b0["h"]]
        assert sim.ranks_[0].host.data is sim.ranks_[1].host.data
    else:
        assert (b0["io"], b1["io"]) == (1, 1)
    if mode == "dcp":
        rk = sim.ranks_[1]
        n = rk.nodes[1]
        data = rk.gather(n.value)
        pos = np.arange(len(n))
        assert np.count_nonzero(data[pos % 2 == 0]) == 0 and np.count_nonzero(data[pos % 2 == 1]) > 0
    if mode == "layersplit":
        cfg0, cfg1 = recs(sim, "config", 0)[0], recs(sim, "config", 1)[0]
        assert (cfg0["layers"], cfg1["layers"]) == ("[0,1)", "[1,2)")


def test_shared_mode_reload_loads_only_owned_pages_per_rank():
    sim, t = mk(mode="shared", ranks=2), Tokens()
    a = t(4)
    sim.request(a)
    sim.step()
    sim.evict_all()
    for rk in sim.ranks_:
        rk.dev.data[:] = 0
    sim.request(a)
    sim.finish()
    rk0, rk1 = sim.ranks_
    dev = rk0.nodes[1].value
    pages = dev // P
    own0 = dev[pages % 2 == 0]
    own1 = dev[pages % 2 == 1]
    assert np.count_nonzero(rk0.dev.data[own0]) > 0 and np.count_nonzero(rk0.dev.data[own1]) == 0
    assert np.count_nonzero(rk1.dev.data[own1]) > 0 and np.count_nonzero(rk1.dev.data[own0]) == 0


def test_level_gating_and_record_grammar():
    for level, forbidden in ((1, {"ack", "free", "compose", "store", "fwd_hash"}), (2, {"fwd_hash"})):
        sim, t = mk(level=level), Tokens()
        a = t(3)
        sim.request(a)
        sim.step()
        sim.evict_all()
        sim.request(a)
        sim.finish()
        tags = set()
        for line in sim.emitter.lines[0]:
            pl = parse_line(line)
            assert pl is not None and not pl.bad_tokens
            assert parse_prefix(pl.prefix).cp_rank == 0
            assert list(pl.fields)[-2:] == ["rank", "ts"]
            tags.add(pl.tag)
        assert not tags & forbidden
        assert {"config", "insert", "prepare", "backup", "evict", "reload"} <= tags
    assert recs(sim, "config")[0]["level"] == 2


def test_ts_is_monotonic_across_ranks_and_reset_restarts_ids():
    sim, t = mk(mode="replicated", ranks=2), Tokens()
    sim.request(t(2))
    sim.reset()
    sim.request(t(2))
    sim.finish()
    evs = sim.emitter.events()
    ts = [e.ts for e in evs]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    ins = [e for e in evs if e.tag == "insert" and e.rank == 0]
    assert [e.node_id for e in ins] == [1, 1] and [e.epoch for e in ins] == [0, 1]


@pytest.mark.parametrize("merge", [True, False])
def test_writes_of_one_round_start_as_one_merged_op(merge):
    """Two requests in one round queue two writes (ops 1, 2): merged, they start as one op with a new id (3) that
    carries one backup and one d2h ack per node (each with its own blen/clen/pub) and one copy of both nodes'
    pages; unmerged, each write is its own op."""
    sim, t = mk(d_w=2, merge=merge), Tokens()
    sim.request(t(2))
    sim.request(t(3))
    rk = sim.ranks_[0]
    sim.step()
    assert len(rk.write_q) == (1 if merge else 2)
    sim.finish()
    assert [p["op"] for p in recs(sim, "prepare")] == [1, 2]
    m1, m2 = (3, 3) if merge else (1, 2)
    assert [(b["op"], b["node_id"]) for b in recs(sim, "backup")] == [(m1, 1), (m2, 2)]
    acks = [(a["op"], a["node_id"], a["blen"], a["clen"], a["pub"]) for a in recs(sim, "ack") if a["dir"] == "d2h"]
    assert acks == [(m1, 1, 8, 8, [1]), (m2, 2, 12, 12, [2])]
    for n in (rk.nodes[1], rk.nodes[2]):     # the one copy read each node's own pages
        assert np.array_equal(rk.host.data[n.host_value], rk.dev.data[n.value])
    assert sim.next_op[0] == (4 if merge else 3)   # the merged id came from the same counter


def test_merged_ops_stay_in_lockstep_across_ranks():
    sim, t = mk(mode="replicated", ranks=2, d_w=1), Tokens()
    sim.request(t(2))
    sim.request(t(1))
    sim.finish()
    for tag in ("prepare", "backup", "ack"):
        r0 = [(x["op"], x["node_id"]) for x in recs(sim, tag, 0)]
        assert r0 == [(x["op"], x["node_id"]) for x in recs(sim, tag, 1)] and r0
    assert {x["op"] for x in recs(sim, "backup", 0)} == {3}


def test_followers_run_ahead_of_the_io_rank_by_lag_ns():
    """``lag_ns``: every rank but the IO rank stamps its records that much earlier; each rank's ts stays monotonic,
    and the followers' stores still precede the IO rank's backup while their acks follow it."""
    from cptrace_otel.sim.tracer import TICK_NS

    sim, t = mk(mode="shared", ranks=3, lag_ns=TICK_NS // 2), Tokens()
    sim.request(t(2))
    sim.finish()
    ts = {r: [parse_line(x).fields["ts"] for x in sim.emitter.lines[r]] for r in range(3)}
    assert all(v == sorted(v) for v in ts.values())
    assert ts[0][0] - ts[1][0] == TICK_NS // 2 - 1   # the config records: rank 1 logs right after rank 0
    (b0,) = [f["ts"] for f in recs(sim, "backup", 0)]
    for r in (1, 2):
        (s,) = [f["ts"] for f in recs(sim, "store", r)]
        (a,) = [f["ts"] for f in recs(sim, "ack", r)]
        assert s < b0 < a


def test_mixed_acks_interleave_a_rounds_directions_differently_per_rank():
    sim, t = mk(mode="replicated", ranks=2, d_w=1, d_l=1, mixed_acks=True), Tokens()
    a = t(3)
    sim.request(a)
    sim.step()
    sim.evict_all()
    sim.request(a)            # a reload (h2d) ...
    sim.request(t(2))         # ... and a write (d2h), acked in the same round
    sim.finish()
    orders = []
    for r in (0, 1):
        acks = [(f["round"], f["dir"]) for f in recs(sim, "ack", r)]
        rounds = {}
        for k, d in acks:
            rounds.setdefault(k, []).append(d)
        orders.append({k: v for k, v in rounds.items() if len(set(v)) > 1})
    assert orders[0] and orders[0].keys() == orders[1].keys()
    assert all(sorted(orders[0][k]) == sorted(orders[1][k]) and orders[0][k] != orders[1][k] for k in orders[0])
    assert [Simulation._ack_order(r, 4, 2, 1) for r in (0, 1, 2)] == [[0, 1, 0], [0, 0, 1], [1, 0, 0]]


def test_c2_round_fault_holds_one_ack_back_for_one_round_on_its_rank_only():
    from cptrace_otel.sim.workload import run_fault

    sim = run_fault("C2_round", "replicated")
    rounds = []
    for r in (0, 1):
        per = {}
        for f in recs(sim, "ack", r):
            per.setdefault(f["round"], []).append(f["node_id"])
        rounds.append(per)
    # every ack, once
    acks = [sorted(functools.reduce(operator.iadd, r.values(), [])) for r in rounds[:2]]
    assert acks[0] == acks[1]
    (k,) = [k for k in rounds[0] if rounds[0][k] != rounds[1].get(k)][:1]
    assert len(rounds[1][k]) == len(rounds[0][k]) - 1 and sim.oracle.injected[0][1] == 1
    assert [(e.code, e.rank) for e in sim.oracle.entries] == [("C2", 1)]
    # the trees stay in step: same structural records on both ranks
    struct = [[x.split("]", 2)[1] + x.split("] ", 2)[2].split(" rank=")[0] for x in sim.emitter.lines[r]
               if any(f"[CPTRACE {t}]" in x for t in ("insert", "split", "prepare", "evict", "reload"))]
              for r in (0, 1)]
    assert struct[0] == struct[1]


def test_sharded_mode_stripes_pages_as_sglang_page_interleave():
    """Mode sharded (SGLang 0.5.23's --enable-kv-cache-sharding): page p of either pool is stored on rank p % R;
    position-page P of a chain is owned by rank (base + P) % R, a new chain's base being the least-full class, an
    extension continuing its chain's and host copies keeping the owners; a rank's backup and reload hashes cover its
    stripe only (hp 0 for other ranks' pages, nz=-1 where it owns none), and the stripes together are the node."""
    R = 4
    sim, t = mk(mode="sharded", ranks=R, dev_pages=16, host_pages=32), Tokens()
    a, b = t(3), t(2)
    sim.request(a)
    sim.request(a + t(2))      # extends a's chain: its pages continue the rotation
    sim.request(b)             # a new chain: the least-full class (a took classes 0-2, then 3-0)
    sim.finish()
    sim.evict_all()
    sim.request(a)             # reload: the device pages keep the host copies' owners
    sim.finish()
    nodes = sim.ranks_[0].nodes
    assert nodes[2].base == nodes[1].base == 0 and nodes[3].base == 1
    for rk in sim.ranks_:
        assert all(n.base == nodes[n.id].base for n in rk.nodes.values())
    for tag in ("backup", "ack"):
        by_node: dict[int, list[dict]] = {}
        for r in range(R):
            for f in recs(sim, tag, r):
                if "hp" in f:
                    by_node.setdefault(f["node_id"], []).append(f)
        assert by_node
        for nid, fs in by_node.items():
            n = nodes[nid]
            owners = [(n.base + n.start // P + j) % R for j in range(len(n) // P)]
            assert len(fs) == R
            for f in fs:
                mine = [o == f["rank"] for o in owners]
                assert [h != 0 for h in f["hp"]] == mine
                assert (f["nz"] == -1) == (not any(mine)) and (f["h"] == 0) == (not any(mine))
    for rk in sim.ranks_:   # the device and host pages of every node are owner-matched on every rank
        for n in rk.nodes.values():
            for slots in (n.value, n.host_value):
                if slots is not None:
                    assert ((slots[::P] // P) % R).tolist() == [(n.base + n.start // P + j) % R
                                                                 for j in range(len(n) // P)]


def test_sharded_one_rank_faults_land_on_rows_that_rank_owns():
    """With 4 ranks the last rank owns no page of many nodes: a one-rank content fault counts only the sites where
    that rank holds rows, so it corrupts something, found on that rank alone. Scripted: a first chain of 3 pages
    (classes 0-2) leaves rank 3 no row, so ZERO_race lands on the second chain, whose base is class 3."""
    from cptrace_otel.sim.workload import analyze, expected_set, found_set, random_workload

    t = Tokens()
    sim = mk(mode="sharded", ranks=4, faults=[FaultPlan("ZERO_race", rank=3)])
    a, b = t(3), t(2)
    sim.request(a)
    sim.request(b)
    for _ in range(3):
        sim.step()
    sim.evict_all()
    sim.request(b)
    sim.finish()
    res = analyze(sim)
    got = found_set(res)
    [(_, rank, nid, _)] = sim.oracle.injected
    assert (rank, sim.ranks_[3].nodes[nid].base) == (3, 3)
    assert got == expected_set(sim, 3, res) and {g[0] for g in got} == {"ZERO", "HASH"} and {g[1] for g in got} == {3}
    found = 0
    for seed in range(4):
        sim = random_workload(seed, "sharded", 4, "wt", level=3, faults=[FaultPlan("HASH_flip", rank=3)])
        res = analyze(sim)
        got = found_set(res)
        assert got == expected_set(sim, 3, res), (seed, [f.message for f in res.findings])
        assert bool(got) == bool(sim.oracle.injected) and {g[1] for g in got} <= {3}
        found += bool(got)
    assert found
