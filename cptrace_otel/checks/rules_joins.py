"""C3-C5 (docs/domain.md §5): per-node joins across ranks. A join is keyed by (epoch, tag, node_id, occurrence of that
tag
for that node on that rank) and holds each rank's facts of the record (``prepare`` completed by its ``backup``, or
``reload``); it is decided once every rank of the group has reported (:meth:`JoinRules._decide`).

* C3, backup participation: every rank has a ``prepare`` for a node iff any rank does; outside mode ``shared`` each
  ``backup`` has ``io=1``; in ``shared`` exactly the ``config io_rank`` has ``io=1`` and host summaries are equal.
* C4, count relations: ``dev.cnt``/``host.cnt`` of a node's prepare and reload equal on all ranks (logical,
  widened counts in dcp).
* C5, content relations: ``replicated`` and ``prefill_cp``: backup ``h`` equal on all ranks; ``shared``: the IO
  rank's ``hs[r]`` equals rank r's ``ack dir=h2d`` hash (nodes split since their prepare are skipped). The store
  fence is ``C5-fence`` (:mod:`.fence`).

Node ids line up across ranks only while C1 holds, so only records at or before the epoch's C1 divergence index
are judged; a join whose records lie past what C1 has compared waits for it.
"""

from __future__ import annotations

from collections import Counter

from ..model.events import Event, int_field
from .cross_base import REPLICA_MODES, CrossRuleBase
from .ranges import Slots, slots_of


def _summary(s: Slots | None) -> tuple | None:
    return s.summary() if s is not None else None


class JoinRules(CrossRuleBase):
    def _occurrence(self, ev: Event, tag: str, nid: int, bump: bool) -> int:
        k = (ev.rank, ev.epoch, tag, nid)
        n = self._occ.get(k, 0)
        if bump:
            self._occ[k] = n + 1
            return n
        return n - 1

    def _join_add(self, ev: Event) -> None:
        """A ``prepare`` or ``reload``: its rank's facts enter the node's join."""
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:   # int_field(), inlined (hot path)
            return
        tag = ev.tag
        r = ev.rank
        epoch = ev.epoch
        k = (r, epoch, tag, nid)   # _occurrence(ev, tag, nid, True), inlined (hot path)
        occ = self._occ.get(k, 0)
        self._occ[k] = occ + 1
        if tag == "prepare" and self._split_since:
            self._split_since.discard((r, epoch, nid))
        key = (epoch, tag, nid, occ)
        d = slots_of(f.get("dev"), f.get("devx"))
        h = slots_of(f.get("host"), f.get("hostx"))
        # "hslots": the host Slots, whose summary only mode shared compares (taken when the join is decided)
        op = f.get("op")
        facts = {"seq": ev.seq, "line": ev.line_no, "src": ev.src, "op": op if type(op) is int else None,
                 "idx": self._c1[epoch].counts.get(r, 1) - 1,
                 "dev": d.cnt if d is not None else None, "host": h.cnt if h is not None else None,
                 "hslots": h}
        per = self._joins.get(key)
        if per is None:
            per = self._joins[key] = {r: facts}
        else:
            per[r] = facts
        # (a join that lacks a rank's record is not decided yet, _decide would return at once: its ranks are among
        # self.ranks, which feed adds each record's rank to first)
        if tag != "prepare" and len(per) >= len(self._ranks_sorted):
            self._decide(key, final=False)

    def _backup(self, ev: Event) -> None:
        """A ``backup`` completes its rank's facts of the node's latest prepare (``io``, ``h``, ``hs``)."""
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:   # int_field(), inlined (hot path)
            return
        r = ev.rank
        epoch = ev.epoch
        # _occurrence(ev, "prepare", nid, False), inlined (hot path): the latest prepare's occurrence
        occ = self._occ.get((r, epoch, "prepare", nid), 0) - 1
        if occ < 0:
            return
        key = (epoch, "prepare", nid, occ)
        per = self._joins.get(key)
        if per is None:
            return
        facts = per.get(r)
        if facts is None:
            return
        io = f.get("io")
        facts["io"] = io if type(io) is int else None   # int_field(), inlined (hot path), as for h
        h = f.get("h")
        if type(h) is int:
            self._saw_hash = True
        else:
            h = None
        facts["h"] = h
        hs = f.get("hs")
        facts["hs"] = hs if isinstance(hs, list) else None
        facts["bseq"] = ev.seq
        if len(per) >= len(self._ranks_sorted):   # (else a rank's prepare is missing: see _join_add)
            self._decide(key, final=False)

    def _decide(self, key: tuple, final: bool) -> None:
        """Decide a join once complete (``final``: at the end of the stream, with what it has): C3 and C5 for a
        prepare, then C4."""
        per = self._joins.get(key)
        if per is None:
            return
        epoch, tag, nid, occ = key
        ranks = self._ranks_sorted   # sorted(self.ranks), kept up to date by feed (read-only here)
        if not final:
            if not (self._is_ready or self._ready()):
                return
            if tag == "prepare":
                for r in ranks:
                    x = per.get(r)
                    if x is None or "io" not in x:
                        return
            else:
                for r in ranks:
                    if r not in per:
                        return
        del self._joins[key]
        if len(ranks) < 2:
            return
        reported = per
        st = self._c1.get(epoch)
        if st is not None and st.diverged is not None:
            # node ids line up across ranks only up to the first C1 divergence (pitfall of docs/domain.md §5): records
            # after it do not count, a join that starts after it is not judged
            per = {r: x for r, x in per.items() if x["idx"] <= st.diverged}
            if not per:
                return
        mode = self.mode
        any_f = next(iter(per.values()))
        if len(per) == len(ranks) and mode != "shared":
            # the common case, decided without the per-rule tallies below: every rank reported the record with the
            # same dev/host counts (C4) and, for a prepare, io=1 where the mode asks for it (C3) and the same h in
            # mode replicated (C5): none of the rules below can find anything
            chk_io = tag == "prepare" and mode is not None and mode != "none"
            chk_h = tag == "prepare" and mode in REPLICA_MODES
            d0, c0, h0 = any_f["dev"], any_f["host"], any_f.get("h")
            for x in per.values():
                if x["dev"] != d0 or x["host"] != c0 or (chk_io and x.get("io", 1) != 1) \
                        or (chk_h and x.get("h") != h0):
                    break
            else:
                return
        if not final and st is not None and st.diverged is None:
            top = 0
            for x in per.values():
                if x["idx"] > top:
                    top = x["idx"]
            if top > st.index:
                # C1 has not compared every tuple before these records yet (it waits for a tie-break, or for a
                # lagging rank): a divergence before them would put them out of judgement, so wait for C1 (a
                # clean join, above, needs no wait: a subset of its records cannot find anything either)
                self._joins[key] = per
                st.wait.add(key)
                return
        if tag == "prepare":
            self._c3(epoch, nid, ranks, per, reported, any_f)
            if mode in REPLICA_MODES:
                self._c5_replicated(epoch, nid, per)
            elif mode == "shared":
                io = per.get(self.io_rank)
                if io is not None and io.get("hs") is not None:   # for C5 at the ranks' h2d acks
                    self._io_hs.setdefault((epoch, nid), {})[occ] = io["hs"]
        self._c4(epoch, tag, nid, per)

    def _c3(self, epoch: int, nid: int, ranks: list[int], per: dict[int, dict], reported: dict[int, dict],
            any_f: dict) -> None:
        """C3 on a decided prepare join: ``per`` the judged ranks' facts, ``reported`` every rank's."""
        mode = self.mode
        if len(per) != len(ranks):
            for r in ranks:
                # a rank whose prepare comes after the divergence index is not judged, nor called missing
                if r not in reported:
                    self._add("C3", "C3", r, epoch, nid, any_f["op"], [any_f["seq"]],
                              f"node {nid}: prepare (backup) on ranks {sorted(per)} but not on rank {r}", any_f)
        if mode is None or mode == "none":
            return
        ios = {r: x.get("io") for r, x in per.items() if "io" in x}
        if mode == "shared":
            writers = sorted(r for r, v in ios.items() if v == 1)
            if ios and writers != [self.io_rank]:
                for r, v in ios.items():
                    if (v == 1) != (r == self.io_rank):
                        x = per[r]
                        self._add("C3", "C3", r, epoch, nid, x["op"], [x.get("bseq", x["seq"])],
                                  f"node {nid}: shared mode expects only io_rank {self.io_rank} to copy; "
                                  f"io=1 on ranks {writers}", x)
            sums = {_summary(x["hslots"]) for x in per.values()}
            if len(sums) > 1:
                self._add("C3", "C3", ranks[-1], epoch, nid, any_f["op"], [x["seq"] for x in per.values()],
                          f"node {nid}: shared host ranges differ across ranks: "
                          f"{ {r: _summary(x['hslots']) for r, x in per.items()} }", any_f)
        else:
            for r, v in ios.items():
                if v != 1:
                    x = per[r]
                    self._add("C3", "C3", r, epoch, nid, x["op"], [x.get("bseq", x["seq"])],
                              f"node {nid}: backup on rank {r} has io={v}; in mode {mode} every rank "
                              "moves its own payload", x)

    def _c5_replicated(self, epoch: int, nid: int, per: dict[int, dict]) -> None:
        """C5, modes replicated and prefill_cp: the backup ``h`` of a decided prepare join is equal on all ranks."""
        hs = {r: x.get("h") for r, x in per.items() if x.get("h") is not None and x["h"] >= 0}
        if len(set(hs.values())) > 1:
            counts = Counter(hs.values())
            top = max(counts.values())
            # the majority's hash; without one (two ranks that differ), the lowest rank's, so that the finding
            # lands on the same rank in every run (and says that it is a choice)
            r0 = min(r for r, v in hs.items() if counts[v] == top)
            ref = hs[r0]
            whose = "elsewhere" if list(counts.values()).count(top) == 1 else \
                f"on rank {r0} (no majority: compared with the lowest rank of the most common hashes)"
            for r, v in sorted(hs.items()):
                if v != ref:
                    x = per[r]
                    self._add("C5", "C5", r, epoch, nid, x["op"], [x.get("bseq", x["seq"])],
                              f"node {nid}: backup h={v} on rank {r}, {ref} {whose} (mode {self.mode}: equal "
                              "copies)", x)

    def _c4(self, epoch: int, tag: str, nid: int, per: dict[int, dict]) -> None:
        """C4: dev and host counts of a decided join equal on all ranks (dcp: logical widened counts)."""
        for part in ("dev", "host"):
            cnts = {r: x[part] for r, x in per.items() if x.get(part) is not None}
            if len(set(cnts.values())) > 1:
                common = max(set(cnts.values()), key=lambda v: list(cnts.values()).count(v))
                for r, v in cnts.items():
                    if v != common:
                        x = per[r]
                        self._add("C4", "C4", r, epoch, nid, x["op"], [x["seq"]],
                                  f"node {nid}: {tag} {part}.cnt={v} on rank {r}, {common} elsewhere", x)

    # -- C5 shared: the IO rank's hs[r] against rank r's reload hash --------------------------------------------
    def _c5_ack(self, ev: Event) -> None:
        """An ``ack dir=h2d`` with ``h`` in mode shared: queued until the IO rank's ``hs`` of the node is known."""
        f = ev.fields
        if f.get("dir") != "h2d" or self.mode != "shared":
            return
        nid = f.get("node_id")
        if type(nid) is not int:   # int_field(), inlined (hot path)
            nid = None
        h = int_field(f.get("h"))
        if nid is None or h is None or h < 0:
            return
        self._saw_hash = True
        if (ev.rank, ev.epoch, nid) in self._split_since:
            return  # hs covers the whole node as backed up; a fragment's hash is not comparable
        occ = self._occurrence(ev, "prepare", nid, False)
        if occ < 0:
            return
        self._reload_hashes.append((ev.epoch, nid, occ, ev.rank, h, ev.seq, ev.line_no, ev.src,
                                    self._index(ev.rank, ev.epoch), int_field(f.get("op"))))
        if len(self._reload_hashes) > 64:
            self._c5_shared(final=False)

    def _c5_shared(self, final: bool) -> None:
        """C5, mode shared: compare the queued reload hashes whose IO-rank ``hs`` is known (and C1 has passed)."""
        keep = []
        for item in self._reload_hashes:
            epoch, nid, occ, rank, h, seq, line, src, idx, _op = item
            hs = self._io_hs.get((epoch, nid), {}).get(occ)
            if hs is None:
                if not final:
                    keep.append(item)
                continue
            st = self._c1.get(epoch)
            if not final and st is not None and st.diverged is None and idx > st.index:
                keep.append(item)   # C1 may still find a divergence before this record (see _decide)
                continue
            if self._diverged_before(epoch, idx):
                continue
            if 0 <= rank < len(hs) and type(hs[rank]) is int and hs[rank] >= 0 and hs[rank] != h:
                self._add("C5", "C5", rank, epoch, nid, None, [seq],
                          f"node {nid}: reload hash {h} on rank {rank} but the IO rank's backup hs[{rank}]="
                          f"{hs[rank]}", {"src": src, "line": line})
        self._reload_hashes = keep
