"""One analysis over an event stream of one run and any number of ranks: per-rank :class:`RankChecker` plus
:class:`CrossRank`. Several runs are analysed one at a time and folded by :class:`Runs` (:func:`analyze_traces`): no
rule ever sees records of two runs.

Feed events in an order that keeps each rank's seq order (the sources do); ``result()`` returns the findings
(sorted most severe first), the unchecked rules and counters, plus the advisory fwd_hash localization
(:mod:`.localize`: never a finding, so it changes neither ``findings`` nor the exit code). Used by
``cptrace-otel check`` and the demo.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from ..checks import Finding, RankChecker, Unchecked
from ..checks.crossrank import CrossRank
from ..checks.rules_l3 import L3Prior
from ..model.events import Event
from .localize import Localizer

if TYPE_CHECKING:
    from .sources.tracedocs import TraceDocs

_FWD_HASH = "fwd_hash"
RUN_BATCH = 2048   # records each stage of Analysis.run takes in turn (see there)


@dataclasses.dataclass
class Result:
    findings: list[Finding]
    unchecked: list[Unchecked]
    stats: dict[str, Any]
    localization: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # advisory, see .localize
    # run -> the run id its trace ids are made of, where that is not the run itself ("" none: a log folder's run)
    links: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}


class Analysis:
    """``Analysis(level=None, rank_levels=None, sampled=None, l3_prior=None)``: ``rank_levels`` are per-rank levels
    recorded by the exporter (OTLP resource ``cptrace.level``), used when no explicit level is given; ``sampled`` the
    sampled ranks' ``(run id, cptrace.sample)`` (OTLP resource), so the cross-rank rules do not call a sampled-out
    node missing; ``l3_prior`` the L3 backups of the runs analysed before this one
    (:class:`~cptrace_otel.checks.rules_l3.L3Prior`): this run's fetches of keys it never wrote are judged against
    them, and :meth:`run` adds this run's backups to it (as ``run``) when it finishes."""

    def __init__(self, level: int | None = None, rank_levels: dict[int, int] | None = None,
                 sampled: dict[int, tuple[str, float]] | None = None, l3_prior: L3Prior | None = None,
                 run: str = "") -> None:
        self.level = level
        self.rank_levels = rank_levels or {}
        self.checkers: dict[int, RankChecker] = {}
        self.cross = CrossRank(level)
        if sampled:   # rank -> (run id, fraction): a node missing there may have been sampled out
            self.cross.sampled = sampled
        self.findings: list[Finding] = []
        self.events = 0
        self.localizer = Localizer()
        self.l3_prior, self.run_name = l3_prior, run

    def feed(self, ev: Event) -> list[Finding]:
        """One record to its rank's rules and to the cross-rank rules; the per-rank findings it completes."""
        out = self.feed_rank(ev)
        self.cross.feed(ev)
        return out

    def feed_rank(self, ev: Event) -> list[Finding]:
        """One record to its rank's rules only (the caller feeds :attr:`cross` itself, in its own merge order: a
        ``serve --live`` replica); the findings it completes, also kept in :attr:`findings`."""
        self.events += 1
        chk = self.checkers.get(ev.rank)
        if chk is None:
            chk = self.checkers[ev.rank] = RankChecker(ev.rank, self.level)
            chk.l3_prior = self.l3_prior
            if self.level is None and ev.rank in self.rank_levels:
                chk.config_level = self.rank_levels[ev.rank]
            chk.observe(_FWD_HASH, self.localizer.feed)   # only fwd_hash records reach the localizer
        out = chk.feed(ev)
        if out:
            self.findings.extend(out)
        return out

    def run(self, events: Iterable[Event], findings_only: bool = False) -> Result:
        """Feed every record of ``events``, then :meth:`result` (``findings_only`` as there)."""
        hint = getattr(events, "ranks", None)   # sources that know their ranks up front (log files)
        if hint:
            self.cross.expect_ranks(hint)
        # The same as calling self.feed per event, with the lookups hoisted (this loop is the hot path of `check`),
        # a batch of records at a time: the per-rank rules over the batch, then the cross-rank rules over it. The two
        # stages share no state (feed_rank's contract: a `serve --live` replica feeds the cross-rank rules in its
        # own order), and each runs with its own code and data in the CPU's caches: over 400k log lines, one record
        # through both in turn took 2.02-2.25 s, batches of 2,048 1.62-1.75 s.
        checkers = self.checkers
        cross = self.cross.feed
        found = self.findings
        n = 0
        it = iter(events)
        while batch := list(itertools.islice(it, RUN_BATCH)):
            for ev in batch:
                chk = checkers.get(ev.rank)
                if chk is None:   # first event of a rank: the full path (creates its checker, counts itself)
                    self.feed_rank(ev)
                    continue
                n += 1
                out = chk.feed_fast(ev)
                if out:
                    found.extend(out)
            for ev in batch:
                cross(ev)
        self.events += n
        res = self.result(findings_only=findings_only)
        if self.l3_prior is not None:
            self.l3_prior.absorb(self.run_name, self.checkers.values())
        return res

    def result(self, extra_stats: dict[str, Any] | None = None, findings_only: bool = False) -> Result:
        """The end of the stream: every finding, sorted; the unchecked rules, the stats and the localization, unless
        ``findings_only`` (a ``serve`` replica's trace, which reports findings alone: the rest costs more than a
        small trace's records, and the findings are the same either way)."""
        findings = list(self.findings)
        unchecked: list[Unchecked] = []
        for r in sorted(self.checkers):
            chk = self.checkers[r]
            findings.extend(chk.finish())
            if not findings_only:
                unchecked.extend(chk.unchecked())
        if self.cross.level < 2 and any(c.level >= 2 for c in self.checkers.values()):
            self.cross.seen_level = 2
        findings.extend(self.cross.finish())
        findings.sort(key=Finding.sort_key)
        if findings_only:
            return Result(findings, [], {"events": self.events})
        unchecked.extend(self.cross.unchecked())
        stats: dict[str, Any] = {
            "events": self.events,
            "ranks": sorted(self.checkers),
            "nodes": sum(c.nodes_total for c in self.checkers.values()),
            "levels": {r: c.level for r, c in sorted(self.checkers.items())},
        }
        if extra_stats:
            stats.update(extra_stats)
        return Result(findings, unchecked, stats, self.localizer.report())


class Runs:
    """The results of several runs, analysed one at a time, folded into one :class:`Result` as they finish.

    ``add(run, result)`` tags each finding (and each localization entry) with its run; the same unchecked entry of
    several runs is listed once with ``runs`` counting them (and ``count`` summed), so neither memory nor the report
    grows with the number of clean runs. ``stats`` sums events and nodes, joins ranks and levels, and adds ``runs``
    (how many) and ``runs_with_findings`` (run -> findings, only the runs that have some)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.unchecked: dict[tuple, Unchecked] = {}
        self.localization: list[dict[str, Any]] = []
        self.events = self.nodes = self.runs = 0
        self.ranks: set[int] = set()
        self.levels: dict[int, int] = {}
        self.with_findings: dict[str, int] = {}
        self.extra: dict[str, Any] = {}
        self.links: dict[str, str] = {}

    def add(self, run: str | None, res: Result) -> None:
        """One run's result; ``run`` None: a result of :meth:`result` (runs already named) folded in."""
        if run is None:
            self.runs += res.stats.get("runs", 1)
            for r, n in res.stats.get("runs_with_findings", {}).items():
                self.with_findings[r] = self.with_findings.get(r, 0) + n
            self.links.update(res.links)
        else:
            self.runs += 1
            for f in res.findings:
                f.run = run
            for e in res.localization:
                e["run"] = run
            if res.findings:
                self.with_findings[run] = self.with_findings.get(run, 0) + len(res.findings)
        self.findings.extend(res.findings)
        for u in res.unchecked:
            key = (u.rule, u.code, u.rank, u.need_level, u.reason, u.kind)
            have = self.unchecked.get(key)
            if have is None:
                self.unchecked[key] = u
            else:
                have.runs += u.runs
                have.count += u.count
                have.examples.extend(u.examples[:max(0, 5 - len(have.examples))])
        self.localization.extend(res.localization)
        st = res.stats
        self.events += st.get("events", 0)
        self.nodes += st.get("nodes", 0)
        self.ranks.update(st.get("ranks", ()))
        for r, lvl in st.get("levels", {}).items():
            self.levels[r] = max(self.levels.get(r, 0), lvl)
        for k, v in st.items():   # counters a source added (unknown_rank_streams)
            if k not in ("events", "nodes", "ranks", "levels", "runs") and isinstance(v, int):
                self.extra[k] = self.extra.get(k, 0) + v

    def result(self) -> Result:
        self.findings.sort(key=Finding.sort_key)
        stats: dict[str, Any] = {"events": self.events, "ranks": sorted(self.ranks), "nodes": self.nodes,
                                 "levels": dict(sorted(self.levels.items())), **self.extra,
                                 "runs": self.runs, "runs_with_findings": self.with_findings}
        return Result(self.findings, list(self.unchecked.values()), stats, self.localization, dict(self.links))


def analyze_traces(level: int | None, docs: TraceDocs, err: TextIO, runs: Runs | None = None,
                   l3_prior: L3Prior | None = None) -> Result:
    """Every run of trace documents (OTLP files, Jaeger; ``docs``: :class:`~.sources.tracedocs.TraceDocs`), one
    :class:`Analysis` each, one run after the other (a run's state is dropped once it is finished), folded by
    :class:`Runs`: every rule, per-rank and cross-rank, judges one run. Per-rank levels and sampled ranks come from
    each run's resources. When several streams are read and some have an unknown rank, says ``N streams with an
    unknown rank: cross-rank rules not run`` on ``err``, runs only the per-rank rules and puts N in
    ``stats["unknown_rank_streams"]`` (``check`` then exits 4 unless something was found). ``runs``, when given, is
    the fold to add to; ``l3_prior`` the L3 backups of runs read before (a fresh one when None): each run's L3
    fetches of keys it never wrote are judged against the backups of the runs before it (FOREIGN, L3a), nothing else
    crosses runs."""
    info = docs.info
    unknown = info.unknown_rank_streams() if len(info.streams) > 1 else 0
    if unknown:
        # their records would be compared as one rank "-1", or against the known ranks: say so instead of passing
        print(f"check: {unknown} streams with an unknown rank: cross-rank rules not run", file=err)
    runs = runs if runs is not None else Runs()
    prior = l3_prior if l3_prior is not None else L3Prior()
    for run, events in docs.runs():
        an = Analysis(level, info.run_levels.get(run), sampled=info.run_sampled.get(run), l3_prior=prior, run=run)
        if unknown:
            an.cross.disabled = True
        runs.add(run, an.run(events))
    res = runs.result()
    res.stats.pop("unknown_rank_streams", None)
    if unknown:
        res.stats["unknown_rank_streams"] = unknown
    return res
