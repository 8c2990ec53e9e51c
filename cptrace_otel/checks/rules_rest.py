"""The rules of copies at rest (REST): REST-hash (host copies), REST-l3 (L3 objects).

* REST-hash: an ``audit`` record (the opt-in audit thread's re-fingerprint of a node's host copy,
  :mod:`cptrace_otel.traced.sglang._audit`) carries the fingerprint of the node's host KV as it is in the host pool
  now; it equals the ``h`` of the ``backup`` that wrote that host copy (per page ``hp`` once a split cut the node).
  A difference is a host copy that changed while at rest (after its d2h copy): found before the reload that would
  bring it back (HASH) when the audit reaches the copy first, and even if no reload ever does.

Judged only when the audited copy is that backup's: the node's backup is acked (``ack dir=d2h``), no free or host
eviction of it came since, and the audit's host slots are the ones the node holds (its ``prepare`` or a split's
``host_p``/``host_c``; compared where both are known). Anything else is counted (``REST-skipped(...)``), never
judged: a copy still being written, one without a backup record in this trace (the trace began later), one whose
slots moved.

* REST-l3: an ``audit tier=l3`` record (the audit thread's read-back of the stored objects of one acked
  ``l3_backup``, :mod:`cptrace_otel.traced.sglang._audit_l3`) carries per page key the fingerprint of the object as
  storage holds it now; it is one of the fingerprints the key was written with (the rank's L3 key map, L3a's:
  :mod:`.rules_l3`). A page that is not is an object that changed in storage after its write: reported on the
  audit's node (the backup's), before, or without, a prefetch that would read it (L3a). Counted, never judged: an
  object gone from storage (evicted, removed: ``REST-skipped(l3 gone)``), one whose read failed (``REST-skipped(l3
  unreadable)``), a key this trace never saw written or that the key map forgot (``REST-skipped(l3 never
  written)``), a record without per-page keys and fingerprints (``REST-skipped(no hash)``).
"""

from __future__ import annotations

from typing import Any

from ..model.events import Event
from ..model.l3 import AUDIT_GONE, AUDIT_UNREADABLE
from .findings import Finding
from .lineage import Bounded
from .ranges import EXACT, Slots, slots_of
from .rank_base import RankRuleBase


class RestRules(RankRuleBase):
    _rest_reported: Bounded   # (node id, backup ref) already reported: one finding per corrupted copy, not per audit
    _l3_keys: Bounded         # L3a's key map: page key -> [(fingerprint, ref of the l3_backup), ...]

    def _rest_hash(self, ev: Event, f: dict, nid: int, ref: tuple) -> Finding | None:
        """REST-hash at an ``audit`` of node ``nid``."""
        node = self.st.nodes.get(nid)
        bk = node.bk if node is not None else None
        if node is None or bk is None:
            self._skip("REST-skipped(no backup)", "REST", nid, "an audited host copy with no backup record")
            return None
        bs = node.bk_state
        if bs is None or bs[0] != "acked" or node.host_freed is not None:
            self._skip("REST-skipped(not at rest)", "REST", nid,
                       "an audited host copy whose backup is not acked, or whose host slots were freed since")
            return None
        got = slots_of(f.get("host"), f.get("hostx"))
        if isinstance(node.host, Slots) and got is not None and got.summary() != node.host.summary():
            self._skip("REST-skipped(moved)", "REST", nid, "the audit read other host slots than the node's backup")
            return None
        h, hp = f.get("h"), f.get("hp")
        op: Any = bk.op
        if (nid, bk.ref) in self._rest_reported:
            return None
        if bk.whole and type(bk.h) is int and type(h) is int and h >= 0:
            if h != bk.h:
                self._rest_reported.put((nid, bk.ref), ref)
                return self._finding("REST", "REST-hash", nid, op, EXACT, [bk.ref, ref],
                                     f"node {nid}: host copy at rest h={h} but its backup wrote h={bk.h}", ev)
            return None
        if isinstance(bk.hp, list) and isinstance(hp, list) and len(bk.hp) == len(hp):
            if bk.hp != hp:
                k = next(i for i, (a, b) in enumerate(zip(bk.hp, hp, strict=True)) if a != b)
                self._rest_reported.put((nid, bk.ref), ref)
                return self._finding("REST", "REST-hash", nid, op, EXACT, [bk.ref, ref],
                                     f"node {nid}: page {k} of its host copy at rest differs from what its backup "
                                     "wrote", ev)
            return None
        self._skip("REST-skipped(no hash)", "REST", nid, "backup or audit carries no comparable h/hp")
        return None

    def _rest_l3(self, ev: Event, f: dict, nid: int, ref: tuple) -> Finding | None:
        """REST-l3 at an ``audit tier=l3`` of node ``nid``'s stored objects."""
        keys, hp = f.get("keys"), f.get("hp")
        if type(keys) is not list or type(hp) is not list or len(keys) != len(hp) or not keys:
            self._skip("REST-skipped(no hash)", "REST", nid, "backup or audit carries no comparable h/hp")
            return None
        bad: list[tuple[int, Any, list]] = []
        for i, (k, h) in enumerate(zip(keys, hp, strict=True)):
            if h == AUDIT_GONE:
                self._skip("REST-skipped(l3 gone)", "REST", nid, "an audited L3 object no longer in storage "
                           "(evicted or removed)")
                continue
            if type(h) is not int or h < 0:
                why = "reading it failed" if h == AUDIT_UNREADABLE else "no fingerprint"
                self._skip("REST-skipped(l3 unreadable)", "REST", nid, f"an audited L3 object whose {why}")
                continue
            written = self._l3_keys.get(k)
            if written is None:
                self._skip("REST-skipped(l3 never written)", "REST", nid, "an audited L3 object whose key this "
                           "trace never saw written (or no longer remembers)")
                continue
            if all(x[0] != h for x in written) and ("l3", k, h) not in self._rest_reported:
                self._rest_reported.put(("l3", k, h), ref)
                bad.append((i, k, written))
        if not bad:
            return None
        i, k, written = bad[0]
        more = f" (and {len(bad) - 1} more of {len(keys)} pages)" if len(bad) > 1 else ""
        return self._finding("REST", "REST-l3", nid, f.get("op"), EXACT, [written[-1][1], ref],
                             f"node {nid}: L3 object {k} (page {i}) at rest has a fingerprint its writes never had"
                             + more, ev)
