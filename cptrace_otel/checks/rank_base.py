"""What the per-rank rule classes (``rules_*.py``) share with :class:`~.rank.RankChecker`, which mixes them in: the
checker's state and the two ways a rule reports (a :class:`Finding`, or a counted skip).

A rule method reads the lineage state (``self.st``, :mod:`.lineage`) as the per-tag handler of
:class:`~.rank.RankChecker` leaves it when it calls the rule, and returns its finding (or appends its findings to the
handler's list); it never dispatches records itself.
"""

from __future__ import annotations

from typing import Any

from ..model.events import Event
from .findings import ERROR, UNDECIDABLE, WARN, Finding, Unchecked
from .lineage import EpochState
from .ranges import EXACT


class RankRuleBase:
    rank: int
    epoch: int
    mode: str
    st: EpochState
    _skips: dict[Any, Unchecked]
    # after a ``free`` without a node: the node whose in-flight copy it newly breached (the first one), else None;
    # set by the H2c and H4 breach marks (rules_h2 documents it), reset by the free's handler
    free_owner: int | None = None

    def _finding(self, code: str, rule: str, node_id: int | None, op: int | None, cert: str, refs: list, msg: str,
                 ev: Event | None = None, severity: str = ERROR) -> Finding:
        """A finding of this rank and epoch; ``refs`` are the (seq, line_no) of its evidence (None entries are
        dropped), reported in seq order; ``ev`` is the record that completed it. Non-exact findings are WARNs."""
        refs = sorted({r for r in refs if r is not None})
        f = Finding(code, rule, self.rank, self.epoch, node_id, op, cert, [r[0] for r in refs], msg,
                    severity if cert == EXACT else WARN)
        f.evidence_lines = [r[1] for r in refs]
        if ev is not None:
            f.src, f.line_no = ev.src, ev.line_no
        return f

    def _skip(self, rule: str, code: str, node_id: int | None, reason: str, kind: str = "skip", level: int = 1) -> None:
        """Count one instance of ``rule`` that could not be decided (an ``Unchecked`` of kind "skip", or of
        ``kind`` "undecidable": a slot overlap the ``rng`` summaries can neither prove nor rule out)."""
        key = rule if kind == "skip" else (kind, rule)
        u = self._skips.get(key)
        if u is None:
            self._skips[key] = Unchecked(rule, code, self.rank, level, reason, kind, 1, [node_id])
        else:
            u.count += 1
            if len(u.examples) < 5 and node_id not in u.examples:
                u.examples.append(node_id)

    def _undecidable(self, rule: str, code: str, node_id: int | None, what: str) -> None:
        """One instance of ``rule`` whose only breach is an interval overlap of ``rng`` summaries (``what``): not a
        finding (the real allocator scatters slots, so unrelated ranges' hulls overlap), counted and reported."""
        self._skip(rule, code, node_id, f"interval overlap the rng summaries cannot decide ({what}); exact sets "
                   "(devx/hostx/idx_x) would", UNDECIDABLE, 2)
