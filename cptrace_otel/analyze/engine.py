"""One analysis over an event stream of any number of ranks: per-rank :class:`RankChecker` plus :class:`CrossRank`.

Feed events in an order that keeps each rank's seq order (the sources do); ``result()`` returns the findings
(sorted most severe first), the unchecked rules and counters, plus the advisory fwd_hash localization
(:mod:`.localize`: never a finding, so it changes neither ``findings`` nor the exit code). Used by
``cptrace-otel check`` and the demo.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, TextIO

from ..checks import Finding, RankChecker, Unchecked
from ..checks.crossrank import CrossRank
from ..model.events import Event
from .localize import Localizer

_FWD_HASH = "fwd_hash"


@dataclasses.dataclass
class Result:
    findings: list[Finding]
    unchecked: list[Unchecked]
    stats: dict[str, Any]
    localization: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # advisory, see .localize

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}


class Analysis:
    """``Analysis(level=None, rank_levels=None, sampled=None)``: ``rank_levels`` are per-rank levels recorded by the
    exporter (OTLP resource ``cptrace.level``), used when no explicit level is given; ``sampled`` the sampled ranks'
    ``(run id, cptrace.sample)`` (OTLP resource), so the cross-rank rules do not call a sampled-out node missing."""

    def __init__(self, level: int | None = None, rank_levels: dict[int, int] | None = None,
                 sampled: dict[int, tuple[str, float]] | None = None) -> None:
        self.level = level
        self.rank_levels = rank_levels or {}
        self.checkers: dict[int, RankChecker] = {}
        self.cross = CrossRank(level)
        if sampled:   # rank -> (run id, fraction): a node missing there may have been sampled out
            self.cross.sampled = sampled
        self.findings: list[Finding] = []
        self.events = 0
        self.localizer = Localizer()

    def feed(self, ev: Event) -> list[Finding]:
        self.events += 1
        chk = self.checkers.get(ev.rank)
        if chk is None:
            chk = self.checkers[ev.rank] = RankChecker(ev.rank, self.level)
            if self.level is None and ev.rank in self.rank_levels:
                chk.config_level = self.rank_levels[ev.rank]
            chk.observe(_FWD_HASH, self.localizer.feed)   # only fwd_hash records reach the localizer
        out = chk.feed(ev)
        if out:
            self.findings.extend(out)
        self.cross.feed(ev)
        return out

    def run(self, events: Iterable[Event]) -> "Result":
        hint = getattr(events, "ranks", None)   # sources that know their ranks up front (log files)
        if hint:
            self.cross.expect_ranks(hint)
        # the same as calling self.feed per event, with the lookups hoisted (this loop is the hot path of `check`)
        checkers = self.checkers
        cross = self.cross.feed
        found = self.findings
        n = 0
        for ev in events:
            chk = checkers.get(ev.rank)
            if chk is None:   # first event of a rank: the full path (creates its checker, counts itself)
                self.feed(ev)
                continue
            n += 1
            out = chk.feed_fast(ev)
            if out:
                found.extend(out)
            cross(ev)
        self.events += n
        return self.result()

    def result(self, extra_stats: dict[str, Any] | None = None) -> Result:
        findings = list(self.findings)
        unchecked: list[Unchecked] = []
        for r in sorted(self.checkers):
            chk = self.checkers[r]
            findings.extend(chk.finish())
            unchecked.extend(chk.unchecked())
        if self.cross.level < 2 and any(c.level >= 2 for c in self.checkers.values()):
            self.cross.seen_level = 2
        findings.extend(self.cross.finish())
        unchecked.extend(self.cross.unchecked())
        findings.sort(key=Finding.sort_key)
        stats: dict[str, Any] = {
            "events": self.events,
            "ranks": sorted(self.checkers),
            "nodes": sum(c.nodes_total for c in self.checkers.values()),
            "levels": {r: c.level for r, c in sorted(self.checkers.items())},
        }
        if extra_stats:
            stats.update(extra_stats)
        return Result(findings, unchecked, stats, self.localizer.report())


def analyze_traces(level: int | None, info: Any, events: Iterable[Event], err: TextIO) -> Result:
    """One analysis of trace documents (OTLP files, Jaeger): per-rank levels and sampled ranks from their resources
    (``info``: :class:`~.sources.otlpfile.OtlpInfo`). When several streams are read and some have an unknown rank,
    says ``N streams with an unknown rank: cross-rank rules not run`` on ``err``, runs only the per-rank rules and
    puts N in ``stats["unknown_rank_streams"]`` (``check`` then exits 4 unless something was found)."""
    an = Analysis(level, info.levels, sampled=info.sampled)
    unknown = info.unknown_rank_streams() if len(info.streams) > 1 else 0
    if unknown:
        # their records would be compared as one rank "-1", or against the known ranks: say so instead of passing
        print(f"check: {unknown} streams with an unknown rank: cross-rank rules not run", file=err)
        an.cross.disabled = True
    res = an.run(events)
    if unknown:
        res.stats["unknown_rank_streams"] = unknown
    return res
