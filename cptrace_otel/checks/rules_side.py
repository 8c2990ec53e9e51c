"""The sidecar rules (SIDE): pools whose slots are the KV's (SGLang 0.5.23's DSA/NSA indexer, ``indexer``) are part
of a node's lifecycle, so they move and survive with its KV.

* SIDE-missing: on a stream whose ``config`` names sidecars (``sidecars=indexer``), every ``backup`` and ``reload``
  moves each of them in the same copy op as the KV (its ``sp`` names it). SGLang decides this in
  ``UnifiedRadixCache._build_sidecar_transfers`` (one ``PoolTransfer`` per ``sidecar_pool_specs`` entry, handed to
  ``HybridCacheController.write``/``load`` as ``extra_pools``); a copy without it leaves the host (backup) or the
  device (reload) copy of the sidecar stale while the KV is fine.
* SIDE-hash: a node's sidecar fingerprint after its host->device load (``ack dir=h2d`` ``sh_<pool>``, per page
  ``shp_<pool>`` across a split) equals the one of its latest backup, as HASH does for the KV.
* SIDE-l3: the sidecar pages survive the L3 round trip with the KV's: per page key, the ``shp_<pool>`` fingerprint
  an ``l3_ack dir=prefetch`` brought back is one an ``l3_backup`` wrote under that key (as L3a does for the KV
  pages; SGLang stores them as their own objects, ``<key>.<pool>`` in the ``file`` backend,
  ``HiCacheFile._log_key``).

A KV-only stream (no ``sidecars`` in its ``config``) gives these rules nothing to check; an undecidable instance is
counted (``SIDE-skipped(...)``), never passed.
"""

from __future__ import annotations

from typing import Any

from ..model import semconv as sc
from ..model.events import Event
from .findings import Finding
from .lineage import Backup, Bounded, PendingLoad
from .ranges import EXACT
from .rank_base import RankRuleBase
from .rules_l3 import FPS_PER_KEY


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
    _side_l3_keys: Bounded   # "<page key>.<pool>" -> its backup fingerprints [(fp, ref), ...] (set by RankChecker)

    def _side_l3_pages(self, f: dict) -> list[tuple[str, int]]:
        """``(<key>.<pool>, fingerprint)`` per sidecar page of an L3 record (sentinels left out)."""
        keys = f.get("keys")
        if type(keys) is not list:
            return []
        out: list[tuple[str, int]] = []
        for p in self.sidecars:
            hp = f.get(sc.side_field(sc.SIDE_HP, p))
            if type(hp) is list and len(hp) == len(keys):
                out.extend((f"{k}.{p}", h) for k, h in zip(keys, hp, strict=False) if type(h) is int and h >= 0)
        return out

    def _side_l3_backup(self, f: dict, ref: tuple) -> None:
        """An ``l3_backup`` (``io=1``): its sidecar pages' fingerprints, per key."""
        if f.get("io", 1) == 0:
            return
        km = self._side_l3_keys
        for k, fp in self._side_l3_pages(f):
            lst = km.get(k)
            if lst is None:
                km.put(k, [(fp, ref)])
            elif all(x[0] != fp for x in lst):
                if len(lst) >= FPS_PER_KEY:
                    del lst[0]
                lst.append((fp, ref))

    def _side_l3(self, ev: Event, f: dict, nid: object, ref: tuple) -> Finding | None:
        """SIDE-l3 at an ``l3_ack dir=prefetch``: each fetched sidecar page is one its key was written with."""
        pairs = self._side_l3_pages(f)
        if not pairs:
            if self.sidecars and type(f.get("keys")) is list and f["keys"]:
                self._skip("SIDE-skipped(no l3 fingerprint)", "SIDE", nid if type(nid) is int else None,
                           "an L3 prefetch without sidecar page fingerprints")
            return None
        km = self._side_l3_keys
        bad = []
        for k, fp in pairs:
            lst = km.get(k)
            if lst is None:
                self._skip("SIDE-skipped(no l3 backup)", "SIDE", nid if type(nid) is int else None,
                           "a fetched sidecar page this trace never saw written")
            elif all(x[0] != fp for x in lst):
                bad.append((k, fp, lst))
        if not bad:
            return None
        k, fp, lst = bad[0]
        op = f.get("op")
        return self._finding("SIDE", "SIDE-l3", nid if type(nid) is int else None, op if type(op) is int else None,
                             EXACT, [lst[-1][1], ref],
                             f"L3 prefetch: sidecar page {k} came back with fingerprint {fp} but was written with "
                             f"{', '.join(str(x[0]) for x in lst)} ({len(bad)} of {len(pairs)} sidecar pages)", ev)

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
                    k = next((i for i, (a, b) in enumerate(zip(hp_b, hp_r, strict=False)) if a != b),
                             min(len(hp_b), len(hp_r)))
                    out.append(self._finding("SIDE", "SIDE-hash", nid, ld.op, EXACT, [bk.ref, ld.ref, ref],
                                             f"node {nid}: sidecar {p} page {k} differs between backup and load",
                                             ev))
            else:
                self._skip("SIDE-skipped(no hash)", "SIDE", nid, f"backup or load carries no {p} fingerprint")
        return out
