"""The content flags (docs/domain.md §4): ZERO and HASH, level 1 when the records carry ``nz``/``h``.

* ZERO: a ``backup`` (ZERO@backup), a ``reload sync=1`` (once per load) or an ``ack dir=h2d`` (once per chain
  node: ZERO@reload) of a
  non-empty node with ``nz=0``; ``nz < 0`` means skip.
* HASH: the node's reload hash (``reload sync=1`` for a one-node chain, per page ``hp`` for a longer one, else the
  ``ack dir=h2d``) against its latest backup's (the witness each chain node had when the load was issued). Across a
  split only per-page ``hp`` slices compare; in mode ``shared`` the backup side is ``hs[rank]`` (else C5 compares
  it). Undecidable instances are counted as ``HASH-skipped(...)`` entries, never passed.
"""

from __future__ import annotations

from ..model.events import Event
from .findings import Finding
from .lineage import Backup, PendingLoad, PendingWrite
from .ranges import EXACT, Slots
from .rank_base import RankRuleBase

_ABSENT = Backup(None, None, None, (), None, False, 0)   # (a node not in a load's snap: its witness is not None)


class ZeroFlag(RankRuleBase):
    def _zero_backup(self, ev: Event, ref: tuple, nid: int, op: int | None, nz: int, d: Slots | None,
                     w: PendingWrite | None) -> Finding | None:
        """ZERO@backup: ``nz=0`` on a backup of ``d`` (else the write's) slots; named by the write's prepare op (a
        merged op carries a new id), as the ack-time rules name it."""
        if nz != 0:
            return None
        cnt = d.cnt if d is not None else (w.dev.cnt if w is not None and isinstance(w.dev, Slots) else 0)
        if cnt <= 0:
            return None
        return self._finding("ZERO", "ZERO@backup", nid, w.op() if w is not None else op, EXACT, [ref],
                             f"backup of node {nid} ({cnt} slots) read all-zero KV (nz=0)", ev)

    def _zero_reload(self, ev: Event, ref: tuple, nid: int, ld: PendingLoad, nz: int,
                     at_ack: bool) -> Finding | None:
        """ZERO@reload: ``nz=0`` after load ``ld`` of node ``nid``, at its ``reload sync=1`` (the whole chain, once)
        or (``at_ack``) at a chain node's ``ack dir=h2d`` (once per chain node: each ack record is its node's)."""
        if nz != 0 or ld.zeroed_all or (at_ack and nid in ld.zeroed):
            return None
        n = self.st.nodes.get(nid) if at_ack else None
        cnt = n.len if n is not None else (ld.dev.cnt if isinstance(ld.dev, Slots) else 0)
        if cnt <= 0:
            return None
        if at_ack:
            ld.zeroed.add(nid)
            return self._finding("ZERO", "ZERO@reload", nid, ld.op, EXACT, [ld.ref, ref],
                                 f"node {nid} holds all-zero KV after its host->device load (nz=0)", ev)
        ld.zeroed_all = True
        return self._finding("ZERO", "ZERO@reload", nid, ld.op, EXACT, [ref],
                             f"reload of node {nid}: all-zero KV after the load (nz=0)", ev)


class HashCompare(RankRuleBase):
    def _hash_reload(self, ev: Event, ref: tuple, nid: int, ld: PendingLoad, hr: object, hp_r: object,
                     out: list[Finding]) -> None:
        """HASH at a ``reload sync=1`` carrying ``h``/``hp`` over the whole chain (appended to ``out``)."""
        chain = ld.chain
        if len(chain) == 1:
            fnd = self._hash_cmp(nid, ld.op, ld.snap.get(nid), hr, hp_r, [ref], ev)
            ld.hashed.add(nid)
            if fnd is not None:
                out.append(fnd)
            return
        bks = [ld.snap.get(c) for c in chain]
        if isinstance(hp_r, list) and all(b is not None and isinstance(b.hp, list) for b in bks):
            exp_hp = [x for b in bks for x in b.hp]  # type: ignore[union-attr]
            if exp_hp != hp_r:
                out.append(self._finding("HASH", "HASH", nid, ld.op, EXACT,
                                         [*(b.ref for b in bks), ref],  # type: ignore[union-attr]
                                         f"reload of chain {chain}: per-page hashes differ from the backups", ev))
            ld.hashed.update(chain)
        else:
            self._skip("HASH-skipped(chain)", "HASH", nid,
                       "a multi-node reload hash without per-page hp is not comparable")

    def _hash_ack(self, ev: Event, ref: tuple, nid: int, ld: PendingLoad, hr: object, hp_r: object) -> Finding | None:
        """HASH at an ``ack dir=h2d`` of node ``nid`` (of load ``ld``) not hashed yet."""
        bk = ld.snap.get(nid, _ABSENT)
        if bk is _ABSENT:
            n = self.st.nodes.get(nid)
            bk = n.bk if n is not None else None
        ld.hashed.add(nid)
        return self._hash_cmp(nid, ld.op, bk, hr, hp_r, [ld.ref, ref], ev)

    def _hash_cmp(self, nid: int, op: int | None, bk: Backup | None, hr: object, hp_r: object, refs: list,
                  ev: Event) -> Finding | None:
        """HASH: the node's reload hash against its latest backup hash (per page across a split)."""
        if bk is None:
            self._skip("HASH-skipped(no backup)", "HASH", nid, "no backup record for the reloaded node")
            return None
        if bk.whole:
            hb = bk.h
            if self.mode == "shared":
                hs = bk.hs
                hb = hs[self.rank] if isinstance(hs, list) and 0 <= self.rank < len(hs) else None
                if hb is None:
                    return None   # compared across ranks against the IO rank's hs[r] (C5)
            if type(hb) is not int or type(hr) is not int:
                self._skip("HASH-skipped(no hash)", "HASH", nid, "backup or reload carries no h")
                return None
            if hb < 0 or hr < 0:
                self._skip("HASH-skipped(sentinel)", "HASH", nid, "h=-1/-2: the hash was skipped")
                return None
            if hb != hr:
                return self._finding("HASH", "HASH", nid, op, EXACT, [bk.ref, *refs],
                                     f"node {nid}: backup h={hb} but reload h={hr}", ev)
            return None
        if isinstance(bk.hp, list) and isinstance(hp_r, list):
            if bk.hp != hp_r:
                k = next((i for i, (a, b) in enumerate(zip(bk.hp, hp_r, strict=False)) if a != b),
                         min(len(bk.hp), len(hp_r)))
                return self._finding("HASH", "HASH", nid, op, EXACT, [bk.ref, *refs],
                                     f"node {nid} (split since backup): page {k} hash differs between backup "
                                     "and reload", ev)
            return None
        self._skip("HASH-skipped(split)", "HASH", nid, "split between backup and reload and no per-page hp")
        return None

    def _count_unhashed(self, ld: PendingLoad) -> None:
        """A load that is over (its acks are all in, the stream or epoch ended, or it was forgotten): each chain node
        without a reload hash is listed (HASH-skipped), never passed: SGLang's load ack names the op's last node
        only, so a missing per-node ack record must show."""
        for nid in ld.chain:
            if nid in ld.hashed:
                continue
            bk = ld.snap.get(nid)
            if bk is None:
                self._skip("HASH-skipped(no backup)", "HASH", nid, "no backup record for the reloaded node")
            elif bk.h is not None or isinstance(bk.hp, list):
                self._skip("HASH-skipped(no reload hash)", "HASH", nid,
                           "a reloaded chain node got no h2d ack hash (and no reload sync=1 h)")
            else:
                self._skip("HASH-skipped(no hash)", "HASH", nid, "backup or reload carries no h")
