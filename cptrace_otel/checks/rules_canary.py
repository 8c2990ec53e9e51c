"""CANARY: SGLang's kv-canary violations (``kv_canary`` records, :mod:`cptrace_otel.model.canary`) as findings on the
node that held the slot.

SGLang's canary checks a hash chain per KV slot on the GPU and reports a broken one with the slot's pool index
(``slot_idx``); it does not know which radix-tree node the slot belonged to. The trace does: every ``insert``,
``reload`` and ``split`` records the device slots a node holds from then on (the lineage state of :mod:`.lineage`),
``evict tier=dev`` takes them away. So at the ``kv_canary`` record the owner of ``slot_idx`` is the node whose
current device slots contain it:

* exact sets (``devx``, or a dense summary whose count equals its span) decide membership; when several nodes'
  recorded slots contain the slot (a slot freed without a record at level 1, then given to another node), the node
  that got its slots last holds it;
* a range summary that only brackets the slot (``min <= slot <= max``, not dense) cannot decide: the finding is
  then reported for the run, not a node, and says which nodes possibly hold it (``CANARY-owner(undecidable)`` is
  counted as a skip);
* no node holding the slot (a running request's slots are not in the tree yet, or the trace began later), or a
  sliding-window launch (``*_SWA``: another pool's index space): reported for the run, saying why.

Every violation is a finding (an ERROR: SGLang saw the chain break, whatever the attribution), except one on a slot
whose holder's device slots were filled by a HiCache load-back (its ``reload``/``ack h2d``, or a split of such a
node): SGLang 0.5.23's canary keeps its stamps in buffers of its own, one entry per device slot, that nothing in
HiCache copies, so a load-back leaves each filled slot with the stamp of the slot's previous use and every such
slot fails its next verify whatever its KV (measured on SGLang's own canary code:
``tests/sglang_real/test_canary_real.py``). Such a violation says nothing about the KV; it is counted as
``CANARY-skipped(reloaded)`` (the reloaded KV is judged by HASH and H2 from the fingerprints instead).
"""

from __future__ import annotations

from ..model.canary import full_pool
from ..model.events import Event
from .findings import Finding
from .lineage import UNKNOWN, Node
from .ranges import EXACT, INTERVAL, Slots, overlap
from .rank_base import RankRuleBase


def _describe(f: dict) -> str:
    tag, why = f.get("launch_tag"), f.get("fail_reason")
    return (f"kv-canary violation launch_tag={tag} fail_reason={why} slot_idx={f.get('slot_idx')} "
            f"position={f.get('position')}")

class CanaryOwner(RankRuleBase):
    """The ``kv_canary`` handler of :class:`~.rank_checker.RankChecker` (rule ``CANARY``)."""

    def dev_owner(self, slot: int) -> tuple[Node | None, list[int], int]:
        """Who holds device slot ``slot`` now: ``(owner, possible, unknown)``; ``owner`` the node whose recorded slots
        surely contain it (the latest assigned when several do), else None; ``possible`` the nodes whose summaries
        only bracket it; ``unknown`` how many nodes hold device slots the trace does not let us reconstruct."""
        pt = Slots(1, slot, slot, slot, slot, ((slot, slot),), True)
        owner: Node | None = None
        possible: list[int] = []
        unknown = 0
        for n in self.st.nodes.values():
            d = n.dev
            if type(d) is Slots:
                if d.lo <= slot <= d.hi:
                    c = overlap(pt, d)
                    if c == EXACT:
                        if owner is None or n.gen_ref[0] > owner.gen_ref[0]:
                            owner = n
                    elif c == INTERVAL:
                        possible.append(n.id)
            elif d == UNKNOWN:
                unknown += 1
        return owner, possible, unknown

    def _canary(self, ev: Event, f: dict, nid: object, ref: tuple) -> list[Finding] | None:
        slot = f.get("slot_idx")
        what = _describe(f)
        if type(slot) is not int:
            return None   # (the readers only build kv_canary records with an int slot_idx)
        if not full_pool(f.get("launch_tag")):
            return [self._finding("CANARY", "CANARY", None, None, EXACT, [ref],
                                  f"{what}: a sliding-window (or unknown) pool's slot, outside the device index space "
                                  "the trace records: no node can be named", ev)]
        owner, possible, unknown = self.dev_owner(slot)
        if owner is not None and owner.dev_loaded:
            self._skip("CANARY-skipped(reloaded)", "CANARY", owner.id,
                       "a violation on a slot a HiCache load-back filled: SGLang's canary stamps do not follow the "
                       "load-back (its per-slot buffers are not copied), so the slot fails whatever its KV; the "
                       "reloaded KV is judged by HASH")
            return None
        if owner is not None:
            gref, why = owner.gen_ref
            return [self._finding("CANARY", "CANARY", owner.id, None, EXACT, [gref, ref],
                                  f"{what}: the slot is one of node {owner.id}'s device slots (since seq {gref[0]}, "
                                  f"{why})", ev)]
        if possible:
            self._skip("CANARY-owner(undecidable)", "CANARY", possible[0],
                       "range summaries bracket the slot but do not decide whether it is in them (no exact set)")
            shown = ", ".join(map(str, possible[:8])) + (", ..." if len(possible) > 8 else "")
            return [self._finding("CANARY", "CANARY", None, None, EXACT, [ref],
                                  f"{what}: owner undecidable: the range summaries of node(s) {shown} bracket the slot "
                                  "but do not decide it (no exact set)", ev)]
        tail = f" ({unknown} node(s) hold device slots the trace does not reconstruct)" if unknown else ""
        return [self._finding("CANARY", "CANARY", None, None, EXACT, [ref],
                              f"{what}: no node of the trace holds the slot (a running request's slots before it "
                              f"enters the tree, or slots recorded before the trace began){tail}", ev)]
