"""The three rule bugs that realistic volumes showed, each with its legal twin:

* C5-fence: stores by the next owner of a node's pages (after a rank gave them up) are not the data the IO rank's
  copy moves; a 1 ns fence margin is legal; the fence's work does not grow with the stores read;
* C2: ack rounds are grouped by ``round=`` when present, and compared per round and direction, whatever the line
  order of the acks inside a round;
* H1a: a split after a level-1 reload is judged against the reloaded slots.
"""

from __future__ import annotations

from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.analyze.sources.logs import read_log_events
from tests.helpers.checks_util import R, check_files, check_lines, write_ranks


def _cfg(r, mode="shared", n=2, level=2):
    return (f"[CPTRACE config] cp_size={n} cp_rank={r} mode={mode} page_size=16 policy=wt level={level} io_rank=0 "
            f"rank={r}")


_write_ts = write_ranks   # every line a (ts, line) pair


def _found(res):
    return [(f.code, f.rule, f.rank, f.node_id, f.op) for f in res.findings]


# -- C5 store fence -----------------------------------------------------------------------------------------------

def _life(r, t0, store_at=None, give_up_at=None, reuse=True, io_evict_at=None, reuse_store_at=None):
    """Mode shared, rank r: node 1 on slots 10..41 is stored (at ``store_at``, default before the backup at t0+20),
    backed up (the IO rank copies at t0+20), acked at t0+30, evicted at ``give_up_at`` (the IO rank: at
    ``io_evict_at`` when given), then node 2 reuses the pages and stores into them at ``reuse_store_at``."""
    io = int(r == 0)
    ev = give_up_at if give_up_at is not None else t0 + 100
    if r == 0 and io_evict_at is not None:
        ev = io_evict_at
    out = [(t0, _cfg(r)),
           (t0 + 1, f"[CPTRACE insert] node_id=1 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}"),
           (store_at if store_at is not None else t0 + 2,
            f"[CPTRACE store] rid=a dev={R(10, 41)} layer=all owner={r} rank={r}"),
           (t0 + 10, f"[CPTRACE prepare] node_id=1 op=1 len=32 dev={R(10, 41)} host={R(50, 81)} policy=wt rank={r}"),
           (t0 + 20, f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(50, 81)} io={io} rank={r}"),
           (t0 + 30, f"[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank={r}"),
           (ev, f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank={r}"),
           (ev + 1, f"[CPTRACE free] pool=dev idx={R(10, 41)} node_id=1 why=evict rank={r}")]
    if reuse:
        rs = reuse_store_at if reuse_store_at is not None else ev + 2
        out += [(rs, f"[CPTRACE store] rid=b dev={R(10, 41)} layer=all owner={r} rank={r}"),
                (rs + 1, f"[CPTRACE insert] node_id=2 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}")]
    out.sort(key=lambda x: x[0])
    return out


def test_c5_store_by_the_next_owner_on_a_rank_ahead_of_the_io_rank_is_legal(tmp_path):
    """The follower gives node 1's pages up (and the next request stores its own KV into them) long before the IO
    rank logs its eviction of node 1: the ranks are not in step in time. That store writes node 2's KV; the copy
    of node 1 was acked long before (the 473 false findings of a healthy long shared run)."""
    per = {0: _life(0, 1000, io_evict_at=900_000), 1: _life(1, 1000, give_up_at=5000)}
    res = check_files(_write_ts(tmp_path, per))
    assert res.findings == [], [f.message for f in res.findings]
    # the same run with the follower's store of node 1's own data late: found, on the IO rank's backup
    per = {0: _life(0, 1000, io_evict_at=900_000), 1: _life(1, 1000, store_at=1025, give_up_at=5000)}
    res = check_files(_write_ts(tmp_path, per))
    assert _found(res) == [("C5", "C5-fence", 0, 1, 1)]
    assert "landed 5 ns after" in res.findings[0].message


def test_c5_reuse_store_after_the_ack_and_the_eviction_is_legal_on_every_rank(tmp_path):
    for r_ahead in (0, 1):
        per = {r: _life(r, 1000, give_up_at=2000 if r == r_ahead else 80_000) for r in (0, 1)}
        res = check_files(_write_ts(tmp_path, per))
        assert res.findings == [], (r_ahead, [f.message for f in res.findings])


def test_c5_a_late_store_after_the_ack_but_before_the_pages_are_given_up_is_found(tmp_path):
    """The store of node 1's own data lands after the copy (and even after the d2h ack): the pages still hold node
    1's KV on that rank, so the copy missed it (fault ZERO_race in mode shared)."""
    per = {0: _life(0, 1000), 1: _life(1, 1000, store_at=1040)}
    res = check_files(_write_ts(tmp_path, per))
    assert _found(res) == [("C5", "C5-fence", 0, 1, 1)]


def test_c5_fence_margin_of_one_ns_is_legal_and_one_ns_late_is_not(tmp_path):
    per = {0: _life(0, 1000, store_at=1019), 1: _life(1, 1000, store_at=1019)}
    assert check_files(_write_ts(tmp_path, per)).findings == []
    per = {0: _life(0, 1000, store_at=1020), 1: _life(1, 1000, store_at=1020)}   # same ns as the backup
    assert check_files(_write_ts(tmp_path, per)).findings == []
    per = {0: _life(0, 1000), 1: _life(1, 1000, store_at=1021)}
    res = check_files(_write_ts(tmp_path, per))
    assert _found(res) == [("C5", "C5-fence", 0, 1, 1)] and "landed 1 ns after" in res.findings[0].message
    # the release side: the follower gives the pages up 1 ns before the next owner's store, which lands 1 ns
    # before the IO rank logs its own eviction
    per = {0: _life(0, 1000, io_evict_at=5003, reuse_store_at=5005), 1: _life(1, 1000, give_up_at=5000)}
    assert check_files(_write_ts(tmp_path, per)).findings == []


def _events(paths):
    return list(read_log_events(paths))


def test_c5_records_read_before_the_io_ranks_backup_are_judged_the_same(tmp_path):
    """Any interleaving that keeps each rank's order: the follower's whole stream first (its late store, its end of
    the tenure and the next owner's store are read before the IO rank's backup), then the IO rank's."""
    for late, want in ((False, []), (True, [("C5", "C5-fence", 0, 1, 1)])):
        per = {0: _life(0, 1000, io_evict_at=900_000),
               1: _life(1, 1000, store_at=1025 if late else None, give_up_at=5000)}
        ev = _events(_write_ts(tmp_path, per))
        for order in (sorted(ev, key=lambda e: (-e.rank, e.seq)), sorted(ev, key=lambda e: (e.rank, e.seq))):
            assert _found(Analysis(None).run(order)) == want, (late, order[0].rank)


def test_c5_a_split_fragment_given_up_ends_the_tenure_of_its_pages(tmp_path):
    """Node 1 is split after its backup; the follower evicts the prefix fragment (node 3) and a new node stores into
    those pages, while the IO rank logs the eviction later: the store is the next owner's."""
    def lines(r, ev_at):
        io = int(r == 0)
        out = [(1, _cfg(r)),
               (2, f"[CPTRACE insert] node_id=1 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}"),
               (3, f"[CPTRACE store] rid=a dev={R(10, 41)} layer=all owner={r} rank={r}"),
               (4, f"[CPTRACE prepare] node_id=1 op=1 len=32 dev={R(10, 41)} host={R(50, 81)} policy=wt rank={r}"),
               (5, f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(50, 81)} io={io} rank={r}"),
               (6, f"[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank={r}"),
               (7, f"[CPTRACE split] node_id=1 new_id=3 parent=0 pre_len=32 split_len=16 dev_p={R(10, 25)} "
                   f"dev_c={R(26, 41)} host_p={R(50, 65)} host_c={R(66, 81)} pend=-1 rank={r}"),
               (ev_at, f"[CPTRACE evict] tier=dev node_id=3 kind=backuped dev={R(10, 25)} rank={r}"),
               (ev_at + 1, f"[CPTRACE store] rid=b dev={R(10, 25)} layer=all owner={r} rank={r}"),
               (ev_at + 2, f"[CPTRACE insert] node_id=4 parent=0 len=16 dev={R(10, 25)} kind=new rank={r}")]
        return sorted(out)
    res = check_files(_write_ts(tmp_path, {0: lines(0, 9000), 1: lines(1, 100)}))
    assert res.findings == [], [f.message for f in res.findings]


def test_c5_fence_work_follows_the_resident_nodes_not_the_stores_read():
    """A long shared run that reuses the same pages again and again: the windows left in the fence's index stay as
    few as the nodes holding pages, so a store tests a bounded number of windows."""
    from cptrace_otel.checks.fence import StoreFence
    from cptrace_otel.model.events import Event
    from cptrace_otel.model.logline import parse_line

    fence = StoreFence()
    fence.group = 2
    seq = {0: 0, 1: 0}
    peak = 0

    def feed(r, ts, body):
        seq[r] += 1
        pl = parse_line(body + f" rank={r} ts={ts}")
        fence.feed(Event(pl.tag, r, seq[r], ts, 0, pl.fields))

    ts = 1000
    for i in range(1, 3001):
        lo = (i % 4) * 64
        d = R(lo, lo + 31)
        for r in (0, 1):
            feed(r, ts + r, f"[CPTRACE store] rid=q{i} dev={d} layer=all owner={r}")
        for r in (0, 1):
            feed(r, ts + 10 + r, f"[CPTRACE backup] op={i} node_id={i} dev={d} host={R(0, 31)} io={int(r == 0)}")
        for r in (0, 1):
            # the follower runs ahead: it gives the pages up before the IO rank does
            feed(r, ts + (40 if r == 0 else 20), f"[CPTRACE evict] tier=dev node_id={i} kind=backuped dev={d}")
        ts += 100
        peak = max(peak, sum(len(v) for v in fence.windows.values()))
    assert fence.findings == []
    assert peak <= 2 and len(fence.by_node) <= 1, (peak, len(fence.by_node))


# -- C2 ack rounds ----------------------------------------------------------------------------------------------

def _round_run(r, order, round2=2, free_between=False, ops=None):
    """Mode replicated, rank r: node 4 backed up (round 1), evicted and reloaded (op 5); nodes 1-3 backed up (ops
    2-4); round 2 acks the three writes and the load, in ``order`` (node ids; 4 is the h2d ack)."""
    io = 1
    out = [_cfg(r, "replicated")]
    for n, lo in ((4, 400), (1, 100), (2, 200), (3, 300)):
        out.append(f"[CPTRACE insert] node_id={n} parent=0 len=32 dev={R(lo, lo + 31)} kind=new rank={r}")
    out += [f"[CPTRACE prepare] node_id=4 op=1 len=32 dev={R(400, 431)} host={R(0, 31)} policy=wt rank={r}",
            f"[CPTRACE backup] op=1 node_id=4 dev={R(400, 431)} host={R(0, 31)} io={io} rank={r}",
            f"[CPTRACE ack] dir=d2h op=1 node_id=4 blen=32 clen=32 pub=[4] round=1 rank={r}",
            f"[CPTRACE evict] tier=dev node_id=4 kind=backuped dev={R(400, 431)} rank={r}",
            f"[CPTRACE reload] node_id=4 chain=[4] op=5 host={R(0, 31)} dev={R(500, 531)} rank={r}"]
    for n, op, lo, hlo in ((1, 2, 100, 32), (2, 3, 200, 64), (3, 4, 300, 96)):
        out += [f"[CPTRACE prepare] node_id={n} op={op} len=32 dev={R(lo, lo + 31)} host={R(hlo, hlo + 31)} "
                f"policy=wt rank={r}",
                f"[CPTRACE backup] op={op} node_id={n} dev={R(lo, lo + 31)} host={R(hlo, hlo + 31)} io={io} rank={r}"]
    op_of = ops or {1: 2, 2: 3, 3: 4}
    for n in order:
        if n == 4:
            out.append(f"[CPTRACE ack] dir=h2d op=5 node_id=4 round={round2} rank={r}")
        else:
            out.append(f"[CPTRACE ack] dir=d2h op={op_of[n]} node_id={n} blen=32 clen=32 pub=[{n}] "
                       f"round={round2} rank={r}")
        if free_between:
            out.append(f"[CPTRACE rid_map] rid=x{n} node_id={n} hit=dev rank={r}")
    out += [f"[CPTRACE rid_map] rid=z node_id=1 hit=dev rank={r}",
            f"[CPTRACE insert] node_id=6 parent=0 len=16 dev={R(600, 615)} kind=new rank={r}"]
    return out


_write_seq = write_ranks   # ts: the line order


def test_c2_a_round_logged_in_another_order_on_one_rank_is_legal(tmp_path):
    """Rank 1 logs the round's h2d ack between its d2h acks (SGLang drains both ack queues in one round), and
    records of other tags between the acks: the round holds the same ops and nodes per direction on both ranks."""
    for order1, between in (([1, 4, 2, 3], False), ([4, 3, 2, 1], False), ([1, 2, 4, 3], True)):
        per = {0: _round_run(0, [1, 2, 3, 4]), 1: _round_run(1, order1, free_between=between)}
        res = check_files(_write_seq(tmp_path, per))
        assert res.findings == [], (order1, [f.message for f in res.findings])


def test_c2_a_round_with_another_op_set_on_one_rank_is_found(tmp_path):
    """Rank 1 acks node 3 a round later (its round 2 holds two of the three writes): C2 on rank 1."""
    r1 = _round_run(1, [1, 4, 2])
    i = next(k for k, x in enumerate(r1) if "rid=z" in x)
    r1.insert(i, "[CPTRACE ack] dir=d2h op=4 node_id=3 blen=32 clen=32 pub=[3] round=3 rank=1")
    per = {0: _round_run(0, [1, 2, 3, 4]), 1: r1}
    res = check_files(_write_seq(tmp_path, per))
    assert [(f.code, f.rank, f.node_id) for f in res.findings] == [("C2", 1, 3)], [f.message for f in res.findings]
    assert "dir=d2h ops=2 nodes=[1, 2]; expected dir=d2h ops=3 nodes=[1, 2, 3]" in res.findings[0].message


def test_c2_without_round_keys_still_splits_at_other_records(tmp_path):
    """The fallback: without round= a round is a run of consecutive acks of one direction; the reordered log of
    the first test is then a mismatch (the records themselves cannot tell the rounds apart)."""
    strip = [x.replace(" round=2", "").replace(" round=1", "") for x in _round_run(1, [1, 4, 2, 3])]
    per = {0: [x.replace(" round=2", "").replace(" round=1", "") for x in _round_run(0, [1, 2, 3, 4])], 1: strip}
    res = check_files(_write_seq(tmp_path, per))
    assert {f.code for f in res.findings} == {"C2"}


# -- H1a after a level-1 reload ---------------------------------------------------------------------------------

def _reload_split(dev_p, dev_c):
    """Level 1 (no ack records), rng summaries only: node 1 backed up from slots 10..41, evicted, reloaded into
    100..131 (sync=1), then split 16+16 with the given device halves."""
    lines = ["[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wt level=1 rank=0",
             f"[CPTRACE insert] node_id=1 parent=0 len=32 dev={R(10, 41)} kind=new rank=0",
             f"[CPTRACE prepare] node_id=1 op=1 len=32 dev={R(10, 41)} host={R(0, 31)} policy=wt rank=0",
             f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(0, 31)} io=1 h=5 nz=9 rank=0",
             f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank=0",
             f"[CPTRACE reload] node_id=1 chain=[1] op=2 host={R(0, 31)} dev={R(100, 131)} sync=1 h=5 nz=9 rank=0",
             f"[CPTRACE split] node_id=1 new_id=2 parent=0 pre_len=32 split_len=16 dev_p={R(*dev_p)} "
             f"dev_c={R(*dev_c)} host_p={R(0, 15)} host_c={R(16, 31)} pend=-1 rank=0"]
    return [f"{x} ts={1000 + i}" for i, x in enumerate(lines)]


def test_h1a_split_from_the_stale_pre_eviction_slots_after_a_reload_is_found(tmp_path):
    res = check_lines(tmp_path, _reload_split((10, 25), (26, 41)))
    assert [(f.code, f.rule, f.node_id) for f in res.findings] == [("H1", "H1a", 1)], [f.message for f in res.findings]
    assert "dev_p.first=10 but the node's dev started at 100" in res.findings[0].message


def test_h1a_split_from_the_reloaded_slots_is_legal(tmp_path):
    res = check_lines(tmp_path, _reload_split((100, 115), (116, 131)))
    assert res.findings == [], [f.message for f in res.findings]


def test_h1a_split_of_an_evicted_node_with_dev_slots_is_found_and_without_is_legal(tmp_path):
    base = [x for x in _reload_split((10, 25), (26, 41)) if "[CPTRACE reload]" not in x and "[CPTRACE split]" not in x]
    split = ("[CPTRACE split] node_id=1 new_id=2 parent=0 pre_len=32 split_len=16 dev_p={} dev_c={} "
             f"host_p={R(0, 15)} host_c={R(16, 31)} pend=-1 rank=0 ts=2000")
    res = check_lines(tmp_path, base + [split.format("(none)", "(none)")])
    assert res.findings == [], [f.message for f in res.findings]
    res = check_lines(tmp_path, base + [split.format(R(10, 25), R(26, 41))])
    assert [(f.rule, f.node_id) for f in res.findings] == [("H1a", 1)]
    assert "evicted from the device split into fragments with dev slots" in res.findings[0].message


def test_c5_a_follower_flush_stamped_before_the_io_ranks_backup_ends_its_tenure_there(tmp_path):
    """write_back: a follower runs its whole flush (backup io=0, ack, eviction, free) before the IO rank's backup is
    stamped, then stores the next owner's KV into the pages after it: that store is not node 1's data. The same
    follower storing node 1's own data after the IO rank's backup, before its eviction, is found."""
    def lines(r, late):
        io = int(r == 0)
        t = 1000 if r == 0 else 940   # the follower runs ahead
        give_up = 1200 if late else t + 3
        out = [(1, _cfg(r)),
               (2, f"[CPTRACE insert] node_id=1 parent=0 len=32 dev={R(10, 41)} kind=new rank={r}"),
               (1100 if late else 3, f"[CPTRACE store] rid=a dev={R(10, 41)} layer=all owner={r} rank={r}"),
               (t, f"[CPTRACE prepare] node_id=1 op=1 len=32 dev={R(10, 41)} host={R(50, 81)} policy=wb rank={r}"),
               (t + 1, f"[CPTRACE backup] op=1 node_id=1 dev={R(10, 41)} host={R(50, 81)} io={io} rank={r}"),
               (t + 2, f"[CPTRACE ack] dir=d2h op=1 node_id=1 blen=32 clen=32 pub=[1] rank={r}"),
               (give_up, f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank={r}"),
               (give_up + 1, f"[CPTRACE free] pool=dev idx={R(10, 41)} node_id=1 why=evict rank={r}"),
               (1300, f"[CPTRACE store] rid=b dev={R(10, 25)} layer=all owner={r} rank={r}")]
        if not late:
            out.append((1050, f"[CPTRACE store] rid=b dev={R(10, 25)} layer=all owner={r} rank={r}"))
        return sorted(out)
    res = check_files(_write_ts(tmp_path, {0: lines(0, False), 1: lines(1, False)}))
    assert res.findings == [], [f.message for f in res.findings]
    res = check_files(_write_ts(tmp_path, {0: lines(0, False), 1: lines(1, True)}))
    assert _found(res) == [("C5", "C5-fence", 0, 1, 1)]


# -- readings where the domain reference leaves a case open (docs/rules.md) -------------------------------------------

def _chain_reload(between: str | None, before: str | None = None):
    """Level 2: nodes 1 (parent) and 2 backed up and acked, both evicted, reloaded as one chain (op 5), then the
    per-node h2d acks of op 5, with ``between`` logged between them (``before``: before the first)."""
    lines = ["[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=16 policy=wt level=2 rank=0"]
    for n, lo, hlo, par in ((1, 10, 0, 0), (2, 42, 32, 1)):
        lines += [f"[CPTRACE insert] node_id={n} parent={par} len=32 dev={R(lo, lo + 31)} kind=new rank=0",
                  f"[CPTRACE prepare] node_id={n} op={n} len=32 dev={R(lo, lo + 31)} host={R(hlo, hlo + 31)} "
                  "policy=wt rank=0",
                  f"[CPTRACE backup] op={n} node_id={n} dev={R(lo, lo + 31)} host={R(hlo, hlo + 31)} io=1 rank=0",
                  f"[CPTRACE ack] dir=d2h op={n} node_id={n} blen=32 clen=32 pub=[{n}] rank=0"]
    lines += [f"[CPTRACE evict] tier=dev node_id=2 kind=backuped dev={R(42, 73)} rank=0",
              f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(10, 41)} rank=0",
              f"[CPTRACE reload] node_id=2 chain=[1,2] op=5 host={R(0, 63)} dev={R(100, 163)} hostx=0-63 "
              "devx=100-163 rank=0"]
    if before:
        lines.append(before)
    lines.append("[CPTRACE ack] dir=h2d op=5 node_id=1 rank=0")
    if between:
        lines.append(between)
    lines.append("[CPTRACE ack] dir=h2d op=5 node_id=2 rank=0")
    return [f"{x} ts={1000 + i}" for i, x in enumerate(lines)]


def test_h2c_a_host_free_between_the_per_node_h2d_acks_of_one_op_is_after_the_ack(tmp_path):
    """loading_check synchronizes the whole op before it logs a record per chain node: the op's first ``ack
    dir=h2d`` record closes its load, so a host free between its per-node records is after the ack (legal); before
    the first one it is H2c."""
    free = f"[CPTRACE free] pool=host idx={R(32, 63)} node_id=2 why=evict rank=0"
    assert check_lines(tmp_path, _chain_reload(free)).findings == []
    res = check_lines(tmp_path, _chain_reload(None, before=free))
    assert [(f.rule, f.node_id, f.op) for f in res.findings] == [("H2c", 2, 5)], [f.message for f in res.findings]
