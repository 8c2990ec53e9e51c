"""One rank's ``ComposeCache``: the derived per-(node, layer) views the simulated attention reads (docs/domain.md §4,
H3).

A view records the device range and the node's generation it was built from; a node's views are invalidated
whenever its device bytes change (evict, reload, revive, split). Fault ``H3_noinval`` skips that at an eviction, so
a later read serves a view of an older generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import kv

if TYPE_CHECKING:
    from .rank import RankSim
    from .tree import Node


class ComposeCache:
    """``views[(node id, layer)] = (source range text, node generation)`` of rank ``rk``."""

    def __init__(self, rk: "RankSim") -> None:
        self.rk = rk
        self.views: dict[tuple[int, int], tuple[str, int]] = {}

    def invalidate(self, n: "Node", force: bool = False, why: str = "") -> None:
        """Drop ``n``'s views (``force``: even those fault H3_noinval keeps; ``why="evict"``: a device eviction)."""
        if n.noinval and not force:
            return
        if why == "evict" and self.rk.hooks.h3_noinval(n, self.views):
            return
        for layer in self.rk.layer_ids.tolist():
            self.views.pop((n.id, layer), None)

    def compose(self, n: "Node") -> None:
        """The attention reads ``n``'s views, one per layer: a hit, or a fill from the node's current slots."""
        rk = self.rk
        for layer in rk.layer_ids.tolist():
            key = (n.id, layer)
            ent = self.views.get(key)
            if ent is not None:
                src, gen = ent
                rk.hooks.expect_stale_view(n, gen)
                rk.rec.compose(n, layer, src, gen, 1)
            else:
                src = kv.rng(n.value)
                self.views[key] = (src, n.gen)
                rk.rec.compose(n, layer, src, n.gen, 0)
