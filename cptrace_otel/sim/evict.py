"""One rank's allocation under pressure and its evictions (docs/domain.md §2, stages S7, S8, S12).

An allocation that does not fit evicts, then retries once. Device eviction takes LRU leaves with ``lock_ref`` 0: a
backuped leaf keeps its host copy (value None), a leaf that is not backuped is deleted with its host-only
descendants. write_back backs the victims up first and flushes synchronously before the free. Host eviction takes
device-evicted host leaves with no host pin and no write in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from .compose import ComposeCache
from .emit import Recorder
from .faults import FaultHooks
from .node import Node, Op
from .pool import PagedPool
from .rank_ctx import Settings
from .tree import Tree


class Writer(Protocol):
    """What eviction needs of the rank's copy engine (:class:`~cptrace_otel.sim.copy_engine.CopyEngine`): start the
    queued writes before a page is freed; write_back's backup of a victim and its synchronous flush."""

    def start_writing(self) -> None: ...

    def write_backup(self, n: Node, write_back: bool = False) -> Op | None: ...

    def flush_writes(self) -> None: ...


class Evictor:
    """Allocation and eviction on one rank's device and host pools (``dev``, ``host``) and ``tree``; ``cache``,
    ``rec``, ``hooks``: the rank's compose views, records and fault sites. The copy engine, which is built on the
    evictor, is given by :meth:`bind`."""

    writer: Writer

    def __init__(self, cfg: Settings, tree: Tree, dev: PagedPool, host: PagedPool, cache: ComposeCache,
                 rec: Recorder, hooks: FaultHooks) -> None:
        self.cfg = cfg
        self.tree = tree
        self.dev = dev
        self.host = host
        self.cache = cache
        self.rec = rec
        self.hooks = hooks

    def bind(self, writer: Writer) -> None:
        """Give the evictor the rank's copy engine (built after the evictor, which it uses)."""
        self.writer = writer

    def alloc_dev(self, n: int, owner: int = -1, start: int | None = 0) -> np.ndarray | None:
        """``n`` device slots for node ``owner``, their pages' owner classes from ``start`` (None: a new chain's,
        the least-full class after any eviction; see :class:`~cptrace_otel.sim.pool.PagedPool`)."""
        return self._alloc(self.dev, self.evict_dev, n, owner, start)

    def alloc_host(self, n: int, owner: int = -1, start: int = 0) -> np.ndarray | None:
        return self._alloc(self.host, self.evict_host, n, owner, start)

    @staticmethod
    def _alloc(pool: PagedPool, evict: Callable[[int], None], n: int, owner: int,
               start: int | None) -> np.ndarray | None:
        """``n`` slots of ``pool`` for node ``owner``; when they do not fit, evict the missing pages and retry once
        (None when they still do not fit); with owner classes, evict on while a class the run needs is short and
        eviction frees pages (SGLang admits on the tightest class)."""

        def take() -> np.ndarray | None:
            return pool.alloc(n, owner, pool.least_full_class() if start is None else start)

        idx = take()
        if idx is None:
            evict(n // pool.page_size - pool.free_pages)
            idx = take()
        while idx is None and pool.classes > 1:
            before = pool.free_pages
            evict(1)
            if pool.free_pages == before:
                return None
            idx = take()
        return idx

    def _dev_leaves(self) -> list[Node]:
        out = []
        for n in self.tree.nodes.values():
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
        cfg = self.cfg
        ps = cfg.page_size
        freed = 0
        self.writer.start_writing()   # queued writes start before any page is freed: their copies read the pages
        while freed < need_pages:
            cands = self._dev_leaves()
            if not cands:
                return
            order = sorted(cands, key=lambda n: (n.last_access, n.id))
            batch = order[:1]
            if cfg.policy == "wb" and cfg.merge:
                batch, got = [], freed
                for v in order:
                    batch.append(v)
                    got += len(v) // ps
                    if got >= need_pages:
                        break
            if cfg.policy == "wb":
                freed += self._evict_write_back(batch)
                continue
            for v in batch:
                freed += len(v) // ps
                if v.host_value is not None:
                    self._evict_backuped(v)
                else:
                    self._evict_regular(v)

    def _evict_write_back(self, victims: list[Node]) -> int:
        """write_back eviction as SGLang's ``_evict_write_back`` stages it (pages freed, returned): a backuped victim
        is evicted at once; one that is not is backed up (``write_backup(write_back=True)``) and staged (SGLang's
        ``_detach_backuped``: off the device tree, its pages still allocated; no record); ``flush_staged`` runs
        ``writing_check(write_back=True)`` (every d2h ack) and only then gives the staged pages back (``evict
        tier=dev`` and the free, at ``evict_device``); a victim the host cannot take flushes the stage and is dropped.
        Fault ``H4_wb_noflush`` skips the flush: the staged pages are freed with their copies in flight."""
        copy = self.writer
        ps = self.cfg.page_size
        freed = 0
        staged: list[tuple] = []

        def flush_staged() -> None:
            if not staged:
                return
            if not self.hooks.h4_wb_noflush(staged, copy.start_writing):
                copy.flush_writes()
            for v, _ in staged:
                self._evict_backuped(v)
            staged.clear()

        for v in victims:
            freed += len(v) // ps
            if v.host_value is not None:
                self._evict_backuped(v)
                continue
            op = copy.write_backup(v, write_back=True)
            if op is not None:
                staged.append((v, op))
            else:
                flush_staged()
                self._evict_regular(v)
        flush_staged()
        return freed

    def _free_dev(self, n: Node, slots: np.ndarray) -> None:
        self.hooks.expect_freed_in_flight(n)
        self.rec.free("dev", slots, n.id, "evict")
        self.dev.free(slots)

    def _evict_backuped(self, v: Node) -> None:
        self.rec.evict_dev(v, "backuped")
        v.evicted_dev, v.stale_dev = v.value, None
        self._free_dev(v, v.dev_slots())
        v.value = None
        v.gen += 1
        self.cache.invalidate(v, why="evict")

    def _evict_regular(self, v: Node) -> None:
        self.rec.evict_dev(v, "regular")
        self._free_dev(v, v.dev_slots())
        v.value = None
        self.cache.invalidate(v)
        # evicted descendants (host only) lose their parent: drop them with their host pages
        stack = list(v.children.values())
        while stack:
            d = stack.pop()
            stack.extend(d.children.values())
            self.rec.evict_host(d, "drop")
            self.free_host(d)
            del self.tree.nodes[d.id]
        self.tree.detach(v)

    def free_host(self, n: Node) -> None:
        """Free ``n``'s host pages (``n.host_value`` becomes None); nothing when it has none."""
        slots = n.host_value
        if slots is None:
            return
        self.rec.free("host", slots, n.id, "evict")
        self.host.free(slots)
        n.host_value = None

    def evict_host(self, need_pages: int) -> None:
        """Evict LRU host leaves until ``need_pages`` pages are freed or none is left."""
        ps = self.cfg.page_size
        freed = 0
        while freed < need_pages:
            cands = [n for n in self.tree.nodes.values() if n.value is None and n.host_value is not None
                     and n.host_ref == 0 and not n.children and not n.pend_ops]
            if not cands:
                return
            v = min(cands, key=lambda n: (n.last_access, n.id))
            freed += len(v) // ps
            self.rec.evict_host(v, "host")
            self.free_host(v)
            self.tree.detach(v)
