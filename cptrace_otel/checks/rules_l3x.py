"""L3c and L3d: the L3 writers of a context-parallel group (records ``l3_backup``, :mod:`cptrace_otel.model.l3`; code
``L3``), mixed into :class:`~.crossrank.CrossRank`.

In the CP modes where each rank holds a shard of its own (``sharded``, ``dcp``, ``layersplit``: domain 5), a node's
KV in storage is complete only when every rank wrote its shard, and each shard must live under keys of its own:

* **L3c, every shard is written**: when some rank backs a node up to L3 (``l3_backup io=1``), every rank of the
  group does (SGLang #37149: with CP only one rank wrote its shard);
* **L3d, keys differ across ranks**: no page key appears in two ranks' ``l3_backup`` of the node (DingoCache #355:
  every rank wrote the same keys, so the last writer's shard replaced the others').

Modes ``replicated`` (equal copies: one writer per replica group is enough, equal keys are fine), ``shared`` (the
IO rank writes for all) and ``none`` are not judged. A join is keyed by (epoch, node, occurrence of ``l3_backup`` for
that node on that rank), decided once every rank of the group reported or at the end of the stream, and, as C3-C5,
judges only records at or before the epoch's first C1 divergence (node ids line up across ranks only up to it).
"""

from __future__ import annotations

from typing import Any

from ..model.events import Event, int_field
from .cross_base import CrossRuleBase

SHARD_MODES = frozenset(("sharded", "dcp", "layersplit"))


class L3Cross(CrossRuleBase):
    _l3_joins: dict[tuple, dict[int, dict]]
    _l3_occ: dict[tuple, int]
    _l3_seen: bool

    def _l3_join(self, ev: Event) -> None:
        """An ``l3_backup``: its rank's facts enter the node's L3 join."""
        f = ev.fields
        nid = int_field(f.get("node_id"))
        if nid is None:
            return
        self._l3_seen = True
        r, epoch = ev.rank, ev.epoch
        k = (r, epoch, nid)
        occ = self._l3_occ.get(k, 0)
        self._l3_occ[k] = occ + 1
        keys = f.get("keys")
        facts = {"seq": ev.seq, "line": ev.line_no, "src": ev.src, "op": int_field(f.get("op")),
                 "io": f.get("io", 1), "keys": keys if type(keys) is list else None,
                 "idx": self._index(r, epoch)}
        key = (epoch, nid, occ)
        per = self._l3_joins.setdefault(key, {})
        per[r] = facts
        if self._ready() and all(x in per for x in self._ranks_sorted):
            self._l3_decide(key)

    def _l3_decide(self, key: tuple) -> None:
        per = self._l3_joins.pop(key, None)
        ranks = self._ranks_sorted
        if not per or len(ranks) < 2 or self.mode not in SHARD_MODES:
            return
        epoch, nid, occ = key
        per = {r: x for r, x in per.items() if not self._diverged_before(epoch, x["idx"])}
        if not per:
            return
        self._l3c(epoch, nid, ranks, per)
        self._l3d(epoch, nid, per)

    def _l3c(self, epoch: int, nid: int, ranks: list[int], per: dict[int, dict]) -> None:
        """L3c on a decided join: the ranks that did not write their shard."""
        writers = sorted(r for r, x in per.items() if x["io"] != 0)
        if not writers:
            return
        w = per[writers[0]]
        for r in ranks:
            x = per.get(r)
            if x is not None and x["io"] != 0:
                continue
            how = f"its l3_backup has io={x['io']}" if x is not None else "it logged no l3_backup of it"
            self._add("L3", "L3c", r, epoch, nid, (x or w)["op"], [(x or w)["seq"]],
                      f"node {nid}: ranks {writers} wrote their shards to L3 but rank {r} did not ({how}); in mode "
                      f"{self.mode} every rank holds a shard of its own: the stored KV is incomplete", x or w)

    def _l3d(self, epoch: int, nid: int, per: dict[int, dict]) -> None:
        """L3d on a decided join: a key written by two ranks."""
        owner: dict[Any, int] = {}
        for r in sorted(per):
            x = per[r]
            if x["io"] == 0 or not x["keys"]:
                continue
            for k in x["keys"]:
                o = owner.setdefault(k, r)
                if o != r:
                    self._add("L3", "L3d", r, epoch, nid, x["op"], [x["seq"]],
                              f"node {nid}: rank {r} writes page key {k} that rank {o} writes too; in mode "
                              f"{self.mode} the ranks' shards differ, so one overwrites the other in storage", x)
                    break

    def _l3x_finish(self) -> None:
        for key in list(self._l3_joins):
            self._l3_decide(key)
