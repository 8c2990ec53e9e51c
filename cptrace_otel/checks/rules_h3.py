"""H3, stale compose cache (docs/domain.md §4, level 2): a derived view is served (``compose hit=1``) after the device
content or slots of a node it derives from changed since its fill (``compose hit=0``).

The fill keeps the device generation of each node of its chain (``Node.gen``, bumped by the handlers at insert
revive, split, dev eviction, reload and h2d ack); a hit fails when there is no fill, a generation moved, or a
``free pool=dev`` hit the fill's source slots (:meth:`H3Compose._h3_free`; a hit is counted as undecidable, not
reported, when that free overlaps the source as an interval of ``rng`` summaries only).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ..model.events import Event
from .findings import Finding
from .lineage import UNKNOWN, Fill, Node
from .ranges import EXACT, Slots, overlap, slots_of
from .rank_base import RankRuleBase


class H3Compose(RankRuleBase):
    def _h3_fill(self, ev: Event, ref: tuple, key: Hashable, chain: list[int]) -> None:
        """A fill (``hit=0``) of ``key``: remember the generation of every chain node."""
        st = self.st
        nodes = st.nodes
        src = slots_of(ev.fields.get("src"))
        one = len(chain) == 1
        gens = {}
        fbn = st.fills_by_node
        for c in chain:   # (one pass: each node's placeholder, generation and index entry concern that node alone)
            n = nodes.get(c)
            if n is None and c not in st.dead:   # first sight of a node (trace began mid-run)
                n = nodes[c] = Node(c, src.cnt if src is not None and one else 0,
                                    src if src is not None and one else UNKNOWN, UNKNOWN, ref)
            gens[c] = n.gen if n is not None else None
            keys = fbn.get(c)
            if keys is None:
                fbn[c] = {key}
            else:
                keys.add(key)
        st.fills[key] = Fill(ref, src, gens)

    def _h3(self, ev: Event, ref: tuple, key: Hashable, nid: int, chain: list[int]) -> list[Finding] | None:
        """H3 at a hit (``hit=1``) of ``key``; a fill is reported once."""
        st = self.st
        fl = st.fills.get(key)
        if fl is None:
            return [self._finding("H3", "H3", nid, None, EXACT, [ref],
                                  f"compose hit for key {key} with no fill since the node's last change", ev)]
        if fl.reported:
            return None
        for c in chain:
            n = st.nodes.get(c)
            g = fl.gens.get(c)
            if n is None or g is None or n.gen != g:
                why = n.gen_ref if n is not None else None
                fl.reported = True
                what = f"{why[1]} at seq {why[0][0]}" if why else "the node is gone"
                return [self._finding("H3", "H3", nid, None, EXACT, [fl.ref, why[0] if why else None, ref],
                                      f"compose hit for key {key} served a view filled before node {c} changed "
                                      f"({what})", ev)]
        if fl.invalid is not None:
            vref, cert = fl.invalid
            fl.reported = True
            if cert != EXACT:   # the free's summary and the fill's source overlap as intervals only
                self._undecidable("H3", "H3", nid, "a free pool=dev and the view's source")
                return None
            return [self._finding("H3", "H3", nid, None, cert, [fl.ref, vref, ref],
                                  f"compose hit for key {key} after its source slots were freed", ev)]
        return None

    def _h3_free(self, s: Slots, nid: int | None, ref: tuple) -> None:
        """A ``free pool=dev`` of ``s`` (owned by ``nid`` when known) invalidates the fills whose source it hit."""
        st = self.st
        fills = st.fills
        if nid is not None and nid >= 0:   # the fills that read this node's slots
            keys = st.fills_by_node.get(nid)
            if not keys:
                return
            cand: Any = [fills.get(k) for k in keys]   # (overlap() changes no index: the same fills, in order)
        else:
            cand = fills.values()
        for fl in cand:
            if fl is not None and (fl.invalid is None or fl.invalid[1] != EXACT):
                c = overlap(s, fl.src)
                if c is not None:
                    fl.invalid = (ref, c)   # an interval one: undecidable at the hit, unless a proven one follows
