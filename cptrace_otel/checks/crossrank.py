"""Cross-rank rules C1-C5 (docs/domain.md §5) over all ranks' events, fed in any interleaving that keeps each rank's
seq order (the sources merge ranks by ``ts``; a lag of a few hundred records between ranks is fine).

:class:`CrossRank` keeps the group's bookkeeping (ranks, mode, readiness, per-node counters) and dispatches each
record by tag to the rule classes mixed in here, one method per rule id: C1 lockstep tree (:mod:`.rules_c1`), C2 ack
rounds (:mod:`.rules_c2`), C3 backup participation, C4 count relations and C5 content relations (:mod:`.rules_joins`),
C5-fence, the shared-mode store fence (:mod:`.fence`). The index of rules, codes and levels is :mod:`.registry`.

Pitfall of docs/domain.md §5: node ids line up across ranks only while C1 holds, so after the first divergence of an
epoch
C2 stops and C3-C5 judge only records at or before the divergence index (the diverging prepare itself still yields
its C3 on a rank that never logs it, as fault ``C1_div`` expects; a rank that logs it after the index is not
judged). C1 may confirm a divergence a few tuples late (a tie-break), so a join whose records lie past what C1 has
compared waits for it, and a C2 mismatch is kept with the latest structural index of its rounds and dropped at the
end if that is past the divergence. The store fence too: a diverged rank reuses, for its own nodes, device pages the
IO rank still holds, so a backup or store after the divergence index is not judged (:mod:`.fence`).

Joins are keyed by (epoch, tag, node_id, occurrence of that tag for that node on that rank) and decided once every
rank of the group (``config cp_size``, the sources' rank hint, at least two) has reported, so memory follows what is
in flight; per-node counters are forgotten a while after the node's lifecycle ends. A single-rank stream switches
the cross-rank rules off after 65,536 records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from ..model.events import Event, int_field
from .cross_base import REPLICA_MODES, EpochC1
from .fence import StoreFence
from .findings import UNDECIDABLE, Finding, Unchecked
from .registry import BY_ID, FENCE_TAGS, STRUCTURAL
from .rules_c1 import C1Lockstep
from .rules_c2 import C2AckRounds
from .rules_joins import JoinRules
from .rules_l3x import L3Cross

# why the mode-dependent rules did not run: no ``config`` record states a mode (the SGLang instrumentation states none
# where SGLang's server arguments do not explain the CP group)
_NO_MODE = "CP mode unknown (no config record, or one without mode)"

# the tags read besides the structural and fence ones: the mode and group (config), C2 (ack), C3/C5 (backup), L3c/L3d
_OTHER_READS = frozenset(("config", "ack", "backup", "l3_backup"))
# the tags whose records :meth:`CrossRank.feed` does more with than the bookkeeping :meth:`CrossRank.skip` repeats
READS: frozenset[str] = STRUCTURAL | FENCE_TAGS | _OTHER_READS
# those of them that only the store fence reads, and it only in mode shared (free, store): under any other mode set,
# feed does with them what skip does
FENCE_ONLY: frozenset[str] = FENCE_TAGS - STRUCTURAL - _OTHER_READS
_READS_UNSHARED = READS - FENCE_ONLY


def sent_tags(mode: str | None) -> frozenset[str]:
    """The tags whose records :meth:`CrossRank.feed` must see once the group's mode is ``mode`` (None: not known
    yet); a run of other records may be given to :meth:`CrossRank.skip` instead. The rule ``check -j``'s workers send
    by (with the mode of their rank's first config that names one)."""
    return READS if mode is None or mode == "shared" else _READS_UNSHARED


class CrossRank(C1Lockstep, C2AckRounds, JoinRules, L3Cross):
    """Streaming C1-C5. ``feed(ev)`` for every event of every rank, then ``finish()`` and ``unchecked()``."""

    def __init__(self, level: int | None = None) -> None:
        self.forced_level = level
        self.seen_level = 1
        self.ranks: set[int] = set()
        self.sampled: dict[int, tuple[str, float]] = {}   # rank -> (run id, fraction) of sampled streams
        # sampled runs only: (split child -> its lineage origin, lineage origin -> kept by every sampled rank)
        self._sampling: tuple[dict[int, int], dict[int, bool]] = ({}, {})
        self.mode: str | None = None
        self.io_rank = 0
        self.findings: list[Finding] = []
        self._c1: dict[int, EpochC1] = {}
        self._occ: dict[tuple, int] = {}                  # (rank, epoch, tag, node) -> occurrences so far
        self._joins: dict[tuple, dict[int, dict]] = {}    # (epoch, tag, node, occ) -> rank -> facts
        self._split_since: set[tuple] = set()             # (rank, epoch, node) split since its last prepare
        self._rounds: dict[tuple[int, int], deque] = {}   # (rank, epoch) -> finished rounds
        self._cur_round: dict[int, list] = {}             # rank -> its open ack round without round= (C2)
        self._cur_keyed: dict[int, list] = {}             # rank -> its open ack round with round= (C2)
        self._c2_done: set[int] = set()
        self._reload_hashes: list[tuple] = []             # shared mode C5 waiting for the IO rank's hs
        self._io_hs: dict[tuple, dict] = {}              # shared: (epoch, node) -> occ -> IO rank's hs
        self._forget: deque = deque()
        self.expected: set[int] = set()
        self.cp_size = 0
        self.disabled = False
        self._count: list[int] | None = [0]   # records so far, counted only while the single-rank switch-off can
        #                                       still happen (None after)
        self._is_ready = False
        self._ranks_sorted: list[int] = []
        self._fence = StoreFence()
        self._c2_qs: dict[int, tuple] = {}                # epoch -> (ranks list it was built for, round queues)
        self._l3: tuple[dict[tuple, dict[int, dict]], dict[tuple, int]] = ({}, {})   # L3c/L3d: (joins, occurrences)
        # (_saw_hash and _l3_seen: class defaults False, set on the instance when first true. An instance of 30
        # attributes or more no longer shares its class's dict keys, and every attribute load on it gets slower:
        # hence the few grouped in tuples above)

    # -- driving ------------------------------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        """One record of any rank. Per-tag work only: records that no cross-rank rule reads (compose, rid_map, ...)
        cost the rank/level bookkeeping and the end of an open ack round, nothing else."""
        if self.disabled:
            return
        r = ev.rank
        if r not in self.ranks:
            self._new_rank(r)
        c = self._count
        if c is not None:
            c[0] = n = c[0] + 1
            if n >= self.SINGLE_RANK_AFTER:
                self._count = None   # decided once, at that record
                if n == self.SINGLE_RANK_AFTER and len(self.ranks) < 2 and len(self.expected) < 2 \
                        and self.cp_size < 2:
                    self._disable()   # one rank only: nothing to compare, and the joins would only pile up
                    return
        lv = ev.level
        if lv > self.seen_level:
            self.seen_level = lv
        tag = ev.tag
        if tag == "config":
            self._config(ev)
            return
        if self.sampled and not self._kept_everywhere(ev):
            return   # a node some sampled rank did not keep: its records there are missing by design
        if self.mode == "shared" and tag in FENCE_TAGS:
            self._fence.io_rank = self.io_rank
            self._fence.feed(ev, self._index(r, ev.epoch))
        if tag == "ack":
            if self.seen_level < 2:
                self.seen_level = 2
            self._round_add(ev)
            if self.mode == "shared":   # (the only mode _c5_ack acts in)
                self._c5_ack(ev)
            return
        if r in self._cur_round:   # any other record of this rank ends its ack round
            self._round_close(r)
        h = _ON_TAG.get(tag)   # structural records and backup; None for tags no other rule reads
        if h is not None:
            h(self, ev)

    def _new_rank(self, r: int) -> None:
        self.ranks.add(r)
        self._ranks_sorted = sorted(self.ranks)
        self._is_ready = False   # recomputed: a new rank can only make the group more complete
        if len(self.ranks) >= 2:
            self._count = None   # the single-rank switch-off of feed can no longer happen

    def skip(self, r: int, n: int, level: int) -> None:
        """The same as :meth:`feed` of ``n`` consecutive records of rank ``r`` whose tags are not in :data:`READS`,
        or are in :data:`FENCE_ONLY` once :attr:`mode` is set and is not ``shared`` (their highest ``level`` given):
        the bookkeeping only (the rank, the record count of the single-rank
        switch-off, the level seen, the end of the rank's open ack round). For streams without sampled ranks (log
        files): the sampled-node test of :meth:`feed` needs each record. Lets a parallel ``check`` send the cross-rank
        stage only the records it reads."""
        if self.disabled or n <= 0:
            return
        if r not in self.ranks:
            self._new_rank(r)
        c = self._count
        if c is not None:
            c[0] = min(c[0] + n, self.SINGLE_RANK_AFTER)
            if c[0] >= self.SINGLE_RANK_AFTER:
                self._count = None   # at one record of this run, as feed decides it
                if len(self.ranks) < 2 and len(self.expected) < 2 and self.cp_size < 2:
                    self._disable()
                    return
        if level > self.seen_level:
            self.seen_level = level
        if r in self._cur_round:   # a record that is no ack ends the rank's ack round
            self._round_close(r)

    def _kept_everywhere(self, ev: Event) -> bool:
        """Sampled runs (``self.sampled``: rank -> (run id, fraction), from the resources): whether the node of
        ``ev`` was kept by every sampled rank (cptrace_otel.model.sampling; a split child by its lineage origin). The
        cross-rank rules compare only such nodes, so a node sampled out somewhere is never "missing on rank r"."""
        f = ev.fields
        nid = int_field(f.get("node_id"))
        if nid is None or nid < 0:
            return True   # no node: always kept
        split_origin, kept = self._sampling
        origin = split_origin.get(nid, nid)
        if ev.tag == "split":
            new = int_field(f.get("new_id"))
            if new is not None:
                split_origin[new] = origin
        key = kept.get(origin)
        if key is None:
            from ..model.sampling import keep_node

            key = kept[origin] = all(keep_node(rid, origin, frac) for rid, frac in self.sampled.values())
        return key

    def _config(self, ev: Event) -> None:
        f = ev.fields
        m = f.get("mode")
        if isinstance(m, str) and self.mode is None:
            self.mode = m
        io = int_field(f.get("io_rank"))
        if io is not None:
            self.io_rank = io
        cs = int_field(f.get("cp_size"))
        if cs is not None and cs > self.cp_size:
            self.cp_size = cs
            self._fence.group = cs
        lv = int_field(f.get("level"))
        if lv is not None and lv > self.seen_level:
            self.seen_level = lv

    def _on_join(self, ev: Event) -> None:
        """prepare / reload: C1 tuple, then the C3/C4/C5 join."""
        self._c1_add(ev)
        self._join_add(ev)

    def _on_evict(self, ev: Event) -> None:
        self._c1_add(ev)
        f = ev.fields
        if f.get("tier") == "host" or f.get("kind") in ("regular", "drop"):
            # the node's lifecycle ended: forget its per-node counters a little later (an in-flight
            # load may still be acked), so memory follows live nodes
            nid = f.get("node_id")
            fq = self._forget
            fq.append((ev.rank, ev.epoch, nid if type(nid) is int else None))   # (int_field(), inlined)
            if len(fq) > self.FORGET_LAG:
                self._forget_one(fq.popleft())

    def _on_split(self, ev: Event) -> None:
        self._c1_add(ev)
        f = ev.fields
        for nid in (int_field(f.get("node_id")), int_field(f.get("new_id"))):
            if nid is not None:
                self._split_since.add((ev.rank, ev.epoch, nid))

    FORGET_LAG = 4096
    SINGLE_RANK_AFTER = 65536

    def _disable(self) -> None:
        self.disabled = True
        self._c1.clear()
        self._joins.clear()
        self._occ.clear()
        self._rounds.clear()
        self._c2_qs.clear()
        self._cur_round.clear()
        self._cur_keyed.clear()
        self._forget.clear()
        self._split_since.clear()
        self._l3[0].clear()
        self._l3[1].clear()

    def _forget_one(self, k: tuple) -> None:
        """Forget the per-node counters of ``k`` = (rank, epoch, node), the oldest entry of ``_forget``."""
        r, epoch, nid = k
        occ = self._occ
        occ.pop((r, epoch, "prepare", nid), None)
        occ.pop((r, epoch, "reload", nid), None)
        # the maps below are empty in most runs (no split, no l3_backup, not mode shared): a truth test is cheaper
        # than a lookup with a new key
        if self._split_since:
            self._split_since.discard(k)
        l3_occ = self._l3[1]
        if l3_occ:
            l3_occ.pop(k, None)
        if self._io_hs and r == self.io_rank \
                and not (self._reload_hashes and any(x[1] == nid for x in self._reload_hashes)):
            self._io_hs.pop((epoch, nid), None)

    def expect_ranks(self, ranks: Iterable[int]) -> None:
        """Ranks the sources know will appear: joins and comparisons wait for all of them."""
        self.expected |= set(ranks)
        self._is_ready = False

    def _ready(self) -> bool:
        """All ranks of the group have shown up (cp_size from config, the sources' hint, at least two)."""
        if self._is_ready:
            return True
        n = max(2, self.cp_size, len(self.expected))
        self._is_ready = len(self.ranks) >= n
        return self._is_ready

    @property
    def level(self) -> int:
        return self.forced_level if self.forced_level is not None else self.seen_level

    def finish(self) -> list[Finding]:
        for r in list(self._cur_round) + list(self._cur_keyed):
            self._round_close(r)
        for e, st in self._c1.items():
            self._c1_compare(e, st, final=True)
            if st.wait:
                self._c1_release(e, st)
            self._c2_compare(e, final=True)
        for st in self._c1.values():
            st.wait.clear()
        for key in list(self._joins):
            self._decide(key, final=True)
        self._c5_shared(final=True)
        self._l3x_finish()
        for st in self._c1.values():
            self.findings.extend(f for f, at in st.late if st.diverged is None or at <= st.diverged)
            st.late = []
        self.findings.extend(self._fence.take(self._diverged_before))
        self.findings.sort(key=Finding.sort_key)
        return self.findings

    def unchecked(self) -> list[Unchecked]:
        """Rules the stream cannot support: below their level (the registry's), or for lack of config or fields."""
        out: list[Unchecked] = []
        if len(self.ranks) < 2:
            return out
        c2, fence = BY_ID["C2"], BY_ID["C5-fence"]
        if self.level < c2.level:
            out.append(Unchecked(c2.id, c2.code, None, c2.level, f"no ack records (trace level < {c2.level})"))
        if self.mode is None:
            out.append(Unchecked("C3-io", "C3", None, 1, f"{_NO_MODE}, io= rules skipped", "skip"))
            out.append(Unchecked("C5", "C5", None, 1, _NO_MODE, "skip"))
        elif (self.mode in REPLICA_MODES or self.mode == "shared") and not self._saw_hash:
            out.append(Unchecked("C5", "C5", None, 1, "no h fields on backup/reload records", "skip"))
        if self.mode is None and self._l3_seen:
            out.append(Unchecked("L3c", "L3", None, 1, f"{_NO_MODE}, L3 writer rules skipped", "skip"))
        if self._fence.undecidable:
            out.append(Unchecked(fence.id, fence.code, None, fence.level,
                                 "interval overlap the rng summaries cannot decide (a store and a backup's source); "
                                 "exact sets (devx) would", UNDECIDABLE, self._fence.undecidable,
                                 list(self._fence.undecidable_nodes)))
        if self.mode == "shared" and self._fence.stores == 0:
            out.append(Unchecked(fence.id, fence.code, None, fence.level,
                                 f"no store records (level {fence.level}) in mode shared",
                                 "level" if self.level < fence.level else "skip"))
        return out


# tag -> handler of the records C1/C3-C5 read besides config and ack (see CrossRank.feed): every STRUCTURAL tag
# feeds C1, some also a join or a per-node memory; backup completes a prepare's join; l3_backup L3c/L3d
# (.rules_l3x). Plain functions called with the CrossRank: bound methods kept on it would make each one a reference
# cycle, freed only by the cyclic collector
_EXTRA = {"split": CrossRank._on_split, "prepare": CrossRank._on_join, "reload": CrossRank._on_join,
          "evict": CrossRank._on_evict}
_ON_TAG: dict[str, Callable[[CrossRank, Event], None]] = {
    **{tag: _EXTRA.get(tag, CrossRank._c1_add) for tag in STRUCTURAL},
    "backup": CrossRank._backup, "l3_backup": CrossRank._l3_join}
