"""The L3 storage tier (cptrace_otel.model.l3): rules L3a (content survives the round trip), L3b (pages held through the
transfer), L3c/L3d (every CP shard written, under keys of its own), and the l3-backup / l3-prefetch stage spans.

Records are upstream log lines as an emitter at SGLang's storage paths writes them (keys: page hash + the file
backend's rank suffix; hp: one fingerprint per page)."""

from __future__ import annotations

from cptrace_otel import cli
from tests.helpers.checks_util import R, check_files, check_lines, rules, write_ranks
from tests.helpers.otlp_receiver import read_jsonl

K = ["a1f0_m_0_1", "b2e1_m_0_1"]   # two pages' storage keys on rank 0


def _lifecycle(fp_back: list[int] | None = None, between: list[str] = (), after: list[str] = (),
               hit_hp: bool = False) -> list[str]:
    """Node 1 (2 pages of 4 tokens) backed up to host, then to L3; evicted; later a request fetches the pages
    back from L3 (prefetch op 9 anchored at node 0) and they enter the tree as node 5."""
    fp = [701, 702]
    back = fp if fp_back is None else fp_back
    keys = f"[{','.join(K)}]"
    hp_hit = f" hp=[{','.join(map(str, back))}]" if hit_hp else ""
    return [
        f"[CPTRACE insert] node_id=1 parent=0 len=8 dev={R(0, 7)} kind=new rank=0 ts=1",
        f"[CPTRACE prepare] node_id=1 op=1 len=8 dev={R(0, 7)} host={R(64, 71)} policy=wt rank=0 ts=2",
        f"[CPTRACE backup] op=1 node_id=1 dev={R(0, 7)} host={R(64, 71)} io=1 rank=0 ts=3",
        "[CPTRACE ack] dir=d2h op=1 node_id=1 blen=8 clen=8 pub=[1] rank=0 ts=4",
        f"[CPTRACE l3_backup] node_id=1 op=3 keys={keys} hp=[{fp[0]},{fp[1]}] host={R(64, 71)} io=1 rank=0 ts=5",
        *between,
        "[CPTRACE l3_ack] dir=backup op=3 node_id=1 done=2 rank=0 ts=6",
        f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(0, 7)} rank=0 ts=7",
        f"[CPTRACE free] pool=dev idx={R(0, 7)} node_id=1 why=evict rank=0 ts=8",
        f"[CPTRACE evict] tier=host node_id=1 kind=host host={R(64, 71)} rank=0 ts=9",
        f"[CPTRACE free] pool=host idx={R(64, 71)} node_id=1 why=evict rank=0 ts=10",
        f"[CPTRACE l3_query] op=9 rid=req7 keys={keys} hit=2 rank=0 ts=11",
        f"[CPTRACE l3_prefetch] op=9 rid=req7 node_id=0 keys={keys} host={R(32, 39)} rank=0 ts=12",
        *after,
        f"[CPTRACE l3_ack] dir=prefetch op=9 node_id=0 done=2 keys={keys} hp=[{back[0]},{back[1]}] rank=0 ts=13",
        f"[CPTRACE l3_hit] node_id=5 op=9 keys={keys} host={R(32, 39)}{hp_hit} rank=0 ts=14",
    ]


def test_a_healthy_round_trip_gives_no_finding(tmp_path):
    res = check_lines(tmp_path, _lifecycle())
    assert res.findings == []
    assert not [u for u in res.unchecked if u.code == "L3"]   # level 2, every key written in this trace


def test_a_flipped_byte_in_a_stored_page_is_found_once(tmp_path):
    res = check_lines(tmp_path, _lifecycle(fp_back=[701, 999], hit_hp=True))
    (f,) = res.findings
    assert (f.code, f.rule, f.node_id, f.op, f.severity) == ("L3", "L3a", 0, 9, "ERROR")
    assert f.evidence == [4, 12] and f.line_no == 13   # the l3_backup and the prefetch's ack
    assert K[1] in f.message and "999" in f.message and "702" in f.message


def test_the_hit_compares_when_the_ack_carries_no_fingerprints(tmp_path):
    lines = [x.replace(" keys=[a1f0_m_0_1,b2e1_m_0_1] hp=[701,999]", "") if "dir=prefetch" in x else x
             for x in _lifecycle(fp_back=[701, 999], hit_hp=True)]
    (f,) = check_lines(tmp_path, lines).findings
    assert (f.rule, f.node_id, f.line_no) == ("L3a", 5, 14)


def test_a_page_freed_during_its_prefetch_is_found(tmp_path):
    free = f"[CPTRACE free] pool=host idx={R(36, 39)} node_id=-1 why=prefetch rank=0 ts=12"
    res = check_lines(tmp_path, _lifecycle(after=[free]))
    (f,) = res.findings
    assert (f.code, f.rule, f.op, f.certainty) == ("L3", "L3b", 9, "exact")
    assert f.evidence == [11, 12, 13] and "free pool=host" in f.message and "prefetch" in f.message


def test_host_pages_reused_during_the_backup_are_found(tmp_path):
    for breach in (f"[CPTRACE free] pool=host idx={R(64, 65)} node_id=1 why=dup rank=0 ts=5",
                   f"[CPTRACE evict] tier=host node_id=1 kind=host host={R(64, 71)} rank=0 ts=5",
                   f"[CPTRACE prepare] node_id=2 op=2 len=2 dev={R(8, 9)} host={R(70, 71)} policy=wt rank=0 ts=5"):
        res = check_lines(tmp_path, _lifecycle(between=[breach]))
        assert [(f.rule, f.op, f.node_id) for f in res.findings if f.code == "L3"] == [("L3b", 3, 1)], breach


def test_a_summary_that_only_brackets_the_pages_is_undecidable_not_a_finding(tmp_path):
    """DESIGN decision 10: a host eviction whose summary brackets the prefetch's slots without an exact set."""
    ev = "[CPTRACE evict] tier=host node_id=3 kind=host host=(cnt=8,min=30,max=45,first=30,last=45) rank=0 ts=12"
    res = check_lines(tmp_path, _lifecycle(after=[ev]))
    assert res.findings == []
    (u,) = [u for u in res.unchecked if u.rule == "L3b-undecidable"]
    assert (u.code, u.kind, u.count) == ("L3", "skip", 1)


def test_near_misses_stay_silent(tmp_path):
    """Freeing the prefetch's pages after its ack, another prefetch into other slots, a second backup of the same
    key with other bits (non-deterministic KV), reads of the same host pages by a reload during a backup."""
    lines = _lifecycle(between=[f"[CPTRACE reload] node_id=1 chain=[1] op=4 host={R(64, 71)} dev={R(16, 23)} "
                                "rank=0 ts=5", "[CPTRACE ack] dir=h2d op=4 node_id=1 rank=0 ts=5"])
    lines += [f"[CPTRACE free] pool=host idx={R(32, 39)} node_id=5 why=evict rank=0 ts=15",
              f"[CPTRACE l3_prefetch] op=10 rid=req8 node_id=0 keys=[{K[0]}] host={R(40, 43)} rank=0 ts=16",
              f"[CPTRACE l3_backup] node_id=7 op=11 keys=[{K[0]}] hp=[801] host={R(80, 83)} io=1 rank=0 ts=17",
              "[CPTRACE l3_ack] dir=backup op=11 node_id=7 done=1 rank=0 ts=18",
              f"[CPTRACE l3_ack] dir=prefetch op=10 node_id=0 done=1 keys=[{K[0]}] hp=[801] rank=0 ts=19"]
    assert check_lines(tmp_path, lines).findings == []


def test_an_unacked_breached_transfer_is_open_at_the_end(tmp_path):
    lines = _lifecycle()[:5] + [f"[CPTRACE free] pool=host idx={R(64, 71)} node_id=1 why=dup rank=0 ts=6",
                                "[CPTRACE ack] dir=d2h op=99 node_id=9 rank=0 ts=7"]
    (f,) = check_lines(tmp_path, lines).findings
    assert (f.rule, f.severity, f.op) == ("L3b-open", "WARN", 3)


def test_levels_and_tiers(tmp_path):
    # level 1 (no acks, no frees): L3a still checks, L3b is unchecked; a stream without L3 records lists no L3 rule
    lv1 = [x for x in _lifecycle(fp_back=[701, 5], hit_hp=True) if "[CPTRACE ack]" not in x
           and "l3_ack" not in x and "[CPTRACE free]" not in x]
    res = check_lines(tmp_path, lv1)
    assert rules(res) == {"L3a"} and ("L3b", "level") in {(u.rule, u.kind) for u in res.unchecked}
    res = check_lines(tmp_path, [x for x in lv1 if "l3_" not in x])
    assert res.findings == [] and not [u for u in res.unchecked if u.code == "L3"]


def test_keys_outlive_a_reset_and_partial_writes_are_taken_back(tmp_path):
    life = _lifecycle()
    reset = ["[CPTRACE reset] reason=flush rank=0 ts=12"]
    # the stored bytes are checked after the cache was reset (storage survives it)
    bad = life[:10] + reset + [x.replace("hp=[701,702]", "hp=[701,703]") if "dir=prefetch" in x else x
                               for x in life[10:]]
    assert rules(check_lines(tmp_path, bad)) == {"L3a"}
    # the backup wrote 1 of its 2 pages: the second key is not in storage as far as the trace knows
    part = [x.replace("done=2", "done=1") if "dir=backup" in x else x for x in bad]
    res = check_lines(tmp_path, part)
    assert res.findings == [] and {u.rule for u in res.unchecked if u.code == "L3"} == {"L3a-skipped(no backup)"}


# -- across ranks -----------------------------------------------------------------------------------------------------

def _cp_run(tmp_path, mode: str, rank1: str | None) -> list[str]:
    per = {}
    for r in (0, 1):
        per[r] = [f"[CPTRACE config] cp_size=2 cp_rank={r} mode={mode} page_size=4 policy=wt level=2 rank={r}",
                  f"[CPTRACE insert] node_id=1 parent=0 len=8 dev={R(0, 7)} kind=new rank={r}"]
        line = (f"[CPTRACE l3_backup] node_id=1 op=3 keys=[a1f0_m_cp{r}_2,b2e1_m_cp{r}_2] hp=[{r}1,{r}2] "
                f"host={R(64, 71)} io=1 rank={r}")
        if r == 1:
            line = rank1(line) if rank1 else None
        per[r] += [line] if line else ["[CPTRACE rid_map] rid=q node_id=1 hit=dev rank=1"]
    return write_ranks(tmp_path, per)


def test_every_cp_rank_writes_its_own_shard(tmp_path):
    assert check_files(_cp_run(tmp_path, "sharded", lambda x: x)).findings == []
    res = check_files(_cp_run(tmp_path, "sharded", None))           # rank 1 never writes its shard (#37149)
    assert [(f.rule, f.rank, f.node_id) for f in res.findings] == [("L3c", 1, 1)]
    res = check_files(_cp_run(tmp_path, "dcp", lambda x: x.replace("io=1", "io=0")))
    assert [(f.rule, f.rank) for f in res.findings] == [("L3c", 1)] and "io=0" in res.findings[0].message
    res = check_files(_cp_run(tmp_path, "sharded", lambda x: x.replace("_cp1_", "_cp0_")))   # same keys (#355)
    assert [(f.rule, f.rank) for f in res.findings] == [("L3d", 1)] and "a1f0_m_cp0_2" in res.findings[0].message
    # replicated copies may share keys and need one writer
    assert check_files(_cp_run(tmp_path, "replicated", None)).findings == []
    assert check_files(_cp_run(tmp_path, "replicated", lambda x: x.replace("_cp1_", "_cp0_"))).findings == []


def test_equal_copies_under_per_rank_keys_need_a_writer_per_rank(tmp_path):
    """Stock prefill CP (mode prefill_cp; replicated too): one writer serves only the ranks that look its keys up.
    SGLang #37149: MLA under CP elects the writer by the global TP rank, so rank 1 skips (io=0) while its keys carry
    its own CP suffix."""
    skip = lambda x: x.replace("io=1", "io=0")   # noqa: E731
    for mode in ("prefill_cp", "replicated"):
        res = check_files(_cp_run(tmp_path, mode, skip))
        assert [(f.rule, f.rank, f.node_id) for f in res.findings] == [("L3c", 1, 1)], mode
        assert "a1f0_m_cp1_2" in res.findings[0].message and "(and 1 more" in res.findings[0].message
        # a writer of the keys rank 1 looks up, a rank that writes its own, or one that logged nothing: no finding
        assert check_files(_cp_run(tmp_path, mode, lambda x: skip(x).replace("_cp1_", "_cp0_"))).findings == []
        assert check_files(_cp_run(tmp_path, mode, lambda x: x)).findings == []
        assert check_files(_cp_run(tmp_path, mode, None)).findings == []
    # one of rank 1's two keys written by rank 0: the other is still missing
    res = check_files(_cp_run(tmp_path, "prefill_cp", lambda x: skip(x).replace("a1f0_m_cp1_", "a1f0_m_cp0_")))
    assert [(f.rule, f.rank) for f in res.findings] == [("L3c", 1)] and "b2e1_m_cp1_2" in res.findings[0].message


# -- spans --------------------------------------------------------------------------------------------------------

def test_l3_stage_spans_in_the_node_trace(tmp_path, capsys):
    log = tmp_path / "rank0.log"
    free = f"[CPTRACE free] pool=host idx={R(36, 39)} node_id=-1 why=prefetch rank=0 ts=12"
    log.write_text("".join(x + "\n" for x in _lifecycle(after=[free])))
    out = tmp_path / "o.jsonl"
    assert cli.main(["ingest", "--no-progress", "--file", str(out), "--run-id", "l3", str(log)]) == 0
    spans = read_jsonl([str(out)])
    by = {sp.name: sp for sp in spans}
    bk, pf = by["rank 0 · l3-backup"], by["rank 0 · l3-prefetch"]
    assert [e.name for e in bk.events] == ["l3_backup", "l3_ack"] and bk.attrs["cptrace.span.closed_by"] == "tag"
    assert bk.attrs["hicache.node_id"] == 1 and bk.attrs["cptrace.span.kind"] == "hicache.l3.backup"
    assert [e.name for e in pf.events][:2] == ["l3_prefetch", "l3_ack"] and pf.attrs["hicache.node_id"] == 0
    assert pf.attrs["cptrace.violation"] == "L3" and pf.attrs["cptrace.violation.L3"] is True   # L3b, at the ack
    lane1 = next(sp for sp in spans if sp.name == "rank 0 · node" and sp.attrs["hicache.node_id"] == 1)
    assert bk.parent_span_id == lane1.span_id and bk.trace_id == lane1.trace_id
    lane5 = next(sp for sp in spans if sp.name == "rank 0 · node" and sp.attrs["hicache.node_id"] == 5)
    assert [(t, s, a["cptrace.link.kind"]) for t, s, a in lane5.links] == [(pf.trace_id, pf.span_id, "l3-prefetch")]
