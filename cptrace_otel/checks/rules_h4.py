"""H4, page recycled before backup completes (docs/domain.md §4, level 2): the source pages of an in-flight
device->host copy
are freed or reassigned before its ack.

The handlers mark each open write's first proven breach: (a) on its device
side between its backup and its ack (a ``free pool=dev``, a dev eviction of its lineage, an ``insert``/``reload`` of
another lineage taking its slots) and (b) on its host side between its prepare and its ack (a ``free pool=host``, a
host eviction, a ``prepare``/``reload`` of another lineage). The d2h ack reports H4a/H4b (:meth:`H4Recycle._h4`); a
copy whose ack never comes is H4-open (WARN) at the end of the stream (:meth:`H4Recycle._h4_open`). An overlap that
the ``rng`` summaries cannot decide (:func:`.ranges.overlap` says "interval") is no breach: a copy whose only
overlaps were such is counted as undecidable for H4a/H4b at its ack (or at the end), never reported as a finding.
"""

from __future__ import annotations

from ..model.events import Event
from .findings import WARN, Finding
from .lineage import PendingWrite
from .ranges import EXACT, Slots, overlap
from .rank_base import RankRuleBase


class H4Recycle(RankRuleBase):
    def _h4(self, ev: Event, ref: tuple, w: PendingWrite, op: int | None, wop: int | None, out: list[Finding]) -> None:
        """H4a/H4b at the d2h ack (for op ``op``) of write ``w``, which has a breach (appended to ``out``) or an
        undecidable overlap (counted)."""
        for rule, v, u in (("H4a", w.viol_a, w.undec_a), ("H4b", w.viol_b, w.undec_b)):
            if v is None:
                if u is not None:
                    self._undecidable(rule, "H4", w.origin, u)
                continue
            vref, cert, what = v
            start = w.b_ref if rule == "H4a" and w.b_ref is not None else w.p_ref
            out.append(self._finding("H4", rule, w.origin, wop, cert, [start, vref, ref],
                                     f"{what} before the d2h ack of op {op} (node {w.origin}): the backup may "
                                     "hold foreign bytes", ev))

    def _h4_open(self, out: list[Finding]) -> None:
        """End of stream: every write still open after a breach (H4-open, WARN), appended to ``out``."""
        for w in self.st.writes.values():
            for rule, v, u in (("H4a", w.viol_a, w.undec_a), ("H4b", w.viol_b, w.undec_b)):
                if v is None:
                    if u is not None:
                        self._undecidable(rule, "H4", w.origin, u)
                    continue
                ref, cert, what = v
                out.append(self._finding("H4", "H4-open", w.origin, w.op(), cert, [w.p_ref, ref],
                                         f"{what} while the d2h copy of op {w.op()} was in flight ({rule}); "
                                         "its ack never arrived", severity=WARN))

    def _h4_breach(self, s: Slots | None, attr: str, exclude: int | None, ref: tuple, what: str,
                   side: str) -> None:
        """Mark H4 (``side`` "a": ``attr`` "dev"; "b": "host") on every in-flight d2h copy (of another lineage
        than ``exclude``) whose dev/host ⊓ ``s``: a proven overlap is a breach, an undecidable one is noted."""
        if s is None:
            return
        writes = self.st.writes
        if not writes or s.cnt <= 0:   # (overlap() of an empty set is None)
            return
        lo, hi = s.lo, s.hi
        a_side = side == "a"
        on_dev = attr == "dev"
        for w in writes.values():
            ws = w.dev if on_dev else w.host
            # the hull test of overlap() first, inline: most in-flight copies are nowhere near ``s``
            if ws is None or ws.cnt <= 0 or ws.hi < lo or hi < ws.lo:
                continue
            if exclude is not None:
                frags = w.frags
                if frags[0][0] == exclude if len(frags) == 1 else any(f[0] == exclude for f in frags):
                    continue
            c = overlap(s, ws)
            if c is None:
                continue
            if c != EXACT:
                if a_side:
                    if w.undec_a is None:
                        w.undec_a = what
                elif w.undec_b is None:
                    w.undec_b = what
                continue
            if a_side:
                if w.viol_a is None:
                    w.viol_a = (ref, c, what)
                    if self.free_owner is None:
                        self.free_owner = w.origin
            elif w.viol_b is None:
                w.viol_b = (ref, c, what)
                if self.free_owner is None:
                    self.free_owner = w.origin

    def _h4_evicted(self, writes: list[PendingWrite], side: str, ref: tuple, what: str) -> None:
        """An eviction (``side`` "a": device, "b": host) of the node these in-flight writes copy: an exact breach."""
        v = (ref, EXACT, what)
        if side == "a":
            for w in writes:
                if w.viol_a is None:
                    w.viol_a = v
        else:
            for w in writes:
                if w.viol_b is None:
                    w.viol_b = v
