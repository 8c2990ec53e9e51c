"""The sliding-window rule (SWA): a hybrid tree's SWA KV survives its host round trips.

SGLang 0.5.23's hybrid full + sliding-window trees keep each node's SWA layers' KV in their own pools, device and
host (``components/swa.py``). A backup copies the device-only SWA values of the node and of its ancestors within one
window into SWA host slots; a load-back copies the host-only SWA values of the loaded node's last window back into
new device slots. A node's SWA value may be dropped (a tombstone) without any copy, and a load brings back only the
window, so the round trip is per host slot, not per node. The records (``swa``, level 2;
:mod:`cptrace_otel.traced.sglang._swa23`): ``dir=d2h`` with the SWA host slots a backup writes (``hostx``) and the
per-page fingerprints of the device rows it copies (``hp``, one per ``page`` tokens), ``dir=h2d`` with the host
slots a load read and the per-page fingerprints of the device rows after the load.

* SWA-hash, at a ``swa dir=h2d``: each loaded page's fingerprint equals the one the latest ``swa dir=d2h`` into
  that page's host slots recorded. A host page no ``d2h`` of this trace wrote is counted
  (``SWA-skipped(no backup)``), never passed; a record whose slots and fingerprints do not line up is counted too
  (``SWA-skipped(no hash)``). Tokens the window dropped are never loaded, so never compared: no finding for them.

A stream without ``swa`` records (a FULL-only tree) gives the rule nothing to check.
"""

from __future__ import annotations

from ..model.events import Event, int_field
from .findings import Finding
from .lineage import Bounded
from .ranges import EXACT, parse_runs
from .rank_base import RankRuleBase

PAGES_KEPT = 1 << 16   # SWA host pages remembered (their latest backup's fingerprint)


def page_keys(f: dict) -> list[tuple[int, int]] | None:
    """``(first host slot of the page, fingerprint)`` per page of a ``swa`` record: ``hp`` has one fingerprint per
    ``page`` tokens of the token-ordered slots ``hostx``; None when they do not line up (or one is missing)."""
    runs, hp, per = parse_runs(f.get("hostx")), f.get("hp"), f.get("page")
    if runs is None or not isinstance(hp, list) or type(per) is not int or per < 1:
        return None
    slots = [x for a, b in runs for x in range(a, b + 1)]
    if len(hp) != -(-len(slots) // per):
        return None
    out = []
    for i, h in enumerate(hp):
        if type(h) is not int or h < 0:
            return None
        out.append((slots[i * per], h))
    return out


def host_round_trip(rule: RankRuleBase, code: str, tag: str, unit: str, book: Bounded, f: dict, nid: int,
                    ref: tuple) -> list[tuple[int, int, int, tuple]] | None:
    """A round trip compared per host slot (an SWA page, a Mamba state) for rule ``code``: a ``d2h`` record's
    ``(first host slot, fingerprint)`` pairs (:func:`page_keys`) remembered in ``book`` with its node and ``ref``, an
    ``h2d`` record's compared with them. Returns the mismatches ``(index, slot, fingerprint, (backup fingerprint,
    backup node, backup ref))`` (None for a ``d2h``); slots never backed up and records that do not line up are
    counted as skipped (``<code>-skipped(no backup)``, ``<code>-skipped(no hash)``), never passed."""
    pages = page_keys(f)
    if pages is None:
        rule._skip(f"{code}-skipped(no hash)", code, nid, f"a {tag} record whose hostx and hp do not line up")
        return None
    if f.get("dir") == "d2h":
        for k, h in pages:
            book.pop(k, None)   # (a rewritten slot is the newest: the last one forgotten)
            book.put(k, (h, nid, ref))
        return None
    bad = []
    for i, (k, h) in enumerate(pages):
        want = book.get(k)
        if want is None:
            rule._skip(f"{code}-skipped(no backup)", code, nid, f"a loaded {unit} this trace never saw backed up")
        elif want[0] != h:
            bad.append((i, k, h, want))
    return bad


class SwaRules(RankRuleBase):
    _swa_pages: Bounded   # first SWA host slot of a page -> (fingerprint, node, ref) of its latest backup
    _swa_seen: bool       # any swa record: the rule applies to this stream
    _swa_ops: Bounded     # the backup ops whose SWA transfer named other nodes (H1b: its ack's pub names them)

    def _swa(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        """A ``swa`` record: a backup's pages remembered (``d2h``), a load's compared with them (``h2d``)."""
        self._swa_seen = True
        op, nodes = int_field(f.get("op")), f.get("nodes")
        if f.get("dir") == "d2h" and op is not None and isinstance(nodes, list) and set(nodes) - {nid}:
            self._swa_ops.put(op, True)
        bad = host_round_trip(self, "SWA", "swa", "SWA host page", self._swa_pages, f, nid, ref)
        if not bad:
            return None
        i, k, h, (hb, _, bref) = bad[0]
        return [self._finding("SWA", "SWA-hash", nid, int_field(f.get("op")), EXACT, [bref, ref],
                              f"node {nid}: SWA page {i} (host slot {k}) loaded with fingerprint {h} but its backup "
                              f"wrote {hb} ({len(bad)} of {len(page_keys(f) or ())} SWA pages differ; nodes "
                              f"{f.get('nodes')})", ev)]
