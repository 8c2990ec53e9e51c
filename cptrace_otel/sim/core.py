"""The simulated HiCache: a mini HiRadix tree per CP rank, its pools and its copy controller, run in lockstep.

Semantics follow SGLang (docs/domain.md §1, §2, §5 and §7.1):

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
* ``check_events`` pops MIN(ready acks) over the ranks on every rank, as ``_all_reduce_attn_groups``; every ack
  record carries ``round=`` (the tick). With ``mixed_acks`` each rank logs a round's d2h and h2d acks in its own
  interleaving (as the two ack queues are drained), so ranks log the same round in different line orders;
* ranks are in step in their decisions, not in time: with ``lag_ns`` every rank but the IO rank stamps its records
  that much earlier (the followers run ahead of the IO rank, which does the copies), so a follower may evict a
  node and store the next owner's KV into its pages before the IO rank logs its own eviction;
* CP modes: the KV each rank holds differs by mode (replicated: identical; sharded: per shard; dcp: the rank's token
  stripe; layersplit: the rank's layers; shared: page owner ``page % R`` writes, one shared host pool, the IO rank
  copies all pages through the shared view, each rank loads only the pages it owns).

Every deviation of a :class:`~cptrace_otel.sim.faults.FaultPlan` is a named hook of
:class:`~cptrace_otel.sim.faults.FaultHooks`; the oracle records what it must make the checker find. One rank is a
:class:`~cptrace_otel.sim.rank.RankSim` (tree, memory, eviction, copy engine, compose views, records, fault hooks,
one module each); :class:`Simulation` here runs the ranks in lockstep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

import numpy as np

from .faults import FaultPlan, Oracle
from .memory import Memory
from .node import Node
from .rank import RankSim
from .rank_ctx import Epoch, RankCtx, Settings
from .tracer import Clock, Emitter, LogEmitter

T = TypeVar("T")


class _Setting(Generic[T]):
    """A parameter of the simulation, read and written in its :class:`Settings` (``sim.cfg``), the one object the
    ranks' parts hold: a write takes effect at once (the pool sizes at the next reset, when the pools are made)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, sim: Simulation, owner: type | None = None) -> T:
        return getattr(sim.cfg, self.name)

    def __set__(self, sim: Simulation, value: T) -> None:
        setattr(sim.cfg, self.name, value)


class Simulation:
    """R ranks in lockstep: every rank's tree gets the same requests; ``step()`` advances one scheduler round.

    ``emitter`` gets every record (``emit(rank, level, tag, **fields)``); ``faults`` are :class:`FaultPlan`;
    ``oracle`` collects the expected findings. The parameters (``sim.mode``, ``sim.d_w`` ...) live in ``sim.cfg``
    (:class:`~cptrace_otel.sim.rank_ctx.Settings`, which documents them).
    """

    mode = _Setting[str]()
    ranks = _Setting[int]()
    policy = _Setting[str]()
    level = _Setting[int]()
    page_size = _Setting[int]()
    layers = _Setting[int]()
    width = _Setting[int]()
    dev_pages = _Setting[int]()
    host_pages = _Setting[int]()
    d_w = _Setting[int]()
    d_l = _Setting[int]()
    lb_threshold = _Setting[int]()
    exact = _Setting[bool]()
    io_rank = _Setting[int]()
    merge = _Setting[bool]()
    lag_ns = _Setting[int]()
    mixed_acks = _Setting[bool]()
    alloc = _Setting[str]()
    split_loading = _Setting[bool]()
    ack_chain = _Setting[bool]()

    def __init__(self, mode: str = "none", ranks: int = 1, policy: str = "wt", level: int = 3,
                 faults: Iterable[FaultPlan] = (), emitter: Emitter | None = None, *, page_size: int = 4,
                 layers: int = 2, width: int = 4, dev_pages: int = 32, host_pages: int = 48, d_w: int = 1,
                 d_l: int = 1, lb_threshold: int = 8, exact: bool = True, io_rank: int = 0,
                 merge: bool = True, lag_ns: int = 0, mixed_acks: bool = False, alloc: str = "lifo",
                 split_loading: bool = True, ack_chain: bool = True) -> None:
        if mode not in ("none", "replicated", "sharded", "dcp", "layersplit", "shared"):
            raise ValueError(f"unknown CP mode {mode!r}")
        if policy not in ("wt", "wts", "wb"):
            raise ValueError(f"unknown write policy {policy!r}")
        if mode == "none":
            ranks = 1
        if mode == "layersplit" and layers % ranks:
            layers = ranks * max(1, layers // ranks)
        if alloc not in ("lifo", "sglang"):
            raise ValueError(f"unknown allocation discipline {alloc!r}")
        self.cfg = Settings(mode, ranks, policy, level, page_size, layers, width, dev_pages, host_pages, d_w, d_l,
                            lb_threshold, exact, io_rank, merge, lag_ns, mixed_acks, alloc, split_loading, ack_chain)
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
            rk.rec.config(rk.layer_ids)

    def _build(self) -> None:
        self.epoch = Epoch()   # a new epoch: no cross-rank divergence yet
        cfg = self.cfg
        shared = None
        if self.mode == "shared":
            nl = self.layers
            shared = np.zeros((self.host_pages * self.page_size, nl, self.width), dtype=np.uint8)
        peers: list[Memory] = []
        peer_nodes: list[dict[int, Node]] = []
        self.ranks_ = [RankSim(RankCtx(cfg, r, self.clock, self.next_op, self.epoch), self.emitter, self.faults,
                               self.oracle, shared, peers, peer_nodes) for r in range(self.ranks)]

    @property
    def diverged_at(self) -> int | None:
        """The structural index of this epoch's first cross-rank divergence (None while the trees are in step)."""
        return self.epoch.diverged_at

    def judged(self, index: int) -> bool:
        """Whether the cross-rank rules C3-C5 judge a record at structural ``index`` of this epoch (see
        :meth:`Epoch.judged <cptrace_otel.sim.rank_ctx.Epoch.judged>`)."""
        return self.epoch.judged(index)

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
            rk.copy.start_writing()   # the writes issued since the last round start together (one merged op if several)
            rk.copy.start_loading()   # so do the loads (their acks carry the merged op's id)
        self.clock.advance()
        t = self.clock.tick
        for rk in self.ranks_:
            rk.copy.complete_writes(t)
        for rk in self.ranks_:
            rk.copy.complete_loads(t)
        for rk in self.ranks_:
            rk.mem.apply_due_stores()
        # a rank that held acks back (fault C2_round) has them ready on top of the group's count
        nw = min(rk.copy.ready(rk.copy.write_q) - rk.copy.held for rk in self.ranks_)
        nl = min(rk.copy.ready(rk.copy.load_q) for rk in self.ranks_)
        for rk in self.ranks_:
            kw = rk.copy.held + rk.hooks.c2_round(nw, rk.copy.write_q, rk.copy.held, rk.requests, rk.tree.path_of,
                                                  self._open, t)
            rk.copy.held = nw + rk.copy.held - kw
            if not self.mixed_acks:
                if kw:
                    rk.copy.ack_writes(kw)
                if nl:
                    rk.copy.ack_loads(nl)
                continue
            for d in self._ack_order(rk.r, t, kw, nl):
                if d:
                    rk.copy.ack_loads(1)
                else:
                    rk.copy.ack_writes(1)
        for rid, due in list(self._open.items()):
            if due <= t:
                del self._open[rid]
                for rk in self.ranks_:
                    rk.finish_request(rid)

    @staticmethod
    def _ack_order(rank: int, tick: int, nw: int, nl: int) -> list[int]:
        """The order rank ``rank`` logs round ``tick``'s ``nw`` d2h (0) and ``nl`` h2d (1) acks in (``mixed_acks``):
        each queue in its own FIFO order, the loads drained after the first k writes, k varying with the rank and
        the round, so the ranks of one round log different line orders."""
        k = (tick + rank) % (nw + 1)
        return [0] * k + [1] * nl + [0] * (nw - k)

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
            rk.rec.reset()
        self._build()

    def evict_all(self) -> None:
        """Memory pressure on every rank: evict every evictable device node (write_back backs them up first)."""
        for rk in self.ranks_:
            rk.evictor.evict_dev(rk.dev.n_pages)

    def rebackup_all(self) -> None:
        """Every rank re-backs up every device-resident backuped node to a fresh host range (see
        :meth:`CopyEngine.rebackup <cptrace_otel.sim.copy_engine.CopyEngine.rebackup>`), parents before children so
        the write-through guard holds."""
        for rk in self.ranks_:
            todo = sorted((n for n in rk.tree.nodes.values() if n.host_value is not None and n.value is not None),
                          key=lambda n: (len(rk.tree.path_of(n)), n.id))
            for n in todo:
                rk.copy.rebackup(n)

    def evict_host_all(self) -> None:
        """Host memory pressure on every rank: evict every evictable host leaf."""
        for rk in self.ranks_:
            rk.evictor.evict_host(rk.host.n_pages)

    def finish(self, max_steps: int = 64) -> None:
        """End of the run: let every copy, late store and request complete."""
        self.drain(max_steps)
