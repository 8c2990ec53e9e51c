"""The rule registry: one entry per rule id (docs/domain.md §4 and §5), the single index from which the level tables,
the ``unchecked`` report, the C1 projection's tags and the rule table of docs/rules.md are derived.

An entry (:class:`Rule`) says which finding ``code`` the rule reports under, the lowest trace ``level`` whose
records it needs (docs/domain.md §3.2/§3.4: 1 structural, 2 adds ack/free/compose/store, 3 adds fwd_hash), the record
``tags``
it reads, its ``scope`` (:data:`RANK`: one rank's stream, ``checks.rank.RankChecker``; :data:`CROSS`: all ranks,
``checks.crossrank.CrossRank``), a one-line ``summary``, the ``Finding.rule`` names it ``emits`` and the
``Unchecked`` names it may report for skipped instances (``skips``), and ``impl``: the ``module:Class.method`` under
``cptrace_otel.checks`` that holds its logic.

Derived here: :data:`RULE_LEVEL` and :data:`LEVEL2_RULES` (per-rank levels), :func:`unchecked_at` (the rules a
stream's level cannot support), :data:`STRUCTURAL` (C1's projection tags), :data:`FENCE_TAGS` (the C5 store fence's
tags), :data:`CODES`, and :func:`render_table` (the rule table of docs/rules.md; ``python -m
cptrace_otel.checks.registry``
prints it, :func:`splice_table` puts it between the markers of a markdown file). Adding a rule: add its entry
here, its method where ``impl`` says, and regenerate the table of docs/rules.md.
"""

from __future__ import annotations

from typing import NamedTuple

RANK, CROSS = "rank", "cross"


class Rule(NamedTuple):
    id: str
    code: str
    level: int
    scope: str
    tags: tuple[str, ...]
    summary: str
    emits: tuple[str, ...]
    impl: str
    skips: tuple[str, ...] = ()
    only_with: tuple[str, ...] = ()   # tags without which a stream gives the rule nothing to check (a tier it skips;
    #                                   SIDE: a config naming sidecars)


def _r(id: str, code: str, level: int, scope: str, tags: str, summary: str, impl: str,
       emits: tuple[str, ...] | None = None, skips: tuple[str, ...] = (), only_with: str = "") -> Rule:
    return Rule(id, code, level, scope, tuple(tags.split()), summary, (id,) if emits is None else emits, impl, skips,
                tuple(only_with.split()))


_L3 = "l3_backup l3_prefetch l3_ack l3_hit"


_HASH_SKIPS = ("HASH-skipped(split)", "HASH-skipped(chain)", "HASH-skipped(no reload hash)",
               "HASH-skipped(no backup)", "HASH-skipped(no hash)", "HASH-skipped(sentinel)")

# In report order: per-rank H1-H4, ZERO, HASH, then cross-rank C1-C5, then SGLang's own signals (CANARY) (CODES and
# the unchecked report follow it).
RULES: tuple[Rule, ...] = (
    _r("H1a", "H1", 1, RANK, "split insert prepare reload",
       "a split partitions the node's latest dev/host slots (from its last insert, reload or split): the prefix to "
       "the new id, the suffix kept by the old id; an evicted node splits without dev slots",
       "rules_h1:H1Split._h1a"),
    _r("H1b", "H1", 2, RANK, "prepare split ack",
       "a d2h ack after a split covers the enqueued length: blen = L and the pub fragments sum to L (a hybrid SWA "
       "backup's pub also names the nodes its SWA transfer covered: no stray check then)",
       "rules_h1:H1Split._h1b"),
    _r("H1c", "H1", 1, RANK, "split reload",
       "a reload of a split-created node uses the host range the split gave it (an H2a finding tagged H1c)",
       "rules_h2:H2Reload._h2a", emits=("H2a",)),
    _r("H2a", "H2", 1, RANK, "reload prepare split evict free",
       "a reload's host range is the concatenation of its chain's current host ranges, none of them freed",
       "rules_h2:H2Reload._h2a"),
    _r("H2b", "H2", 2, RANK, "reload prepare ack",
       "every chain node's backup has its d2h ack before the reload is issued",
       "rules_h2:H2Reload._h2b"),
    _r("H2c", "H2", 2, RANK, "reload ack free evict prepare",
       "the reload's host pages stay pinned until its h2d ack (the op's first ack record): no free, host eviction "
       "or reuse in between",
       "rules_h2:H2Reload._h2c"),
    _r("H3", "H3", 2, RANK, "compose evict reload ack split insert free",
       "a compose hit is served from a fill made after the last device change of the nodes it derives from",
       "rules_h3:H3Compose._h3"),
    _r("H4", "H4", 2, RANK, "prepare backup ack free evict insert reload",
       "a d2h copy's source pages are not freed or reassigned before its ack (H4a dev, H4b host; H4-open: no ack)",
       "rules_h4:H4Recycle._h4", emits=("H4a", "H4b", "H4-open")),
    _r("ZERO", "ZERO", 1, RANK, "backup reload ack",
       "a backup, a reload sync=1 or an h2d ack of a non-empty node never reads all-zero KV (nz=0)",
       "rules_content:ZeroFlag._zero_backup", emits=("ZERO@backup", "ZERO@reload")),
    _r("HASH", "HASH", 1, RANK, "backup reload ack split",
       "a node's reload hash equals its latest backup hash (per-page hp across a split)",
       "rules_content:HashCompare._hash_cmp", skips=_HASH_SKIPS),
    _r("SIDE-missing", "SIDE", 1, RANK, "config backup reload",
       "a backup or reload moves each sidecar pool the config names (DSA indexer: sidecars=indexer) in the same "
       "copy op as the node's KV (its sp names it)",
       "rules_side:SideRules._side_missing", skips=("SIDE-skipped(no sp)",)),
    _r("SIDE-hash", "SIDE", 2, RANK, "config backup ack split",
       "a node's sidecar fingerprint after its h2d load equals its latest backup's (per-page shp across a split)",
       "rules_side:SideRules._side_hash", skips=("SIDE-skipped(no backup)", "SIDE-skipped(no hash)"),
       only_with="config"),
    _r("SIDE-l3", "SIDE", 2, RANK, "config l3_backup l3_ack",
       "sidecar pages survive the L3 round trip: per page key, the sidecar fingerprint a prefetch brought back "
       "(l3_ack dir=prefetch shp_<pool>) is one the key was written with (l3_backup)",
       "rules_side:SideRules._side_l3", skips=("SIDE-skipped(no l3 backup)", "SIDE-skipped(no l3 fingerprint)"),
       only_with="config"),
    _r("LOAD-early", "LOAD", 2, RANK, "ld_start ld_layer ld_read ack",
       "no layer of a layer-wise load-back is read before its load completed it: each first read of a layer "
       "(ld_read) while the step is in flight follows that layer's completion (ld_layer) and the forward's wait "
       "for it (waited >= layer) (SGLang #22811)",
       "rules_load:LoadRules._load_early", skips=("LOAD-skipped(no start)",), only_with="ld_start ld_layer ld_read"),
    _r("REST-hash", "REST", 2, RANK, "prepare backup ack split evict free audit",
       "a host copy at rest (audit: the opt-in audit thread's re-fingerprint of an acked backup's host slots) "
       "equals what its backup wrote (backup h; per-page hp across a split)",
       "rules_rest:RestRules._rest_hash",
       skips=("REST-skipped(no backup)", "REST-skipped(not at rest)", "REST-skipped(moved)", "REST-skipped(no hash)"),
       only_with="audit"),
    _r("REST-l3", "REST", 2, RANK, "l3_backup l3_ack audit",
       "an L3 object at rest (audit tier=l3: the audit thread's read-back of an acked l3_backup's objects through "
       "the storage backend) has a fingerprint its key was written with (l3_backup hp)",
       "rules_rest:RestRules._rest_l3",
       skips=("REST-skipped(l3 gone)", "REST-skipped(l3 unreadable)", "REST-skipped(l3 never written)",
              "REST-skipped(no hash)"),
       only_with="audit"),
    _r("SWA-hash", "SWA", 2, RANK, "swa",
       "a hybrid tree's sliding-window KV survives its host round trip: per SWA host page, the fingerprint after a "
       "load-back (swa dir=h2d) equals the one its latest backup wrote (swa dir=d2h); tokens the window dropped are "
       "never loaded, never compared",
       "rules_swa:SwaRules._swa", skips=("SWA-skipped(no backup)", "SWA-skipped(no hash)"), only_with="swa"),
    _r("MAMBA-hash", "MAMBA", 2, RANK, "mamba",
       "a hybrid tree's Mamba state survives its host round trip: per Mamba host slot, the fingerprint of the node's "
       "state after a load-back (mamba dir=h2d) equals the one its latest backup wrote (mamba dir=d2h); a split's "
       "new parent has no state, never compared",
       "rules_mamba:MambaRules._mamba", skips=("MAMBA-skipped(no backup)", "MAMBA-skipped(no hash)"),
       only_with="mamba"),
    _r("C1", "C1", 1, CROSS, "insert split prepare evict reload reset",
       "lockstep tree: every rank's structural tuples are identical; the first divergence is reported",
       "rules_c1:C1Lockstep._c1_compare"),
    _r("C2", "C2", 2, CROSS, "ack",
       "every ack round (by round= when logged, compared per direction; else a run of one direction's acks) holds "
       "the same (dir, op count, node set) on all ranks",
       "rules_c2:C2AckRounds._c2_compare"),
    _r("C3", "C3", 1, CROSS, "config prepare backup",
       "every rank has a prepare for a node iff any does, each with io=1 (shared: only io_rank, equal host)",
       "rules_joins:JoinRules._c3", skips=("C3-io",)),
    _r("C4", "C4", 1, CROSS, "prepare reload",
       "dev.cnt and host.cnt of a node's prepare and reload are equal on all ranks",
       "rules_joins:JoinRules._c4"),
    _r("C5", "C5", 1, CROSS, "config backup ack",
       "replicated, prefill_cp: backup h equal on all ranks; shared: the IO rank's hs[r] equals rank r's reload hash",
       "rules_joins:JoinRules._c5_replicated"),
    _r("C5-fence", "C5", 2, CROSS, "store backup evict free reset",
       "shared: no rank's store to a node's pages lands after the IO rank's backup of them began, while that rank's "
       "pages still hold the node's KV (a store after it gave them up writes the next owner's)",
       "fence:StoreFence._test"),
    _r("CANARY", "CANARY", 1, RANK, "kv_canary insert split reload evict",
       "SGLang's kv-canary saw a slot's hash chain break (a `kv_canary violation:` log line): reported on the node "
       "whose device slots held the slot then (exact sets decide; else for the run, saying why)",
       "rules_canary:CanaryOwner._canary", skips=("CANARY-owner(undecidable)", "CANARY-skipped(reloaded)")),
    _r("L3a", "L3", 1, RANK, "l3_backup l3_ack l3_hit",
       "content survives the L3 round trip: per page key, the fingerprint after a prefetch (l3_ack dir=prefetch, "
       "l3_hit) is one the key was backed up with (l3_backup hp)",
       "rules_l3:L3Rules._l3_compare", skips=("L3a-skipped(no backup)",), only_with=_L3),
    _r("L3b", "L3", 2, RANK, "l3_backup l3_prefetch l3_ack free evict prepare reload",
       "an L3 transfer's host pages are not freed, evicted or given to another copy before its l3_ack (L3b-open: "
       "no ack)",
       "rules_l3:L3Rules._l3b", emits=("L3b", "L3b-open"), skips=("L3b-undecidable",), only_with=_L3),
    _r("L3c", "L3", 1, CROSS, "config l3_backup",
       "when a rank writes a node to L3 (l3_backup io=1), every rank's copy is in storage: with a shard per rank "
       "(sharded, dcp, layersplit) every rank writes its shard; with equal copies (replicated, prefill_cp) every "
       "page key a rank's l3_backup names (io=0 too) is written by some rank (SGLang #37149)",
       "rules_l3x:L3Cross._l3c", only_with=_L3),
    _r("L3d", "L3", 1, CROSS, "config l3_backup",
       "CP modes with a shard per rank: the ranks' L3 keys of a node are disjoint (one rank's shard never "
       "overwrites another's)",
       "rules_l3x:L3Cross._l3d", only_with=_L3),
    _r("FOREIGN", "FOREIGN", 2, RANK, "config l3_backup l3_ack",
       "a fetched L3 page this run never wrote was written under the same storage identity (model, kv_dtype, "
       "layout, page_size of the config) as the metadata beside the object (l3_ack wid) or an earlier run's trace "
       "given to check says (SGLang's keys omit the KV dtype and layout: sglang #33268, the model: #24758); the "
       "same identity with another fingerprint is L3a",
       "rules_l3:L3Rules._l3_compare", only_with=_L3),
)

BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
CODES: tuple[str, ...] = tuple(dict.fromkeys(r.code for r in RULES))

# Per-rank level tables (public through cptrace_otel.checks).
RULE_LEVEL: dict[str, int] = {r.id: r.level for r in RULES if r.scope == RANK}
LEVEL2_RULES: tuple[tuple[str, str], ...] = tuple((r.id, r.code) for r in RULES if r.scope == RANK and r.level == 2)

# What a stream below each level lacks (the reason of a rule's "level" unchecked entry).
LEVEL_RECORDS = {2: "ack/free/compose records", 3: "fwd_hash records"}

STRUCTURAL: frozenset[str] = frozenset(BY_ID["C1"].tags)      # the tags C1 projects each rank's stream onto
FENCE_TAGS: frozenset[str] = frozenset(BY_ID["C5-fence"].tags)  # the records the C5 store fence reads


def unchecked_at(level: int, scope: str) -> list[Rule]:
    """The rules of ``scope`` that a stream at trace ``level`` cannot support, in registry order. Level-1 rules are
    never among them: they read the structural records every stream consists of."""
    floor = level if level > 1 else 1
    return [r for r in RULES if r.scope == scope and r.level > floor]


TABLE_BEGIN, TABLE_END = "<!-- rules:begin -->", "<!-- rules:end -->"   # around the table in a markdown file


def render_table() -> str:
    """The README's rule table (markdown), generated from :data:`RULES`."""
    rows = ["| rule | code | level | scope | reads | what it checks | reported as |",
            "|---|---|---|---|---|---|---|"]
    for r in RULES:
        emits = ", ".join(f"`{e}`" for e in r.emits)
        rows.append(f"| {r.id} | {r.code} | {r.level} | {'per rank' if r.scope == RANK else 'cross-rank'} | "
                    f"{', '.join(f'`{t}`' for t in r.tags)} | {r.summary} | {emits} |")
    return "\n".join(rows) + "\n"


def splice_table(text: str) -> str:
    """``text`` (a markdown document) with the lines between :data:`TABLE_BEGIN` and :data:`TABLE_END` replaced by
    :func:`render_table`; ValueError when the markers are missing."""
    a = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    b = text.index(TABLE_END, a)
    return text[:a] + "\n" + render_table() + text[b:]
