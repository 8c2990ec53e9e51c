"""L3c and L3d: the L3 writers of a context-parallel group (records ``l3_backup``, :mod:`cptrace_otel.model.l3`; code
``L3``), mixed into :class:`~.crossrank.CrossRank`.

In the CP modes where each rank holds a shard of its own (``sharded``, ``dcp``, ``layersplit``: domain 5), a node's
KV in storage is complete only when every rank wrote its shard, and each shard must live under keys of its own:

* **L3c, every shard is written**: when some rank backs a node up to L3 (``l3_backup io=1``), every rank of the
  group does;
* **L3d, keys differ across ranks**: no page key appears in two ranks' ``l3_backup`` of the node (DingoCache #355:
  every rank wrote the same keys, so the last writer's shard replaced the others').

In the modes of equal copies (``replicated``, ``prefill_cp``: every rank holds the same KV) one writer may serve
every rank, but only under keys they all look up. Stock SGLang's prefill CP keys every CP rank's pages apart (the
``file`` backend's ``_cp<r>_<N>``) and, for MLA, elects one storage writer by the global TP rank: only CP rank 0
writes, the other ranks' lookups miss, and the MIN over the ranks' hit counts makes every prefetch a miss
(SGLang #37149). So there:

* **L3c, every rank's keys are written**: when some rank backs a node up to L3, each page key of every rank's
  ``l3_backup`` of the node (its own keys, whether it writes them or not: ``io=0`` records name them too) is among
  the keys some rank wrote (``io=1``). Equal keys across ranks are fine (one writer serves all); L3d is not judged.

Mode ``shared`` (the IO rank writes for all) and ``none`` are not judged. A join is keyed by (epoch, node, occurrence
of ``l3_backup`` for that node on that rank), decided once every rank of the group reported or at the end of the
stream, and, as C3-C5, judges only records at or before the epoch's first C1 divergence (node ids line up across
ranks only up to it).
"""

from __future__ import annotations

from typing import Any

from ..model.events import Event, int_field
from .cross_base import REPLICA_MODES, CrossRuleBase

SHARD_MODES = frozenset(("sharded", "dcp", "layersplit"))


class L3Cross(CrossRuleBase):
    _l3: tuple[dict[tuple, dict[int, dict]], dict[tuple, int]]   # (joins, occurrences), see CrossRank.__init__
    _l3_seen: bool = False   # set on the instance by the first l3_backup

    def _l3_join(self, ev: Event) -> None:
        """An ``l3_backup``: its rank's facts enter the node's L3 join."""
        f = ev.fields
        nid = int_field(f.get("node_id"))
        if nid is None:
            return
        self._l3_seen = True
        r, epoch = ev.rank, ev.epoch
        k = (r, epoch, nid)
        joins, l3_occ = self._l3
        occ = l3_occ.get(k, 0)
        l3_occ[k] = occ + 1
        keys = f.get("keys")
        facts = {"seq": ev.seq, "line": ev.line_no, "src": ev.src, "op": int_field(f.get("op")),
                 "io": f.get("io", 1), "keys": keys if type(keys) is list else None,
                 "idx": self._index(r, epoch)}
        key = (epoch, nid, occ)
        per = joins.setdefault(key, {})
        per[r] = facts
        if self._ready() and all(x in per for x in self._ranks_sorted):
            self._l3_decide(key)

    def _l3_decide(self, key: tuple) -> None:
        per = self._l3[0].pop(key, None)
        ranks = self._ranks_sorted
        mode = self.mode
        if not per or len(ranks) < 2 or (mode not in SHARD_MODES and mode not in REPLICA_MODES):
            return
        epoch, nid, _occ = key
        per = {r: x for r, x in per.items() if not self._diverged_before(epoch, x["idx"])}
        if not per:
            return
        if mode in REPLICA_MODES:
            self._l3c_keys(epoch, nid, ranks, per)
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

    def _l3c_keys(self, epoch: int, nid: int, ranks: list[int], per: dict[int, dict]) -> None:
        """L3c on a decided join in a mode of equal copies: the ranks some of whose page keys no rank wrote."""
        writers = sorted(r for r, x in per.items() if x["io"] != 0)
        if not writers:
            return
        written: set = set()
        for r in writers:
            written.update(per[r]["keys"] or ())
        for r in ranks:
            x = per.get(r)
            if x is None or x["io"] != 0 or not x["keys"]:
                continue   # (no record: its keys are unknown; an instrumentation may log the writer only)
            missing = [k for k in x["keys"] if k not in written]
            if not missing:
                continue   # another rank wrote the keys this rank looks up (equal keys): one writer serves both
            more = f" (and {len(missing) - 1} more of its {len(x['keys'])} page keys)" if len(missing) > 1 else ""
            self._add("L3", "L3c", r, epoch, nid, x["op"], [x["seq"]],
                      f"node {nid}: rank {r} does not write it to L3 (io={x['io']}) and no rank writes its page key "
                      f"{missing[0]}{more}: ranks {writers} wrote under their own keys; in mode {self.mode} every "
                      f"rank holds the same KV but looks it up under its own keys, so rank {r}'s lookups miss and "
                      "the MIN over the ranks' hit counts gives the whole group 0 hits", x)

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
        for key in list(self._l3[0]):
            self._l3_decide(key)
