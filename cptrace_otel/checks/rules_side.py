"""The sidecar rules (SIDE): pools whose slots are the KV's (SGLang 0.5.23's DSA/NSA indexer, ``indexer``) are part
of a node's lifecycle, so they move and survive with its KV.

* SIDE-missing: on a stream whose ``config`` names sidecars (``sidecars=indexer``), every ``backup`` and ``reload``
  moves each of them in the same copy op as the KV (its ``sp`` names it). SGLang decides this in
  ``UnifiedRadixCache._build_sidecar_transfers`` (one ``PoolTransfer`` per ``sidecar_pool_specs`` entry, handed to
  ``HybridCacheController.write``/``load`` as ``extra_pools``); a copy without it leaves the host (backup) or the
  device (reload) copy of the sidecar stale while the KV is fine.
* SIDE-hash: a node's sidecar fingerprint after its host->device load (``ack dir=h2d`` ``sh_<pool>``, per page
  ``shp_<pool>`` across a split) equals the one of its latest backup, as HASH does for the KV.

A KV-only stream (no ``sidecars`` in its ``config``) gives these rules nothing to check; an undecidable instance is
counted (``SIDE-skipped(...)``), never passed.
"""

from __future__ import annotations

from typing import Any

from ..model import semconv as sc
from ..model.events import Event
from .findings import Finding
from .rank_base import RankRuleBase
from .ranges import EXACT
from .state import Backup, PendingLoad


def side_witness(f: dict, pools: tuple[str, ...]) -> dict[str, tuple[Any, Any]] | None:
    """``{pool: (h, hp)}`` of a record's sidecar fingerprints (``h`` None when absent or a sentinel)."""
    if not pools:
        return None
    out = {}
    for p in pools:
        h, hp = f.get(sc.side_field(sc.SIDE_H, p)), f.get(sc.side_field(sc.SIDE_HP, p))
        out[p] = (h if type(h) is int and h >= 0 else None, hp if isinstance(hp, list) else None)
    return out


class SideRules(RankRuleBase):
    sidecars: tuple[str, ...]

    def _side_missing(self, ev: Event, f: dict, nid: int, ref: tuple, what: str) -> Finding | None:
        """SIDE-missing at a ``backup`` or ``reload`` (``what``) of node ``nid`` whose ``sp`` lacks a sidecar the
        stream's ``config`` names."""
        moved = f.get(sc.SIDE_MOVED)
        if not isinstance(moved, str):
            self._skip("SIDE-skipped(no sp)", "SIDE", nid, f"a {what} record names no moved sidecar pools (sp)")
            return None
        got = set(moved.split("+"))
        lack = [p for p in self.sidecars if p not in got]
        if not lack:
            return None
        op = f.get("op")
        return self._finding("SIDE", "SIDE-missing", nid, op if type(op) is int else None, EXACT, [ref],
                             f"{what} of node {nid} moves its KV without its sidecar pool(s) {'+'.join(lack)} "
                             f"(sp={moved})", ev)

    def _side_hash(self, ev: Event, f: dict, nid: int, ref: tuple, ld: PendingLoad) -> list[Finding]:
        """SIDE-hash at an ``ack dir=h2d`` of node ``nid``: each sidecar's fingerprint against its latest backup."""
        bk: Backup | None = ld.snap.get(nid) if nid in ld.snap else getattr(self.st.nodes.get(nid), "bk", None)
        got = side_witness(f, self.sidecars) or {}
        want = bk.side if bk is not None else None
        out = []
        for p in self.sidecars:
            hr, hp_r = got.get(p, (None, None))
            hb, hp_b = want.get(p, (None, None)) if want else (None, None)
            if bk is None or want is None:
                self._skip("SIDE-skipped(no backup)", "SIDE", nid, "no backup with sidecar fingerprints")
                continue
            if bk.whole and hb is not None and hr is not None:
                if hb != hr:
                    out.append(self._finding("SIDE", "SIDE-hash", nid, ld.op, EXACT, [bk.ref, ld.ref, ref],
                                             f"node {nid}: sidecar {p} backup h={hb} but after load h={hr}", ev))
            elif hp_b is not None and hp_r is not None:
                if hp_b != hp_r:
                    k = next((i for i, (a, b) in enumerate(zip(hp_b, hp_r)) if a != b), min(len(hp_b), len(hp_r)))
                    out.append(self._finding("SIDE", "SIDE-hash", nid, ld.op, EXACT, [bk.ref, ld.ref, ref],
                                             f"node {nid}: sidecar {p} page {k} differs between backup and load",
                                             ev))
            else:
                self._skip("SIDE-skipped(no hash)", "SIDE", nid, f"backup or load carries no {p} fingerprint")
        return out
