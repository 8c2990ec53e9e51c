"""The Mamba rule (MAMBA): a hybrid tree's Mamba state survives its host round trips.

SGLang 0.5.23's hybrid full + Mamba trees keep one recurrent-state slot per node that ends a cached sequence (every
Mamba layer's conv and SSM state after the node's last token), device and host (``components/mamba.py``). A backup
copies the node's device slot into a new host slot; a load-back copies the host slot into a new device slot for the
node (and, copy-on-write, into the request's own slot). A split leaves the new parent with no state on either tier,
so it is never backed up nor loaded: no record, nothing compared. The slots on either side change, so the round trip
is compared by content, per host slot. The records (``mamba``, level 2; :mod:`cptrace_otel.traced.sglang._mamba23`):
``dir=d2h`` with the host slot a backup writes (``hostx``) and the fingerprint of the device state it copies
(``hp``, one per slot: ``page=1``), ``dir=h2d`` with the host slot a load read and the fingerprint of the node's
device state after the load.

* MAMBA-hash, at a ``mamba dir=h2d``: the loaded state's fingerprint equals the one the latest ``mamba dir=d2h``
  into that host slot recorded. A host slot no ``d2h`` of this trace wrote is counted (``MAMBA-skipped(no
  backup)``), never passed; a record whose slots and fingerprints do not line up is counted too
  (``MAMBA-skipped(no hash)``).

A stream without ``mamba`` records (a FULL-only or SWA tree) gives the rule nothing to check.
"""

from __future__ import annotations

from ..model.events import Event, int_field
from .findings import Finding
from .lineage import Bounded
from .ranges import EXACT
from .rank_base import RankRuleBase
from .rules_swa import host_round_trip

SLOTS_KEPT = 1 << 16   # Mamba host slots remembered (their latest backup's fingerprint and node)


class MambaRules(RankRuleBase):
    _mamba_slots: Bounded   # Mamba host slot -> (fingerprint, node, ref) of its latest backup (RankChecker)
    _mamba_seen: bool       # any mamba record: the rule applies to this stream

    def _mamba(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        """A ``mamba`` record: a backup's states remembered per host slot (``d2h``), a load's compared with them
        (``h2d``)."""
        self._mamba_seen = True
        bad = host_round_trip(self, "MAMBA", "mamba", "Mamba host slot", self._mamba_slots, f, nid, ref)
        if not bad:
            return None
        _, k, h, (hb, bnode, bref) = bad[0]
        return [self._finding("MAMBA", "MAMBA-hash", nid, int_field(f.get("op")), EXACT, [bref, ref],
                              f"node {nid}: Mamba state loaded from host slot {k} with fingerprint {h} but the backup "
                              f"of node {bnode} into that slot wrote {hb}", ev)]
