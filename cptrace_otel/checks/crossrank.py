"""Cross-rank rules C1-C5 (domain section 5) over all ranks' events, fed in any interleaving that keeps each rank's
seq order (the sources merge ranks by ``ts``; a lag of a few hundred records between ranks is fine).

* **C1** lockstep tree: each rank's projection onto structural tuples (tag in insert, split, prepare, evict, reload,
  reset; node_id; len or pre_len; split_len; evict tier) must be identical; the first divergence per epoch is
  reported on the rank that deviates from the majority (in a tie: the rank that skipped a record the others have),
  with the node and op of the expected record.
* **C2** ack rounds: each round of ``ack`` records (``round=`` when emitted, else a run of consecutive ack records
  of one direction) holds the same (dir, op count, node set) on all ranks. Level 2.
* **C3** backup participation: every rank has a ``prepare`` for a node iff any rank does; outside mode ``shared``
  each ``backup`` has ``io=1``; in ``shared`` exactly the ``config io_rank`` has ``io=1`` and host summaries are
  equal on all ranks.
* **C4** count relations: ``dev.cnt``/``host.cnt`` of a node's prepare and reload equal on all ranks (logical,
  widened counts in dcp).
* **C5** content relations: ``replicated``: backup ``h`` equal on all ranks; ``shared``: the IO rank's ``hs[r]``
  equals rank r's ``ack dir=h2d`` hash (nodes split since their prepare are skipped); ``shared`` store fence
  (rule ``C5-fence``, :mod:`.fence`): no rank's ``store`` to the pages may land after the IO rank's ``backup``.

Pitfall of domain 5: node ids line up across ranks only while C1 holds, so after the first divergence of an epoch
C2 stops and C3-C5 judge only records at or before the divergence index (the diverging prepare itself still yields
its C3 on a rank that never logs it, as fault ``C1_div`` expects; a rank that logs it after the index is not
judged). C1 may confirm a divergence a few tuples late (a tie-break), so a join whose records lie past what C1 has
compared waits for it, and a C2 mismatch is kept with the latest structural index of its rounds and dropped at the
end if that is past the divergence. The store fence too: a diverged rank reuses, for its own nodes, device pages the
IO rank still holds, so a backup or store after the divergence index is not judged (:mod:`.fence`).

Joins are keyed by (epoch, tag, node_id, occurrence of that tag for that node on that rank) and decided once every
rank of the group (``config cp_size``, the sources' rank hint, at least two) has reported, so memory follows what is
in flight; per-node counters are forgotten a while after the node's lifecycle ends. A single-rank stream switches
the cross-rank rules off after 65,536 records.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from ..events import Event
from .fence import StoreFence
from .findings import ERROR, Finding, Unchecked
from .ranges import slots_of

STRUCTURAL = ("insert", "split", "prepare", "evict", "reload", "reset")
_FENCE_TAGS = frozenset(("store", "backup", "evict", "free", "reset"))
_PER_RANK_CONTENT = ("sharded", "dcp", "layersplit")


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _proj(ev: Event) -> tuple:
    """A record's C1 tuple: (tag, node id, length, split length, tier), ints and str only."""
    f = ev.fields
    tag = ev.tag
    nid = f.get("node_id")
    ln = f.get("pre_len" if tag == "split" else "len")
    sl = f.get("split_len")
    tier = f.get("tier") if tag == "evict" else None
    return (tag, nid if type(nid) is int else None, ln if type(ln) is int else None,
            sl if type(sl) is int else None, tier if type(tier) is str else None)


def _summary(s: Any) -> tuple | None:
    return s.summary() if s is not None else None


def _str(v: Any) -> str | None:
    return v if type(v) is str else None


class _EpochC1:
    __slots__ = ("queues", "index", "diverged", "pending", "counts", "qs", "qs_ranks", "wait", "late")

    def __init__(self) -> None:
        self.queues: dict[int, deque] = {}
        self.counts: dict[int, int] = {}    # rank -> structural records of this epoch so far (the join index)
        self.qs: list[deque] = []           # queues[r] for r in qs_ranks (the comparison's view)
        self.qs_ranks: list[int] | None = None   # the CrossRank._ranks_sorted list qs was built for
        self.index = 0              # tuples compared so far
        self.diverged: int | None = None
        self.pending: tuple | None = None   # a divergence waiting for one more tuple per rank (tie-break)
        self.wait: set = set()      # join keys waiting for C1 to compare up to their records (CrossRank._decide)
        self.late: list[tuple[Finding, int]] = []   # C2 findings with the structural index they are judged at


class CrossRank:
    """Streaming C1-C5. ``feed(ev)`` for every event of every rank, then ``finish()`` and ``unchecked()``."""

    def __init__(self, level: int | None = None) -> None:
        self.forced_level = level
        self.seen_level = 1
        self.ranks: set[int] = set()
        self.mode: str | None = None
        self.io_rank = 0
        self.findings: list[Finding] = []
        self._c1: dict[int, _EpochC1] = {}
        self._occ: dict[tuple, int] = {}                  # (rank, epoch, tag, node) -> occurrences so far
        self._joins: dict[tuple, dict[int, dict]] = {}    # (epoch, tag, node, occ) -> rank -> facts
        self._split_since: set[tuple] = set()             # (rank, epoch, node) split since its last prepare
        self._rounds: dict[tuple[int, int], deque] = {}   # (rank, epoch) -> finished rounds
        self._cur_round: dict[int, list] = {}             # rank -> [epoch, key, dir, ops, nodes, seqs]
        self._c2_done: set[int] = set()
        self._reload_hashes: list[tuple] = []             # shared mode C5 waiting for the IO rank's hs
        self._io_hs: dict[tuple, dict] = {}              # shared: (epoch, node) -> occ -> IO rank's hs
        self._saw_ack = False
        self._saw_hash = False
        self._forget: deque = deque()
        self.expected: set[int] = set()
        self.cp_size = 0
        self.disabled = False
        self._n = 0
        self._counting = True   # records are counted (_n) only while the single-rank switch-off can still happen
        self._is_ready = False
        self._ranks_sorted: list[int] = []
        self._fence = StoreFence()
        self._c2_qs: dict[int, tuple] = {}                # epoch -> (ranks list it was built for, round queues)
        # tag -> handler of the records C1/C3-C5 read besides config and ack (see feed): every STRUCTURAL tag feeds
        # C1, some also a join or a per-node memory; backup completes a prepare's join
        extra = {"split": self._on_split, "prepare": self._on_join, "reload": self._on_join, "evict": self._on_evict}
        self._on_tag = {tag: extra.get(tag, self._c1_add) for tag in STRUCTURAL}
        self._on_tag["backup"] = self._backup

    # -- driving ------------------------------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        """One record of any rank. Per-tag work only: records that no cross-rank rule reads (compose, rid_map, ...)
        cost the rank/level bookkeeping and the end of an open ack round, nothing else."""
        if self.disabled:
            return
        r = ev.rank
        if r not in self.ranks:
            self.ranks.add(r)
            self._ranks_sorted = sorted(self.ranks)
            self._is_ready = False   # recomputed: a new rank can only make the group more complete
            if len(self.ranks) >= 2:
                self._counting = False   # the single-rank switch-off below can no longer happen
        if self._counting:
            self._n = n = self._n + 1
            if n >= self.SINGLE_RANK_AFTER:
                self._counting = False   # decided once, at that record
                if n == self.SINGLE_RANK_AFTER and len(self.ranks) < 2 and len(self.expected) < 2 \
                        and self.cp_size < 2:
                    self._disable()   # one rank only: nothing to compare, and the joins would only pile up
                    return
        lv = ev.level
        if lv > self.seen_level:
            self.seen_level = lv
        tag = ev.tag
        if tag == "config":
            self._config(ev)
            return
        if self.mode == "shared" and tag in _FENCE_TAGS:
            self._fence.io_rank = self.io_rank
            self._fence.feed(ev, self._index(r, ev.epoch))
        if tag == "ack":
            self._saw_ack = True
            if self.seen_level < 2:
                self.seen_level = 2
            self._round_add(ev)
            if self.mode == "shared":   # (the only mode _c5_ack acts in)
                self._c5_ack(ev)
            return
        if r in self._cur_round:   # any other record of this rank ends its ack round
            self._round_close(r)
        h = self._on_tag.get(tag)   # structural records and backup; None for tags no other rule reads
        if h is not None:
            h(ev)

    def _config(self, ev: Event) -> None:
        f = ev.fields
        m = f.get("mode")
        if isinstance(m, str) and self.mode is None:
            self.mode = m
        io = _int(f.get("io_rank"))
        if io is not None:
            self.io_rank = io
        cs = _int(f.get("cp_size"))
        if cs is not None and cs > self.cp_size:
            self.cp_size = cs
        lv = _int(f.get("level"))
        if lv is not None and lv > self.seen_level:
            self.seen_level = lv

    def _on_join(self, ev: Event) -> None:
        """prepare / reload: C1 tuple, then the C3/C4/C5 join."""
        self._c1_add(ev)
        self._join_add(ev)

    def _on_evict(self, ev: Event) -> None:
        self._c1_add(ev)
        f = ev.fields
        if f.get("tier") == "host" or f.get("kind") in ("regular", "drop"):
            # the node's lifecycle ended: forget its per-node counters a little later (an in-flight
            # load may still be acked), so memory follows live nodes
            self._forget.append((ev.rank, ev.epoch, _int(f.get("node_id"))))
            if len(self._forget) > self.FORGET_LAG:
                self._forget_one()

    def _on_split(self, ev: Event) -> None:
        self._c1_add(ev)
        f = ev.fields
        for nid in (_int(f.get("node_id")), _int(f.get("new_id"))):
            if nid is not None:
                self._split_since.add((ev.rank, ev.epoch, nid))

    FORGET_LAG = 4096
    SINGLE_RANK_AFTER = 65536

    def _disable(self) -> None:
        self.disabled = True
        self._c1.clear()
        self._joins.clear()
        self._occ.clear()
        self._rounds.clear()
        self._c2_qs.clear()
        self._cur_round.clear()
        self._forget.clear()
        self._split_since.clear()

    def _forget_one(self) -> None:
        r, epoch, nid = self._forget.popleft()
        for t in ("prepare", "reload"):
            self._occ.pop((r, epoch, t, nid), None)
        self._split_since.discard((r, epoch, nid))
        if r == self.io_rank and not (self._reload_hashes and any(x[1] == nid for x in self._reload_hashes)):
            self._io_hs.pop((epoch, nid), None)

    def expect_ranks(self, ranks: Iterable[int]) -> None:
        """Ranks the sources know will appear: joins and comparisons wait for all of them."""
        self.expected |= set(ranks)
        self._is_ready = False

    def _ready(self) -> bool:
        """All ranks of the group have shown up (cp_size from config, the sources' hint, at least two)."""
        if self._is_ready:
            return True
        n = max(2, self.cp_size, len(self.expected))
        self._is_ready = len(self.ranks) >= n
        return self._is_ready

    @property
    def level(self) -> int:
        return self.forced_level if self.forced_level is not None else self.seen_level

    def finish(self) -> list[Finding]:
        for r in list(self._cur_round):
            self._round_close(r)
        for e, st in self._c1.items():
            self._c1_compare(e, st, final=True)
            if st.wait:
                self._c1_release(e, st)
            self._c2_compare(e, final=True)
        for st in self._c1.values():
            st.wait.clear()
        for key in list(self._joins):
            self._decide(key, final=True)
        self._c5_shared(final=True)
        for st in self._c1.values():
            self.findings.extend(f for f, at in st.late if st.diverged is None or at <= st.diverged)
            st.late = []
        self.findings.extend(self._fence.take(self._diverged_before))
        self.findings.sort(key=Finding.sort_key)
        return self.findings

    def unchecked(self) -> list[Unchecked]:
        out: list[Unchecked] = []
        if len(self.ranks) < 2:
            return out
        if self.level < 2:
            out.append(Unchecked("C2", "C2", None, 2, "no ack records (trace level < 2)"))
        if self.mode is None:
            out.append(Unchecked("C3-io", "C3", None, 1, "no config record: CP mode unknown, io= rules skipped",
                                 "skip"))
            out.append(Unchecked("C5", "C5", None, 1, "no config record: CP mode unknown", "skip"))
        elif self.mode in ("replicated", "shared") and not self._saw_hash:
            out.append(Unchecked("C5", "C5", None, 1, "no h fields on backup/reload records", "skip"))
        if self.mode == "shared" and self._fence.stores == 0:
            out.append(Unchecked("C5-fence", "C5", None, 2, "no store records (level 2) in mode shared",
                                 "level" if self.level < 2 else "skip"))
        return out

    # -- C1 -----------------------------------------------------------------------------------------------------
    def _c1_add(self, ev: Event) -> None:
        """Append the record's structural tuple (:func:`_proj`) to its rank's queue and compare the queue heads when
        that can decide something."""
        epoch = ev.epoch
        r = ev.rank
        st = self._c1.get(epoch)
        if st is None:
            st = self._c1[epoch] = _EpochC1()
        counts = st.counts
        counts[r] = counts.get(r, 0) + 1   # this rank's structural index in the epoch (counted after a divergence too)
        if st.diverged is not None:
            return
        q = st.queues.get(r)
        if q is None:
            q = st.queues[r] = deque()
        n = len(q)
        # (tuple, record): the record gives seq, line, src and op if this tuple is ever reported
        q.append((_proj(ev), ev))
        if n >= 2:
            # this rank was already two or more tuples ahead: the last comparison stopped on another rank's empty
            # queue, readiness, or a tie-break wait that needs the other ranks' second tuples, none of which a
            # tuple appended here changes (heads are untouched), so comparing again would return at once
            return
        if st.qs_ranks is self._ranks_sorted and not all(st.qs):
            return   # another rank has no tuple yet: _c1_compare would stop at once (its queues are all built)
        self._c1_compare(epoch, st, final=False)
        if st.wait:
            self._c1_release(epoch, st)

    def _c1_release(self, epoch: int, st: _EpochC1) -> None:
        """Decide the joins that waited for C1 (see :meth:`_decide`) once it has diverged or compared up to them."""
        waiting = st.wait
        for key in list(waiting):
            per = self._joins.get(key)
            if per is None:
                waiting.discard(key)
            elif st.diverged is not None or max(x["idx"] for x in per.values()) <= st.index:
                waiting.discard(key)
                self._decide(key, final=False)

    def _c1_compare(self, epoch: int, st: _EpochC1, final: bool) -> None:
        ranks = self._ranks_sorted
        if len(ranks) < 2 or st.diverged is not None or not (final or self._ready()):
            return
        qs = st.qs
        if st.qs_ranks is not ranks:   # (re)built when a rank appears: the queue of every rank, in rank order
            queues = st.queues
            for r in ranks:
                if r not in queues:
                    queues[r] = deque()
            qs = st.qs = [queues[r] for r in ranks]
            st.qs_ranks = ranks
        while True:
            if not all(qs):
                if not final or not any(qs):
                    return
                # end of stream: some ranks have records the others never logged
                short = [r for r, q in zip(ranks, qs) if not q]
                longq = next(q for q in qs if q)
                t0 = longq[0]
                for r in short:
                    self._emit_c1(epoch, r, t0, st.index, f"rank {r} ends after {st.index} structural records; "
                                  f"other ranks continue with {t0[0]}", t0[1])
                st.diverged = st.index
                return
            heads = [q[0][0] for q in qs]
            if heads.count(heads[0]) == len(heads):   # all equal (C-level, no generator per tuple)
                for q in qs:
                    q.popleft()
                st.index += 1
                continue
            if not final and min(map(len, qs)) < 2:
                return  # wait for one more tuple per rank to break ties
            self._c1_diverge(epoch, st, ranks, qs)
            return

    def _c1_diverge(self, epoch: int, st: _EpochC1, ranks: list[int], qs: list[deque]) -> None:
        heads = [q[0][0] for q in qs]
        counts: dict[tuple, int] = {}
        for h in heads:
            counts[h] = counts.get(h, 0) + 1
        best = max(counts.values())
        majority = [h for h in counts if counts[h] == best]
        if len(majority) == 1:
            ref = majority[0]
        else:
            # tie: the reference is a record that some rank skipped (its next tuple is the other's current one)
            ref = heads[0]
            for i, q in enumerate(qs):
                for j, q2 in enumerate(qs):
                    if i != j and len(q2) >= 2 and q2[1][0] == q[0][0] and q2[0][0] != q[0][0]:
                        ref = q2[0][0]  # rank i skipped q2's head
        ref_item = next(q[0] for q in qs if q[0][0] == ref)
        for r, q in zip(ranks, qs):
            if q[0][0] != ref:
                self._emit_c1(epoch, r, ref_item, st.index,
                              f"structural record #{st.index}: rank {r} has {_fmt(q[0][0])}, expected "
                              f"{_fmt(ref)} (ranks {[x for x, y in zip(ranks, qs) if y[0][0] == ref]})",
                              q[0][1], ref_item)
        st.diverged = st.index
        st.queues.clear()
        st.qs = []
        st.qs_ranks = None

    def _emit_c1(self, epoch: int, rank: int, ref_item: tuple, index: int, msg: str, where: Event,
                 other: tuple | None = None) -> None:
        """C1 on ``rank`` at record ``where``; node and op of the expected queue item ``ref_item`` (tuple, record)."""
        seq, line, src = where.seq, where.line_no, where.src
        f = Finding("C1", "C1", rank, epoch, ref_item[0][1], _int(ref_item[1].fields.get("op")), "exact", [seq], msg,
                    ERROR, src, line)
        f.evidence_lines = [line]
        self.findings.append(f)

    def _index(self, rank: int, epoch: int) -> int:
        """Structural records of ``rank`` in ``epoch`` so far."""
        st = self._c1.get(epoch)
        return st.counts.get(rank, 0) if st is not None else 0

    def _diverged_before(self, epoch: int, index: int) -> bool:
        st = self._c1.get(epoch)
        return st is not None and st.diverged is not None and index > st.diverged

    # -- C3 / C4 / C5 joins -------------------------------------------------------------------------------------
    def _occurrence(self, ev: Event, tag: str, nid: int, bump: bool) -> int:
        k = (ev.rank, ev.epoch, tag, nid)
        n = self._occ.get(k, 0)
        if bump:
            self._occ[k] = n + 1
            return n
        return n - 1

    def _join_add(self, ev: Event) -> None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:   # _int(), inlined (hot path)
            return
        tag = ev.tag
        r = ev.rank
        epoch = ev.epoch
        occ = self._occurrence(ev, tag, nid, True)
        if tag == "prepare" and self._split_since:
            self._split_since.discard((r, epoch, nid))
        key = (epoch, tag, nid, occ)
        d = slots_of(f.get("dev"), f.get("devx"))
        h = slots_of(f.get("host"), f.get("hostx"))
        # "hslots": the host Slots, whose summary only mode shared compares (taken when the join is decided)
        facts = {"seq": ev.seq, "line": ev.line_no, "src": ev.src, "op": _int(f.get("op")),
                 "idx": self._c1[epoch].counts.get(r, 1) - 1,
                 "dev": d.cnt if d is not None else None, "host": h.cnt if h is not None else None,
                 "hslots": h}
        per = self._joins.get(key)
        if per is None:
            self._joins[key] = {r: facts}
        else:
            per[r] = facts
        if tag != "prepare":
            self._decide(key, final=False)

    def _backup(self, ev: Event) -> None:
        f = ev.fields
        nid = f.get("node_id")
        if type(nid) is not int:   # _int(), inlined (hot path)
            return
        r = ev.rank
        occ = self._occurrence(ev, "prepare", nid, False)
        if occ < 0:
            return
        key = (ev.epoch, "prepare", nid, occ)
        per = self._joins.get(key)
        if per is None:
            return
        facts = per.get(r)
        if facts is None:
            return
        facts["io"] = _int(f.get("io"))
        h = _int(f.get("h"))
        if h is not None:
            self._saw_hash = True
        facts["h"] = h
        hs = f.get("hs")
        facts["hs"] = hs if isinstance(hs, list) else None
        facts["bseq"] = ev.seq
        self._decide(key, final=False)

    def _decide(self, key: tuple, final: bool) -> None:
        per = self._joins.get(key)
        if per is None:
            return
        epoch, tag, nid, occ = key
        ranks = self._ranks_sorted   # sorted(self.ranks), kept up to date by feed (read-only here)
        if not final:
            if not (self._ready()):
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
            # node ids line up across ranks only up to the first C1 divergence (pitfall of domain 5): records
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
            chk_h = tag == "prepare" and mode == "replicated"
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
            if tag == "prepare" and len(per) != len(ranks):
                for r in ranks:
                    # a rank whose prepare comes after the divergence index is not judged, nor called missing
                    if r not in reported:
                        self._add("C3", "C3", r, epoch, nid, any_f["op"], [any_f["seq"]],
                                  f"node {nid}: prepare (backup) on ranks {sorted(per)} but not on rank {r}",
                                  any_f)
            if mode is not None and mode != "none":
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
            if mode == "replicated":
                hs = {r: x.get("h") for r, x in per.items() if x.get("h") is not None and x["h"] >= 0}
                if len(set(hs.values())) > 1:
                    vals = sorted(set(hs.values()), key=lambda v: -list(hs.values()).count(v))
                    ref = vals[0]
                    for r, v in hs.items():
                        if v != ref:
                            x = per[r]
                            self._add("C5", "C5", r, epoch, nid, x["op"], [x.get("bseq", x["seq"])],
                                      f"node {nid}: replicated backup h={v} on rank {r}, {ref} elsewhere", x)
            if mode == "shared":
                io = per.get(self.io_rank)
                if io is not None and io.get("hs") is not None:
                    self._io_hs.setdefault((epoch, nid), {})[occ] = io["hs"]
        # C4: counts equal on all ranks (dcp: logical widened counts)
        for part in ("dev", "host"):
            cnts = {r: x[part] for r, x in per.items() if x.get(part) is not None}
            if len(set(cnts.values())) > 1:
                common = max(set(cnts.values()), key=lambda v: list(cnts.values()).count(v))
                for r, v in cnts.items():
                    if v != common:
                        x = per[r]
                        self._add("C4", "C4", r, epoch, nid, x["op"], [x["seq"]],
                                  f"node {nid}: {tag} {part}.cnt={v} on rank {r}, {common} elsewhere", x)

    def _add(self, code: str, rule: str, rank: int, epoch: int, nid: Any, op: Any, seqs: list, msg: str,
             facts: dict) -> None:
        f = Finding(code, rule, rank, epoch, nid, op, "exact", sorted(seqs), msg, ERROR, facts.get("src", ""),
                    facts.get("line", 0))
        self.findings.append(f)

    # -- C5 shared: the IO rank's hs[r] against rank r's reload hash --------------------------------------------
    def _c5_ack(self, ev: Event) -> None:
        f = ev.fields
        if f.get("dir") != "h2d" or self.mode != "shared":
            return
        nid = f.get("node_id")
        if type(nid) is not int:   # _int(), inlined (hot path)
            nid = None
        h = _int(f.get("h"))
        if nid is None or h is None or h < 0:
            return
        self._saw_hash = True
        if (ev.rank, ev.epoch, nid) in self._split_since:
            return  # hs covers the whole node as backed up; a fragment's hash is not comparable
        occ = self._occurrence(ev, "prepare", nid, False)
        if occ < 0:
            return
        self._reload_hashes.append((ev.epoch, nid, occ, ev.rank, h, ev.seq, ev.line_no, ev.src,
                                    self._index(ev.rank, ev.epoch), _int(f.get("op"))))
        if len(self._reload_hashes) > 64:
            self._c5_shared(final=False)

    def _c5_shared(self, final: bool) -> None:
        keep = []
        for item in self._reload_hashes:
            epoch, nid, occ, rank, h, seq, line, src, idx, op = item
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

    # -- C2 -----------------------------------------------------------------------------------------------------
    def _round_add(self, ev: Event) -> None:
        f = ev.fields
        r = ev.rank
        d = _str(f.get("dir"))
        rk = f.get("round")
        if type(rk) is not int:
            rk = None
        cur = self._cur_round.get(r)
        if cur is not None and (cur[0] != ev.epoch or cur[1] != rk or cur[2] != d):
            self._round_close(r)
            cur = None
        if cur is None:
            cur = self._cur_round[r] = [ev.epoch, rk, d, set(), set(), ev.seq, ev.line_no, ev.src,
                                        self._index(r, ev.epoch)]
        cur[3].add(_int(f.get("op")))
        nid = f.get("node_id")
        if type(nid) is int:
            cur[4].add(nid)

    def _round_close(self, r: int) -> None:
        cur = self._cur_round.pop(r, None)
        if cur is None:
            return
        epoch = cur[0]
        if epoch in self._c2_done:
            return   # C2 of this epoch is decided: its later rounds are never compared (nor kept)
        q = self._rounds.get((r, epoch))
        if q is None:
            q = self._rounds[(r, epoch)] = deque()
        q.append((cur[2], len(cur[3]), frozenset(cur[4]), cur[5], cur[6], cur[7], cur[8]))
        c = self._c2_qs.get(epoch)
        if c is not None and c[0] is self._ranks_sorted and not all(c[1]):
            return   # another rank has no round yet: _c2_compare would stop at once
        self._c2_compare(epoch, final=False)

    def _c2_compare(self, epoch: int, final: bool) -> None:
        if epoch in self._c2_done:
            return
        ranks = self._ranks_sorted
        if len(ranks) < 2 or not (final or self._ready()):
            return
        c = self._c2_qs.get(epoch)
        if c is not None and c[0] is ranks:
            qs = c[1]
        else:   # (re)built when a rank appears: the round queue of every rank, in rank order
            qs = [self._rounds.setdefault((r, epoch), deque()) for r in ranks]
            self._c2_qs[epoch] = (ranks, qs)
        n = 0
        while all(qs):
            heads = [q[0][:3] for q in qs]
            if heads.count(heads[0]) == len(heads):
                for q in qs:
                    q.popleft()
                n += 1
                continue
            st = self._c1.get(epoch)
            if st is not None and st.diverged is not None:
                self._c2_done.add(epoch)  # node sets no longer comparable after a C1 divergence
                return
            counts: dict[tuple, int] = {}
            for h in heads:
                counts[h] = counts.get(h, 0) + 1
            ref = max(counts, key=lambda h: (counts[h], len(h[2])))
            # judged at the latest structural index of the rounds compared: a C1 divergence found later (it can
            # wait for more tuples) at or before that index drops the finding (finish), as C2 stops there
            at = max(q[0][6] for q in qs)
            for r, q in zip(ranks, qs):
                if q[0][:3] != ref:
                    d, nops, nodes, seq, line, src, _ = q[0]
                    f = Finding("C2", "C2", r, epoch, min(ref[2] ^ nodes) if ref[2] ^ nodes else None, None, "exact",
                                [seq], f"ack round on rank {r}: dir={d} ops={nops} nodes={sorted(nodes)}; "
                                f"expected dir={ref[0]} ops={ref[1]} nodes={sorted(ref[2])}", ERROR, src, line)
                    f.evidence_lines = [line]
                    if st is not None:
                        st.late.append((f, at))
                    else:
                        self.findings.append(f)   # no structural record in this epoch: no divergence to wait for
            self._c2_done.add(epoch)
            for q in qs:
                q.clear()
            return
        if final and any(qs):
            st = self._c1.get(epoch)
            if st is not None and st.diverged is not None:
                return
            for r, q in zip(ranks, qs):
                if not q and any(qs):
                    other = next(x for x in qs if x)[0]
                    f = Finding("C2", "C2", r, epoch, min(other[2]) if other[2] else None, None, "exact",
                                [other[3]], f"rank {r} has fewer ack rounds than the other ranks", ERROR)
                    self.findings.append(f)
            self._c2_done.add(epoch)


def _fmt(t: tuple) -> str:
    tag, nid, ln, sl, tier = t
    parts = [tag, f"node_id={nid}"]
    if ln is not None:
        parts.append(f"len={ln}")
    if sl is not None:
        parts.append(f"split_len={sl}")
    if tier is not None:
        parts.append(f"tier={tier}")
    return " ".join(parts)
