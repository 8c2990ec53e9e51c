"""The lineage state a :class:`~.rank_checker.RankChecker` rebuilds for one (rank, epoch) (docs/domain.md §3.4).

Everything here is bounded by what is live: nodes leave with their lifecycle (host eviction, regular eviction),
pending writes and loads leave at their ack, compose fills leave with their node, and the few "recently closed"
and "recently deleted" memories are fixed-size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from .ranges import Slots

UNKNOWN = "unknown"  # a slot set the trace implies but does not let us reconstruct (e.g. a reload slice)

Ref = tuple  # (seq, line_no): where a record sits in the stream and its file


class Backup:
    """The content witness of a node's latest backup: ``h`` (whole node) or ``hp`` (per page) or ``hs`` (shared).

    ``whole`` is False for a fragment left by a split: its ``h`` is not composable, only ``hp`` slices are."""

    __slots__ = ("h", "hp", "hs", "ref", "op", "whole", "length", "side")

    def __init__(self, h: int | None, hp: object, hs: object, ref: Ref, op: int | None, whole: bool, length: int,
                 side: dict | None = None) -> None:
        self.h, self.hp, self.hs, self.ref, self.op, self.whole, self.length = h, hp, hs, ref, op, whole, length
        self.side = side   # sidecar pool -> (h, hp) of the same backup (rules_side)

    def _pages(self, hp: object, start: int, n: int) -> list | None:
        if isinstance(hp, list) and hp and self.length > 0 and self.length % len(hp) == 0:
            tpp = self.length // len(hp)  # tokens per page
            if start % tpp == 0 and n % tpp == 0:
                return hp[start // tpp:(start + n) // tpp]
        return None

    def fragment(self, start: int, n: int) -> Backup:
        side = None if self.side is None else {p: (None, self._pages(hp, start, n)) for p, (_, hp) in
                                               self.side.items()}
        return Backup(None, self._pages(self.hp, start, n), None, self.ref, self.op, False, n, side)


LOAD_BACK = frozenset(("reload", "ack h2d"))   # the bump reasons of a load-back into fresh device slots


class Node:
    __slots__ = ("id", "len", "dev", "host", "host_freed", "gen", "gen_ref", "bk", "bk_state", "from_split",
                 "dev_loaded")

    def __init__(self, nid: int, length: int, dev: Slots | str | None, host: Slots | str | None, ref: Ref) -> None:
        self.id = nid
        self.len = length
        self.dev: Slots | str | None = dev      # None: evicted from device; UNKNOWN: present, slots not known
        self.host: Slots | str | None = host    # None: not backuped
        self.host_freed: Ref | None = None      # a host free/evict of this node since its last prepare
        self.gen = 0                            # our device generation (docs/domain.md §3.3 `gen`)
        self.gen_ref: tuple = (ref, "insert")   # the record that last changed the device state
        self.bk: Backup | None = None
        self.bk_state: tuple | None = None      # ("pending", write) or ("acked", ref)
        self.from_split = False
        self.dev_loaded = False                 # its device slots were filled by a load-back (CANARY)

    def bump(self, ref: Ref, why: str) -> None:
        """The node's device state changed at ``ref`` (H3 compares fills against ``gen``); a ``reload`` or its
        ``ack h2d`` marks its device slots as filled by a load-back, a split keeps the mark, anything else clears
        it."""
        self.gen += 1
        self.gen_ref = (ref, why)
        if why in LOAD_BACK:
            self.dev_loaded = True
        elif not why.startswith("split"):
            self.dev_loaded = False


class PendingWrite:
    """A device->host copy from its ``prepare`` to its ``ack dir=d2h``, following the tokens across splits."""

    __slots__ = ("ops", "origin", "L", "dev", "host", "p_ref", "b_ref", "frags", "splits", "viol_a", "viol_b",
                 "undec_a", "undec_b")

    def __init__(self, op: int | None, origin: int, length: int, dev: Slots | None, host: Slots | None,
                 p_ref: Ref) -> None:
        self.ops = {op}
        self.origin = origin
        self.L = length
        self.dev = dev
        self.host = host
        self.p_ref = p_ref
        self.b_ref: Ref | None = None
        self.frags: list[list] = [[origin, length]]   # [node_id, len] of the lineage fragments, prefix first
        self.splits: list[Ref] = []
        self.viol_a: tuple | None = None   # (ref, certainty, what) of the first H4a breach (proven: exact)
        self.viol_b: tuple | None = None
        self.undec_a: str | None = None    # what first overlapped it as an interval only (undecidable)
        self.undec_b: str | None = None

    def op(self) -> int | None:
        """The op id to report: the prepare's (the lowest known)."""
        ids = [o for o in self.ops if type(o) is int]
        return min(ids) if ids else None

    def frag_ids(self) -> list[int]:
        return [f[0] for f in self.frags]


class PendingLoad:
    """A host->device copy from its ``reload`` to its ``ack dir=h2d``."""

    __slots__ = ("op", "node_id", "chain", "host", "dev", "ref", "snap", "viol", "undec", "hashed", "zeroed",
                 "zeroed_all", "due")

    def __init__(self, op: int | None, node_id: int, chain: list[int], host: Slots | None, dev: Slots | None, ref: Ref,
                 snap: dict[int, Backup | None]) -> None:
        self.op, self.node_id, self.chain, self.host, self.dev, self.ref = op, node_id, chain, host, dev, ref
        self.snap = snap            # each chain node's backup witness at issue time (survives its host eviction)
        self.viol: tuple | None = None   # (ref, certainty, what) of the first proven H2c breach
        self.undec: str | None = None    # what first overlapped its host slots as an interval only
        self.hashed: set[int] = set()
        self.zeroed: set[int] = set()   # chain nodes whose ack reported ZERO
        self.zeroed_all = False         # the reload sync=1 reported ZERO (for the whole chain)
        # (ev, ref) of the first h2d ack, which ended a breached H2c window at another chain node than the reload's:
        # the finding waits for the reload node's own ack (rules_h2), in the trace that holds the reload
        self.due: tuple | None = None


class L3Transfer:
    """An L3 transfer in flight: ``kind`` "backup" (``l3_backup`` .. ``l3_ack dir=backup``: host pages read into
    storage) or "prefetch" (``l3_prefetch`` .. ``l3_ack dir=prefetch``: storage read into host pages)."""

    __slots__ = ("kind", "op", "node_id", "host", "ref", "viol", "undecided", "added")

    def __init__(self, kind: str, op: int | None, node_id: object, host: Slots | None, ref: Ref) -> None:
        self.kind, self.op, self.node_id, self.host, self.ref = kind, op, node_id, host, ref
        self.viol: tuple | None = None          # (ref, certainty, what) of the first exact breach of its host pages
        self.undecided = False                  # a breach range summaries could not decide
        self.added: list[tuple] = []            # (key, fingerprint) this backup added to the rank's key map


class Fill:
    """A compose fill (``hit=0``): the generation of every node it was derived from."""

    __slots__ = ("ref", "src", "gens", "invalid", "reported")

    def __init__(self, ref: Ref, src: Slots | None, gens: dict[int, int | None]) -> None:
        self.ref, self.src, self.gens = ref, src, gens
        self.invalid: tuple | None = None   # (ref, certainty) of a free pool=dev that hit ``src``
        self.reported = False


class Bounded(OrderedDict):
    """An insertion-ordered dict that forgets its oldest entries beyond ``cap``."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def put(self, k: Hashable, v: object) -> None:
        self[k] = v
        if len(self) > self.cap:
            self.popitem(last=False)


class EpochState:
    """All per-(rank, epoch) state, and the bookkeeping of its indexes (open/close/find a write or a load, delete a
    node) that the checker's handlers share."""

    MAX_PENDING = 8192   # in-flight copies kept; at level 1 (no acks) older ones are forgotten

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.dead: Bounded = Bounded(8192)              # node id -> ref of its host eviction / deletion
        self.writes: dict[int, PendingWrite] = {}       # id(write) -> write, in prepare order
        self.writes_by_node: dict[int, list[PendingWrite]] = {}
        self.loads: dict[int, PendingLoad] = {}         # id(load) -> load, in reload order
        self.loads_by_node: dict[int, list[PendingLoad]] = {}   # every chain node of an open load -> its loads
        # loads whose first h2d ack closed them, still taking the ack records of their other chain nodes (one per
        # chain node, after the one that closed it): id(load) -> load, oldest first, and chain node -> load
        self.closed_loads: OrderedDict = OrderedDict()
        self.closed_by_node: dict[int, PendingLoad] = {}
        self.fills: dict[Any, Fill] = {}
        self.fills_by_node: dict[int, set] = {}
        self.l3: dict[tuple, L3Transfer] = {}          # (kind, op) -> L3 transfer in flight, in issue order

    # -- nodes --------------------------------------------------------------------------------------------------
    def delete(self, nid: int, ref: Ref, why: str) -> None:
        """Node ``nid`` left the tree at ``ref``: remembered as dead (H2a names why), its compose fills dropped."""
        if self.nodes.pop(nid, None) is not None:
            dead = self.dead   # dead.put(nid, (ref, why)), inlined
            dead[nid] = (ref, why)
            if len(dead) > dead.cap:
                dead.popitem(last=False)
        keys = self.fills_by_node.pop(nid, None)
        if keys:
            fills = self.fills
            for k in keys:
                fills.pop(k, None)

    # -- pending writes (prepare -> ack dir=d2h) ------------------------------------------------------------------
    def open_write(self, w: PendingWrite) -> None:
        writes = self.writes
        writes[id(w)] = w
        lst = self.writes_by_node.get(w.origin)
        if lst is None:
            self.writes_by_node[w.origin] = [w]
        else:
            lst.append(w)
        if len(writes) > self.MAX_PENDING:  # a level-1 stream never acks: forget the oldest
            self.close_write(next(iter(writes.values())))

    def close_write(self, w: PendingWrite) -> None:
        self.writes.pop(id(w), None)
        wbn = self.writes_by_node
        for fr in w.frags:
            nid = fr[0]
            lst = wbn.get(nid)
            if lst:
                if len(lst) == 1:   # (the usual case: the node's only write)
                    if lst[0] is w:
                        del wbn[nid]
                    continue
                try:
                    lst.remove(w)
                except ValueError:
                    pass
                if not lst:
                    del wbn[nid]

    def find_write(self, nid: int, op: int | None, need_unbacked: bool = False) -> PendingWrite | None:
        """The open write of node ``nid`` for ``op`` (``need_unbacked``: not yet seen by a backup record), else the
        node's first such write (a merged op carries a new op id)."""
        lst = self.writes_by_node.get(nid)
        if not lst:
            return None
        if len(lst) == 1:   # (the usual case: the node's only write, whatever its op)
            w = lst[0]
            return w if not need_unbacked or w.b_ref is None else None
        if need_unbacked:
            for w in lst:
                if w.b_ref is None and op in w.ops:
                    return w
            for w in lst:
                if w.b_ref is None:
                    return w
            return None
        for w in lst:
            if op in w.ops:
                return w
        return lst[0]

    # -- pending loads (reload -> ack dir=h2d) --------------------------------------------------------------------
    MAX_CLOSED = 256   # closed loads kept for their late chain-node acks

    def open_load(self, ld: PendingLoad) -> PendingLoad | None:
        """Open ``ld``; returns the oldest load when it had to be forgotten (over ``MAX_PENDING``), else None."""
        self.loads[id(ld)] = ld
        lbn = self.loads_by_node
        for cid in ld.chain:
            lst = lbn.get(cid)
            if lst is None:
                lbn[cid] = [ld]
            else:
                lst.append(ld)
        if len(self.loads) > self.MAX_PENDING:
            old = next(iter(self.loads.values()))
            self._unindex(old)
            return old
        return None

    def _unindex(self, ld: PendingLoad) -> None:
        self.loads.pop(id(ld), None)
        lbn = self.loads_by_node
        for cid in ld.chain:
            lst = lbn.get(cid)
            if lst:
                if len(lst) == 1:   # (the usual case: the node's only load)
                    if lst[0] is ld:
                        del lbn[cid]
                    continue
                try:
                    lst.remove(ld)
                except ValueError:
                    pass
                if not lst:
                    del lbn[cid]

    def close_load(self, ld: PendingLoad) -> PendingLoad | None:
        """``ld``'s first h2d ack came: it leaves the open loads and waits for its other chain nodes' acks. Returns
        the oldest closed load when one had to be forgotten (over ``MAX_CLOSED``): its unacked nodes are final."""
        self._unindex(ld)
        self.closed_loads[id(ld)] = ld
        cbn = self.closed_by_node
        for cid in ld.chain:
            cbn[cid] = ld
        if len(self.closed_loads) > self.MAX_CLOSED:
            _, old = self.closed_loads.popitem(last=False)
            self._forget_closed(old)
            return old
        return None

    def _forget_closed(self, ld: PendingLoad) -> None:
        cbn = self.closed_by_node
        for cid in ld.chain:
            if cbn.get(cid) is ld:
                del cbn[cid]

    def split_loads(self, c: int, p: int, L: int, s: int) -> None:
        """Node ``c`` (``L`` tokens) was cut at ``s`` into ``p`` (prefix) + ``c`` (suffix) while a load of it is in
        flight (SGLang's match_prefix/insert split nodes whose load is pending): the load's chain and backup
        witnesses follow the tokens, so the acks of either fragment compare with their slice of the backup."""
        # (open loads only: a closed load got its ack records in one go, a later split is of a device-resident node)
        for ld in list(self.loads_by_node.get(c, ())):
            try:
                i = ld.chain.index(c)
            except ValueError:
                continue
            ld.chain[i:i + 1] = [p, c]
            bk = ld.snap.get(c)
            if bk is not None:
                if bk.length == L:
                    ld.snap[p], ld.snap[c] = bk.fragment(0, s), bk.fragment(s, L - s)
                else:   # the witness does not line up with the node: nothing to slice
                    ld.snap[p] = ld.snap[c] = Backup(None, None, None, bk.ref, bk.op, False, 0)
            else:
                ld.snap[p] = None
            if c in ld.hashed:
                ld.hashed.add(p)
            self.loads_by_node.setdefault(p, []).append(ld)

    def drain_loads(self) -> list[PendingLoad]:
        """Every load still held (open or closed): the end of the stream or of the epoch."""
        out = list(self.loads.values()) + list(self.closed_loads.values())
        self.loads.clear()
        self.loads_by_node.clear()
        self.closed_loads.clear()
        self.closed_by_node.clear()
        return out
