"""One rank's KV bytes: what a forward computes and stores, and the device pages as the rank's kernels read them.

By CP mode (docs/domain.md §5): replicated ranks hold identical KV; sharded and layersplit ranks their own shard
(layersplit:
only the rank's layers); a dcp rank stores only its token stripe; in mode shared page ``p`` is owned by rank
``p % R``, whose device pool holds its bytes, and a rank reads every page through the shared view. A store may be
late (fault ZERO_race): it is then pending until its due round, and a hash ordered after it (the backup's start
event on the compute stream) sees it already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import kv

if TYPE_CHECKING:
    from .rank import RankSim
    from .tree import Node


class Memory:
    """The KV bytes of rank ``rk``; ``pending_stores``: the late stores, (due round, slots, bytes, rid, node id)."""

    def __init__(self, rk: "RankSim") -> None:
        self.rk = rk
        self.pending_stores: list[tuple[int, np.ndarray, np.ndarray, str, int]] = []

    def kv_for(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """The KV this rank's forward computes for ``tokens`` at prompt positions ``start...``."""
        rk = self.rk
        sim = rk.sim
        pos = np.arange(start, start + tokens.size)
        shard = rk.r if sim.mode in ("sharded", "dcp", "layersplit") else 0
        data = kv.content(tokens, pos, rk.layer_ids, sim.width, shard)
        if sim.mode == "dcp":
            data[(pos % sim.ranks) != rk.r] = 0   # this rank stores only its token stripe
        return data

    def owned(self, slots: np.ndarray) -> np.ndarray:
        """Mask of the slots whose page this rank owns (mode shared); all slots otherwise."""
        sim = self.rk.sim
        if sim.mode != "shared":
            return np.ones(slots.size, dtype=bool)
        return (slots // sim.page_size) % sim.ranks == self.rk.r

    def gather(self, slots: np.ndarray, post_store: bool = False) -> np.ndarray:
        """The node's device KV in token order as this rank's kernels see it (mode shared: through the view).

        ``post_store`` overlays stores that are scheduled but not landed: what a hash on the compute stream, ordered
        after the forward's store, observes."""
        rk = self.rk
        sim = rk.sim
        if sim.mode == "shared":
            out = np.empty((slots.size,) + rk.dev.data.shape[1:], dtype=np.uint8)
            owner = (slots // sim.page_size) % sim.ranks
            for other in sim.ranks_:
                m = owner == other.r
                out[m] = other.dev.data[slots[m]]
            sources = sim.ranks_
        else:
            out = rk.dev.data[slots]
            sources = [rk]
        if post_store:
            for src in sources:
                for _, s_slots, s_bytes, _, _ in src.mem.pending_stores:
                    where = {int(x): j for j, x in enumerate(s_slots.tolist())}
                    own = src.mem.owned(s_slots)
                    for i, x in enumerate(slots.tolist()):
                        j = where.get(x)
                        if j is not None and own[j]:
                            out[i] = s_bytes[j]
        return out

    def write_dev(self, slots: np.ndarray, data: np.ndarray) -> None:
        """Write ``data`` to the slots this rank owns."""
        m = self.owned(slots)
        self.rk.dev.data[slots[m]] = data[m]

    def store(self, rid: str, n: "Node") -> None:
        """The forward's KV store of node ``n`` for request ``rid`` (faults ZERO_nostore, ZERO_race)."""
        rk = self.rk
        sim = rk.sim
        slots = n.value
        data = self.kv_for(n.key, n.start)
        if rk.hooks.zero_nostore(n):
            self.write_dev(slots, np.zeros_like(data))   # the fault: the store never runs (pages hold zeros)
            return
        if rk.hooks.zero_race(n):
            # the fault: the store lands after the backup copy of these pages has completed
            self.write_dev(slots, np.zeros_like(data))
            self.pending_stores.append((sim.clock.tick + sim.d_w + 1, slots.copy(), data, rid, n.id))
            return
        self.write_dev(slots, data)
        rk.rec.store(rid, slots)

    def apply_due_stores(self) -> None:
        """Land the late stores due by now."""
        rk = self.rk
        keep = []
        for due, slots, data, rid, nid in self.pending_stores:
            if due > rk.sim.clock.tick:
                keep.append((due, slots, data, rid, nid))
                continue
            self.write_dev(slots, data)
            rk.rec.store(rid, slots)
            rk.hooks.expect_late_store(nid)
        self.pending_stores = keep
