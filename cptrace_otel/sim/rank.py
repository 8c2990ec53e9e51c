"""One CP rank of the simulation: :class:`RankSim`, the facade over the rank's parts, and the request path.

Each part is a module that owns its state and reaches the others through the rank:

* ``tree`` (:mod:`.tree`): the nodes, match and split, ``lock_ref``;
* ``mem`` (:mod:`.memory`): the KV bytes, the forward's stores, ``gather``;
* ``evictor`` (:mod:`.evict`): allocation under pressure, device and host eviction;
* ``copy`` (:mod:`.copy`): the write and load queues, the copies, the acks;
* ``cache`` (:mod:`.compose`): the attention's compose views;
* ``rec`` (:mod:`.emit`): the records and the structural index;
* ``hooks`` (:mod:`.faults`): every fault site and every finding the oracle derives.

:class:`~cptrace_otel.sim.core.Simulation` drives the ranks in lockstep; the request path here runs one request
on one rank: match (+ splits), load_back or recompute, insert, then (after every rank got it) the stores and the
write-through backups.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ..fingerprint.cpu import khash_bytes
from .compose import ComposeCache
from .copy import CopyEngine, Op
from .emit import Recorder
from .evict import Evictor
from .faults import FaultHooks
from .memory import Memory
from .pool import PagedPool
from .tree import Node, Tree

if TYPE_CHECKING:
    from .core import Simulation

THRESHOLD = {"wt": 1, "wts": 2}   # hit count that triggers write_through(_selective)'s backup; none for write_back


class RankSim:
    """One CP rank: tree, device pool, host pool (a shadow allocator over shared data in mode shared), controller.

    The attributes and methods below are what the simulation driver, the workloads and the tests use; the rank's
    steps live in its parts (``rk.tree.split``, ``rk.copy.load_back`` ...)."""

    def __init__(self, sim: "Simulation", rank: int, host_data: np.ndarray | None) -> None:
        self.sim = sim
        self.r = rank
        if sim.mode == "layersplit":
            per = sim.layers // sim.ranks
            self.layer_ids = np.arange(rank * per, (rank + 1) * per)
        else:
            self.layer_ids = np.arange(sim.layers)
        nl = self.layer_ids.size
        real = sim.alloc == "sglang"
        self.dev = PagedPool(sim.dev_pages, sim.page_size, nl, sim.width, f"dev{rank}", "sorted" if real else "lifo")
        self.host = PagedPool(sim.host_pages, sim.page_size, nl, sim.width, f"host{rank}", "fifo" if real else "lifo")
        if host_data is not None:
            self.host.data = host_data            # shared L2: one buffer, identical shadow allocators
        self.rec = Recorder(sim, rank)
        self.hooks = FaultHooks(sim, rank, self.rec)
        self.tree = Tree(self)
        self.mem = Memory(self)
        self.cache = ComposeCache(self)
        self.evictor = Evictor(self)
        self.copy = CopyEngine(self)
        self.requests: dict[str, tuple[Node, int]] = {}
        self.want_backup: list[Node] = []
        self.to_store: list[tuple[str, Node]] = []

    # -- what the driver and the tests read --------------------------------------------------------------------
    @property
    def nodes(self) -> dict[int, Node]:
        return self.tree.nodes

    @property
    def root(self) -> Node:
        return self.tree.root

    @property
    def write_q(self) -> deque[Op]:
        return self.copy.write_q

    def gather(self, slots: np.ndarray, post_store: bool = False) -> np.ndarray:
        """The device KV at ``slots`` in token order as this rank's kernels see it (see :meth:`Memory.gather`)."""
        return self.mem.gather(slots, post_store)

    def start_writing(self) -> None:
        """Start the queued writes as one transfer (see :meth:`CopyEngine.start_writing`)."""
        self.copy.start_writing()

    def idle(self) -> bool:
        copy = self.copy
        return not copy.write_q and not copy.write_new and not copy.load_q and not self.requests \
            and not self.mem.pending_stores

    # -- a request ---------------------------------------------------------------------------------------------
    def begin_request(self, rid: str, tokens: np.ndarray) -> None:
        sim, tree, rec = self.sim, self.tree, self.rec
        path, pos = tree.match(tokens)
        ndev = 0
        while ndev < len(path) and path[ndev].value is not None:
            ndev += 1
        dev_nodes, chain = path[:ndev], path[ndev:]
        ancestor = dev_nodes[-1] if dev_nodes else tree.root
        dlen = sum(len(n) for n in dev_nodes)
        hlen = sum(len(n) for n in chain)
        op = self.copy.load_back(chain, ancestor) if chain else None
        hit = "host" if op is not None else ("dev" if dev_nodes else "miss")
        last = path[-1] if path else tree.root
        pfp = khash_bytes(tokens.astype(np.int64).view(np.uint8))
        rec.rid_map(rid, last, hit, dlen, hlen, int(tokens.size), pfp)
        cur = ancestor if op is None else chain[-1]
        if op is None:
            for n in chain:   # recompute: revive the evicted nodes with the request's new slots
                tree.inc_lock(cur)
                slots = self.evictor.alloc_dev(len(n), n.id)
                tree.dec_lock(cur)
                if slots is None:
                    break
                n.value = slots
                n.gen += 1
                self.cache.invalidate(n)
                rec.insert(n, n.parent, slots, "revive")
                self.to_store.append((rid, n))
                cur = n
        if cur is (chain[-1] if chain else ancestor) and pos < tokens.size:
            rest = tokens[pos:].copy()
            tree.inc_lock(cur)
            slots = self.evictor.alloc_dev(rest.size)
            tree.dec_lock(cur)
            if slots is not None and tree.edge(rest) in cur.children:
                self.dev.free(slots)   # a node that is loading right now holds this prefix: do not cache it twice
                slots = None
            if slots is not None:
                n = tree.new_node(rest, cur, pos)
                cur.children[tree.edge(rest)] = n
                n.value = slots
                n.gen = 1
                n.last_access = sim.clock.tick
                rec.insert(n, cur, slots, "new")
                self.to_store.append((rid, n))
                cur = n
        tree.inc_lock(cur)
        self.requests[rid] = (cur, sim.clock.tick)
        final = tree.path_of(cur)
        th = THRESHOLD.get(sim.policy)
        for n in final:
            n.hit_count += 1
            n.last_access = sim.clock.tick
            if th is not None and n.hit_count >= th and n.host_value is None:
                self.want_backup.append(n)
        if rec.on(2):
            for n in final:
                if n.value is not None:
                    self.cache.compose(n)
        if rec.on(3):
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
                self.mem.store(rid, n)

    def do_backups(self) -> None:
        todo, self.want_backup = self.want_backup, []
        for n in todo:
            if n.parent is not None and (n.id in self.tree.nodes):
                self.copy.write_backup(n)

    def finish_request(self, rid: str) -> None:
        node, _ = self.requests.pop(rid)
        self.tree.dec_lock(node)

    def fwd_hash(self, rid: str, tokens: np.ndarray, final: list[Node], src: str, pfp: int,
                 loaded: tuple[int, list[Node]] | None = None) -> None:
        """The forward's per-layer ``fwd_hash`` records: the KV of the prompt as computed, except that the tokens a
        host reload brought back (``loaded`` = (their first position, the chain)) are the device bytes the load
        wrote, as the attention reads them: a corrupt reload shows up in the forward."""
        data = self.mem.kv_for(tokens, 0)
        if loaded is not None:
            start, chain = loaded
            rows = np.concatenate([self.mem.gather(n.value) for n in chain]) if chain else data[:0]
            data[start:start + len(rows)] = rows
        cprank = self.r if self.sim.mode == "shared" else -1
        for li, layer in enumerate(self.layer_ids.tolist()):
            self.rec.fwd_hash(rid, layer, data[:, li], int(tokens.size), cprank, pfp, src)
