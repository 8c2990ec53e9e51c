"""The simulated HiCache: a mini HiRadix tree per CP rank, its pools and its copy controller, run in lockstep.

Semantics follow SGLang (domain spec sections 1, 2, 5 and 7.1):

* page-aligned match/insert; a partial match splits a node: the **new id takes the prefix**, the old id keeps the
  suffix; a split rewrites a pending device->host write entry to list the fragments prefix first;
* ``lock_ref`` propagates to the root; write_through (threshold 1), write_through_selective (threshold 2) and
  write_back (backup at eviction, synchronous flush before the free); the parent-backuped guard;
* device eviction of LRU leaves (backuped -> value None; not backuped -> deleted), host eviction of evicted host
  leaves with no host pin, load_back of the evicted chain (threshold, host pin held until the load ack);
* copies run asynchronously and **read their source when they complete**, so a recycled page becomes corruption;
* the writes prepared within one scheduler round (the requests between two ``step()`` calls, a write_back eviction
  pass) are queued and started together by ``start_writing``: several are merged into one op with a new id from the
  rank's op counter (SGLang's ``merge_ops``), one ``backup`` and one ``ack dir=d2h`` record per node, one copy; a
  lone write stays its own op (``Simulation(merge=False)``: every write starts at its prepare, as before). The
  queue is started before anything could change a queued node (a device eviction, a split of that node);
* ``check_events`` pops MIN(ready acks) over the ranks on every rank, as ``_all_reduce_attn_groups``;
* CP modes: the KV each rank holds differs by mode (replicated: identical; sharded: per shard; dcp: the rank's token
  stripe; layersplit: the rank's layers; shared: page owner ``page % R`` writes, one shared host pool, the IO rank
  copies all pages through the shared view, each rank loads only the pages it owns).

Every deviation of a :class:`~cptrace_otel.sim.faults.FaultPlan` is a marked branch; the oracle records what it
must make the checker find.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

import numpy as np

from ..analyze.crossrank import STRUCTURAL as _C1_TAGS
from ..fingerprint.cpu import khash_bytes
from . import kv
from .faults import FaultPlan, Oracle
from .pool import PagedPool
from .tracer import Clock, Emitter, LogEmitter, TS_BASE, WALL_BASE_NS

THRESHOLD = {"wt": 1, "wts": 2}
STRUCTURAL = frozenset(_C1_TAGS)   # the tags of cross-rank C1's projection: the checker's structural join index


class Node:
    __slots__ = ("id", "key", "parent", "children", "value", "host_value", "lock_ref", "host_ref", "hit_count",
                 "gen", "last_access", "start", "bk", "bk_op", "bk_split", "bk_idx", "pend_ops", "loading",
                 "prev_host", "old_host", "noinval", "host_refused")

    def __init__(self, nid: int, key: np.ndarray, parent: "Node | None", start: int) -> None:
        self.id = nid
        self.key = key
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.value: np.ndarray | None = None
        self.host_value: np.ndarray | None = None
        self.lock_ref = 0
        self.host_ref = 0
        self.hit_count = 0
        self.gen = 0
        self.last_access = 0
        self.start = start
        self.bk: np.ndarray | None = None        # bytes hashed by this node's latest backup record (token order)
        self.bk_op = -1
        self.bk_split = False                    # split since its backup (whole-node hashes not comparable)
        self.bk_idx = 0                          # the rank's structural index at that backup record
        self.pend_ops: list[Op] = []             # pending device->host writes whose fragments include this node
        self.loading = False
        self.prev_host: np.ndarray | None = None  # host range before the latest split (for H2_stale)
        self.old_host: np.ndarray | None = None   # range released by the latest re-backup (for H2_stale_clean)
        self.noinval = False
        self.host_refused = False                 # C1_div: this rank's host pool refused the node (no retry)

    def __len__(self) -> int:
        return int(self.key.size)


class Op:
    """One CacheOperation. A device->host write is first a queued *part* (its ``prepare``: one node, its own op id);
    ``start_writing`` turns the queue into one *transfer*: the part itself when it is alone, else a merged op with a
    new id whose ``parts`` are the queued writes (SGLang's ``merge_ops``). The tree's bookkeeping (``pend_ops``,
    fragments, locks) stays on the parts; the copy, its completion and its place in ``write_q`` are the transfer's."""

    __slots__ = ("id", "dir", "node", "frags", "blen", "dev", "host", "complete_at", "done", "locked", "chain",
                 "flip", "stale", "released", "old_host", "fwd", "parts")

    def __init__(self, oid: int, direction: str, dev: np.ndarray, host: np.ndarray, complete_at: int) -> None:
        self.id = oid
        self.dir = direction
        self.node: Node | None = None
        self.frags: list[Node] = []
        self.blen = 0
        self.dev = dev
        self.host = host
        self.complete_at = complete_at
        self.done = False
        self.locked = False
        self.chain: list[Node] = []
        self.flip = False
        self.stale = False
        self.released = False
        self.old_host: np.ndarray | None = None   # a re-backup's previous host range, released at the ack
        self.fwd: tuple | None = None   # a load's forward (fwd_hash arguments): it runs once the load has landed
        self.parts: list[Op] = []       # a merged write transfer: the queued writes it carries (prepare order)

    def writes(self) -> list["Op"]:
        """The writes a d2h transfer carries: its parts when merged, else itself."""
        return self.parts or [self]


class RankSim:
    """One CP rank: tree, device pool, host pool (a shadow allocator over shared data in mode shared), controller."""

    def __init__(self, sim: "Simulation", rank: int, host_data: np.ndarray | None) -> None:
        self.sim = sim
        self.r = rank
        c = sim
        if c.mode == "layersplit":
            per = c.layers // c.ranks
            self.layer_ids = np.arange(rank * per, (rank + 1) * per)
        else:
            self.layer_ids = np.arange(c.layers)
        nl = self.layer_ids.size
        self.dev = PagedPool(c.dev_pages, c.page_size, nl, c.width, f"dev{rank}")
        self.host = PagedPool(c.host_pages, c.page_size, nl, c.width, f"host{rank}")
        if host_data is not None:
            self.host.data = host_data            # shared L2: one buffer, identical shadow allocators
        self.next_id = 0
        self.root = self._new_node(np.zeros(0, dtype=np.int64), None, 0)
        self.root.value = np.zeros(0, dtype=np.int64)
        self.root.host_value = np.zeros(0, dtype=np.int64)
        self.nodes: dict[int, Node] = {}
        self.write_q: deque[Op] = deque()        # started d2h transfers, FIFO (the ack order)
        self.write_new: list[Op] = []             # writes prepared but not started yet (merged at start_writing)
        self.load_q: deque[Op] = deque()
        self.compose_cache: dict[tuple[int, int], tuple[str, int]] = {}
        self.pending_stores: list[tuple[int, np.ndarray, np.ndarray, str]] = []
        self.requests: dict[str, tuple[Node, int]] = {}
        self.want_backup: list[Node] = []
        self.to_store: list[tuple[str, Node]] = []
        self.n_struct = 0    # structural records (C1's tags) emitted in this epoch: the checker's join index

    # -- plumbing --------------------------------------------------------------------------------------------
    def emit(self, level: int, tag: str, /, **f: Any) -> None:
        sim = self.sim
        if level <= sim.level:
            f["rank"] = self.r
            f["ts"] = sim.clock.ts()
            sim.emitter.emit(self.r, level, tag, **f)
            if tag in STRUCTURAL:
                self.n_struct += 1

    def on(self, level: int) -> bool:
        return level <= self.sim.level

    def fault(self, kind: str) -> FaultPlan | None:
        for p in self.sim.faults:
            if p.kind == kind and p.applies(self.r):
                return p
        return None

    def hit(self, kind: str) -> bool:
        p = self.fault(kind)
        return p is not None and p.hit(self.r)

    def _new_node(self, key: np.ndarray, parent: Node | None, start: int) -> Node:
        n = Node(self.next_id, key, parent, start)
        self.next_id += 1
        if parent is not None:
            self.nodes[n.id] = n
        return n

    def _new_op(self, direction: str, dev: np.ndarray, host: np.ndarray, delay: int) -> Op:
        oid = self.sim.next_op[self.r]
        self.sim.next_op[self.r] += 1
        return Op(oid, direction, dev, host, self.sim.clock.tick + delay)

    # -- KV bytes --------------------------------------------------------------------------------------------
    def kv_for(self, tokens: np.ndarray, start: int) -> np.ndarray:
        sim = self.sim
        pos = np.arange(start, start + tokens.size)
        shard = self.r if sim.mode in ("sharded", "dcp", "layersplit") else 0
        data = kv.content(tokens, pos, self.layer_ids, sim.width, shard)
        if sim.mode == "dcp":
            data[(pos % sim.ranks) != self.r] = 0   # this rank stores only its token stripe
        return data

    def owned(self, slots: np.ndarray) -> np.ndarray:
        """Mask of the slots whose page this rank owns (mode shared); all slots otherwise."""
        if self.sim.mode != "shared":
            return np.ones(slots.size, dtype=bool)
        return (slots // self.sim.page_size) % self.sim.ranks == self.r

    def gather(self, slots: np.ndarray, post_store: bool = False) -> np.ndarray:
        """The node's device KV in token order as this rank's kernels see it (mode shared: through the view).

        ``post_store`` overlays stores that are scheduled but not landed: what a hash on the compute stream, ordered
        after the forward's store, observes."""
        sim = self.sim
        if sim.mode == "shared":
            out = np.empty((slots.size,) + self.dev.data.shape[1:], dtype=np.uint8)
            owner = (slots // sim.page_size) % sim.ranks
            for rk in sim.ranks_:
                m = owner == rk.r
                out[m] = rk.dev.data[slots[m]]
            sources = sim.ranks_
        else:
            out = self.dev.data[slots]
            sources = [self]
        if post_store:
            for rk in sources:
                for _, s_slots, s_bytes, _, _ in rk.pending_stores:
                    where = {int(x): j for j, x in enumerate(s_slots.tolist())}
                    own = rk.owned(s_slots)
                    for i, x in enumerate(slots.tolist()):
                        j = where.get(x)
                        if j is not None and own[j]:
                            out[i] = s_bytes[j]
        return out

    def write_dev(self, slots: np.ndarray, data: np.ndarray) -> None:
        m = self.owned(slots)
        self.dev.data[slots[m]] = data[m]

    def fingerprint(self, b: np.ndarray) -> dict[str, Any]:
        return kv.fingerprint(b, self.sim.page_size)

    # -- tree ------------------------------------------------------------------------------------------------
    def path_of(self, n: Node) -> list[Node]:
        out = []
        while n is not self.root and n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def inc_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref += 1
            n = n.parent

    def dec_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref -= 1
            assert n.lock_ref >= 0, f"rank {self.r}: lock_ref of node {n.id} below zero"
            n = n.parent

    def match(self, tokens: np.ndarray) -> tuple[list[Node], int]:
        ps = self.sim.page_size
        node, pos, path = self.root, 0, []
        while pos < tokens.size:
            child = node.children.get(tuple(tokens[pos:pos + ps].tolist()))
            if child is None:
                break
            rest = tokens[pos:]
            m = min(child.key.size, rest.size)
            diff = np.nonzero(child.key[:m] != rest[:m])[0]
            common = (int(diff[0]) if diff.size else m) // ps * ps
            if common == 0:
                break
            if common < child.key.size:
                if child.loading:      # never cut a node whose host->device copy is in flight
                    break
                child = self.split(child, common)
                path.append(child)
                pos += common
                break
            path.append(child)
            pos += common
            node = child
        for n in path:
            n.last_access = self.sim.clock.tick
        return path, pos

    def split(self, c: Node, s: int) -> Node:
        sim = self.sim
        parent = c.parent
        assert parent is not None
        if self.write_new and any(op in self.write_new for op in c.pend_ops):
            self.start_writing()   # a queued write of c starts (with the rest of the queue) before c is cut
        L = len(c)
        p = self._new_node(c.key[:s].copy(), parent, c.start)
        pre_dev, pre_host = c.value, c.host_value
        if pre_dev is not None:
            p.value, c.value = pre_dev[:s].copy(), pre_dev[s:].copy()
        hp_ = hc_ = None
        if pre_host is not None:
            hp_, hc_ = pre_host[:s].copy(), pre_host[s:].copy()
            if self.hit("H1_swap"):
                # the fault: the prefix node gets the suffix's pages (same counts, wrong order)
                hp_, hc_ = pre_host[L - s:].copy(), pre_host[:L - s].copy()
                pend0 = c.pend_ops[0].id if c.pend_ops else None
                sim.oracle.inject("H1_swap", self.r, c.id, pend0)
                sim.oracle.expect("H1", "H1a", self.r, c.id, pend0, "H1_swap")
            p.host_value, c.host_value = hp_, hc_
            c.prev_host = pre_host
        c.old_host = None    # a re-backup's released range no longer matches the (shorter) node
        if c.bk is not None:
            p.bk, c.bk = c.bk[:s].copy(), c.bk[s:].copy()
            p.bk_op, p.bk_split, c.bk_split = c.bk_op, True, True
        p.lock_ref, p.hit_count, p.host_ref = c.lock_ref, c.hit_count, c.host_ref
        p.gen = c.gen + 1
        c.gen += 1
        p.last_access = c.last_access
        c.key = c.key[s:].copy()
        c.start += s
        ps = sim.page_size
        parent.children[tuple(p.key[:ps].tolist())] = p
        p.children = {tuple(c.key[:ps].tolist()): c}
        c.parent = p
        pend = c.pend_ops[0].id if c.pend_ops else -1
        for op in c.pend_ops:
            if self.hit("H1_ack"):
                op.stale = True     # the fault: the pending entry still lists only the kept (suffix) id
                sim.oracle.inject("H1_ack", self.r, op.node.id, op.id)
            if not op.stale:
                i = op.frags.index(c)
                op.frags[i:i + 1] = [p, c]
            p.pend_ops.append(op)
        self.invalidate(c)
        self.emit(1, "split", node_id=c.id, new_id=p.id, parent=parent.id, pre_len=L, split_len=s,
                  dev_p=kv.rng(p.value), dev_c=kv.rng(c.value), host_p=kv.rng(hp_), host_c=kv.rng(hc_),
                  pend=pend, lock=c.lock_ref)
        return p

    # -- allocation and eviction -------------------------------------------------------------------------------
    def alloc_dev(self, n: int, owner: int = -1) -> np.ndarray | None:
        idx = self.dev.alloc(n, owner)
        if idx is None:
            self.evict_dev(n // self.sim.page_size - self.dev.free_pages)
            idx = self.dev.alloc(n, owner)
        return idx

    def alloc_host(self, n: int, owner: int = -1) -> np.ndarray | None:
        idx = self.host.alloc(n, owner)
        if idx is None:
            self.evict_host(n // self.sim.page_size - self.host.free_pages)
            idx = self.host.alloc(n, owner)
        return idx

    def _dev_leaves(self) -> list[Node]:
        out = []
        for n in self.nodes.values():
            if n.value is None or n.lock_ref > 0:
                continue
            if any(ch.value is not None for ch in n.children.values()):
                continue
            out.append(n)
        return out

    def evict_dev(self, need_pages: int) -> None:
        """Evict LRU device leaves (lock_ref 0) until ``need_pages`` pages are freed or none is left.

        write_back backs a victim up first and flushes synchronously before the free. With merging on, a pass works
        as SGLang's ``evict()``: it picks LRU leaves until enough pages, backs up the unbacked ones (queued, so they
        start as one merged op), flushes once, then evicts the whole pass; without merging, one victim at a time."""
        ps = self.sim.page_size
        freed = 0
        self.start_writing()   # queued writes start before any page is freed: their copies read the pages
        while freed < need_pages:
            cands = self._dev_leaves()
            if not cands:
                return
            order = sorted(cands, key=lambda n: (n.last_access, n.id))
            batch = order[:1]
            if self.sim.policy == "wb" and self.sim.merge:
                batch, got = [], freed
                for v in order:
                    batch.append(v)
                    got += len(v) // ps
                    if got >= need_pages:
                        break
            if self.sim.policy == "wb":
                self._write_back(batch)
            for v in batch:
                freed += len(v) // ps
                if v.host_value is not None:
                    self.evict_backuped(v)
                else:
                    self.evict_regular(v)

    def _write_back(self, victims: list[Node]) -> None:
        """write_back eviction: back up the victims that are not backuped, then ``writing_check(write_back=True)``
        before any of them is freed (fault ``H4_wb_noflush`` skips the flush: every write of the pass is then still
        in flight when its pages are freed)."""
        written = []
        for v in victims:
            if v.host_value is None:
                op = self.write_backup(v, write_back=True)
                if op is not None:
                    written.append((v, op))
        if not written:
            return
        noflush = False
        for v, op in written:
            if self.hit("H4_wb_noflush"):
                noflush = True
                self.sim.oracle.inject("H4_wb_noflush", self.r, v.id, op.id)
        if not noflush:
            self.flush_writes()
            return
        # the fault: free the device pages while the device->host copy is still in flight
        self.start_writing()
        for v, op in written:
            self.sim.oracle.expect("H4", "H4", self.r, v.id, op.id, "H4_wb_noflush")

    def _free_dev(self, n: Node, slots: np.ndarray) -> None:
        for op in n.pend_ops:   # only reachable under a fault: the copy still reads these pages
            if self.fault("H4_nolock") and not op.locked and op.dir == "d2h":
                self.sim.oracle.expect("H4", "H4", self.r, op.node.id, op.id, "H4_nolock")
        self.emit(2, "free", pool="dev", idx=kv.rng(slots), node_id=n.id, why="evict", **self.xs("idx_x", slots))
        self.dev.free(slots)

    def xs(self, key: str, idx: np.ndarray | None) -> dict[str, str]:
        if not self.sim.exact or idx is None:
            return {}
        return {key: kv.runs(idx)}

    def evict_backuped(self, v: Node) -> None:
        slots = v.value
        self.emit(1, "evict", tier="dev", node_id=v.id, kind="backuped", dev=kv.rng(slots), lock=v.lock_ref,
                  href=v.host_ref, **self.xs("devx", slots))
        self._free_dev(v, slots)
        v.value = None
        v.gen += 1
        self.invalidate(v, why="evict")

    def evict_regular(self, v: Node) -> None:
        slots = v.value
        self.emit(1, "evict", tier="dev", node_id=v.id, kind="regular", dev=kv.rng(slots), lock=v.lock_ref,
                  href=v.host_ref, **self.xs("devx", slots))
        self._free_dev(v, slots)
        v.value = None
        self.invalidate(v)
        # evicted descendants (host only) lose their parent: drop them with their host pages
        stack = list(v.children.values())
        while stack:
            d = stack.pop()
            stack.extend(d.children.values())
            self.emit(1, "evict", tier="host", node_id=d.id, kind="drop", host=kv.rng(d.host_value), href=d.host_ref,
                      **self.xs("hostx", d.host_value))
            self._free_host(d)
            del self.nodes[d.id]
        self._detach(v)

    def _detach(self, v: Node) -> None:
        parent = v.parent
        assert parent is not None
        del parent.children[tuple(v.key[:self.sim.page_size].tolist())]
        del self.nodes[v.id]
        self.invalidate(v, force=True)

    def _free_host(self, n: Node) -> None:
        slots = n.host_value
        if slots is None:
            return
        self.emit(2, "free", pool="host", idx=kv.rng(slots), node_id=n.id, why="evict", **self.xs("idx_x", slots))
        self.host.free(slots)
        n.host_value = None

    def evict_host(self, need_pages: int) -> None:
        ps = self.sim.page_size
        freed = 0
        while freed < need_pages:
            cands = [n for n in self.nodes.values() if n.value is None and n.host_value is not None
                     and n.host_ref == 0 and not n.children and not n.pend_ops]
            if not cands:
                return
            v = min(cands, key=lambda n: (n.last_access, n.id))
            freed += len(v) // ps
            self.emit(1, "evict", tier="host", node_id=v.id, kind="host", host=kv.rng(v.host_value), href=v.host_ref,
                      **self.xs("hostx", v.host_value))
            self._free_host(v)
            self._detach(v)

    # -- device -> host ----------------------------------------------------------------------------------------
    def write_backup(self, n: Node, write_back: bool = False) -> Op | None:
        sim = self.sim
        if n.host_value is not None or n.value is None or n.parent is None or n.loading:
            return None   # nothing to do, or its device copy is still being loaded
        parent = n.parent
        if not write_back and parent is not self.root and parent.host_value is None:
            return None  # write-through contiguity guard: the parent must already be backuped
        if n.host_refused:
            return None   # C1_div: this rank's host pool keeps refusing the node while it is on the device
        if sim.ranks > 1 and self.hit("C1_div"):
            # the fault: the host alloc fails on this rank only, so the backup is skipped here. The host pool stays
            # full for the node on this rank (what made the alloc fail does not clear by the next hit), so the rank
            # never backs it up while it is on the device; a node that never was backuped is deleted when it
            # leaves, so this rank never logs the prepare the other ranks logged: the structural streams diverge
            # here, at this rank's structural index, wherever the site falls. (A retry at the next hit, as SGLang's
            # _inc_hit_count would try, can land before any other structural record and leave no trace at all.)
            n.host_refused = True
            if sim.diverged_at is None:
                sim.diverged_at = self.n_struct
            # the op id the other ranks give this prepare: the ranks' op counters run in lockstep up to here, so it
            # is the id this rank would take now (whether or not a peer already took it, or merged ops since)
            op_id = sim.next_op[self.r]
            sim.oracle.inject("C1_div", self.r, n.id, op_id)
            sim.oracle.expect("C1", "C1", self.r, n.id, op_id, "C1_div")
            sim.oracle.expect("C3", "C3", self.r, n.id, op_id, "C1_div")
            return None
        host = self.alloc_host(len(n), n.id)
        if host is None:
            return None
        op = self._new_op("d2h", n.value.copy(), host, sim.d_w)
        op.node, op.frags, op.blen = n, [n], len(n)
        n.host_value = host.copy()
        if not write_back:
            if self.hit("H4_nolock"):
                sim.oracle.inject("H4_nolock", self.r, n.id, op.id)   # the fault: no inc_lock_ref
            else:
                self.inc_lock(n)
                op.locked = True
        n.pend_ops.append(op)
        self.emit(1, "prepare", node_id=n.id, op=op.id, len=len(n), dev=kv.rng(op.dev), host=kv.rng(host),
                  policy=sim.policy, parent=parent.id, pbk=int(parent is self.root or parent.host_value is not None),
                  **self.xs("hostx", host), **self.xs("devx", op.dev))
        self.write_new.append(op)
        if not sim.merge:
            self.start_writing()   # one op per write, started right after its prepare
        return op

    def rebackup(self, n: Node) -> Op | None:
        """Re-back up a device-resident, already backuped node to a fresh host range (a host-pool compaction).

        The new range is allocated while the old one is still held, so the two differ; the old range is released
        only at the new copy's d2h ack, and its pages keep the node's bytes until some later allocation reuses
        them. Skips a node that is loading, pinned by a load, or has a write in flight."""
        old = n.host_value
        if old is None or n.value is None or n.loading or n.host_ref or n.pend_ops:
            return None
        n.host_value = None
        op = self.write_backup(n)
        if op is None:
            n.host_value = old   # no backup issued (guard or no host room): the node keeps its old copy
            return None
        op.old_host = old
        return op

    def start_writing(self) -> None:
        """``start_writing``: start the queued writes as one transfer. A lone write is its own op; several are merged
        into one op with a new id from the rank's op counter (``merge_ops``), which carries one ``backup`` record
        per node (op = the merged id) and one copy of all their pages. Every rank queues the same writes in the
        same order (lockstep), so every rank makes the same merge."""
        sim = self.sim
        parts, self.write_new = self.write_new, []
        if not parts:
            return
        if len(parts) == 1:
            t = parts[0]
        else:
            t = self._new_op("d2h", np.concatenate([op.dev for op in parts]),
                             np.concatenate([op.host for op in parts]), sim.d_w)
            t.parts = parts
        io = 1
        if sim.mode == "shared" and self.r != sim.io_rank:
            io = 0
        for op in parts:
            self._backup_record(t, op, io)
        self.write_q.append(t)

    def _backup_record(self, t: Op, op: Op, io: int) -> None:
        """The ``backup`` record of write ``op`` (node ``op.node``) in transfer ``t``: the node's KV as the copy's
        start event sees it (post-store), hashed in token order. Findings about the write name its prepare's op
        (the checker reports the lowest op id it knows for a write); the backup witness keeps the transfer's id."""
        sim = self.sim
        n = op.node
        if self.hit("C3_writer"):
            io = 0   # the fault: this rank does not count as a writer
            sim.oracle.inject("C3_writer", self.r, n.id, op.id)
            sim.oracle.expect("C3", "C3", self.r, n.id, op.id, "C3_writer")
        b = self.gather(op.dev, post_store=True)
        n.bk = b.copy()
        n.bk_op = t.id
        n.bk_split = False
        n.bk_idx = self.n_struct
        fp = self.fingerprint(b)
        if fp["nz"] == 0 and op.dev.size:
            sim.oracle.expect("ZERO", "ZERO@backup", self.r, n.id, op.id, self._fault_names(), "ZERO@backup")
        if sim.mode == "shared":
            # every rank reads the node through the shared view after the post-copy fence, so the hash each rank's
            # reload must reproduce is the view's hash
            fp["hs"] = [fp["h"]] * sim.ranks
        if self.on(1):
            self.emit(1, "backup", op=t.id, node_id=n.id, dev=kv.rng(op.dev), host=kv.rng(op.host), io=io, **fp,
                      **self.xs("devx", op.dev), **self.xs("hostx", op.host))

    def _fault_names(self) -> str:
        kinds = [p.kind for p in self.sim.faults]
        return kinds[0] if len(kinds) == 1 else ",".join(kinds)

    def copy_d2h(self, op: Op) -> None:
        """The device->host copy, executed when it completes: it reads the device pages *now*."""
        sim = self.sim
        if sim.mode == "shared" and self.r != sim.io_rank:
            op.done = True    # followers skip the payload (the IO rank copies every page through the view)
            return
        self.host.data[op.host] = self.gather(op.dev)
        op.done = True

    def flush_writes(self) -> None:
        """write_back's ``writing_check(write_back=True)``: finish and acknowledge every queued write now."""
        self.start_writing()
        for op in self.write_q:
            if not op.done:
                self.copy_d2h(op)
        self.ack_writes(len(self.write_q))

    def ready(self, q: deque[Op]) -> int:
        n = 0
        for op in q:
            if not op.done:
                break
            n += 1
        return n

    def ack_writes(self, count: int) -> None:
        """Pop ``count`` finished transfers: one ``ack dir=d2h`` record per write they carry (op = the transfer's
        id, blen/clen/pub = that write's), then each write's unlock and re-backup release."""
        for _ in range(count):
            t = self.write_q.popleft()
            for op in t.writes():
                self._ack_write(t, op)

    def _ack_write(self, t: Op, op: Op) -> None:
        sim = self.sim
        n = op.node
        frags = [n] if op.stale else op.frags
        clen = len(n)
        if op.stale and clen < op.blen:
            sim.oracle.expect("H1", "H1b", self.r, n.id, op.id, "H1_ack")
        self.emit(2, "ack", dir="d2h", op=t.id, node_id=n.id, blen=op.blen, clen=clen,
                  pub=[f.id for f in frags], round=sim.clock.tick)
        for f in op.frags + [n]:
            if op in f.pend_ops:
                f.pend_ops.remove(op)
        if op.locked:
            self.dec_lock(n)
        if op.old_host is not None:
            # a re-backup: the old host range is released now that the new copy is complete
            self.emit(2, "free", pool="host", idx=kv.rng(op.old_host), node_id=n.id, why="rebackup",
                      **self.xs("idx_x", op.old_host))
            self.host.free(op.old_host)
            n.old_host = op.old_host

    # -- host -> device ----------------------------------------------------------------------------------------
    def load_back(self, chain: list[Node], ancestor: Node) -> Op | None:
        sim = self.sim
        total = sum(len(n) for n in chain)
        if total < sim.lb_threshold:
            return None
        self.inc_lock(ancestor)
        for n in chain:
            n.host_ref += 1
        dev = self.alloc_dev(total)
        self.dec_lock(ancestor)
        if dev is None:
            for n in chain:
                n.host_ref -= 1
            return None
        hosts = []
        stale = stale_clean = None
        for n in chain:
            h = n.host_value
            if n.prev_host is not None and n.prev_host.size >= len(n) and self.hit("H2_stale"):
                # the fault: load from the range the node had before its split
                h = n.prev_host[:len(n)].copy()
                stale = n
            elif n.old_host is not None and n.old_host.size == len(n) and self.hit("H2_stale_clean"):
                # the fault: load from the range the node had before its re-backup (released, not yet reused)
                h = n.old_host.copy()
                stale_clean = n
            hosts.append(h)
        host = np.concatenate(hosts)
        op = self._new_op("h2d", dev, host, sim.d_l)
        op.chain = list(chain)
        op.node = chain[-1]
        off = 0
        for n in chain:
            n.value = dev[off:off + len(n)].copy()
            n.loading = True
            off += len(n)
        last = chain[-1]
        self.inc_lock(last)
        op.locked = True
        if stale is not None:
            sim.oracle.inject("H2_stale", self.r, last.id, op.id)
            sim.oracle.expect("H2", "H2a", self.r, last.id, op.id, "H2_stale")
        if stale_clean is not None:
            # the bytes may well be right (the oracle adds HASH at the ack only if the old pages were reused), but
            # the reload's host range is not the chain's current one
            sim.oracle.inject("H2_stale_clean", self.r, last.id, op.id)
            sim.oracle.expect("H2", "H2a", self.r, last.id, op.id, "H2_stale_clean")
        self.emit(1, "reload", node_id=last.id, chain=[n.id for n in chain], op=op.id, host=kv.rng(host),
                  dev=kv.rng(dev), **self.xs("hostx", host), **self.xs("devx", dev))
        self.load_q.append(op)
        if self.hit("HASH_flip"):
            op.flip = True
            sim.oracle.inject("HASH_flip", self.r, last.id, op.id)
        if self.hit("H2_release"):
            # the fault: the host pin goes at issue; the pages are freed now and reused by the next backup
            sim.oracle.inject("H2_release", self.r, last.id, op.id)
            sim.oracle.expect("H2", "H2c", self.r, last.id, op.id, "H2_release")
            for n in chain:
                n.host_ref -= 1
            op.released = True
            for n in chain:
                self.emit(1, "evict", tier="host", node_id=n.id, kind="host", host=kv.rng(n.host_value),
                          href=n.host_ref, **self.xs("hostx", n.host_value))
                self._free_host(n)
        return op

    def copy_h2d(self, op: Op) -> None:
        """The host->device copy, executed when it completes: it reads the host pages *now*."""
        data = self.host.data[op.host].copy()
        if op.flip:
            m = np.nonzero(self.owned(op.dev))[0]
            if m.size:   # mode shared: only a page this rank loads can be hit
                data[m[-1], 0, 0] ^= 0xFF   # one byte of one layer of this copy
        self.write_dev(op.dev, data)
        op.done = True

    def ack_loads(self, count: int) -> None:
        sim = self.sim
        for _ in range(count):
            op = self.load_q.popleft()
            for n in op.chain:
                b = self.gather(n.value)
                fp = self.fingerprint(b)
                if fp["nz"] == 0 and b.size:
                    sim.oracle.expect("ZERO", "ZERO@reload", self.r, n.id, op.id, self._fault_names(), "ZERO@reload")
                if n.bk is not None and not np.array_equal(b, n.bk):
                    sim.oracle.expect("HASH", "HASH", self.r, n.id, op.id, self._fault_names())
                    if sim.mode == "shared" and not n.bk_split and sim.judged(self.n_struct):
                        # the same relation across ranks: the IO rank's hs[r] against this rank's reload hash
                        sim.oracle.expect("C5", "C5", self.r, n.id, None, self._fault_names(), "C5 shared")
                self.emit(2, "ack", dir="h2d", op=op.id, node_id=n.id, round=sim.clock.tick, **fp)
                n.loading = False
                n.gen += 1
                self.invalidate(n)
            if op.fwd is not None:
                rid, tokens, final, hit, pfp, dlen = op.fwd
                self.fwd_hash(rid, tokens, final, hit, pfp, loaded=(dlen, op.chain))
            self.dec_lock(op.node)
            if not op.released:
                for n in op.chain:
                    n.host_ref -= 1

    # -- compose cache (the derived view the simulated attention uses) ----------------------------------------
    def invalidate(self, n: Node, force: bool = False, why: str = "") -> None:
        if n.noinval and not force:
            return
        if why == "evict" and self.compose_cache and self.fault("H3_noinval") \
                and any(k[0] == n.id for k in self.compose_cache) and self.hit("H3_noinval"):
            n.noinval = True     # the fault: from here on this node's views are never invalidated
            self.sim.oracle.inject("H3_noinval", self.r, n.id, None)
            return
        for layer in self.layer_ids.tolist():
            self.compose_cache.pop((n.id, layer), None)

    def compose(self, n: Node) -> None:
        for layer in self.layer_ids.tolist():
            key = (n.id, layer)
            ent = self.compose_cache.get(key)
            if ent is not None:
                src, gen = ent
                if gen != n.gen:
                    self.sim.oracle.expect("H3", "H3", self.r, n.id, None, "H3_noinval")
                self.emit(2, "compose", key=f"L{layer}:n{n.id}", node_id=n.id, layer=layer, src=src, gen=gen, hit=1)
            else:
                src = kv.rng(n.value)
                self.compose_cache[key] = (src, n.gen)
                self.emit(2, "compose", key=f"L{layer}:n{n.id}", node_id=n.id, layer=layer, src=src, gen=n.gen,
                          hit=0)

    # -- stores ------------------------------------------------------------------------------------------------
    def store(self, rid: str, n: Node) -> None:
        sim = self.sim
        slots = n.value
        data = self.kv_for(n.key, n.start)
        if self.hit("ZERO_nostore"):
            sim.oracle.inject("ZERO_nostore", self.r, n.id, None)
            self.write_dev(slots, np.zeros_like(data))   # the fault: the store never runs (pages hold zeros)
            return
        if self.hit("ZERO_race"):
            # the fault: the store lands after the backup copy of these pages has completed
            sim.oracle.inject("ZERO_race", self.r, n.id, None)
            self.write_dev(slots, np.zeros_like(data))
            self.pending_stores.append((sim.clock.tick + sim.d_w + 1, slots.copy(), data, rid, n.id))
            return
        self.write_dev(slots, data)
        self.emit(2, "store", rid=rid, dev=kv.rng(slots), layer="all", **({"owner": self.r} if sim.mode == "shared" else {}),
                  **self.xs("devx", slots))

    def apply_due_stores(self) -> None:
        sim = self.sim
        keep = []
        for due, slots, data, rid, nid in self.pending_stores:
            if due > sim.clock.tick:
                keep.append((due, slots, data, rid, nid))
                continue
            self.write_dev(slots, data)
            self.emit(2, "store", rid=rid, dev=kv.rng(slots), layer="all",
                      **({"owner": self.r} if sim.mode == "shared" else {}), **self.xs("devx", slots))
            io_node = sim.ranks_[sim.io_rank].nodes.get(nid) if sim.mode == "shared" else None
            if io_node is not None and io_node.bk_op >= 0 and sim.judged(max(self.n_struct, io_node.bk_idx)):
                # the IO rank's backup of these pages was issued before this store landed
                sim.oracle.expect("C5", "C5-fence", sim.io_rank, nid, io_node.bk_op, "ZERO_race", "store fence")
        self.pending_stores = keep

    # -- a request ---------------------------------------------------------------------------------------------
    def begin_request(self, rid: str, tokens: np.ndarray) -> None:
        sim = self.sim
        path, pos = self.match(tokens)
        ndev = 0
        while ndev < len(path) and path[ndev].value is not None:
            ndev += 1
        dev_nodes, chain = path[:ndev], path[ndev:]
        ancestor = dev_nodes[-1] if dev_nodes else self.root
        dlen = sum(len(n) for n in dev_nodes)
        hlen = sum(len(n) for n in chain)
        op = self.load_back(chain, ancestor) if chain else None
        hit = "host" if op is not None else ("dev" if dev_nodes else "miss")
        last = path[-1] if path else self.root
        pfp = khash_bytes(tokens.astype(np.int64).view(np.uint8))
        self.emit(1, "rid_map", rid=rid, node_id=last.id, hit=hit, dlen=dlen, hlen=hlen, plen=int(tokens.size),
                  pfp=pfp)
        cur = ancestor if op is None else chain[-1]
        if op is None:
            for n in chain:   # recompute: revive the evicted nodes with the request's new slots
                self.inc_lock(cur)
                slots = self.alloc_dev(len(n), n.id)
                self.dec_lock(cur)
                if slots is None:
                    break
                n.value = slots
                n.gen += 1
                self.invalidate(n)
                self.emit(1, "insert", node_id=n.id, parent=n.parent.id, len=len(n), dev=kv.rng(slots), kind="revive",
                          **self.xs("devx", slots))
                self.to_store.append((rid, n))
                cur = n
        if cur is (chain[-1] if chain else ancestor) and pos < tokens.size:
            rest = tokens[pos:].copy()
            self.inc_lock(cur)
            slots = self.alloc_dev(rest.size)
            self.dec_lock(cur)
            if slots is not None and tuple(rest[:sim.page_size].tolist()) in cur.children:
                self.dev.free(slots)   # a node that is loading right now holds this prefix: do not cache it twice
                slots = None
            if slots is not None:
                n = self._new_node(rest, cur, pos)
                cur.children[tuple(rest[:sim.page_size].tolist())] = n
                n.value = slots
                n.gen = 1
                n.last_access = sim.clock.tick
                self.emit(1, "insert", node_id=n.id, parent=cur.id, len=len(n), dev=kv.rng(slots), kind="new",
                          **self.xs("devx", slots))
                self.to_store.append((rid, n))
                cur = n
        self.inc_lock(cur)
        self.requests[rid] = (cur, sim.clock.tick)
        final = self.path_of(cur)
        th = THRESHOLD.get(sim.policy)
        for n in final:
            n.hit_count += 1
            n.last_access = sim.clock.tick
            if th is not None and n.hit_count >= th and n.host_value is None:
                self.want_backup.append(n)
        if self.on(2):
            for n in final:
                if n.value is not None:
                    self.compose(n)
        if self.on(3):
            if op is not None:   # the forward reads the reloaded KV: it runs when the load has landed (ack_loads)
                op.fwd = (rid, tokens, final, hit, pfp, dlen)
            else:
                self.fwd_hash(rid, tokens, final, hit, pfp)

    def do_stores(self) -> None:
        """The forward's KV stores of this request (after every rank scheduled it, so in mode shared no rank's
        store lands in the shared view before another rank's eviction flush has read it)."""
        todo, self.to_store = self.to_store, []
        for rid, n in todo:
            if n.value is not None:
                self.store(rid, n)

    def do_backups(self) -> None:
        todo, self.want_backup = self.want_backup, []
        for n in todo:
            if n.parent is not None and (n.id in self.nodes):
                self.write_backup(n)

    def finish_request(self, rid: str) -> None:
        node, _ = self.requests.pop(rid)
        self.dec_lock(node)

    def fwd_hash(self, rid: str, tokens: np.ndarray, final: list[Node], src: str, pfp: int,
                 loaded: tuple[int, list[Node]] | None = None) -> None:
        """The forward's per-layer ``fwd_hash`` records: the KV of the prompt as computed, except that the tokens a
        host reload brought back (``loaded`` = (their first position, the chain)) are the device bytes the load
        wrote, as the attention reads them: a corrupt reload shows up in the forward."""
        sim = self.sim
        data = self.kv_for(tokens, 0)
        if loaded is not None:
            start, chain = loaded
            rows = np.concatenate([self.gather(n.value) for n in chain]) if chain else data[:0]
            data[start:start + len(rows)] = rows
        cprank = self.r if sim.mode == "shared" else -1
        for li, layer in enumerate(self.layer_ids.tolist()):
            b = data[:, li]
            self.emit(3, "fwd_hash", rid=rid, nreq=1, layer=layer, stage="attn_kv", h=khash_bytes(b), nz=kv.knz(b),
                      rows=int(tokens.size), cprank=cprank, pfp=pfp, src=src, plen=int(tokens.size))

    def idle(self) -> bool:
        return not self.write_q and not self.write_new and not self.load_q and not self.requests \
            and not self.pending_stores


class Simulation:
    """R ranks in lockstep: every rank's tree gets the same requests; ``step()`` advances one scheduler round.

    ``emitter`` gets every record (``emit(rank, level, tag, **fields)``); ``faults`` are :class:`FaultPlan`;
    ``oracle`` collects the expected findings.
    """

    def __init__(self, mode: str = "none", ranks: int = 1, policy: str = "wt", level: int = 3,
                 faults: Iterable[FaultPlan] = (), emitter: Emitter | None = None, *, page_size: int = 4,
                 layers: int = 2, width: int = 4, dev_pages: int = 32, host_pages: int = 48, d_w: int = 1,
                 d_l: int = 1, lb_threshold: int = 8, exact: bool = True, io_rank: int = 0,
                 merge: bool = True) -> None:
        if mode not in ("none", "replicated", "sharded", "dcp", "layersplit", "shared"):
            raise ValueError(f"unknown CP mode {mode!r}")
        if policy not in ("wt", "wts", "wb"):
            raise ValueError(f"unknown write policy {policy!r}")
        if mode == "none":
            ranks = 1
        if mode == "layersplit" and layers % ranks:
            layers = ranks * max(1, layers // ranks)
        self.mode, self.ranks, self.policy, self.level = mode, ranks, policy, level
        self.page_size, self.layers, self.width = page_size, layers, width
        self.dev_pages, self.host_pages = dev_pages, host_pages
        self.d_w, self.d_l, self.lb_threshold = d_w, d_l, lb_threshold
        self.exact, self.io_rank = exact, io_rank
        # merge: the writes of one scheduler step (a request's backups, a write_back eviction's victims, a
        # re-backup pass) start as one merged op, as SGLang's merge_ops; off: each write is its own op at once
        self.merge = merge
        self.faults = list(faults)
        for p in self.faults:
            if p.kind == "ZERO_race" and mode == "shared":
                p.scope = "all"   # shared mode: the IO rank copies before every owner's store (no pre-copy fence)
        self.emitter = emitter if emitter is not None else LogEmitter(level, ranks)
        self.oracle = Oracle()
        self.clock = Clock()
        self.next_op = [1] * ranks
        self._rid = 0
        self._open: dict[str, int] = {}
        self.ranks_: list[RankSim] = []
        self._build()
        for rk in self.ranks_:
            extra: dict[str, Any] = {}
            if mode == "dcp":
                extra["dcp_size"] = ranks
            if mode == "shared":
                extra["io_rank"] = io_rank
            if mode == "layersplit":
                lo, hi = int(rk.layer_ids[0]), int(rk.layer_ids[-1]) + 1
                extra["layers"] = f"[{lo},{hi})"
            rk.emit(1, "config", cp_size=ranks, cp_rank=rk.r, mode=mode, page_size=page_size, policy=policy,
                    level=level, **extra, mono=TS_BASE, wall=WALL_BASE_NS)

    def _build(self) -> None:
        self.diverged_at: int | None = None   # structural index of this epoch's first cross-rank divergence
        shared = None
        if self.mode == "shared":
            nl = self.layers
            shared = np.zeros((self.host_pages * self.page_size, nl, self.width), dtype=np.uint8)
        self.ranks_ = [RankSim(self, r, shared) for r in range(self.ranks)]

    def judged(self, index: int) -> bool:
        """Whether the cross-rank rules C3-C5 judge a record at structural ``index`` of this epoch: node ids (and
        in mode shared the pages) line up across ranks only up to the first divergence of the trees, so the
        checker judges only records at or before it (domain 5, pitfall). ``index``: the rank's structural records
        before the record (:attr:`RankSim.n_struct` when it is emitted)."""
        return self.diverged_at is None or index <= self.diverged_at

    # -- driver ------------------------------------------------------------------------------------------------
    def request(self, tokens: Iterable[int], dur: int = 0, rid: str | None = None) -> str:
        """One request on every rank: match (+splits), load_back or recompute, insert, store, compose; backups after
        every rank stored (the shared-mode fence order). ``dur`` rounds until it finishes (0: at once)."""
        t = np.asarray(list(tokens), dtype=np.int64)
        if t.size % self.page_size:
            raise ValueError("request length must be page-aligned")
        if rid is None:
            self._rid += 1
            rid = f"r{self._rid}"
        for rk in self.ranks_:
            rk.begin_request(rid, t)
        for rk in self.ranks_:
            rk.do_stores()
        for rk in self.ranks_:
            rk.do_backups()
        if dur <= 0:
            for rk in self.ranks_:
                rk.finish_request(rid)
        else:
            self._open[rid] = self.clock.tick + dur
        return rid

    def step(self) -> None:
        """One scheduler round: copies that complete now read their sources, late stores land, then
        ``check_events`` pops MIN(ready) acks on every rank, then due requests finish."""
        for rk in self.ranks_:
            rk.start_writing()   # the writes issued since the last round start together (one merged op if several)
        self.clock.advance()
        t = self.clock.tick
        for rk in self.ranks_:
            for op in rk.write_q:
                if not op.done and op.complete_at <= t:
                    rk.copy_d2h(op)
        for rk in self.ranks_:
            for op in rk.load_q:
                if not op.done and op.complete_at <= t:
                    rk.copy_h2d(op)
        for rk in self.ranks_:
            rk.apply_due_stores()
        n = min(rk.ready(rk.write_q) for rk in self.ranks_)
        if n:
            for rk in self.ranks_:
                rk.ack_writes(n)
        n = min(rk.ready(rk.load_q) for rk in self.ranks_)
        if n:
            for rk in self.ranks_:
                rk.ack_loads(n)
        for rid, due in list(self._open.items()):
            if due <= t:
                del self._open[rid]
                for rk in self.ranks_:
                    rk.finish_request(rid)

    def drain(self, max_steps: int = 64) -> None:
        """Step until no copy, late store or request is in flight (or ``max_steps``: a diverged group can hang)."""
        for _ in range(max_steps):
            if all(rk.idle() for rk in self.ranks_) and not self._open:
                return
            self.step()

    def reset(self) -> None:
        """``HiRadixCache.reset`` (flush_cache) on every rank, once idle: node ids restart, pools are emptied."""
        self.drain()
        for rk in self.ranks_:
            rk.emit(1, "reset", reason="flush")
        self._build()

    def evict_all(self) -> None:
        """Memory pressure on every rank: evict every evictable device node (write_back backs them up first)."""
        for rk in self.ranks_:
            rk.evict_dev(rk.dev.n_pages)

    def rebackup_all(self) -> None:
        """Every rank re-backs up every device-resident backuped node to a fresh host range (see
        :meth:`RankSim.rebackup`), parents before children so the write-through guard holds."""
        for rk in self.ranks_:
            todo = sorted((n for n in rk.nodes.values() if n.host_value is not None and n.value is not None),
                          key=lambda n: (len(rk.path_of(n)), n.id))
            for n in todo:
                rk.rebackup(n)

    def evict_host_all(self) -> None:
        """Host memory pressure on every rank: evict every evictable host leaf."""
        for rk in self.ranks_:
            rk.evict_host(rk.host.n_pages)

    def finish(self, max_steps: int = 64) -> None:
        """End of the run: let every copy, late store and request complete."""
        self.drain(max_steps)
