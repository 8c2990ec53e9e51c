"""Cross-rank rules C1-C5 over per-rank log files (docs/domain.md §5)."""

from __future__ import annotations

from tests.helpers.checks_util import R, check_files, write_ranks


def _node(r, node, op, dev, host, h=None, io=1, hs=None, extra_backup=""):
    n = dev[1] - dev[0] + 1
    hb = f" h={h}" if h is not None else ""
    hsb = f" hs=[{','.join(map(str, hs))}]" if hs is not None else ""
    return [
        f"[CPTRACE insert] node_id={node} parent=0 len={n} dev={R(*dev)} kind=new rank={r}",
        f"[CPTRACE prepare] node_id={node} op={op} len={n} dev={R(*dev)} host={R(*host)} policy=wt rank={r}",
        f"[CPTRACE backup] op={op} node_id={node} dev={R(*dev)} host={R(*host)} io={io}{hb}{hsb} nz=4{extra_backup} "
        f"rank={r}",
        f"[CPTRACE ack] dir=d2h op={op} node_id={node} blen={n} clen={n} pub=[{node}] rank={r}",
    ]


_write = write_ranks   # ts: the line order, identical across ranks (lockstep)


def _cfg(r, mode, n=2, io_rank=0):
    return [f"[CPTRACE config] cp_size={n} cp_rank={r} mode={mode} page_size=16 policy=wt level=2 io_rank={io_rank} "
            f"rank={r}"]


def _clean(r, mode="replicated", n_nodes=3, **kw):
    out = _cfg(r, mode, **kw)
    for i in range(1, n_nodes + 1):
        out += _node(r, i, i, (i * 100, i * 100 + 31), (i * 50, i * 50 + 31), h=7 * i)
    return out


def found(res):
    return {(f.code, f.rank, f.node_id) for f in res.findings}


def test_lockstep_ranks_are_clean(tmp_path):
    for mode in ("replicated", "sharded", "dcp", "layersplit"):
        res = check_files(_write(tmp_path, {r: _clean(r, mode) for r in (0, 1)}))
        assert res.findings == [], (mode, [f.message for f in res.findings])


def test_c1_and_c3_when_one_rank_skips_a_backup(tmp_path):
    r0 = _clean(0)
    r1 = _clean(1)
    del r1[1 + 4 + 1: 1 + 4 + 4]  # rank 1: node 2 inserted but never prepared/backed up/acked
    res = check_files(_write(tmp_path, {0: r0, 1: r1}))
    assert found(res) == {("C1", 1, 2), ("C3", 1, 2)}
    c1 = next(f for f in res.findings if f.code == "C1")
    assert c1.op == 2 and "prepare" in c1.message


def test_c1_majority_names_the_deviating_rank(tmp_path):
    ranks = {r: _clean(r, n=3) for r in (0, 1, 2)}
    ranks[2][1 + 4 + 1] = ranks[2][1 + 4 + 1].replace("len=32", "len=16")
    res = check_files(_write(tmp_path, ranks))
    assert {(f.code, f.rank) for f in res.findings if f.code == "C1"} == {("C1", 2)}


def test_joins_stop_after_divergence(tmp_path):
    r0 = _clean(0, n_nodes=4)
    r1 = _clean(1, n_nodes=4)
    # rank 1 diverges at node 2's insert, and later node ids differ in meaning: no C3/C4/C5 about them
    r1[1 + 4] = r1[1 + 4].replace("len=32", "len=24")
    r1[1 + 12 + 2] = r1[1 + 12 + 2].replace("io=1", "io=0")
    res = check_files(_write(tmp_path, {0: r0, 1: r1}))
    assert {f.code for f in res.findings} == {"C1"}


def test_c2_ack_rounds_differ(tmp_path):
    r0 = _cfg(0, "replicated")
    r1 = _cfg(1, "replicated")
    for r, out in ((0, r0), (1, r1)):
        for i in (1, 2):
            out += _node(r, i, i, (i * 100, i * 100 + 31), (i * 50, i * 50 + 31))[:3]
    # rank 0 pops both acks in one round, rank 1 only one (MIN-reduction broken)
    r0 += ["[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank=0",
           "[CPTRACE ack] dir=d2h op=2 node_id=2 blen=32 clen=32 pub=[2] rank=0"]
    r1 += ["[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank=1",
           "[CPTRACE rid_map] rid=a node_id=1 hit=dev rank=1",
           "[CPTRACE ack] dir=d2h op=2 node_id=2 blen=32 clen=32 pub=[2] rank=1"]
    r0 += ["[CPTRACE rid_map] rid=a node_id=1 hit=dev rank=0"]
    res = check_files(_write(tmp_path, {0: r0, 1: r1}))
    assert {f.code for f in res.findings} == {"C2"}


def test_c3_sharded_writer_with_io_0(tmp_path):
    r1 = _clean(1, "sharded")
    r1[1 + 4 + 2] = r1[1 + 4 + 2].replace("io=1", "io=0")
    res = check_files(_write(tmp_path, {0: _clean(0, "sharded"), 1: r1}))
    assert found(res) == {("C3", 1, 2)}


def test_c3_shared_io_rank_and_host_agreement(tmp_path):
    def shared(r, io_of_2=None, host2=(100, 131)):
        out = _cfg(r, "shared")
        out += _node(r, 1, 1, (10, 41), (50, 81), io=1 if r == 0 else 0)
        out += _node(r, 2, 2, (200, 231), host2, io=(io_of_2 if io_of_2 is not None else (1 if r == 0 else 0)))
        return out
    assert check_files(_write(tmp_path, {0: shared(0), 1: shared(1)})).findings == []
    res = check_files(_write(tmp_path, {0: shared(0), 1: shared(1, io_of_2=1)}))
    assert found(res) == {("C3", 1, 2)}
    res = check_files(_write(tmp_path, {0: shared(0), 1: shared(1, host2=(132, 163))}))
    assert {(f.code, f.node_id) for f in res.findings} == {("C3", 2)}


def test_c4_counts_differ(tmp_path):
    r1 = _clean(1)
    r1[1 + 1] = r1[1 + 1].replace(f"host={R(50, 81)}", "host=(cnt=16,min=50,max=65,first=50,last=65)")
    res = check_files(_write(tmp_path, {0: _clean(0), 1: r1}))
    assert found(res) == {("C4", 1, 1)}


def test_c5_replicated_backup_hash_differs(tmp_path):
    for mode in ("replicated", "prefill_cp"):   # prefill_cp: stock SGLang prefill CP writes the whole KV everywhere
        ranks = {r: _clean(r, mode, n=3) for r in (0, 1, 2)}
        assert check_files(_write(tmp_path, ranks)).findings == []
        ranks[1][1 + 4 + 2] = ranks[1][1 + 4 + 2].replace("h=14", "h=99")
        res = check_files(_write(tmp_path, ranks))
        assert found(res) == {("C5", 1, 2)}, mode
        assert f"mode {mode}" in res.findings[0].message
    # two ranks that differ: no majority; the finding is on the higher rank in every run, and says why
    for bad in (0, 1):
        ranks = {r: _clean(r, "prefill_cp", n=3) for r in (0, 1)}
        ranks[bad][1 + 4 + 2] = ranks[bad][1 + 4 + 2].replace("h=14", "h=99")
        res = check_files(_write(tmp_path, ranks))
        assert found(res) == {("C5", 1, 2)} and "no majority" in res.findings[0].message
    ranks = {r: _clean(r, "sharded", n=3) for r in (0, 1, 2)}   # shards differ: no equality
    ranks[1][1 + 4 + 2] = ranks[1][1 + 4 + 2].replace("h=14", "h=99")
    assert check_files(_write(tmp_path, ranks)).findings == []


def test_c5_shared_reload_hash_against_io_rank_hs(tmp_path):
    def shared(r, reload_h):
        out = _cfg(r, "shared")
        out += _node(r, 1, 1, (10, 41), (50, 81), io=1 if r == 0 else 0, hs=[111, 222] if r == 0 else None)
        out += [f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank={r}",
                f"[CPTRACE reload] node_id=1 chain=[1] op=2 host={R(50, 81)} dev={R(300, 331)} rank={r}",
                f"[CPTRACE ack] dir=h2d op=2 node_id=1 h={reload_h} nz=5 rank={r}"]
        return out
    assert check_files(_write(tmp_path, {0: shared(0, 111), 1: shared(1, 222)})).findings == []
    res = check_files(_write(tmp_path, {0: shared(0, 111), 1: shared(1, 223)}))
    assert found(res) == {("C5", 1, 1)}


def test_long_files_merged_in_chunks_give_no_false_joins(tmp_path):
    """More records than one read chunk per rank: the joins must wait for the other rank."""
    ranks = {r: _clean(r, n_nodes=400) for r in (0, 1)}
    res = check_files(_write(tmp_path, ranks))
    assert res.findings == [] and res.stats["events"] == 2 * (1 + 400 * 4)


def test_single_rank_and_level_1_unchecked(tmp_path):
    res = check_files(_write(tmp_path, {0: _clean(0)}))
    assert res.findings == [] and not [u for u in res.unchecked if u.code.startswith("C")]
    lines = {r: [x.replace("level=2", "level=1") for x in _clean(r) if "[CPTRACE ack]" not in x] for r in (0, 1)}
    res = check_files(_write(tmp_path, lines))
    assert "C2" in {u.rule for u in res.unchecked if u.kind == "level"}


def _fence_run(tmp_path, late_store: bool):
    """Mode shared: both ranks store node 1's pages, then the IO rank (0) backs them up; with ``late_store`` rank
    1's store lands after the backup began (the pre-copy fence is missing)."""
    ranks = {}
    for r in (0, 1):
        out = _cfg(r, "shared")
        out.append(f"[CPTRACE insert] node_id=1 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}")
        store = f"[CPTRACE store] rid=a dev={R(10, 41)} layer=all owner={r} rank={r}"
        if not (late_store and r == 1):
            out.append(store)
        out += [f"[CPTRACE prepare] node_id=1 op=1 len=32 dev={R(10, 41)} host={R(50, 81)} policy=wt rank={r}",
                f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(50, 81)} io={1 if r == 0 else 0} rank={r}",
                f"[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank={r}"]
        if late_store and r == 1:
            out.append(store)   # ts: after the IO rank's backup (the line order is the time in these files)
        # later: the pages are given up and reused by node 2, whose store is legal
        out += [f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank={r}",
                f"[CPTRACE insert] node_id=2 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}",
                f"[CPTRACE store] rid=b dev={R(10, 41)} layer=all owner={r} rank={r}"]
        ranks[r] = out
    return check_files(_write(tmp_path, ranks))


def test_c5_store_fence_shared(tmp_path):
    res = _fence_run(tmp_path, late_store=False)
    assert res.findings == [] and "C5-fence" not in {u.rule for u in res.unchecked}
    res = _fence_run(tmp_path, late_store=True)
    assert [(f.code, f.rule, f.rank, f.node_id, f.op) for f in res.findings] == [("C5", "C5-fence", 0, 1, 1)]


def _ins(r, node, n, dev):
    return f"[CPTRACE insert] node_id={node} parent=0 len={n} dev={R(*dev)} kind=new rank={r}"


def _prep(r, node, op, n, dev, host, io):
    return [f"[CPTRACE prepare] node_id={node} op={op} len={n} dev={R(*dev)} host={R(*host)} policy=wt rank={r}",
            f"[CPTRACE backup] op={op} node_id={node} dev={R(*dev)} host={R(*host)} io={io} rank={r}"]


def test_store_fence_stops_at_the_c1_divergence(tmp_path):
    """Mode shared: after the trees diverge (structural record #2), rank 1 reuses, for its own node, pages the IO
    rank's node 1 still holds, and stores into them after the IO rank's backup. The pages no longer mean the same
    node on both ranks (docs/domain.md §5, pitfall): C1 reports the divergence, the fence does not judge that store."""
    ranks = {}
    for r in (0, 1):
        out = _cfg(r, "shared")
        out += [_ins(r, 1, 32, (10, 41)), f"[CPTRACE store] rid=a dev={R(10, 41)} layer=all owner={r} rank={r}"]
        out += _prep(r, 1, 1, 32, (10, 41), (50, 81), int(r == 0))
        out.append(f"[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank={r}")
        if r == 0:
            out += [_ins(0, 2, 32, (100, 131)), f"[CPTRACE store] rid=b dev={R(100, 131)} layer=all owner=0 rank=0"]
        else:   # rank 1's tree diverged: its node 2 took node 1's pages (node 1 is gone from its tree)
            out += [_ins(1, 2, 16, (10, 25)), f"[CPTRACE store] rid=b dev={R(10, 25)} layer=all owner=1 rank=1"]
        ranks[r] = out
    res = check_files(_write(tmp_path, ranks))
    assert [(f.code, f.rule, f.rank, f.node_id) for f in res.findings] == [("C1", "C1", 1, 2)]


def test_c2_mismatch_past_the_divergence_is_dropped_even_when_c1_finds_it_later(tmp_path):
    """Rank 1 skips node 2's backup (C1 #3). Its ack round closes before rank 1 logs another structural record, so
    C2 compares the rounds before C1 can tell the divergence; the rounds come after the divergence index, so C2
    (which stops there) must not report them, whatever the order in which the two are decided."""
    ranks = {}
    for r in (0, 1):
        out = _cfg(r, "replicated")
        out += [_ins(r, 1, 32, (10, 41)), _prep(r, 1, 1, 32, (10, 41), (50, 81), 1)[0], _ins(r, 2, 32, (100, 131))]
        if r == 0:
            out += [_prep(0, 2, 2, 32, (100, 131), (82, 113), 1)[0],
                    f"[CPTRACE backup] op=3 node_id=1 dev={R(10, 41)} host={R(50, 81)} io=1 rank=0",
                    f"[CPTRACE backup] op=3 node_id=2 dev={R(100, 131)} host={R(82, 113)} io=1 rank=0",
                    "[CPTRACE ack] dir=d2h op=3 node_id=1 blen=32 clen=32 pub=[1] round=1 rank=0",
                    "[CPTRACE ack] dir=d2h op=3 node_id=2 blen=32 clen=32 pub=[2] round=1 rank=0"]
        else:
            out += [f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(50, 81)} io=1 rank=1",
                    "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] round=1 rank=1"]
        out += [f"[CPTRACE rid_map] rid=b node_id=2 hit=dev rank={r}", _ins(r, 3, 16, (200, 215))]
        ranks[r] = out
    res = check_files(_write(tmp_path, ranks))
    assert found(res) == {("C1", 1, 2), ("C3", 1, 2)}, [f.message for f in res.findings]


def test_a_prepare_logged_after_the_divergence_index_is_not_judged(tmp_path):
    """Mode shared: rank 1 skips node 1's backup, so its prepare of node 2 is its record #2 where rank 0 has node
    1's, and rank 0 prepares node 2 one record later (#3), with another host range (the shadow allocators
    drifted). The join of node 2 is complete before C1 can decide (it waits for a tie-break): it must wait for
    C1, then judge only records at or before the divergence: no C3 about node 2 on either rank."""
    ranks = {}
    for r in (0, 1):
        out = _cfg(r, "shared") + [_ins(r, 1, 32, (10, 41)), _ins(r, 2, 32, (100, 131))]
        if r == 0:
            out += _prep(0, 1, 1, 32, (10, 41), (50, 81), 1) + _prep(0, 2, 2, 32, (100, 131), (82, 113), 1)
        else:
            out += _prep(1, 2, 1, 32, (100, 131), (50, 81), 0)
        ranks[r] = out
    res = check_files(_write(tmp_path, ranks))
    assert found(res) == {("C1", 1, 1), ("C3", 1, 1)}, [f.message for f in res.findings]
