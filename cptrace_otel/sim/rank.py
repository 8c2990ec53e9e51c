"""One CP rank of the simulation: :class:`RankSim`, the facade over the rank's parts, and the request path.

Each part is a module that owns its state and is given, when the rank builds it, the other parts' state it works on
(never the rank or the simulation; the group's settings and shared counters come as a
:class:`~cptrace_otel.sim.rank_ctx.RankCtx`):

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

import numpy as np

from ..fingerprint.cpu import khash_bytes
from .compose import ComposeCache
from .copy_engine import CopyEngine
from .emit import Recorder
from .evict import Evictor
from .faults import FaultHooks, FaultPlan, Oracle
from .memory import Memory
from .node import Node, Op
from .pool import PagedPool
from .rank_ctx import RankCtx
from .tracer import Emitter
from .tree import Tree

THRESHOLD = {"wt": 1, "wts": 2}   # hit count that triggers write_through(_selective)'s backup; none for write_back


class RankSim:
    """One CP rank: tree, device pool, host pool (a shadow allocator over shared data in mode shared), controller.

    The attributes and methods below are what the simulation driver, the workloads and the tests use; the rank's
    steps live in its parts (``rk.tree.split``, ``rk.copy.load_back`` ...)."""

    def __init__(self, ctx: RankCtx, emitter: Emitter, faults: list[FaultPlan], oracle: Oracle,
                 host_data: np.ndarray | None, peers: list[Memory], peer_nodes: list[dict[int, Node]]) -> None:
        """Rank ``ctx.r`` of the group: ``host_data`` the shared host buffer (mode shared); ``peers`` and
        ``peer_nodes`` the group's lists of every rank's memory and tree nodes, to which this rank adds its own."""
        cfg = ctx.cfg
        self.ctx = ctx
        self.cfg = cfg
        self.r = rank = ctx.r
        if cfg.mode == "layersplit":
            per = cfg.layers // cfg.ranks
            self.layer_ids = np.arange(rank * per, (rank + 1) * per)
        else:
            self.layer_ids = np.arange(cfg.layers)
        nl = self.layer_ids.size
        real = cfg.alloc == "sglang"
        # mode sharded: SGLang's page interleave, page p of either pool on rank p % R (identical books on every
        # rank); the pools' logical pages are R times one rank's, so the sizes round up to a multiple of R
        classes = cfg.ranks if cfg.mode == "sharded" else 1
        dev_pages, host_pages = (-(-n // classes) * classes for n in (cfg.dev_pages, cfg.host_pages))
        self.dev = PagedPool(dev_pages, cfg.page_size, nl, cfg.width, f"dev{rank}", "sorted" if real else "lifo",
                             classes)
        self.host = PagedPool(host_pages, cfg.page_size, nl, cfg.width, f"host{rank}", "fifo" if real else "lifo",
                              classes)
        if host_data is not None:
            self.host.data = host_data            # shared L2: one buffer, identical shadow allocators
        self.rec = Recorder(ctx, emitter)
        self.hooks = FaultHooks(ctx, self.rec, faults, oracle, peer_nodes)
        self.cache = ComposeCache(self.layer_ids, self.hooks, self.rec)
        self.tree = Tree(ctx, self.hooks, self.cache, self.rec)
        self.mem = Memory(ctx, self.layer_ids, self.dev, self.hooks, self.rec, peers)
        self.evictor = Evictor(cfg, self.tree, self.dev, self.host, self.cache, self.rec, self.hooks)
        self.copy = CopyEngine(ctx, self.tree, self.evictor, self.mem, self.host, self.cache, self.rec, self.hooks)
        self.tree.bind(self.copy)
        self.evictor.bind(self.copy)
        peers.append(self.mem)
        peer_nodes.append(self.tree.nodes)
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
        cfg, clock, tree, rec = self.cfg, self.ctx.clock, self.tree, self.rec
        ps = cfg.page_size
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
            # recompute: revive the evicted nodes with the request's new slots. Mode sharded: at the chain's owners
            # (SGLang draws a new base where the whole path was evicted and declines the insert where it differs;
            # the simulator models no declined insert)
            for n in chain:
                tree.inc_lock(cur)
                slots = self.evictor.alloc_dev(len(n), n.id, tree.first_class(n))
                tree.dec_lock(cur)
                if slots is None:
                    break
                n.value = slots
                n.gen += 1
                self.cache.invalidate(n)
                rec.insert(n, n.up(), slots, "revive")
                self.to_store.append((rid, n))
                cur = n
        if cur is (chain[-1] if chain else ancestor) and pos < tokens.size:
            rest = tokens[pos:].copy()
            tree.inc_lock(cur)
            # mode sharded: the prompt continues its chain's rotation; a new chain (under the root) starts at the
            # least-full class, which becomes its base
            start = None if cur is tree.root else (cur.base + pos // ps) % cfg.ranks
            slots = self.evictor.alloc_dev(rest.size, start=start if cfg.mode == "sharded" else 0)
            tree.dec_lock(cur)
            if slots is not None and tree.edge(rest) in cur.children:
                self.dev.free(slots)   # a node that is loading right now holds this prefix: do not cache it twice
                slots = None
            if slots is not None:
                n = tree.new_node(rest, cur, pos)
                n.base = int(slots[0] // ps) % cfg.ranks if cur is tree.root and cfg.mode == "sharded" else cur.base
                cur.children[tree.edge(rest)] = n
                n.value = slots
                n.gen = 1
                n.last_access = clock.tick
                rec.insert(n, cur, slots, "new")
                self.to_store.append((rid, n))
                cur = n
        tree.inc_lock(cur)
        self.requests[rid] = (cur, clock.tick)
        final = tree.path_of(cur)
        th = THRESHOLD.get(cfg.policy)
        for n in final:
            n.hit_count += 1
            n.last_access = clock.tick
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
                self.mem.fwd_hash(rid, tokens, final, hit, pfp)

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
