"""H1, split misattribution (docs/domain.md §4): after a split the prefix tokens live under a new id and the old id
keeps only
the suffix; bookkeeping still keyed by the old id acts on the wrong range.

* H1a (level 1), at the ``split``: the halves partition the node's latest dev/host slots.
* H1b (level 2), at the ``ack dir=d2h``: a write enqueued before a split publishes every lineage fragment.
* H1c is checked by H2a through the lineage (:mod:`.rules_h2`).
"""

from __future__ import annotations

from ..model.events import Event, int_field
from .findings import Finding
from .lineage import Bounded, Node, PendingWrite
from .ranges import EXACT, Slots, is_none_range
from .rank_base import RankRuleBase


class H1Split(RankRuleBase):
    _swa_ops: Bounded   # the backup ops whose SWA transfer named other nodes (rules_swa)

    def _h1a(self, ev: Event, ref: tuple, pre: Node, c: int, p: int, L: int, s: int, dp: Slots | None,
             dc: Slots | None, hp: Slots | None, hc: Slots | None, hp_raw: object, hc_raw: object) -> Finding | None:
        """H1a for ``split(node=c, new=p, pre_len=L, split_len=s)`` against ``pre``, node c before the split: counts
        s + (L-s), the prefix starts where c's slots started, the suffix ends where they ended (c's latest dev: its
        insert, reload or split; a node evicted from the device splits into fragments without dev slots); a
        backuped node splits into two backuped halves, a node that is not backuped into two without host slots."""
        bad: list[str] = []
        if pre.dev is None:   # evicted: SGLang's split gives both fragments no device slots
            if (dp is not None and dp.cnt > 0) or (dc is not None and dc.cnt > 0):
                bad.append("a node evicted from the device split into fragments with dev slots")
        elif dp is not None and dc is not None:
            if dp.cnt != s or dc.cnt != L - s:
                bad.append(f"dev counts {dp.cnt}+{dc.cnt}, expected {s}+{L - s}")
            elif isinstance(pre.dev, Slots) and pre.dev.cnt == L and L > 0:
                if s > 0 and dp.first != pre.dev.first:
                    bad.append(f"dev_p.first={dp.first} but the node's dev started at {pre.dev.first}")
                if L - s > 0 and dc.last != pre.dev.last:
                    bad.append(f"dev_c.last={dc.last} but the node's dev ended at {pre.dev.last}")
        if isinstance(pre.host, Slots) and pre.host_freed is None:
            if hp is None or hc is None:
                if is_none_range(hp_raw) or is_none_range(hc_raw):
                    bad.append("a backuped node split into a fragment without host slots")
            elif hp.cnt != s or hc.cnt != L - s:
                bad.append(f"host counts {hp.cnt}+{hc.cnt}, expected {s}+{L - s}")
            elif pre.host.cnt == L and L > 0:
                if s > 0 and hp.first != pre.host.first:
                    bad.append(f"host_p.first={hp.first} but the node's host started at {pre.host.first}")
                if L - s > 0 and hc.last != pre.host.last:
                    bad.append(f"host_c.last={hc.last} but the node's host ended at {pre.host.last}")
        elif pre.host is None and ((hp is not None and hp.cnt > 0) or (hc is not None and hc.cnt > 0)):
            bad.append("a node that is not backuped split into fragments with host slots")
        if not bad:
            return None
        return self._finding("H1", "H1a", c, int_field(ev.fields.get("pend")), EXACT, [ref],
                             f"split of node {c} into {p}+{c} (split_len={s}): " + "; ".join(bad), ev)

    def _h1b(self, ev: Event, ref: tuple, w: PendingWrite, op: int | None, wop: int | None) -> Finding | None:
        """H1b at the d2h ack (for op ``op``) of write ``w``, split since its prepare: ``blen`` is the enqueued length
        L and ``pub`` lists the lineage fragments covering L once each (without ``pub``: ``clen`` not short)."""
        f = ev.fields
        bad: list[str] = []
        L = w.L
        blen = int_field(f.get("blen"))
        if blen is not None and blen != L:
            bad.append(f"blen={blen} but the prepare enqueued {L} tokens")
        pub = f.get("pub")
        flen = {fr[0]: fr[1] for fr in w.frags}
        if isinstance(pub, list):
            ids = [x for x in pub if type(x) is int]
            total = sum(flen.get(x, 0) for x in ids)
            # a hybrid SWA backup also publishes the nodes its SWA transfer covered (SGLang's
            # _backup_publish_node_ids), or their split fragments: not strays of the write's lineage
            comp = any(o in self._swa_ops for o in w.ops)
            stray = [] if comp else [x for x in ids if x not in flen]
            if total != L or stray or len(set(ids)) != len(ids):
                bad.append(f"pub={pub} covers {total} of {L} tokens; the lineage fragments are "
                           f"{[fr[0] for fr in w.frags]}")
        else:
            clen = int_field(f.get("clen"))
            if clen is not None and clen < (blen if blen is not None else L):
                bad.append(f"clen={clen} < {blen if blen is not None else L} and no pub= fragments")
        if not bad:
            return None
        return self._finding("H1", "H1b", w.origin, wop, EXACT, [w.p_ref, *w.splits, ref],
                             f"d2h ack of op {op} after a split of node {w.origin}: " + "; ".join(bad), ev)
