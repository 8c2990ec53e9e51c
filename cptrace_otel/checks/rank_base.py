"""What the per-rank rule classes (``rules_*.py``) share with :class:`~.rank.RankChecker`, which mixes them in: the
checker's state and the two ways a rule reports (a :class:`Finding`, or a counted skip).

A rule method reads the lineage state (``self.st``, :mod:`.lineage`) as the per-tag handler of
:class:`~.rank.RankChecker` leaves it when it calls the rule, and returns its finding (or appends its findings to the
handler's list); it never dispatches records itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model.events import LEVEL_OF_TAG, Event
from .epochs import EPOCH_TAGS
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
    forced_level: int | None
    seen_level: int
    _config_level: int | None = None
    # the checker's level (:attr:`level`) as the hot paths read it: refreshed whenever one of its three inputs
    # changes (the forced level is set once; config_level by its setter, also when the analysis sets it from the
    # source's recorded level; seen_level by feed_fast)
    _lv: int

    @property
    def level(self) -> int:
        """Explicit level, else ``config level=``, else the highest level whose records occurred (docs/domain.md
        §3.4)."""
        if self.forced_level is not None:
            return self.forced_level
        if self._config_level is not None:
            return self._config_level
        return self.seen_level

    @property
    def config_level(self) -> int | None:
        """The level a ``config`` record stated, or the level the source recorded for the rank (set by the
        analysis before the rank's first record)."""
        return self._config_level

    @config_level.setter
    def config_level(self, v: int | None) -> None:
        self._config_level = v
        self._lv = self.level

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


# handler(checker, ev, ev.fields, node_id, (seq, line_no)); node_id is an int for the keyed tags (the rest get the
# raw value)
Handler = Callable[[Any, Event, dict, Any, tuple], "list[Finding] | None"]
# tag -> the name of its handler on the checker's class
HANDLERS = {
    "config": "_config", "insert": "_insert", "split": "_split", "prepare": "_prepare", "backup": "_backup",
    "ack": "_ack", "evict": "_evict", "free": "_free", "reload": "_reload", "compose": "_compose",
    "kv_canary": "_canary", "l3_backup": "_l3_backup_all", "l3_prefetch": "_l3_prefetch", "l3_ack": "_l3_ack_all",
    "l3_hit": "_l3_hit", "audit": "_audit", "swa": "_swa", "mamba": "_mamba", "ld_start": "_ld_start",
    "ld_layer": "_ld_layer", "ld_read": "_ld_read",
}
# handlers that also run for a record without an int node_id
_UNKEYED = frozenset(("config", "free", "kv_canary", "l3_prefetch", "l3_ack", "ld_start", "ld_layer", "ld_read"))
_TABLES: dict[type, dict[str, tuple[int, Handler | None, bool, bool]]] = {}


def handler_table(cls: type) -> dict[str, tuple[int, Handler | None, bool, bool]]:
    """``cls``'s per-tag table, made once per class: tag -> (level of the tag, its handler as a plain function,
    whether the record can move the epoch tracker, whether the handler needs an int node_id). Shared by every
    checker of the class; a checker that adds to it (``observe``) copies it first."""
    tab = _TABLES.get(cls)
    if tab is None:
        levels = {**dict.fromkeys(HANDLERS, 1), **LEVEL_OF_TAG}   # (a handled tag the grammar lacks: level 1)
        tab = _TABLES[cls] = {tag: (lv, getattr(cls, HANDLERS[tag]) if tag in HANDLERS else None, tag in EPOCH_TAGS,
                                    tag not in _UNKEYED) for tag, lv in levels.items()}
    return tab


# (checker class, the tags observed) -> its table (observed_table)
_OBSERVED: dict[tuple[type, frozenset[str]], dict[str, tuple[int, Handler | None, bool, bool]]] = {}


def observed_table(cls: type, tags: frozenset[str]) -> dict[str, tuple[int, Handler | None, bool, bool]]:
    """``cls``'s table (:func:`handler_table`) where each tag of ``tags`` first calls the checker's observers of it
    (``checker._observers[tag]``, set by ``RankChecker.observe``), then the tag's rule as its own entry would. Made
    once per (class, tags) and shared, like the class's table."""
    key = (cls, tags)
    tab = _OBSERVED.get(key)
    if tab is None:
        base = handler_table(cls)
        tab = _OBSERVED[key] = dict(base)
        for t in tags:
            lv, rule, moves, keyed = base.get(t, (LEVEL_OF_TAG.get(t, 1), None, t in EPOCH_TAGS, False))
            tab[t] = (lv, _observed(t, rule, keyed), moves, False)
    return tab


def _observed(tag: str, rule: Handler | None, keyed: bool) -> Handler:
    def observed(chk: Any, ev: Event, f: dict, nid: object, ref: tuple) -> list[Finding] | None:
        for fn in chk._observers[tag]:
            fn(ev)
        if rule is None or (keyed and type(nid) is not int):
            return None
        return rule(chk, ev, f, nid, ref)
    return observed
