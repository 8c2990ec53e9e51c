"""Per-rank streaming rules: H1-H4, ZERO and HASH over one rank's events in seq order (domain sections 3.4, 4).

:class:`RankChecker` keeps the lineage state of :mod:`.state` for the current epoch and returns each finding at the
record that completes its evidence (H1b at the d2h ack, H2c at the h2d ack, H4 at the d2h ack, H3 at the stale
hit, H1a at the split, H2a/H2b at the reload, ZERO/HASH at the hashed record).
"""

from __future__ import annotations

from typing import Any, Callable

from ..events import LEVEL_OF_TAG, Event
from .epochs import EpochTracker
from .findings import ERROR, WARN, Finding, Unchecked
from .ranges import EXACT, Slots, concat, is_none_range, overlap, slice_slots, slots_of
from .state import (UNKNOWN, Backup, EpochState, Fill, Node, PendingLoad, PendingWrite)

_EPOCH_TAGS = frozenset(("reset", "split", "insert"))  # the only records that can move the epoch tracker

# Rules that need trace level 2 (ack/free/compose records): reported as unchecked below it.
LEVEL2_RULES = (("H1b", "H1"), ("H2b", "H2"), ("H2c", "H2"), ("H3", "H3"), ("H4", "H4"))
RULE_LEVEL = {"H1a": 1, "H1b": 2, "H1c": 1, "H2a": 1, "H2b": 2, "H2c": 2, "H3": 2, "H4": 2, "ZERO": 1, "HASH": 1}


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _ref(ev: Event) -> tuple:
    return (ev.seq, ev.line_no)


class RankChecker:
    """Streaming checker of one rank. See the package docstring for the contract."""

    def __init__(self, rank: int, level: int | None = None) -> None:
        self.rank = rank
        self.forced_level = level
        self.config_level: int | None = None
        self.seen_level = 1
        self.mode = "none"
        self.io_rank = 0
        self.epoch = 0
        self._tracker = EpochTracker()
        self.st = EpochState()
        self.events = 0
        self.nodes_total = 0
        self._skips: dict[str, Unchecked] = {}
        self._seen_nz = self._seen_h = False
        self._dispatch: dict[str, Callable[[Event], list[Finding] | None]] = {
            "config": self._config, "insert": self._insert, "split": self._split, "prepare": self._prepare,
            "backup": self._backup, "ack": self._ack, "evict": self._evict, "free": self._free,
            "reload": self._reload, "compose": self._compose,
        }
        # tag -> (level of the tag, handler, whether the record can move the epoch tracker): one lookup per record
        # on the hot path
        self._tab: dict[str, tuple[int, Callable[[Event], list[Finding] | None] | None, bool]] = {
            tag: (lv, self._dispatch.get(tag), tag in _EPOCH_TAGS) for tag, lv in LEVEL_OF_TAG.items()}
        for tag, h in self._dispatch.items():
            if tag not in self._tab:
                self._tab[tag] = (1, h, tag in _EPOCH_TAGS)

    def observe(self, tag: str, fn: Callable[[Event], Any]) -> None:
        """Also pass every record with ``tag`` to ``fn`` (before the tag's rule, if it has one; ``fn``'s result is
        ignored). Through the per-tag table the hot path looks up anyway, so records of other tags pay nothing."""
        lv, rule, moves = self._tab.get(tag, (LEVEL_OF_TAG.get(tag, 1), None, tag in _EPOCH_TAGS))

        def observed(ev: Event) -> list[Finding] | None:
            fn(ev)
            return rule(ev) if rule is not None else None

        self._tab[tag] = (lv, observed, moves)

    # -- level --------------------------------------------------------------------------------------------------
    @property
    def level(self) -> int:
        """Explicit level, else ``config level=``, else the highest level whose records occurred (domain 3.4)."""
        if self.forced_level is not None:
            return self.forced_level
        if self.config_level is not None:
            return self.config_level
        return self.seen_level

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
            lv, h, moves = LEVEL_OF_TAG.get(tag, 1), None, tag in _EPOCH_TAGS
        else:
            lv, h, moves = ent
        evl = ev.level
        if evl > lv:
            lv = evl
        if lv > self.seen_level:
            self.seen_level = lv
        t = self._tracker
        if moves or t._after_reset or ev.epoch > t.epoch:
            e = t.step(tag, ev.fields, ev.epoch)
            if e != self.epoch:
                self.epoch = e
                self.st = EpochState()   # pending state of the old epoch is dropped: a reset aborts in-flight copies
        # (the tracker's epoch moves only in step(), so outside the branch above it equals self.epoch)
        if h is None:
            return None
        return h(ev)

    def finish(self) -> list[Finding]:
        """End of stream: d2h copies whose ack never came after a breach (H4-open, WARN)."""
        out: list[Finding] = []
        if self.level >= 2:
            for w in self.st.writes.values():
                for rule, v in (("H4a", w.viol_a), ("H4b", w.viol_b)):
                    if v is None:
                        continue
                    ref, cert, what = v
                    out.append(self._finding("H4", "H4-open", w.origin, w.op(), cert, [w.p_ref, ref],
                                             f"{what} while the d2h copy of op {w.op()} was in flight ({rule}); "
                                             "its ack never arrived", severity=WARN))
        for ld in self.st.loads.values():
            self._count_unhashed(ld)
        self.st.loads.clear()
        self.st.loads_by_node.clear()
        return out

    def unchecked(self) -> list[Unchecked]:
        """Rules that could not run at this stream's level, then per-instance skips (HASH across a split, ...)."""
        out: list[Unchecked] = []
        if self.level < 2:
            for rule, code in LEVEL2_RULES:
                out.append(Unchecked(rule, code, self.rank, 2, f"trace level {self.level} < 2: no ack/free/compose "
                                     "records", "level"))
        out.extend(self._skips.values())
        return out

    # -- helpers ------------------------------------------------------------------------------------------------
    def _finding(self, code: str, rule: str, node_id: Any, op: Any, cert: str, refs: list, msg: str,
                 ev: Event | None = None, severity: str = ERROR) -> Finding:
        refs = sorted({r for r in refs if r is not None})
        f = Finding(code, rule, self.rank, self.epoch, node_id, op, cert, [r[0] for r in refs], msg,
                    severity if cert == EXACT else WARN)
        f.evidence_lines = [r[1] for r in refs]
        if ev is not None:
            f.src, f.line_no = ev.src, ev.line_no
        return f

    def _skip(self, rule: str, code: str, node_id: Any, reason: str) -> None:
        u = self._skips.get(rule)
        if u is None:
            self._skips[rule] = Unchecked(rule, code, self.rank, 1, reason, "skip", 1, [node_id])
        else:
            u.count += 1
            if len(u.examples) < 5 and node_id not in u.examples:
                u.examples.append(node_id)

    def _bump(self, node: Node | None, ref: tuple, why: str) -> None:
        if node is not None:
            node.gen += 1
            node.gen_ref = (ref, why)

    def _delete(self, nid: int, ref: tuple, why: str) -> None:
        st = self.st
        if st.nodes.pop(nid, None) is not None:
            st.dead.put(nid, (ref, why))
        keys = st.fills_by_node.pop(nid, None)
        if keys:
            for k in keys:
                st.fills.pop(k, None)

    def _open_write(self, w: PendingWrite) -> None:
        st = self.st
        st.writes[id(w)] = w
        st.writes_by_node.setdefault(w.origin, []).append(w)
        if len(st.writes) > st.MAX_PENDING:  # a level-1 stream never acks: forget the oldest
            self._close_write(next(iter(st.writes.values())))

    def _close_write(self, w: PendingWrite) -> None:
        st = self.st
        st.writes.pop(id(w), None)
        for nid in w.frag_ids():
            lst = st.writes_by_node.get(nid)
            if lst:
                try:
                    lst.remove(w)
                except ValueError:
                    pass
                if not lst:
                    del st.writes_by_node[nid]

    def _find_write(self, nid: int, op: Any, need_unbacked: bool = False) -> PendingWrite | None:
        lst = self.st.writes_by_node.get(nid)
        if not lst:
            return None
        for w in lst:
            if op in w.ops and not (need_unbacked and w.b_ref is not None):
                return w
        for w in lst:  # merged ops carry a new op id: fall back to the node
            if not (need_unbacked and w.b_ref is not None):
                return w
        return None

    def _open_load(self, ld: PendingLoad) -> None:
        st = self.st
        st.loads[id(ld)] = ld
        st.loads_by_node.setdefault(ld.node_id, []).append(ld)
        if len(st.loads) > st.MAX_PENDING:
            old = next(iter(st.loads.values()))
            self._close_load(old)
            self._count_unhashed(old)

    def _close_load(self, ld: PendingLoad) -> None:
        st = self.st
        st.loads.pop(id(ld), None)
        lst = st.loads_by_node.get(ld.node_id)
        if lst:
            try:
                lst.remove(ld)
            except ValueError:
                pass
            if not lst:
                del st.loads_by_node[ld.node_id]
        st.recent_loads.put((ld.op, ld.node_id), ld)

    def _count_unhashed(self, ld: PendingLoad) -> None:
        for nid in ld.chain:
            bk = ld.snap.get(nid)
            if nid not in ld.hashed and bk is not None and bk.h is not None:
                self._skip("HASH-skipped(no reload hash)", "HASH", nid,
                           "reload without sync=1 h and no h2d ack hash (level 1?)")

    def _breach_writes(self, s: Slots | None, attr: str, exclude: int | None, ref: tuple, what: str,
                       side: str) -> None:
        """Mark H4 on every in-flight d2h copy (of another lineage than ``exclude``) whose dev/host ⊓ ``s``."""
        if s is None or not self.st.writes:
            return
        for w in self.st.writes.values():
            if exclude is not None and any(f[0] == exclude for f in w.frags):
                continue
            c = overlap(s, getattr(w, attr))
            if c is None:
                continue
            v = (ref, c, what)
            if side == "a":
                if w.viol_a is None or (w.viol_a[1] != EXACT and c == EXACT):
                    w.viol_a = v
            elif w.viol_b is None or (w.viol_b[1] != EXACT and c == EXACT):
                w.viol_b = v

    def _breach_loads(self, s: Slots | None, exclude: int | None, ref: tuple, what: str) -> None:
        """Mark H2c on every in-flight h2d copy (of another lineage than ``exclude``) whose host ⊓ ``s``."""
        if s is None or not self.st.loads:
            return
        for ld in self.st.loads.values():
            if exclude is not None and exclude in ld.chain:
                continue
            c = overlap(s, ld.host)
            if c is not None and (ld.viol is None or (ld.viol[1] != EXACT and c == EXACT)):
                ld.viol = (ref, c, what)

    # -- handlers -----------------------------------------------------------------------------------------------
    def _config(self, ev: Event) -> None:
        f = ev.fields
        lv = _int(f.get("level"))
        if lv is not None:
            self.config_level = lv
        if isinstance(f.get("mode"), str):
            self.mode = f["mode"]
        io = _int(f.get("io_rank"))
        if io is not None:
            self.io_rank = io

    def _insert(self, ev: Event) -> None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        d = slots_of(f.get("dev"), f.get("devx"))
        st = self.st
        node = st.nodes.get(nid)
        if node is not None and f.get("kind") != "new":   # revive: adopts the request's slots
            node.dev = d if d is not None else UNKNOWN
            self._bump(node, ref, "insert kind=revive")
        else:
            length = _int(f.get("len")) or (d.cnt if d is not None else 0)
            node = Node(nid, length, d if d is not None else UNKNOWN, None, ref)
            st.nodes[nid] = node
            st.dead.pop(nid, None)
            self.nodes_total += 1
        if st.writes and d is not None:
            self._breach_writes(d, "dev", nid, ref, f"insert of node {nid} took dev slots of the copy", "a")
        return None

    def _split(self, ev: Event) -> list[Finding] | None:
        f = ev.fields
        c, p = _int(f.get("node_id")), _int(f.get("new_id"))
        L, s = _int(f.get("pre_len")), _int(f.get("split_len"))
        if c is None or p is None or L is None or s is None:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        st = self.st
        pre = st.nodes.get(c)
        dp, dc = slots_of(f.get("dev_p")), slots_of(f.get("dev_c"))
        hp_raw, hc_raw = f.get("host_p"), f.get("host_c")
        hp, hc = slots_of(hp_raw), slots_of(hc_raw)
        out: list[Finding] = []
        if pre is not None:
            bad: list[str] = []
            if dp is not None and dc is not None:
                if dp.cnt != s or dc.cnt != L - s:
                    bad.append(f"dev counts {dp.cnt}+{dc.cnt}, expected {s}+{L - s}")
                elif isinstance(pre.dev, Slots) and pre.dev.cnt == L and L > 0:
                    if s > 0 and dp.first != pre.dev.first:
                        bad.append(f"dev_p.first={dp.first} but the node's dev started at {pre.dev.first}")
                    if L - s > 0 and dc.last != pre.dev.last:
                        bad.append(f"dev_c.last={dc.last} but the node's dev ended at {pre.dev.last}")
            if isinstance(pre.host, Slots) and pre.host_freed is None:
                if hp is None or hc is None:
                    if is_none_range(hp_raw) or is_none_range(hc_raw):
                        bad.append("a backuped node split into a fragment without host slots")
                elif hp.cnt != s or hc.cnt != L - s:
                    bad.append(f"host counts {hp.cnt}+{hc.cnt}, expected {s}+{L - s}")
                elif pre.host.cnt == L and L > 0:
                    if s > 0 and hp.first != pre.host.first:
                        bad.append(f"host_p.first={hp.first} but the node's host started at {pre.host.first}")
                    if L - s > 0 and hc.last != pre.host.last:
                        bad.append(f"host_c.last={hc.last} but the node's host ended at {pre.host.last}")
            elif pre.host is None and ((hp is not None and hp.cnt > 0) or (hc is not None and hc.cnt > 0)):
                bad.append("a node that is not backuped split into fragments with host slots")
            if bad:
                out.append(self._finding("H1", "H1a", c, _int(f.get("pend")), EXACT, [ref],
                                         f"split of node {c} into {p}+{c} (split_len={s}): " + "; ".join(bad), ev))
        # -- update the lineage: the prefix moves to the new id, the old id keeps the suffix
        pnode = Node(p, s, dp if dp is not None else (None if is_none_range(f.get("dev_p")) else UNKNOWN),
                     hp if hp is not None else (None if is_none_range(hp_raw) else UNKNOWN), ref)
        pnode.from_split = True
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
        self._bump(pre, ref, f"split into {p}+{c}")
        pnode.gen_ref = (ref, f"split into {p}+{c}")
        lst = st.writes_by_node.get(c)
        if lst:
            for w in lst:
                for i, fr in enumerate(w.frags):
                    if fr[0] == c:
                        w.frags[i:i + 1] = [[p, s], [c, fr[1] - s]]
                        break
                w.splits.append(ref)
            st.writes_by_node[p] = list(lst)
        return out

    def _prepare(self, ev: Event) -> None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        st = self.st
        h = slots_of(f.get("host"), f.get("hostx"))
        d = slots_of(f.get("dev"), f.get("devx"))
        if h is not None:
            if st.writes:
                self._breach_writes(h, "host", nid, ref, f"prepare of node {nid} took host slots of the copy", "b")
            if st.loads:
                self._breach_loads(h, nid, ref, f"prepare of node {nid} took host slots being loaded")
        length = _int(f.get("len")) or (d.cnt if d is not None else 0)
        node = st.nodes.get(nid)
        if node is None:
            node = Node(nid, length, d if d is not None else UNKNOWN, None, ref)
            st.nodes[nid] = node
            self.nodes_total += 1
        node.host = h if h is not None else UNKNOWN
        node.host_freed = None
        w = PendingWrite(_int(f.get("op")), nid, length, d, h, ref)
        node.bk_state = ("pending", w)
        self._open_write(w)
        return None

    def _backup(self, ev: Event) -> list[Finding] | None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        st = self.st
        op = _int(f.get("op"))
        w = self._find_write(nid, op, True)
        d = slots_of(f.get("dev"), f.get("devx"))
        if w is not None:
            w.ops.add(op)
            w.b_ref = ref
            if d is not None:
                w.dev = d
        node = st.nodes.get(nid)
        h = f.get("h")
        if type(h) is int:
            self._seen_h = True
        if node is not None:
            node.bk = Backup(h if type(h) is int and h >= 0 else None, f.get("hp"), f.get("hs"), ref, op, True,
                             node.len)
        nz = f.get("nz")
        if type(nz) is int:
            self._seen_nz = True
            cnt = d.cnt if d is not None else (w.dev.cnt if w is not None and isinstance(w.dev, Slots) else 0)
            if nz == 0 and cnt > 0:
                # a merged op carries a new id: name the write by its prepare's op, as the ack-time rules do
                return [self._finding("ZERO", "ZERO@backup", nid, w.op() if w is not None else op, EXACT, [ref],
                                      f"backup of node {nid} ({cnt} slots) read all-zero KV (nz=0)", ev)]
        return None

    def _ack(self, ev: Event) -> list[Finding] | None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        d = f.get("dir")
        if d == "d2h":
            return self._ack_d2h(ev, nid)
        if d == "h2d":
            return self._ack_h2d(ev, nid)
        return None

    def _ack_d2h(self, ev: Event, nid: int) -> list[Finding] | None:
        f = ev.fields
        st = self.st
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        op = _int(f.get("op"))
        w = self._find_write(nid, op)
        if w is None:
            return None   # a duplicate record of an ack already closed, or a copy issued before the trace began
        out: list[Finding] = []
        w.ops.add(op)
        # the write's op as every finding about it names it: its prepare's (the lowest known), not the id of the
        # merged op that carried it, so H1b/H4 here, H4-open at the end and ZERO@backup agree
        wop = w.op()
        gated = self.level >= 2
        if gated and w.splits:
            bad: list[str] = []
            L = w.L
            blen = _int(f.get("blen"))
            if blen is not None and blen != L:
                bad.append(f"blen={blen} but the prepare enqueued {L} tokens")
            pub = f.get("pub")
            flen = {fr[0]: fr[1] for fr in w.frags}
            if isinstance(pub, list):
                ids = [x for x in pub if type(x) is int]
                total = sum(flen.get(x, 0) for x in ids)
                stray = [x for x in ids if x not in flen]
                if total != L or stray or len(set(ids)) != len(ids):
                    bad.append(f"pub={pub} covers {total} of {L} tokens; the lineage fragments are "
                               f"{[fr[0] for fr in w.frags]}")
            else:
                clen = _int(f.get("clen"))
                if clen is not None and clen < (blen if blen is not None else L):
                    bad.append(f"clen={clen} < {blen if blen is not None else L} and no pub= fragments")
            if bad:
                out.append(self._finding("H1", "H1b", w.origin, wop, EXACT, [w.p_ref, *w.splits, ref],
                                         f"d2h ack of op {op} after a split of node {w.origin}: " + "; ".join(bad),
                                         ev))
        if gated and (w.viol_a is not None or w.viol_b is not None):
            for rule, v in (("H4a", w.viol_a), ("H4b", w.viol_b)):
                if v is None:
                    continue
                vref, cert, what = v
                start = w.b_ref if rule == "H4a" and w.b_ref is not None else w.p_ref
                out.append(self._finding("H4", rule, w.origin, wop, cert, [start, vref, ref],
                                         f"{what} before the d2h ack of op {op} (node {w.origin}): the backup may "
                                         "hold foreign bytes", ev))
        self._close_write(w)
        for fid in w.frag_ids():
            n = st.nodes.get(fid)
            if n is not None:
                bs = n.bk_state
                if bs is not None and bs[0] == "pending" and bs[1] is w:
                    n.bk_state = ("acked", ref)
        return out

    def _ack_h2d(self, ev: Event, nid: int) -> list[Finding] | None:
        f = ev.fields
        st = self.st
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        op = _int(f.get("op"))
        ld = None
        lst = st.loads_by_node.get(nid)
        if lst:
            ld = lst[0]
            if ld.op != op:
                ld = next((x for x in lst if x.op == op), ld)
        first = ld is not None
        if ld is None:
            ld = st.recent_loads.get((op, nid))
            if ld is None:
                for x in st.loads.values():   # an ack record naming another chain node of an open load
                    if x.op == op and nid in x.chain:
                        ld = x
                        first = True
                        break
            if ld is None:
                return None
        out: list[Finding] = []
        if first:
            if ld.viol is not None and self.level >= 2:
                vref, cert, what = ld.viol
                out.append(self._finding("H2", "H2c", ld.node_id, ld.op, cert, [ld.ref, vref, ref],
                                         f"{what} before the h2d ack of op {ld.op}: the load read unpinned host "
                                         "pages", ev))
            self._close_load(ld)
            for cid in ld.chain:
                self._bump(st.nodes.get(cid), ref, "ack h2d")
        nz = f.get("nz")
        if type(nz) is int:
            self._seen_nz = True
            n = st.nodes.get(nid)
            cnt = n.len if n is not None else (ld.dev.cnt if isinstance(ld.dev, Slots) else 0)
            if nz == 0 and cnt > 0 and not ld.zeroed:
                ld.zeroed = True
                out.append(self._finding("ZERO", "ZERO@reload", nid, ld.op, EXACT, [ld.ref, ref],
                                         f"node {nid} holds all-zero KV after its host->device load (nz=0)", ev))
        hr = f.get("h")
        if (type(hr) is int or isinstance(f.get("hp"), list)) and nid not in ld.hashed:
            if nid in ld.snap:
                bk = ld.snap[nid]
            else:
                n = st.nodes.get(nid)
                bk = n.bk if n is not None else None
            fnd = self._hash_cmp(nid, ld.op, bk, hr, f.get("hp"), [ld.ref, ref], ev)
            ld.hashed.add(nid)
            if fnd is not None:
                out.append(fnd)
        return out

    def _hash_cmp(self, nid: int, op: Any, bk: Backup | None, hr: Any, hp_r: Any, refs: list,
                  ev: Event) -> Finding | None:
        """HASH: the node's reload hash against its latest backup hash (per page across a split)."""
        if type(hr) is int:
            self._seen_h = True
        if bk is None:
            self._skip("HASH-skipped(no backup)", "HASH", nid, "no backup record for the reloaded node")
            return None
        if bk.whole:
            hb = bk.h
            if self.mode == "shared":
                hs = bk.hs
                hb = hs[self.rank] if isinstance(hs, list) and 0 <= self.rank < len(hs) else None
                if hb is None:
                    return None   # compared across ranks against the IO rank's hs[r] (C5)
            if type(hb) is not int or type(hr) is not int:
                self._skip("HASH-skipped(no hash)", "HASH", nid, "backup or reload carries no h")
                return None
            if hb < 0 or hr < 0:
                self._skip("HASH-skipped(sentinel)", "HASH", nid, "h=-1/-2: the hash was skipped")
                return None
            if hb != hr:
                return self._finding("HASH", "HASH", nid, op, EXACT, [bk.ref, *refs],
                                     f"node {nid}: backup h={hb} but reload h={hr}", ev)
            return None
        if isinstance(bk.hp, list) and isinstance(hp_r, list):
            if bk.hp != hp_r:
                k = next((i for i, (a, b) in enumerate(zip(bk.hp, hp_r)) if a != b), min(len(bk.hp), len(hp_r)))
                return self._finding("HASH", "HASH", nid, op, EXACT, [bk.ref, *refs],
                                     f"node {nid} (split since backup): page {k} hash differs between backup "
                                     "and reload", ev)
            return None
        self._skip("HASH-skipped(split)", "HASH", nid, "split between backup and reload and no per-page hp")
        return None

    def _evict(self, ev: Event) -> None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        st = self.st
        node = st.nodes.get(nid)
        tier = f.get("tier")
        if tier == "dev":
            lst = st.writes_by_node.get(nid)
            if lst:
                for w in lst:
                    if w.viol_a is None or w.viol_a[1] != EXACT:
                        w.viol_a = (ref, EXACT, f"device eviction of node {nid}")
            kind = f.get("kind")
            if kind == "regular" or kind == "drop":
                self._delete(nid, ref, f"evict kind={kind}")
            elif node is not None:
                node.dev = None
                self._bump(node, ref, "evict tier=dev")
        elif tier == "host":
            hs = None
            if st.writes or st.loads:   # the freed host slots matter only to copies in flight
                hs = slots_of(f.get("host"), f.get("hostx"))
                if node is not None and isinstance(node.host, Slots) and hs is None:
                    hs = node.host
            lst = st.writes_by_node.get(nid)
            if lst:
                for w in lst:
                    if w.viol_b is None or w.viol_b[1] != EXACT:
                        w.viol_b = (ref, EXACT, f"host eviction of node {nid}")
            # (guards: the messages are only built when something is in flight)
            if hs is not None and st.writes:
                self._breach_writes(hs, "host", nid, ref, f"host eviction of node {nid} freed host slots", "b")
            if st.loads:
                for ld in st.loads.values():
                    if nid in ld.chain:
                        if ld.viol is None or ld.viol[1] != EXACT:
                            ld.viol = (ref, EXACT, f"host eviction of node {nid}")
                if hs is not None:
                    self._breach_loads(hs, nid, ref, f"host eviction of node {nid} freed host slots")
            self._delete(nid, ref, "evict tier=host")
        return None

    def _free(self, ev: Event) -> None:
        f = ev.fields
        st = self.st
        s = slots_of(f.get("idx"), f.get("idx_x"))
        if s is None:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        nid = f.get("node_id")
        if type(nid) is not int:   # _int(), inlined (hot path)
            nid = None
        pool = f.get("pool")
        if pool == "dev":
            if st.writes:
                self._breach_writes(s, "dev", None, ref, f"free pool=dev (why={f.get('why')}) of the copy's "
                                    "source slots", "a")
            fills = st.fills
            if fills:
                if nid is not None and nid >= 0:   # the fills that read this node's slots
                    cand: Any = (fills.get(k) for k in st.fills_by_node.get(nid, ()))
                else:
                    cand = fills.values()
                for fl in cand:
                    if fl is not None and fl.invalid is None:
                        c = overlap(s, fl.src)
                        if c is not None:
                            fl.invalid = (ref, c)
        elif pool == "host":
            if st.writes:
                self._breach_writes(s, "host", None, ref, f"free pool=host (why={f.get('why')}) of the copy's "
                                    "host slots", "b")
            if st.loads:
                self._breach_loads(s, None, ref, f"free pool=host (why={f.get('why')}) of the load's host slots")
            if nid is not None and nid >= 0:
                node = st.nodes.get(nid)
                if node is not None and isinstance(node.host, Slots) and overlap(s, node.host) is not None:
                    node.host_freed = ref
        return None

    def _reload(self, ev: Event) -> list[Finding] | None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        st = self.st
        chain = f.get("chain")
        if type(chain) is list and len(chain) == 1 and type(chain[0]) is int:
            chain = [chain[0]]
        else:
            chain = [x for x in chain if type(x) is int] if isinstance(chain, list) and chain else [nid]
        H = slots_of(f.get("host"), f.get("hostx"))
        D = slots_of(f.get("dev"), f.get("devx"))
        op = _int(f.get("op"))
        out: list[Finding] = []
        # -- H2a / H1c: the host range is the concatenation of the chain's current host ranges
        bad: list[str] = []
        evid: list = [ref]
        hosts: list | None = []   # None once a chain node's host is unknown
        total_len = 0
        split_made = False
        for cid in chain:
            n = st.nodes.get(cid)
            if n is None:
                d = st.dead.get(cid)
                if d is not None:
                    bad.append(f"chain node {cid} is gone ({d[1]})")
                    evid.append(d[0])
                hosts = None
                continue
            split_made |= n.from_split
            total_len += n.len
            if n.host is None:
                bad.append(f"chain node {cid} has no host copy (not backuped)")
                hosts = None
            elif n.host_freed is not None:
                bad.append(f"chain node {cid}'s host slots were freed")
                evid.append(n.host_freed)
                hosts = None
            elif n.host is UNKNOWN:
                hosts = None
            elif hosts is not None:
                hosts.append(n.host)
        if not bad and hosts and H is not None and len(hosts) == len(chain):
            exp = concat(hosts)
            if exp is not None:
                if (exp.cnt != H.cnt or exp.lo != H.lo or exp.hi != H.hi or exp.first != H.first
                        or exp.last != H.last):   # exp.summary() != H.summary(), without the two tuples
                    bad.append(f"host={H.summary()} but the chain's host is {exp.summary()} "
                               "(cnt,min,max,first,last)")
                elif exp.ordered and H.ordered and exp.runs != H.runs:
                    bad.append("host slots differ from the chain's host slots (exact sets)")
                if H.cnt != total_len:
                    bad.append(f"host.cnt={H.cnt} but the chain holds {total_len} tokens")
        if bad:
            tag = " (split-created node: H1c)" if split_made else ""
            out.append(self._finding("H2", "H2a", nid, op, EXACT, evid,
                                     f"reload of node {nid} chain={chain}{tag}: " + "; ".join(bad), ev))
        # -- H2b: every chain node's backup acknowledged before the load is issued
        if self.level >= 2:
            for cid in chain:
                n = st.nodes.get(cid)
                if n is not None and n.bk_state is not None and n.bk_state[0] == "pending":
                    w = n.bk_state[1]
                    out.append(self._finding("H2", "H2b", cid, op, EXACT, [w.p_ref, ref],
                                             f"reload op {op} of node {cid} before the d2h ack of its backup "
                                             f"(op {w.op()})", ev))
        # -- H4 and H2c windows of other copies
        if D is not None and st.writes:
            self._breach_writes(D, "dev", nid, ref, f"reload of node {nid} took dev slots of the copy", "a")
        if H is not None:
            if st.writes:
                self._breach_writes(H, "host", nid, ref, f"reload of node {nid} read host slots of the copy", "b")
            if st.loads:
                self._breach_loads(H, nid, ref, f"reload of node {nid} was given host slots being loaded")
        for cid in chain:
            if cid not in st.nodes and cid not in st.dead:   # first sight (trace began mid-run): a placeholder
                st.nodes[cid] = Node(cid, H.cnt if H is not None and len(chain) == 1 else 0, None, UNKNOWN, ref)
        snap = {cid: (st.nodes[cid].bk if cid in st.nodes else None) for cid in chain}
        ld = PendingLoad(op, nid, chain, H, D, ref, snap)
        # -- ZERO / HASH when the emitter synchronized before hashing
        if f.get("sync") == 1:
            nz = f.get("nz")
            if type(nz) is int:
                self._seen_nz = True
                if nz == 0 and D is not None and D.cnt > 0:
                    ld.zeroed = True
                    out.append(self._finding("ZERO", "ZERO@reload", nid, op, EXACT, [ref],
                                             f"reload of node {nid}: all-zero KV after the load (nz=0)", ev))
            hr, hp_r = f.get("h"), f.get("hp")
            if type(hr) is int or isinstance(hp_r, list):
                if len(chain) == 1:
                    fnd = self._hash_cmp(nid, op, snap.get(nid), hr, hp_r, [ref], ev)
                    ld.hashed.add(nid)
                    if fnd is not None:
                        out.append(fnd)
                else:
                    bks = [snap.get(c) for c in chain]
                    if isinstance(hp_r, list) and all(b is not None and isinstance(b.hp, list) for b in bks):
                        exp_hp = [x for b in bks for x in b.hp]  # type: ignore[union-attr]
                        if exp_hp != hp_r:
                            out.append(self._finding("HASH", "HASH", nid, op, EXACT,
                                                     [*(b.ref for b in bks), ref],  # type: ignore[union-attr]
                                                     f"reload of chain {chain}: per-page hashes differ from the "
                                                     "backups", ev))
                        ld.hashed.update(chain)
                    else:
                        self._skip("HASH-skipped(chain)", "HASH", nid,
                                   "a multi-node reload hash without per-page hp is not comparable")
        # -- the chain nodes get the new device slots, in chain order
        start = 0
        for cid in chain:
            n = st.nodes.get(cid)
            if n is None:
                continue
            # slice_slots gives None for a set whose order is unknown (and a non-empty slice): skip the call
            part = (slice_slots(D, start, n.len) if D is not None and (n.len <= 0 or (D.ordered and D.runs is not None))
                    else None)
            n.dev = part if part is not None else UNKNOWN
            start += n.len
            self._bump(n, ref, "reload")
        self._open_load(ld)
        return out

    def _compose(self, ev: Event) -> list[Finding] | None:
        f = ev.fields
        key = f.get("key")
        nid = f.get("node_id")
        if key is None or type(nid) is not int or type(key) is list:
            return None
        st = self.st
        chain = f.get("chain")
        if chain is None:   # the usual record: the view derives from its own node
            chain = [nid]
        elif type(chain) is list and len(chain) == 1 and type(chain[0]) is int:
            chain = [chain[0]]
        else:
            chain = [x for x in chain if type(x) is int] if isinstance(chain, list) and chain else [nid]
        hit = f.get("hit")
        if hit == 0:
            nodes = st.nodes
            ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
            src = slots_of(f.get("src"))
            one = len(chain) == 1
            for c in chain:
                if c not in nodes and c not in st.dead:   # first sight of a node (trace began mid-run)
                    nodes[c] = Node(c, src.cnt if src is not None and one else 0,
                                    src if src is not None and one else UNKNOWN, UNKNOWN, ref)
            gens = {}
            for c in chain:
                n = nodes.get(c)
                gens[c] = n.gen if n is not None else None
            st.fills[key] = Fill(ref, src, gens)
            fbn = st.fills_by_node
            for c in chain:
                keys = fbn.get(c)
                if keys is None:
                    fbn[c] = {key}
                else:
                    keys.add(key)
            return None
        if hit != 1 or self.level < 2:
            return None
        ref = (ev.seq, ev.line_no)   # _ref(ev), inlined (hot path)
        fl = st.fills.get(key)
        if fl is None:
            return [self._finding("H3", "H3", nid, None, EXACT, [ref],
                                  f"compose hit for key {key} with no fill since the node's last change", ev)]
        if fl.reported:
            return None
        for c in chain:
            n = st.nodes.get(c)
            g = fl.gens.get(c)
            if n is None or g is None or n.gen != g:
                why = n.gen_ref if n is not None else None
                fl.reported = True
                what = f"{why[1]} at seq {why[0][0]}" if why else "the node is gone"
                return [self._finding("H3", "H3", nid, None, EXACT, [fl.ref, why[0] if why else None, ref],
                                      f"compose hit for key {key} served a view filled before node {c} changed "
                                      f"({what})", ev)]
        if fl.invalid is not None:
            vref, cert = fl.invalid
            fl.reported = True
            return [self._finding("H3", "H3", nid, None, cert, [fl.ref, vref, ref],
                                  f"compose hit for key {key} after its source slots were freed", ev)]
        return None
