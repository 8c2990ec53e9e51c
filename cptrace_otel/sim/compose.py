"""One rank's ``ComposeCache``: the derived per-(node, layer) views the simulated attention reads (docs/domain.md §4,
H3).

A view records the device range and the node's generation it was built from; a node's views are invalidated
whenever its device bytes change (evict, reload, revive, split). Fault ``H3_noinval`` skips that at an eviction, so
a later read serves a view of an older generation.
"""

from __future__ import annotations

import numpy as np

from . import kv
from .emit import Recorder
from .faults import FaultHooks
from .node import Node


class ComposeCache:
    """``views[(node id, layer)] = (source range text, node generation)`` of one rank, whose layers are
    ``layer_ids``; ``hooks`` and ``rec``: the rank's fault sites and records."""

    def __init__(self, layer_ids: np.ndarray, hooks: FaultHooks, rec: Recorder) -> None:
        self.layer_ids = layer_ids
        self.hooks = hooks
        self.rec = rec
        self.views: dict[tuple[int, int], tuple[str, int]] = {}

    def invalidate(self, n: Node, force: bool = False, why: str = "") -> None:
        """Drop ``n``'s views (``force``: even those fault H3_noinval keeps; ``why="evict"``: a device eviction)."""
        if n.noinval and not force:
            return
        if why == "evict" and self.hooks.h3_noinval(n, self.views):
            return
        for layer in self.layer_ids.tolist():
            self.views.pop((n.id, layer), None)

    def compose(self, n: Node) -> None:
        """The attention reads ``n``'s views, one per layer: a hit, or a fill from the node's current slots."""
        for layer in self.layer_ids.tolist():
            key = (n.id, layer)
            ent = self.views.get(key)
            if ent is not None:
                src, gen = ent
                self.hooks.expect_stale_view(n, gen)
                self.rec.compose(n, layer, src, gen, 1)
            else:
                src = kv.rng(n.value)
                self.views[key] = (src, n.gen)
                self.rec.compose(n, layer, src, n.gen, 0)
