"""C2, ack-count agreement (docs/domain.md §5, level 2): each round of ``ack`` records holds the same (dir, op count,
node set)
on all ranks, since writing_check and loading_check take the MIN across the attn_cp and attn_tp groups.

A round is the acks with one ``round=`` value when the emitter logs it, whatever their line order and whatever
records come between them (SGLang drains the write and the load ack queues in one scheduler round, and a rank may
log an h2d ack between the d2h acks of the same round, or a free between the per-node acks of one op); the round is
compared per direction, d2h then h2d. Without ``round=`` a round is a run of consecutive ack records of one
direction (split at any other record: the check_events markers).

The first mismatch per epoch is reported (on each rank that differs from the majority); it is kept with the latest
structural index of the rounds compared and dropped at the end if that lies past the epoch's C1 divergence (C2
stops there). A rank with fewer rounds than the others is reported at the end of the stream.
"""

from __future__ import annotations

from collections import deque

from ..model.events import Event
from .cross_base import CrossRuleBase
from .findings import ERROR, Finding


def _agree(qs: list[deque]) -> None:
    """Pop the queues' heads while every queue has one and all of them are the same round (direction, op count,
    nodes). Then some queue is empty, or the heads disagree."""
    while all(qs):
        h0 = qs[0][0][:3]
        for q in qs:   # (no list of heads to build: one comparison per rank)
            if q[0][:3] != h0:
                return
        for q in qs:
            q.popleft()


def _dir_order(d: str | None) -> tuple:
    """The order a keyed round's directions are compared in: d2h, h2d, then any other (None last)."""
    return (d != "d2h", d != "h2d", d is None, d or "")


class C2AckRounds(CrossRuleBase):
    _rounds: dict[tuple[int, int], deque]   # (rank, epoch) -> finished rounds
    # rank -> its open round without round=: [epoch, None, dir, ops, nodes, seq, line, src, index]
    _cur_round: dict[int, list]
    # rank -> its open round with round=: [epoch, round, {dir: a list laid out as above}]
    _cur_keyed: dict[int, list]
    _c2_done: set[int]
    _c2_qs: dict[int, tuple]               # epoch -> (ranks list it was built for, round queues)

    def _round_add(self, ev: Event) -> None:
        f = ev.fields
        r = ev.rank
        d = f.get("dir")
        if type(d) is not str:   # a str or None (hot path: no helper call)
            d = None
        rk = f.get("round")
        if type(rk) is int:
            cur = self._keyed_part(ev, r, d, rk)
        else:   # (the common upstream record: kept to one flat list per round)
            if r in self._cur_keyed:
                self._round_close(r)
            epoch = ev.epoch
            cur = self._cur_round.get(r)  # type: ignore[assignment]
            if cur is not None and (cur[0] != epoch or cur[2] != d):
                self._round_close(r)
                cur = None
            if cur is None:
                st = self._c1.get(epoch)   # self._index(r, epoch), inlined
                cur = self._cur_round[r] = [epoch, None, d, set(), set(), ev.seq, ev.line_no, ev.src,
                                            st.counts.get(r, 0) if st is not None else 0]
        op = f.get("op")   # int_field(), inlined (hot path)
        cur[3].add(op if type(op) is int else None)  # type: ignore[index]
        nid = f.get("node_id")
        if type(nid) is int:
            cur[4].add(nid)  # type: ignore[index]

    def _keyed_part(self, ev: Event, r: int, d: str | None, rk: int) -> list:
        """The direction ``d`` part of rank ``r``'s open round ``rk``: other records do not end a keyed round, nor
        does a change of direction; an ack of another round (or epoch) does."""
        if r in self._cur_round:
            self._round_close(r)
        cur = self._cur_keyed.get(r)
        if cur is not None and (cur[0] != ev.epoch or cur[1] != rk):
            self._round_close(r)
            cur = None
        if cur is None:
            cur = self._cur_keyed[r] = [ev.epoch, rk, {}]
        part = cur[2].get(d)
        if part is None:
            part = cur[2][d] = [ev.epoch, rk, d, set(), set(), ev.seq, ev.line_no, ev.src, self._index(r, ev.epoch)]
        return part

    def _round_close(self, r: int) -> None:
        cur = self._cur_round.pop(r, None)
        if cur is not None:
            parts = None
        else:
            cur = self._cur_keyed.pop(r, None)
            if cur is None:
                return
            parts = sorted(cur[2].items(), key=lambda x: _dir_order(x[0])) if len(cur[2]) > 1 else cur[2].items()
        epoch = cur[0]
        if epoch in self._c2_done:
            return   # C2 of this epoch is decided: its later rounds are never compared (nor kept)
        q = self._rounds.get((r, epoch))
        if q is None:
            q = self._rounds[(r, epoch)] = deque()
        if parts is None:
            # the node set as it is (no frozenset copy per round): the round list is closed, nothing adds to it
            # again; _c2_compare makes a hashable copy only where heads differ
            q.append((cur[2], len(cur[3]), cur[4], cur[5], cur[6], cur[7], cur[8]))
        else:
            q.extend((d, len(p[3]), p[4], p[5], p[6], p[7], p[8]) for d, p in parts)
        c = self._c2_qs.get(epoch)
        if c is not None and c[0] is self._ranks_sorted:   # (then two ranks or more: see _c2_compare)
            qs = c[1]
            if not all(qs):
                return   # another rank has no round yet: _c2_compare would stop at once
            if self._is_ready:
                # the common case, without _c2_compare's checks: the heads agree (one step, as the round that
                # completes them closes); a mismatch is left to _c2_compare, from the same state
                _agree(qs)
                if all(qs):
                    self._c2_compare(epoch, final=False)
                return
        self._c2_compare(epoch, final=False)

    def _c2_compare(self, epoch: int, final: bool) -> None:
        """C2: pop the rounds all ranks agree on; report the first mismatch of the epoch."""
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
        _agree(qs)
        if all(qs):   # the heads disagree
            st = self._c1.get(epoch)
            if st is not None and st.diverged is not None:
                self._c2_done.add(epoch)  # node sets no longer comparable after a C1 divergence
                return
            # the heads, hashable (a round keeps its node set as is)
            heads = [(h[0], h[1], frozenset(h[2])) for h in (q[0] for q in qs)]
            counts: dict[tuple, int] = {}
            for h in heads:
                counts[h] = counts.get(h, 0) + 1
            ref = max(counts, key=lambda h: (counts[h], len(h[2])))
            # judged at the latest structural index of the rounds compared: a C1 divergence found later (it can
            # wait for more tuples) at or before that index drops the finding (finish), as C2 stops there
            at = max(q[0][6] for q in qs)
            for r, q in zip(ranks, qs, strict=False):
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
            for r, q in zip(ranks, qs, strict=False):
                if not q and any(qs):
                    other = next(x for x in qs if x)[0]
                    f = Finding("C2", "C2", r, epoch, min(other[2]) if other[2] else None, None, "exact",
                                [other[3]], f"rank {r} has fewer ack rounds than the other ranks", ERROR)
                    self.findings.append(f)
            self._c2_done.add(epoch)
