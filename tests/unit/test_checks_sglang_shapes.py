"""Record shapes that stock SGLang's HiCache produces and the simulator's first reading did not: a chain
node split between its ``reload`` and its ``ack dir=h2d``, load acks that name the op's last node only, loads merged
into one op with a new id, and write_back's eviction staging. Hand-written streams, read like ``cptrace-otel check``
reads log files."""

from __future__ import annotations

from tests.helpers.checks_util import R, check_lines

CFG = "[CPTRACE config] cp_size=1 cp_rank=0 mode=none page_size=4 policy=wt level=2"


def _backed_up(nid, parent, dev, host, op, hp):
    """Insert, prepare, backup (h + per-page hp), d2h ack, device eviction of node ``nid``."""
    n = dev[1] - dev[0] + 1
    return [
        f"[CPTRACE insert] node_id={nid} parent={parent} len={n} dev={R(*dev)} kind=new",
        f"[CPTRACE prepare] node_id={nid} op={op} len={n} dev={R(*dev)} host={R(*host)} policy=wt",
        f"[CPTRACE backup] op={op} node_id={nid} dev={R(*dev)} host={R(*host)} io=1 h={sum(hp)} nz=9 "
        f"hp=[{','.join(map(str, hp))}]",
        f"[CPTRACE ack] dir=d2h op={op} node_id={nid} blen={n} clen={n} pub=[{nid}]",
        f"[CPTRACE evict] tier=dev node_id={nid} kind=backuped dev={R(*dev)}",
        f"[CPTRACE free] pool=dev idx={R(*dev)} node_id={nid} why=evict",
    ]


def _chain_reloaded():
    """Nodes 1 (8 tokens, pages 11, 12) and 2 (8 tokens, pages 21, 22, child of 1) backed up, evicted, and
    reloaded as one chain [1, 2] (op 5) into dev 100..115."""
    return ([CFG] + _backed_up(1, 0, (0, 7), (40, 47), 1, [11, 12])
            + _backed_up(2, 1, (8, 15), (48, 55), 2, [21, 22])
            + [f"[CPTRACE reload] node_id=2 chain=[1,2] op=5 host={R(40, 55)} dev={R(100, 115)}"])


def _hash_skips(res):
    return {u.rule: (u.count, u.examples) for u in res.unchecked if u.rule.startswith("HASH-skipped")}


def test_split_of_a_node_whose_load_is_in_flight_is_applied_to_the_load(tmp_path):
    """SGLang's match_prefix/insert split node 2 (its new id 3 takes the prefix) before the load's ack: each
    fragment's ack carries its own pages' hashes, a slice of the backup's, and they compare equal (not a HASH on
    the suffix's whole-node h against the pre-split backup's h)."""
    lines = _chain_reloaded() + [
        f"[CPTRACE split] node_id=2 new_id=3 parent=1 pre_len=8 split_len=4 dev_p={R(108, 111)} "
        f"dev_c={R(112, 115)} host_p={R(48, 51)} host_c={R(52, 55)} pend=-1",
        "[CPTRACE ack] dir=h2d op=9 node_id=2 h=22 nz=9 hp=[22]",    # the merged op's id, the last node first
        "[CPTRACE ack] dir=h2d op=9 node_id=1 h=23 nz=9 hp=[11,12]",
        "[CPTRACE ack] dir=h2d op=9 node_id=3 h=21 nz=9 hp=[21]",
    ]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    assert _hash_skips(res) == {}   # all three nodes compared
    # the prefix fragment brought back a wrong page: HASH on node 3, the new id
    bad = lines[:-1] + ["[CPTRACE ack] dir=h2d op=9 node_id=3 h=20 nz=9 hp=[20]"]
    res = check_lines(tmp_path, bad)
    assert [(f.code, f.node_id, f.op, f.certainty) for f in res.findings] == [("HASH", 3, 5, "exact")]
    assert "page 0" in res.findings[0].message


def test_split_in_flight_without_per_page_hashes_is_listed_not_passed(tmp_path):
    """The same split when the backup carried no hp: the fragments' whole-node hashes are not comparable with the
    pre-split backup's, so both fragments are listed as HASH-skipped(split), and nothing is reported."""
    lines = [x.replace(" hp=[21,22]", "") for x in _chain_reloaded()] + [
        f"[CPTRACE split] node_id=2 new_id=3 parent=1 pre_len=8 split_len=4 dev_p={R(108, 111)} "
        f"dev_c={R(112, 115)} host_p={R(48, 51)} host_c={R(52, 55)} pend=-1",
        "[CPTRACE ack] dir=h2d op=5 node_id=1 h=23 nz=9 hp=[11,12]",
        "[CPTRACE ack] dir=h2d op=5 node_id=3 h=21 nz=9",
        "[CPTRACE ack] dir=h2d op=5 node_id=2 h=22 nz=9",
    ]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    assert _hash_skips(res) == {"HASH-skipped(split)": (2, [3, 2])}


def test_load_ack_naming_the_last_node_only_lists_the_other_chain_nodes(tmp_path):
    """SGLang's HiCacheAck names the op's last node: with one ack record per node id in the ack, node 1 (the top
    of the chain) gets no reload hash. It is listed as HASH-skipped(no reload hash), never passed silently; a
    corrupt page there is then visible as unchecked, not as clean."""
    lines = _chain_reloaded() + ["[CPTRACE ack] dir=h2d op=5 node_id=2 h=43 nz=9 hp=[21,22]"]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    assert _hash_skips(res) == {"HASH-skipped(no reload hash)": (1, [1])}
    # one record per chain node: every node compared, the corrupt one found
    full = lines + ["[CPTRACE ack] dir=h2d op=5 node_id=1 h=24 nz=9 hp=[11,13]"]
    res = check_lines(tmp_path, full)
    assert [(f.code, f.node_id) for f in res.findings] == [("HASH", 1)]
    assert _hash_skips(res) == {}


def test_chain_node_acks_in_any_order_and_under_a_merged_op_id(tmp_path):
    """The first ack record of the load closes it (the H2c window) whichever chain node it names; the others are
    still compared; a merged load op's ack carries another id than the reload's."""
    for order in ((1, 2), (2, 1)):
        hp = {1: "h=23 nz=9 hp=[11,12]", 2: "h=43 nz=9 hp=[21,22]"}
        lines = _chain_reloaded() + [f"[CPTRACE ack] dir=h2d op=77 node_id={n} {hp[n]}" for n in order]
        res = check_lines(tmp_path, lines)
        assert res.findings == [] and _hash_skips(res) == {}, order
    # a free of the load's host pages after its first ack record is legal (the window ended there)
    lines = _chain_reloaded() + ["[CPTRACE ack] dir=h2d op=77 node_id=1 h=23 nz=9 hp=[11,12]",
                                 f"[CPTRACE free] pool=host idx={R(48, 55)} node_id=-1 why=dup",
                                 "[CPTRACE ack] dir=h2d op=77 node_id=2 h=43 nz=9 hp=[21,22]"]
    assert check_lines(tmp_path, lines).findings == []


def test_a_reset_with_a_load_in_flight_lists_its_chain(tmp_path):
    lines = _chain_reloaded() + ["[CPTRACE reset] reason=flush"]
    res = check_lines(tmp_path, lines)
    assert res.findings == []
    assert _hash_skips(res) == {"HASH-skipped(no reload hash)": (2, [1, 2])}


# -- write_back's eviction staging (README, rule readings) ------------------------------------------------------------

def _wb_staged(order):
    """A write_back eviction of node 4 (not backuped) as SGLang 0.5.20's ``_evict_write_back`` runs it:
    ``write_backup(write_back=True)`` (prepare, backup), ``_detach_backuped`` (no record: the pages stay allocated),
    then ``flush_staged``: ``writing_check(write_back=True)`` (the d2h ack), ``evict_device`` (evict + free). ``order``
    lists the records after the backup."""
    recs = {
        "ack": "[CPTRACE ack] dir=d2h op=3 node_id=4 blen=8 clen=8 pub=[4]",
        "evict": f"[CPTRACE evict] tier=dev node_id=4 kind=backuped dev={R(16, 23)}",
        "free": f"[CPTRACE free] pool=dev idx={R(16, 23)} node_id=4 why=evict",
        "insert": f"[CPTRACE insert] node_id=5 parent=0 len=8 dev={R(16, 23)} kind=new",
    }
    return [CFG.replace("policy=wt", "policy=wb"),
            f"[CPTRACE insert] node_id=4 parent=0 len=8 dev={R(16, 23)} kind=new",
            f"[CPTRACE prepare] node_id=4 op=3 len=8 dev={R(16, 23)} host={R(0, 7)} policy=wb",
            f"[CPTRACE backup] op=3 node_id=4 dev={R(16, 23)} host={R(0, 7)} io=1 h=5 nz=9"] + [recs[k] for k in order]


def test_write_back_staging_recorded_where_the_pages_are_freed_is_clean(tmp_path):
    """The reading: ``evict tier=dev`` is recorded where the node gives its device pages back. For a staged node
    that is ``flush_staged``'s ``evict_device``, after the flush's acks; ``_detach_backuped`` alone (the node leaves
    the device tree, its pages stay allocated to the staging list) records nothing."""
    res = check_lines(tmp_path, _wb_staged(["ack", "evict", "free", "insert"]))
    assert res.findings == [] and not [u for u in res.unchecked if u.kind == "undecidable"]


def test_write_back_eviction_before_the_flush_ack_is_h4a(tmp_path):
    """What the rules conclude from an ``evict tier=dev`` before the node's d2h ack: the device pages were given
    up while the copy read them, an exact H4a on the node (#24585: write_back eviction without the synchronous
    flush). Recording the eviction at ``_detach_backuped`` would make every staged node look like this."""
    for order in (["evict", "ack"], ["evict", "free", "insert", "ack"], ["free", "ack"]):
        res = check_lines(tmp_path, _wb_staged(order))
        assert [(f.rule, f.node_id, f.op, f.certainty) for f in res.findings] == [("H4a", 4, 3, "exact")], order
