"""Per-rank streaming rules: H1-H4, ZERO and HASH over one rank's events in seq order (docs/domain.md §3.4, §4).

:class:`RankChecker` keeps the lineage state of :mod:`.lineage` for the current epoch and returns each finding at the
record that completes its evidence (H1b at the d2h ack, H2c at the h2d ack, H4 at the d2h ack, H3 at the stale
hit, H1a at the split, H2a/H2b at the reload, ZERO/HASH at the hashed record).

Layout: one method per rule id, in the rule classes mixed in here (:mod:`.rules_h1` ... :mod:`.rules_content`; the
index is :mod:`.registry`), and one handler per record tag below. A handler updates the lineage state and calls
the rules that the record completes or breaches, in a fixed order (which fixes the order of the findings); it keeps
inline only the cheap test of whether a rule has anything to look at (a write or load in flight, a split since
the prepare, the stream's level), so a clean record costs no call to a rule that cannot fire. The common prologue
(the record's fields, its int ``node_id``, its ``(seq, line_no)`` ref) is done once, in :meth:`RankChecker.feed_fast`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model import semconv as sc
from ..model.events import LEVEL_OF_TAG, Event, int_field
from ..model.l3 import TIER_L3
from ..model.logline import Rng
from .epochs import EPOCH_TAGS, EpochTracker
from .findings import Finding, Unchecked
from .lineage import UNKNOWN, Backup, Bounded, EpochState, Node, PendingLoad, PendingWrite
from .ranges import Slots, is_none_range, overlap, slice_slots, slots_of
from .rank_base import Handler, handler_table, observed_table
from .registry import LEVEL_RECORDS, RANK, Rule, unchecked_at
from .rules_canary import CanaryOwner
from .rules_content import HashCompare, ZeroFlag
from .rules_h1 import H1Split
from .rules_h2 import H2Reload
from .rules_h3 import H3Compose
from .rules_h4 import H4Recycle
from .rules_l3 import KEYS_KEPT, L3Rules
from .rules_load import STEPS_KEPT, LoadRules
from .rules_mamba import SLOTS_KEPT, MambaRules
from .rules_rest import RestRules
from .rules_side import SideRules, side_witness
from .rules_swa import PAGES_KEPT, SwaRules


class RankChecker(H1Split, H2Reload, H3Compose, H4Recycle, ZeroFlag, HashCompare, CanaryOwner, L3Rules,
                  SideRules, LoadRules, RestRules, SwaRules, MambaRules):
    """Streaming checker of one rank. See the package docstring for the contract."""

    _observers: dict[str, tuple[Callable[[Event], Any], ...]] | None = None   # tag -> observe()'s fns

    def __init__(self, rank: int, level: int | None = None) -> None:
        self.rank = rank
        self.forced_level = level
        self.seen_level = 1
        self._lv = level if level is not None else 1   # self.level, kept in step with its three inputs (rank_base)
        self.mode = "none"
        self.io_rank = 0
        self.sidecars: tuple[str, ...] = ()   # the config's sidecar pools (rules_side)
        self.epoch = 0
        self._tracker = EpochTracker()
        self.st = EpochState()
        self.events = 0
        self.nodes_total = 0
        self._skips: dict[str, Unchecked] = {}
        self._l3_keys = Bounded(KEYS_KEPT)   # L3a: page key -> its backup fingerprints (outlives epochs, as storage)
        self._side_l3_keys = Bounded(KEYS_KEPT)   # SIDE-l3: the same for sidecar pages ("<key>.<pool>")
        self._swa_pages = Bounded(PAGES_KEPT)   # SWA-hash: SWA host page -> its latest backup (outlives epochs)
        self._swa_seen, self._swa_ops = False, Bounded(PAGES_KEPT)   # any swa record; ops naming more nodes (H1b)
        self._mamba_slots, self._mamba_seen = Bounded(SLOTS_KEPT), False   # MAMBA-hash: the same per Mamba host slot
        self._l3_acked = Bounded(4096)       # L3a: prefetch ops compared at their ack
        self._l3_seen = False                # any L3 record: the L3 rules apply to this stream
        self._ld_steps = Bounded(STEPS_KEPT)   # LOAD: layer-wise load-back steps (outlive epochs, as op ids do)
        self._ld_by_op = Bounded(STEPS_KEPT)
        self._ld_seen = False                # any ld_* record: LOAD applies to this stream
        self._audit_seen = False             # any audit record: REST applies to this stream
        self._rest_reported = Bounded(4096)  # REST-hash: the copies reported (one finding per corrupted copy)
        self._l3_ident: dict = {}            # FOREIGN: this rank's storage identity (its config)
        self.l3_prior = None                 # FOREIGN: earlier runs' L3 backups (set by the analysis)
        # tag -> (level of the tag, handler, whether the record can move the epoch tracker, whether the handler
        # needs an int node_id): one lookup per record on the hot path. One table per class, of plain functions
        # called with the checker: bound methods here would make every checker a reference cycle, freed only by
        # the cyclic collector (a serve replica makes one per rank of every trace: 30% of its CPU went there)
        self._tab: dict[str, tuple[int, Handler | None, bool, bool]] = handler_table(type(self))

    def observe(self, tag: str, fn: Callable[[Event], Any]) -> None:
        """Also pass every record with ``tag`` to ``fn`` (before the tag's rule, if it has one; ``fn``'s result is
        ignored; several per tag are called in the order given). Through the per-tag table the hot path looks up
        anyway, so records of other tags pay nothing. The checker's ``fn``s are its own; the table that calls them
        is shared by every checker of its class observing the same tags (a replica makes a checker per rank of
        every trace: a table each was 2 KB and a copy per checker)."""
        cur = self._observers or {}
        self._observers = {**cur, tag: (*cur.get(tag, ()), fn)}
        self._tab = observed_table(type(self), frozenset(self._observers))

    # -- driving ------------------------------------------------------------------------------------------------
    def feed(self, ev: Event) -> list[Finding]:
        """Process the next record of this rank; returns the findings whose evidence completes at ``ev``."""
        out = self.feed_fast(ev)
        return out if out else []

    def feed_fast(self, ev: Event) -> list[Finding] | None:
        """:meth:`feed` that may return None (or an empty list) when nothing was found: the engine's hot loop uses
        it to skip allocating an empty list per record."""
        self.events += 1
        tag = ev.tag
        ent = self._tab.get(tag)
        if ent is None:   # a tag no rule reads (it still counts towards the inferred level)
            lv, h, moves, keyed = LEVEL_OF_TAG.get(tag, 1), None, tag in EPOCH_TAGS, False
        else:
            lv, h, moves, keyed = ent
        evl = ev.level
        if evl > lv:
            lv = evl
        if lv > self.seen_level:
            self.seen_level = lv
            self._lv = self.level
        t = self._tracker
        late = None   # a due H2c of an epoch this record ends: reported with this record's findings
        if moves or t.pending or ev.epoch > t.epoch:
            e = t.step(tag, ev.fields, ev.epoch)
            if e != self.epoch:
                late = self._drain_loads()   # (a reset aborts in-flight copies: their nodes go unchecked)
                self.epoch = e
                self.st = EpochState()   # pending state of the old epoch is dropped: a reset aborts in-flight copies
        # (the tracker's epoch moves only in step(), so outside the branch above it equals self.epoch)
        if h is None:
            return late
        # the handlers' common prologue
        f = ev.fields
        nid = f.get("node_id")
        if keyed and type(nid) is not int:
            return late
        out = h(self, ev, f, nid, (ev.seq, ev.line_no))
        return out if late is None else late + (out or [])

    def finish(self) -> list[Finding]:
        """End of stream: d2h copies whose ack never came after a breach (H4-open, WARN), and an H2c whose reload
        node's ack never came (with the op's first ack as evidence)."""
        out: list[Finding] = []
        if self.level >= 2:
            self._h4_open(out)
            self._l3_open(out)
        out.extend(self._drain_loads() or ())   # every reloaded chain node is compared or listed, never passed
        return out

    def _drain_loads(self) -> list[Finding] | None:
        """End every load held (stream or epoch end): its due H2c (:meth:`_h2c_late`), its unhashed chain nodes."""
        late = None
        for ld in self.st.drain_loads():
            late = self._h2c_late(ld, late)
            self._count_unhashed(ld)
        return late

    def _stream_had(self, r: Rule) -> bool:
        """Whether this stream had the tier, pool or records that rule ``r`` needs (its ``only_with``)."""
        if r.code == "SIDE":
            return bool(self.sidecars) and (self._l3_seen or "l3_ack" not in r.tags)
        return {"LOAD": self._ld_seen, "REST": self._audit_seen, "SWA": self._swa_seen,
                "MAMBA": self._mamba_seen}.get(r.code, self._l3_seen)

    def unchecked(self) -> list[Unchecked]:
        """Rules that could not run at this stream's level (:func:`.registry.unchecked_at`), then per-instance skips
        (HASH across a split, ...)."""
        out: list[Unchecked] = []
        lv = self.level
        for r in unchecked_at(lv, RANK):
            if r.only_with and not self._stream_had(r):
                continue   # a tier (L3) or pool (sidecars) this stream never had: nothing the rule could check
            out.append(Unchecked(r.id, r.code, self.rank, r.level,
                                 f"trace level {lv} < {r.level}: no {LEVEL_RECORDS[r.level]}", "level"))
        out.extend(self._skips.values())
        return out

    # -- handlers: one per tag, in the order the rules must see the record -----------------------------------------
    def _config(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
        lv = int_field(f.get("level"))
        if lv is not None:
            self.config_level = lv
        if isinstance(f.get("mode"), str):
            self.mode = f["mode"]
        io = int_field(f.get("io_rank"))
        if io is not None:
            self.io_rank = io
        side = f.get(sc.SIDECARS)
        self.sidecars = tuple(p for p in side.split("+") if p) if isinstance(side, str) else ()
        self._l3_config(f)

    def _insert(self, ev: Event, f: dict, nid: int, ref: tuple) -> None:
        d = slots_of(f.get("dev"), f.get("devx"))
        st = self.st
        node = st.nodes.get(nid)
        if node is not None and f.get("kind") != "new":   # revive: adopts the request's slots
            node.dev = d if d is not None else UNKNOWN
            node.bump(ref, "insert kind=revive")
        else:
            length = ln if type(ln := f.get("len")) is int and ln else (d.cnt if d is not None else 0)   # int_field
            node = Node(nid, length, d if d is not None else UNKNOWN, None, ref)
            st.nodes[nid] = node
            st.dead.pop(nid, None)
            self.nodes_total += 1
        if st.writes and d is not None:
            self._h4_breach(d, "dev", nid, ref, f"insert of node {nid} took dev slots of the copy", "a")
        return None

    def _split(self, ev: Event, f: dict, c: int, ref: tuple) -> list[Finding] | None:
        p, L, s = int_field(f.get("new_id")), int_field(f.get("pre_len")), int_field(f.get("split_len"))
        if p is None or L is None or s is None:
            return None
        st = self.st
        pre = st.nodes.get(c)
        dp, dc = slots_of(f.get("dev_p")), slots_of(f.get("dev_c"))
        hp_raw, hc_raw = f.get("host_p"), f.get("host_c")
        hp, hc = slots_of(hp_raw), slots_of(hc_raw)
        fnd = self._h1a(ev, ref, pre, c, p, L, s, dp, dc, hp, hc, hp_raw, hc_raw) if pre is not None else None
        # -- update the lineage: the prefix moves to the new id, the old id keeps the suffix
        pnode = Node(p, s, dp if dp is not None else (None if is_none_range(f.get("dev_p")) else UNKNOWN),
                     hp if hp is not None else (None if is_none_range(hp_raw) else UNKNOWN), ref)
        pnode.from_split = True
        pnode.dev_loaded = pre is not None and pre.dev_loaded   # (the prefix's device slots came as the node's)
        st.nodes[p] = pnode
        self.nodes_total += 1
        if pre is None:
            pre = Node(c, L, UNKNOWN, UNKNOWN, ref)
            st.nodes[c] = pre
        pnode.bk_state = pre.bk_state
        pnode.host_freed = pre.host_freed
        if pre.bk is not None:
            pnode.bk = pre.bk.fragment(0, s) if pre.bk.length == L else Backup(None, None, None, pre.bk.ref,
                                                                                pre.bk.op, False, s)
            pre.bk = pre.bk.fragment(s, L - s) if pre.bk.length == L else Backup(None, None, None, pre.bk.ref,
                                                                                 pre.bk.op, False, L - s)
        pre.len = L - s
        pre.dev = dc if dc is not None else (None if is_none_range(f.get("dev_c")) else UNKNOWN)
        pre.host = hc if hc is not None else (None if is_none_range(hc_raw) else UNKNOWN)
        pre.bump(ref, f"split into {p}+{c}")
        pnode.gen_ref = (ref, f"split into {p}+{c}")
        if st.loads:   # a load in flight follows its tokens too (HASH per fragment)
            st.split_loads(c, p, L, s)
        lst = st.writes_by_node.get(c)
        if lst:   # a pending write follows its tokens: its fragment list gets both halves (H1b)
            for w in lst:
                for i, fr in enumerate(w.frags):
                    if fr[0] == c:
                        w.frags[i:i + 1] = [[p, s], [c, fr[1] - s]]
                        break
                w.splits.append(ref)
            st.writes_by_node[p] = list(lst)
        return [fnd] if fnd is not None else None

    def _prepare(self, ev: Event, f: dict, nid: int, ref: tuple) -> None:
        st = self.st
        # slots_of() only where it can give a set (an Rng, a string, an exact-set field): a plain int is no set
        hv, hx = f.get("host"), f.get("hostx")
        h = slots_of(hv, hx) if hx is not None or type(hv) is Rng or type(hv) is str else None
        dv, dx = f.get("dev"), f.get("devx")
        d = slots_of(dv, dx) if dx is not None or type(dv) is Rng or type(dv) is str else None
        if h is not None:
            if st.writes:
                self._h4_breach(h, "host", nid, ref, f"prepare of node {nid} took host slots of the copy", "b")
            if st.loads:
                self._h2c_breach(h, nid, ref, f"prepare of node {nid} took host slots being loaded")
            if st.l3:
                self._l3_breach(h, ref, f"prepare of node {nid} took host slots")
        length = f.get("len")
        if type(length) is not int or not length:   # int_field(len) or the slot count, inlined (hot path)
            length = d.cnt if d is not None else 0
        node = st.nodes.get(nid)
        if node is None:
            node = Node(nid, length, d if d is not None else UNKNOWN, None, ref)
            st.nodes[nid] = node
            self.nodes_total += 1
        node.host = h if h is not None else UNKNOWN
        node.host_freed = None
        op = f.get("op")
        w = PendingWrite(op if type(op) is int else None, nid, length, d, h, ref)
        node.bk_state = ("pending", w)
        st.open_write(w)
        return None

    def _backup(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        st = self.st
        op = op if type(op := f.get("op")) is int else None
        w = st.find_write(nid, op, True)
        dv, dx = f.get("dev"), f.get("devx")
        d = slots_of(dv, dx) if dx is not None or type(dv) is Rng or type(dv) is str else None
        if w is not None:
            w.ops.add(op)
            w.b_ref = ref
            if d is not None:
                w.dev = d
        node = st.nodes.get(nid)
        if node is not None:   # the content witness HASH compares a later reload with
            h = f.get("h")
            node.bk = Backup(h if type(h) is int and h >= 0 else None, f.get("hp"), f.get("hs"), ref, op, True,
                             node.len, side_witness(f, self.sidecars) if self.sidecars else None)
        out = None
        nz = f.get("nz")
        if nz == 0 and type(nz) is int:   # (ZERO@backup fires on nz=0 only)
            fnd = self._zero_backup(ev, ref, nid, op, nz, d, w)
            if fnd is not None:
                out = [fnd]
        if self.sidecars:
            fnd = self._side_missing(ev, f, nid, ref, "backup")
            if fnd is not None:
                out = [*(out or ()), fnd]
        return out

    def _ack(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        d = f.get("dir")
        if d != "d2h":
            if d == "h2d" and self._ld_seen:
                self._ld_closed(f.get("op"))   # LOAD: its layer-wise step finished loading
            return self._ack_h2d(ev, f, nid, ref) if d == "h2d" else None
        # -- ack dir=d2h (inline here: the commonest ack, one call less)
        st = self.st
        op = op if type(op := f.get("op")) is int else None
        w = st.find_write(nid, op)
        if w is None:
            return None   # a duplicate record of an ack already closed, or a copy issued before the trace began
        out: list[Finding] = []
        w.ops.add(op)
        if (w.splits or w.viol_a is not None or w.viol_b is not None or w.undec_a is not None
                or w.undec_b is not None) and self._lv >= 2:
            # the write's op as every finding about it names it: its prepare's (the lowest known), not the id of
            # the merged op that carried it, so H1b/H4 here, H4-open at the end and ZERO@backup agree
            wop = w.op()
            if w.splits:
                fnd = self._h1b(ev, ref, w, op, wop)
                if fnd is not None:
                    out.append(fnd)
            if w.viol_a is not None or w.viol_b is not None or w.undec_a is not None or w.undec_b is not None:
                self._h4(ev, ref, w, op, wop, out)
        st.close_write(w)
        nodes = st.nodes
        acked = None
        for fr in w.frags:
            n = nodes.get(fr[0])
            if n is not None:
                bs = n.bk_state
                if bs is not None and bs[1] is w and bs[0] == "pending":
                    if acked is None:
                        acked = ("acked", ref)
                    n.bk_state = acked
        return out

    def _ack_h2d(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        st = self.st
        op = op if type(op := f.get("op")) is int else None   # int_field(), inlined (hot path)
        ld = None
        lst = st.loads_by_node.get(nid)
        if lst:   # an open load of this node: this is its first ack record (it ends the H2c window)
            ld = lst[0]
            if ld.op != op:
                ld = next((x for x in lst if x.op == op), ld)   # (a merged op's ack carries another id)
            first = True
        else:     # another chain node's record of a load an earlier record of the same ack closed
            ld = st.closed_by_node.get(nid)
            if ld is None:
                return None   # no reload of this node in the stream (it began mid-run)
            first = False
        out: list[Finding] = []
        if self._lv >= 2:
            if not first or ld.viol is not None:
                fnd = self._h2c_at_ack(ev, ref, nid, ld, first)
                if fnd is not None:
                    out.append(fnd)
            elif ld.undec is not None:   # (no breach in the window: _h2c_at_ack's None, without the call)
                self._undecidable("H2c", "H2", ld.node_id, ld.undec)
        if first:
            old = st.close_load(ld)
            if old is not None:
                if old.due is not None:   # (_h2c_late has nothing to report otherwise)
                    out.extend(self._h2c_late(old, None) or ())
                if not old.hashed.issuperset(old.chain):   # (_count_unhashed skips the hashed nodes)
                    self._count_unhashed(old)
            nodes = st.nodes
            for cid in ld.chain:
                n = nodes.get(cid)
                if n is not None:
                    n.bump(ref, "ack h2d")
        nz = f.get("nz")
        if nz == 0 and type(nz) is int:   # (ZERO@reload fires on nz=0 only)
            fnd = self._zero_reload(ev, ref, nid, ld, nz, True)
            if fnd is not None:
                out.append(fnd)
        hr, hp_r = f.get("h"), f.get("hp")
        if (type(hr) is int or isinstance(hp_r, list)) and nid not in ld.hashed:
            fnd = self._hash_ack(ev, ref, nid, ld, hr, hp_r)
            if fnd is not None:
                out.append(fnd)
        if self.sidecars:
            out.extend(self._side_hash(ev, f, nid, ref, ld))
        return out

    def _l3_backup_all(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
        """``l3_backup``: L3a/L3b's state, then the sidecar pages' (SIDE-l3)."""
        self._l3_backup(ev, f, nid, ref)
        if self.sidecars:
            self._side_l3_backup(f, ref)

    def _ld_read(self, ev: Event, f: dict, nid: object, ref: tuple) -> list[Finding] | None:
        """``ld_read``: LOAD-early."""
        fnd = self._load_early(ev, f, nid, ref)
        return [fnd] if fnd is not None else None

    def _l3_ack_all(self, ev: Event, f: dict, nid: object, ref: tuple) -> list[Finding] | None:
        """``l3_ack``: L3a/L3b, then SIDE-l3 at a prefetch's ack."""
        out = self._l3_ack(ev, f, nid, ref)
        if self.sidecars and f.get("dir") == "prefetch":
            fnd = self._side_l3(ev, f, nid, ref)
            if fnd is not None:
                out = [*(out or ()), fnd]
        return out

    def _audit(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        """``audit``: a host copy at rest re-fingerprinted (REST-hash), or with ``tier=l3`` stored objects (REST-l3)."""
        self._audit_seen = True
        fnd = self._rest_l3(ev, f, nid, ref) if f.get("tier") == TIER_L3 else self._rest_hash(ev, f, nid, ref)
        return [fnd] if fnd is not None else None

    def _evict(self, ev: Event, f: dict, nid: int, ref: tuple) -> None:
        tier = f.get("tier")
        if tier != "dev" and tier != "host":
            return None
        st = self.st
        node = st.nodes.get(nid)
        if tier == "dev":
            lst = st.writes_by_node.get(nid)
            if lst:
                self._h4_evicted(lst, "a", ref, f"device eviction of node {nid}")
            kind = f.get("kind")
            if kind == "regular" or kind == "drop":
                st.delete(nid, ref, "evict kind=regular" if kind == "regular" else "evict kind=drop")   # (no format)
            elif node is not None:
                node.dev = None
                node.bump(ref, "evict tier=dev")
        elif tier == "host":
            hs = None
            if st.writes or st.loads or st.l3:   # the freed host slots matter only to copies in flight
                hs = slots_of(f.get("host"), f.get("hostx"))
                if node is not None and isinstance(node.host, Slots) and hs is None:
                    hs = node.host
            lst = st.writes_by_node.get(nid)
            if lst:
                self._h4_evicted(lst, "b", ref, f"host eviction of node {nid}")
            # (guards: the messages are only built when something is in flight)
            if hs is not None and st.writes:
                self._h4_breach(hs, "host", nid, ref, f"host eviction of node {nid} freed host slots", "b")
            if st.loads:
                self._h2c_host_evict(nid, hs, ref)
            if st.l3:
                self._l3_breach(hs, ref, f"host eviction of node {nid}", node=nid)
            st.delete(nid, ref, "evict tier=host")
        return None

    def _free(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
        st = self.st
        self.free_owner = None   # (the breach marks below name the copy's node: free_owner, rules_h2)
        pool = f.get("pool")
        if pool != "host" and (pool != "dev" or not (st.writes or st.fills)):   # (nothing the slots matter to)
            return None
        s = slots_of(f.get("idx"), f.get("idx_x"))
        if s is None:
            return None
        nid = nid if type(nid) is int else None   # int_field(), inlined (hot path)
        if pool == "dev":
            if st.writes:
                self._h4_breach(s, "dev", None, ref, f"free pool=dev (why={f.get('why')}) of the copy's "
                                "source slots", "a")
            if st.fills:
                self._h3_free(s, nid, ref)
        elif pool == "host":
            if st.writes:
                self._h4_breach(s, "host", None, ref, f"free pool=host (why={f.get('why')}) of the copy's "
                                "host slots", "b")
            if st.loads:
                self._h2c_breach(s, None, ref, f"free pool=host (why={f.get('why')}) of the load's host slots")
            if st.l3:
                self._l3_breach(s, ref, f"free pool=host (why={f.get('why')}) of its host slots")
            if nid is not None and nid >= 0:   # H2a/H1a: the node's host copy is gone
                node = st.nodes.get(nid)
                if node is not None and isinstance(node.host, Slots) and overlap(s, node.host) is not None:
                    node.host_freed = ref
        return None

    def _reload(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        st = self.st
        chain = f.get("chain")
        if type(chain) is list and len(chain) == 1 and type(chain[0]) is int:
            chain = [chain[0]]
        else:
            chain = [x for x in chain if type(x) is int] if isinstance(chain, list) and chain else [nid]
        H = slots_of(f.get("host"), f.get("hostx"))
        D = slots_of(f.get("dev"), f.get("devx"))
        op = op if type(op := f.get("op")) is int else None   # int_field(), inlined (hot path)
        out: list[Finding] = []
        fnd = self._h2a(ev, ref, nid, chain, H, op)
        if fnd is not None:
            out.append(fnd)
        if self.sidecars:
            fnd = self._side_missing(ev, f, nid, ref, "reload")
            if fnd is not None:
                out.append(fnd)
        # one pass over the chain: each node's backup witness (a placeholder node at first sight: the trace began
        # mid-run), whether one is pending (H2b; a placeholder's is not), then its new device slots, in chain order
        # (nothing below reads a node's device state or generation)
        nodes = st.nodes
        snap: dict[int, Backup | None] = {}
        pend = False
        start = 0
        for cid in chain:
            n = nodes.get(cid)
            if n is None:
                if cid in st.dead:
                    snap[cid] = None
                    continue
                n = nodes[cid] = Node(cid, H.cnt if H is not None and len(chain) == 1 else 0, None, UNKNOWN, ref)
            snap[cid], bs = n.bk, n.bk_state
            pend = pend or (bs is not None and bs[0] == "pending")
            # slice_slots gives None for a set whose order is unknown (and a non-empty slice): skip the call
            part = (slice_slots(D, start, n.len) if D is not None and (n.len <= 0 or (D.ordered and D.runs is not None))
                    else None)
            if part is None and D is not None and start == 0 and n.len == D.cnt:
                part = D   # the node takes the whole range (a one-node chain): its summary is the node's, in any order
            n.dev = part if part is not None else UNKNOWN
            start += n.len
            n.bump(ref, "reload")
        if pend and self._lv >= 2:
            self._h2b(ev, ref, chain, op, out)
        # -- H4 and H2c windows of other copies
        if D is not None and st.writes:
            self._h4_breach(D, "dev", nid, ref, f"reload of node {nid} took dev slots of the copy", "a")
        if H is not None:
            if st.writes:
                self._h4_breach(H, "host", nid, ref, f"reload of node {nid} read host slots of the copy", "b")
            if st.loads:
                self._h2c_breach(H, nid, ref, f"reload of node {nid} was given host slots being loaded")
            if st.l3:
                self._l3_breach(H, ref, f"reload of node {nid} read host slots", ("prefetch",))
        ld = PendingLoad(op, nid, chain, H, D, ref, snap)
        # -- ZERO / HASH when the emitter synchronized before hashing
        if f.get("sync") == 1:
            nz = f.get("nz")
            if type(nz) is int:
                fnd = self._zero_reload(ev, ref, nid, ld, nz, False)
                if fnd is not None:
                    out.append(fnd)
            hr, hp_r = f.get("h"), f.get("hp")
            if type(hr) is int or isinstance(hp_r, list):
                self._hash_reload(ev, ref, nid, ld, hr, hp_r, out)
        old = st.open_load(ld)
        if old is not None:   # over MAX_PENDING: the oldest load is forgotten
            self._count_unhashed(old)
        return out

    def _compose(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        key = f.get("key")
        if key is None or type(key) is list:
            return None
        chain = f.get("chain")
        if chain is None:   # the usual record: the view derives from its own node
            chain = [nid]
        elif type(chain) is list and len(chain) == 1 and type(chain[0]) is int:
            chain = [chain[0]]
        else:
            chain = [x for x in chain if type(x) is int] if isinstance(chain, list) and chain else [nid]
        hit = f.get("hit")
        if hit == 0:
            self._h3_fill(ev, ref, key, chain)
            return None
        if hit != 1 or self._lv < 2:
            return None
        return self._h3(ev, ref, key, nid, chain)


def checker_factory(enabled: bool, level: int | None) -> Callable[[int], RankChecker] | None:
    """The ``checker_factory`` of :class:`~cptrace_otel.model.spans.SpanBuilder` (the online checks of the exporter
    and ``ingest``): ``rank -> RankChecker(rank, level)`` (``level`` None: the checker infers it from the stream)
    when the online checks are ``enabled``, else None."""
    if not enabled:
        return None
    return lambda rank: RankChecker(rank, level)
