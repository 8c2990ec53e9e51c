"""One rank's KV bytes: what a forward computes and stores, and the device pages as the rank's kernels read them.

By CP mode (docs/domain.md §5): replicated ranks hold identical KV; layersplit ranks their own shard (only the
rank's layers); a dcp rank stores only its token stripe; in mode shared page ``p`` is owned by rank ``p % R``, whose
device pool holds its bytes, and a rank reads every page through the shared view; in mode sharded (SGLang 0.5.23's
page interleave) the KV is the replicated one, page ``p`` of either pool is stored only on rank ``p % R`` (the rows
of other ranks' pages are never written on this one), and a forward reads the KV assembled from the owners.

A store may be late (fault ZERO_race): it is then pending until its due round, and a hash ordered after it (the
backup's start event on the compute stream) sees it already.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import kv
from .emit import Recorder
from .faults import FaultHooks
from .node import Node
from .pool import PagedPool
from .rank_ctx import RankCtx


class Memory:
    """The KV bytes of rank ``ctx.r`` (its layers ``layer_ids``, its device pool ``dev``); ``pending_stores``: the
    late stores, (due round, slots, bytes, rid, node id). ``peers``: every rank's Memory in rank order (the group's
    list, filled as the ranks are built): in mode shared a rank reads every page through the shared view."""

    def __init__(self, ctx: RankCtx, layer_ids: np.ndarray, dev: PagedPool, hooks: FaultHooks, rec: Recorder,
                 peers: list[Memory]) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.r = ctx.r
        self.layer_ids = layer_ids
        self.dev = dev
        self.hooks = hooks
        self.rec = rec
        self.peers = peers
        self.pending_stores: list[tuple[int, np.ndarray, np.ndarray, str, int]] = []

    def kv_for(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """The KV this rank's forward computes for ``tokens`` at prompt positions ``start...``."""
        cfg = self.cfg
        pos = np.arange(start, start + tokens.size)
        shard = self.r if cfg.mode in ("dcp", "layersplit") else 0
        data = kv.content(tokens, pos, self.layer_ids, cfg.width, shard)
        if cfg.mode == "dcp":
            data[(pos % cfg.ranks) != self.r] = 0   # this rank stores only its token stripe
        return data

    def owned(self, slots: np.ndarray) -> np.ndarray:
        """Mask of the slots whose page this rank owns (modes shared and sharded); all slots otherwise."""
        cfg = self.cfg
        if cfg.mode not in ("shared", "sharded"):
            return np.ones(slots.size, dtype=bool)
        return (slots // cfg.page_size) % cfg.ranks == self.r

    def fingerprint(self, slots: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        """The ``h``/``nz``/``hp`` a record of the bytes ``b`` this rank read at ``slots`` carries: in mode sharded
        those of the rank's stripe (``traced/sglang/_shard.py``'s contract), else of all of ``b``."""
        if self.cfg.mode != "sharded":
            return kv.fingerprint(b, self.cfg.page_size)
        return kv.stripe_fingerprint(b, self.owned(slots), self.cfg.page_size)

    def _view(self, slots: np.ndarray) -> np.ndarray:
        """The device KV at ``slots`` read from each page's owner (shared mode's view; mode sharded: the KV a
        forward assembles from the ranks)."""
        cfg = self.cfg
        out = np.empty((slots.size, *self.dev.data.shape[1:]), dtype=np.uint8)
        owner = (slots // cfg.page_size) % cfg.ranks
        for other in self.peers:
            m = owner == other.r
            out[m] = other.dev.data[slots[m]]
        return out

    def gather(self, slots: np.ndarray, post_store: bool = False) -> np.ndarray:
        """The node's device KV in token order as this rank's kernels see it (mode shared: through the view).

        ``post_store`` overlays stores that are scheduled but not landed: what a hash on the compute stream, ordered
        after the forward's store, observes."""
        cfg = self.cfg
        sources: list[Memory]
        if cfg.mode == "shared":
            out = self._view(slots)
            sources = self.peers
        else:
            out = self.dev.data[slots]
            sources = [self]
        if post_store:
            for src in sources:
                for _, s_slots, s_bytes, _, _ in src.pending_stores:
                    where = {int(x): j for j, x in enumerate(s_slots.tolist())}
                    own = src.owned(s_slots)
                    for i, x in enumerate(slots.tolist()):
                        j = where.get(x)
                        if j is not None and own[j]:
                            out[i] = s_bytes[j]
        return out

    def write_dev(self, slots: np.ndarray, data: np.ndarray) -> None:
        """Write ``data`` to the slots this rank owns."""
        m = self.owned(slots)
        self.dev.data[slots[m]] = data[m]

    def store(self, rid: str, n: Node) -> None:
        """The forward's KV store of node ``n`` for request ``rid`` (faults ZERO_nostore, ZERO_race)."""
        slots = n.value
        assert slots is not None, f"node {n.id} stored without device slots"
        data = self.kv_for(n.key, n.start)
        if self.hooks.zero_nostore(n):
            self.write_dev(slots, np.zeros_like(data))   # the fault: the store never runs (pages hold zeros)
            return
        if self.hooks.zero_race(n, bool(self.owned(slots).any())):
            # the fault: the store lands after the backup copy of these pages has completed
            self.write_dev(slots, np.zeros_like(data))
            self.pending_stores.append((self.ctx.clock.tick + self.cfg.d_w + 1, slots.copy(), data, rid, n.id))
            return
        self.write_dev(slots, data)
        self.rec.store(rid, slots)

    def apply_due_stores(self) -> None:
        """Land the late stores due by now."""
        keep = []
        for due, slots, data, rid, nid in self.pending_stores:
            if due > self.ctx.clock.tick:
                keep.append((due, slots, data, rid, nid))
                continue
            self.write_dev(slots, data)
            self.rec.store(rid, slots)
            self.hooks.expect_late_store(nid)
        self.pending_stores = keep

    def fwd_hash(self, rid: str, tokens: np.ndarray, final: list[Node], src: str, pfp: int,
                 loaded: tuple[int, list[Node]] | None = None) -> None:
        """The forward's per-layer ``fwd_hash`` records: the KV of the prompt as computed, except that the tokens a
        host reload brought back (``loaded`` = (their first position, the chain)) are the device bytes the load
        wrote, as the attention reads them: a corrupt reload shows up in the forward."""
        data = self.kv_for(tokens, 0)
        if loaded is not None:
            start, chain = loaded
            read = self._view if self.cfg.mode == "sharded" else self.gather
            rows = np.concatenate([read(n.dev_slots()) for n in chain]) if chain else data[:0]
            data[start:start + len(rows)] = rows
        cprank = self.r if self.cfg.mode == "shared" else -1
        for li, layer in enumerate(self.layer_ids.tolist()):
            self.rec.fwd_hash(rid, layer, data[:, li], int(tokens.size), cprank, pfp, src)

