"""C1, lockstep tree (docs/domain.md §5): each rank's projection onto structural tuples (tag in
:data:`~.registry.STRUCTURAL`; node_id; len or pre_len; split_len; evict tier) must be identical on all ranks of
the group. The first divergence per epoch is reported on the rank that deviates from the majority (in a tie: the
rank that skipped a record the others have), with the node and op of the expected record; a rank whose stream ends
early diverges at its end. A divergence is confirmed only once every rank has one more tuple (the tie-break), so
C1 may confirm it a few tuples late; the rules that stop at it wait (:meth:`C1Lockstep._c1_release`).
"""

from __future__ import annotations

from collections import deque

from ..model.events import Event, int_field
from .cross_base import CrossRuleBase, EpochC1, agree, new_epoch_c1
from .findings import ERROR, Finding


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


class C1Lockstep(CrossRuleBase):
    def _c1_add(self, ev: Event) -> None:
        """C1 for one structural record: :meth:`EpochC1.push <.cross_base.EpochC1.push>` (the C twin's where it
        was built) counts and queues it and pops the agreeing heads; the rest is done here when it says so."""
        epoch = ev.epoch
        st = self._c1.get(epoch)
        if st is None:
            st = self._c1[epoch] = new_epoch_c1()
        act = st.push(ev, self._ranks_sorted, self._is_ready)
        if act:
            if act == 1:
                self._c1_compare(epoch, st, final=False)
            if st.wait:
                self._c1_release(epoch, st)

    def _c1_release(self, epoch: int, st: EpochC1) -> None:
        """Decide the joins that waited for C1 (see :meth:`~.rules_joins.JoinRules._decide`) once it has diverged
        or compared up to them."""
        waiting = st.wait
        for key in list(waiting):
            per = self._joins.get(key)
            if per is None:
                waiting.discard(key)
            elif st.diverged is not None or max(x["idx"] for x in per.values()) <= st.index:
                waiting.discard(key)
                self._decide(key, final=False)  # type: ignore[call-arg]

    def _c1_compare(self, epoch: int, st: EpochC1, final: bool) -> None:
        """C1: pop the tuples all ranks agree on; report the first divergence (at the end of the stream: the ranks
        whose records ran out)."""
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
        st.index += agree(qs)
        if not all(qs):
            if not final or not any(qs):
                return
            # end of stream: some ranks have records the others never logged
            short = [r for r, q in zip(ranks, qs, strict=False) if not q]
            longq = next(q for q in qs if q)
            t0 = longq[0]
            for r in short:
                self._emit_c1(epoch, r, t0, st.index, f"rank {r} ends after {st.index} structural records; "
                              f"other ranks continue with {t0[0]}", t0[1])
            st.diverged = st.index
            return
        # the heads disagree
        if not final and min(map(len, qs)) < 2:
            return  # wait for one more tuple per rank to break ties
        self._c1_diverge(epoch, st, ranks, qs)

    def _c1_diverge(self, epoch: int, st: EpochC1, ranks: list[int], qs: list[deque]) -> None:
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
        for r, q in zip(ranks, qs, strict=False):
            if q[0][0] != ref:
                self._emit_c1(epoch, r, ref_item, st.index,
                              f"structural record #{st.index}: rank {r} has {_fmt(q[0][0])}, expected "
                              f"{_fmt(ref)} (ranks {[x for x, y in zip(ranks, qs, strict=False) if y[0][0] == ref]})",
                              q[0][1], ref_item)
        st.diverged = st.index
        st.queues.clear()
        st.qs = []
        st.qs_ranks = None

    def _emit_c1(self, epoch: int, rank: int, ref_item: tuple, index: int, msg: str, where: Event,
                 other: tuple | None = None) -> None:
        """C1 on ``rank`` at record ``where``; node and op of the expected queue item ``ref_item`` (tuple, record)."""
        seq, line, src = where.seq, where.line_no, where.src
        op = int_field(ref_item[1].fields.get("op"))
        f = Finding("C1", "C1", rank, epoch, ref_item[0][1], op, "exact", [seq], msg,
                    ERROR, src, line)
        f.evidence_lines = [line]
        self.findings.append(f)
