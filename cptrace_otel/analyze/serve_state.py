"""The state of one ``cptrace-otel serve`` replica: records held by node trace, checked when the trace goes idle.

Behind the collector's ``loadbalancing`` exporter (routing key ``traceID``) a replica receives whole traces: every
rank's spans of a node trace (``blake2b(run|epoch|node)``), and whole rank traces, but only some of a run's nodes.
So the unit of checking is the trace, not the rank's stream:

* :meth:`ServeState.add` holds the records of each (run id, trace id) as they arrive, by rank, with the span of each
  record (for the write-back's evidence links).
* :meth:`ServeState.sweep` finalises every trace idle for ``idle_s`` (no new record): its records, each rank's in
  (epoch, seq) order, the ranks merged by ``ts``, go through a fresh :class:`~.engine.Analysis` (the rules ``check``
  runs: a :class:`~cptrace_otel.checks.RankChecker` per rank and
  :class:`~cptrace_otel.checks.crossrank.CrossRank`), end of stream included, and its state is freed.
* Each rank's ``config`` record sits in its rank trace (usually on another replica), so the exporter stamps it on
  the resource of every request (:mod:`~cptrace_otel.model.config_stamp`); the intake hands it over with each span
  and a trace's check starts each rank's records with it (:func:`with_config`): the cross-rank rules know the CP
  group size, mode and IO rank. Without it C1 compared the ranks seen so far as the whole group and reported the
  later ones as diverged (52 false C1 findings on a clean 4-rank sharded simulator run, 0 with it).
* Live (``live=True``, ``serve --live``): each held trace has a :class:`~.serve_live.LiveCheck`, a fresh
  :class:`~.engine.Analysis` fed each rank's records (led by its config record) in (epoch, seq) order through a
  small reorder window per rank (``window`` records, ``window_s`` seconds; a record behind it is not fed and is
  counted in :attr:`ServeState.past_window`), and its cross-rank rules the ranks merged by ``ts`` as on the idle
  path, as far as every rank of the CP group has sent (:func:`~.serve_trace.merge_facts` tells it the group). A
  finding is reported as soon as the record that decides it is fed; the end-of-stream ones (H4-open) at the
  finalisation. Only each rank's first record is held (for the moved-trace test at the finalisation: a tail found
  then is reported UNCHECKED, though per-rank findings of it may have been reported already; its cross-rank merge
  never started, as a tail lacks a rank's first lane span). A record whose (rank, seq) the trace already has (a
  batch sent again) is dropped and counted in :attr:`ServeState.duplicates`.
* Only the rules that a trace's records decide by themselves are reported (:data:`TRACE_RULES`, exact: the same
  findings as ``check`` over the whole run; :data:`LOCKSTEP_RULES`, exact while the run's ranks stay in lockstep,
  and only on a trace whose every rank came with a config stamp; :data:`PARTIAL_RULES`, whose findings are real but
  which can miss one whose evidence sits in another trace, a split's parent). The others need a rank's whole stream
  or the order of the whole run: their findings on a trace in isolation are not trusted, so they are dropped and
  counted in :attr:`ServeState.suppressed` (rule -> findings), never passed silently.
* A trace whose check raises (a bug, or an input no rule foresaw) is reported on stderr as NOT checked and counted
  in :attr:`ServeState.errors`; the replica goes on with the others.
* Records of a trace that arrive after it was finalised (a span later than ``idle_s``) are not checked again (no
  finding doubled): they are counted in :attr:`ServeState.late`. The finalised trace ids of a run are kept (at most
  :data:`MAX_DONE` per run) until the run is finished.
* With a :class:`~.serve_journal.Journal` (``--state-dir``), which traces were held, checked and emitted
  survives the process: a trace checked before a restart stays late, one whose state died is reported through
  :meth:`ServeState.lost` (UNCHECKED, counted in :attr:`ServeState.unchecked`) and its later records are counted,
  not checked; a finding emitted before is not emitted again.
* A node trace lacking a rank's first records (:func:`~.serve_journal.ranks_without_start`: the resolver moved
  it here mid-life) is not checked: reported through :meth:`ServeState.lost` with reason :data:`CUT`. One holding
  records of fewer ranks than its CP group (``cp_size`` of the stamps) is checked without :data:`LOCKSTEP_RULES`
  and reported through :meth:`ServeState.lost` with reason :data:`GROUP_SHORT` (no record counted lost).
* With a :class:`~.serve_confirm.StoreConfirm` (``confirm``, ``serve --confirm-url``), a trace whose end decided a
  finding of :data:`END_DECIDED` is first looked up in the span store: if the store holds records of it that never
  came here (a head whose tail the resolver moved away), those findings are not reported and the trace is reported
  through :meth:`ServeState.lost` with reason :data:`~.serve_confirm.MOVED`.
* Scope run (``scope="run"``, ``serve --scope run``, behind a ``loadbalancing`` exporter keyed by the run id): every
  span of a run is held under one id (:data:`RUN_TRACE`, :meth:`ServeState.held_id`) and checked live as one stream,
  each rank's records of every node through its reorder window, the ranks merged as soon as every rank of the CP
  group (the config stamps) has records queued: ``check``'s analysis over the whole run, so every rule's findings are
  reported (none suppressed, :func:`unchecked_rules` is empty) and no trace is cut or short. It takes no span store.
* Memory: at most ``max_nodes`` traces held (past it, the least recently changed is finalised early, counted in
  :attr:`ServeState.early`) and ``max_runs`` runs (past it, the least recently changed run is finished: its traces
  finalised early). A run with no held trace and nothing new for ``run_idle_s`` is finished and forgotten.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..checks import Finding
from ..model.trace_ids import lane_span_id
from .otlp_intake import SpanRecords
from .serve_confirm import MOVED, StoreConfirm
from .serve_journal import Journal, finding_id, trace_node
from .serve_live import MERGE_CAP, WINDOW, WINDOW_S, LiveCheck
from .serve_trace import TraceState, check_trace, from_spans, is_cut, joins_trusted, merge_facts, with_config

# rules whose findings on one trace are exactly those of ``check`` over the whole run (per rank, about one node).
# Not H1a, H1b nor H2a: on real SGLang (4 sharded ranks) a node split more than once has its lineage in the other
# fragments' traces, and one trace alone gave false findings (healthy run: 4 H1b, 4 H2a; with a flipped stripe: 4
# H1a); the simulator's runs show it since its near-miss segment splits a node twice while its write is pending
# (bench/serve_trace_rules.py: 12 one-trace H1b on the 20 runs, one per rank of each clean 4-rank run)
# H2c and H4: a free SGLang makes by index (``free node_id=-1``) that breaks the copy is put in the copy's node trace
# by the exporter (cptrace_otel.model.spans), and H2c is reported at the reload node's own ack, which that trace holds
TRACE_RULES = frozenset(("H2c", "H4a", "H4b", "H4-open", "ZERO@backup", "ZERO@reload"))
# rules whose findings on one trace are real, but which may miss one whose evidence is in another trace: HASH across
# a split (the backup hash is the parent's), H2b/H3 over a chain or a compose of several nodes (their state is in
# the other nodes' traces: a node not seen is unknown to the rule, which then does not judge it)
PARTIAL_RULES = frozenset(("HASH", "H2b", "H3"))
# cross-rank joins over one node's records on every rank (C3 backup participation, C4 count relations, C5 content
# relations), with the group size, mode and IO rank from each rank's config stamp (cptrace_otel.model.config_stamp):
# exact while the run's ranks stay in lockstep. After a C1 divergence, which ``check`` reports and a replica cannot
# see (it is in the order of the whole stream), ``check`` stops judging later nodes (their ids may no longer line
# up) while a replica judges each node trace apart: it may then report C3-C5 on a node ``check`` no longer judges
LOCKSTEP_RULES = frozenset(("C3", "C4", "C5"))
# findings a trace's end decides that a trace cut by a resolver change can make false (the later records of a rank
# went to another replica): a join without that rank's side, a backup whose ack went away. With a span store to ask
# (serve --confirm-url, serve_confirm) they are reported only when the store holds no record that did not come here
END_DECIDED = LOCKSTEP_RULES | frozenset(("H4-open",))
# the registry's rule ids (cptrace_otel.checks.registry) whose findings a replica reports, exact or partial
REPORTED_IDS = frozenset(("H2c", "H4", "ZERO", "HASH", "H2b", "H3", "C3", "C4", "C5"))
CUT = ("first records not seen here (moved here mid-life by a resolver change, or begun on a replica since "
       "removed): not checked alone")
GROUP_SHORT = ("records of fewer ranks than the CP group has (the others' went to another replica, or came before "
               "this one): its cross-rank joins C3-C5 not checked here")
MERGE_GONE = ("more records waited in the live cross-rank merge for a rank of the group than it holds: its "
              "cross-rank joins C3-C5 not checked from there on")
SCOPES = ("trace", "run")   # what a replica holds and checks as one: a trace, or a whole run (serve --scope)
RUN_TRACE = "run"           # the id a run-scope replica holds a run's records under (not a trace id)
MAX_DONE = 200_000   # finalised trace ids remembered per run (a late span of one is counted, not checked again)
# records one trace holds (idle-only) or remembers the spans of (live) before its records so far are checked as one
# segment: a rank trace lives as long as its run (SGLang's device frees by index land there, one per finished
# request), so without it a long run's rank traces would grow without bound
MAX_TRACE_RECORDS = 200_000


def unchecked_rules(scope: str = "trace") -> list[str]:
    """The registry's rule ids a replica does not check (they need a rank's whole stream or the whole run's order),
    live or idle-only alike: stated at start and in the summary, so a run with a fault only they find is never read
    as clean. None in scope run (the replica holds the whole run)."""
    from ..checks.registry import RULES

    return [r.id for r in RULES if r.id not in REPORTED_IDS] if scope == "trace" else []


class RunState:
    __slots__ = ("run_id", "done", "changed", "traces", "findings", "events")

    def __init__(self, run_id: str, now: float) -> None:
        self.run_id = run_id
        self.done: OrderedDict[str, None] = OrderedDict()   # finalised trace ids (late spans are not re-checked)
        self.changed = now
        self.traces = 0      # traces held now
        self.findings = 0
        self.events = 0


Report = Callable[[TraceState, list[Finding]], None]
Unchecked = Callable[[str, str, str, int], None]   # (run id, trace id, why, records) of a trace NOT checked


class ServeState:
    """See the module doc. ``report(trace, findings)`` receives each finalised trace's findings (possibly none)
    and ``note(text)`` the lines for stderr. Not thread-safe: one checking thread owns it."""

    def __init__(self, report: Report, idle_s: float = 30.0, max_nodes: int = 100_000, max_runs: int = 256,
                 run_idle_s: float | None = None, note: Callable[[str], None] = lambda s: None,
                 journal: Journal | None = None, unchecked: Unchecked | None = None, live: bool = False,
                 window: int = WINDOW, window_s: float = WINDOW_S, merge_cap: int = MERGE_CAP,
                 max_trace_records: int = MAX_TRACE_RECORDS, confirm: StoreConfirm | None = None,
                 scope: str = "trace") -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")
        if scope == "run" and (not live or confirm is not None):
            raise ValueError("scope run: a run's records are checked live (live=True), and no span store is asked")
        self.scope = scope   # "run": every span of a run held as one stream, every rule reported (module doc)
        self.report, self.note = report, note
        self.confirm = confirm                       # the span store that tells a cut head from a whole trace
        self.journal = journal                       # serve_journal: restart-safe late/lost and finding ids
        self.on_unchecked = unchecked or (lambda run_id, trace_id, why, n: None)
        self.unchecked = Counter[tuple[str, str]]()  # (run id, why) -> traces reported UNCHECKED
        self.unchecked_records = 0                   # the records those traces held (they died unchecked)
        self.idle_s, self.max_nodes, self.max_runs = idle_s, max(1, max_nodes), max(1, max_runs)
        self.run_idle_s = max(idle_s, 60.0) if run_idle_s is None else run_idle_s
        self.traces: OrderedDict[tuple[str, str], TraceState] = OrderedDict()   # least recently changed first
        self.runs: dict[str, RunState] = {}
        self.events_checked = 0
        self.findings = Counter[tuple[str, str]]()   # (run id, code) -> findings reported
        self.suppressed = Counter[str]()             # rule -> findings not trusted on one trace (not reported)
        self.late = 0        # records of a trace that arrived after it was finalised (not checked)
        self.early = 0       # traces finalised before their idle window (a memory bound was hit)
        self.newest_ts = 0   # the newest record time seen (ns), for the lag
        self.errors = 0      # traces whose check raised (reported on stderr, counted: never a silent pass)
        self.live, self.window, self.window_s, self.merge_cap = live, window, window_s, merge_cap
        self.max_trace_records = max(1, max_trace_records)
        self.segments = 0     # segments checked of traces that reached max_trace_records
        self.due: deque[tuple[float, tuple[str, str]]] = deque()   # (arrival, trace) of records in a window
        self.past_window = 0  # records behind their rank's reorder window (not fed: said at finalisation)
        self.duplicates = 0   # records whose (rank, seq) the trace already had (sent again: dropped)
        self.withheld = Counter[str]()   # rule -> end-of-trace findings of a trace the span store showed cut here
        self.rechecked = 0   # tails (first records not seen here) checked whole from the span store

    @property
    def records_held(self) -> int:
        """Records held: live, those in the reorder windows and the cross-rank merges; idle-only, every record of
        the held traces."""
        return sum(t.records if t.live is None else t.live.held + t.live.xheld for t in self.traces.values())

    def held_id(self, s: SpanRecords) -> str:
        """The id the records of span ``s`` are held under: its trace's, or (scope run) :data:`RUN_TRACE`."""
        return s.trace_id if self.scope == "trace" else RUN_TRACE

    def add(self, spans: list[SpanRecords], now: float | None = None) -> None:
        """Hold the records of ``spans`` (one decoded request)."""
        now = time.monotonic() if now is None else now
        touched: dict[tuple[str, str], TraceState] = {}
        for s in spans:
            run = self.runs.get(s.run_id)
            if run is None:
                if len(self.runs) >= self.max_runs:
                    oldest = min(self.runs.values(), key=lambda r: r.changed)
                    self._finish_run(oldest, f"more than {self.max_runs} runs at once (--max-runs): the least "
                                             "recently changed is finished early")
                run = self.runs[s.run_id] = RunState(s.run_id, now)
            run.changed = now
            tid = self.held_id(s)
            if tid in run.done:
                self.late += len(s.events)
                continue
            key = (s.run_id, tid)
            tr = self.traces.get(key)
            if tr is None:
                why = self.journal.state_of(s.run_id, tid) if self.journal is not None else None
                if why is not None:   # checked before a restart (late), or its state died with the process (lost)
                    if why == "late":
                        self.late += len(s.events)
                    else:
                        self.journal.lost_records += len(s.events)   # type: ignore[union-attr]
                    continue
                if len(self.traces) >= self.max_nodes:
                    self._finalise(next(iter(self.traces.values())), early=True)
                tr = self.traces[key] = TraceState(s.run_id, tid, now)
                if self.live:
                    tr.live = LiveCheck(tr.levels, self.window, self.window_s, self.merge_cap)
                run.traces += 1
            else:
                self.traces.move_to_end(key)
                tr.changed = now
            live, refs = tr.live, tr.refs
            if live is not None and s.events:
                merge_facts(tr, live, s, whole_run=self.scope == "run")
            n = 0
            for ev in s.events:
                rk = (ev.rank, ev.seq)
                # the same record again (a batch the collector resent; or a config record whose stamp led its rank
                # here, in a rank trace or a run scope): checked once
                if rk in refs or (live is not None and rk in live.led):
                    self.duplicates += 1
                    continue
                if s.level is not None:
                    tr.levels[ev.rank] = s.level
                if s.config is not None:
                    tr.configs[ev.rank] = s.config
                if ev.ts > self.newest_ts:
                    self.newest_ts = ev.ts
                n += 1
                if live is None:
                    refs[rk] = s.ref
                    if not tr.broken:
                        tr.ranks.setdefault(ev.rank, []).append(ev)
                    continue
                refs[rk] = s.ref
                if ev.rank not in tr.ranks:   # the rank's first record here: led by its config record
                    tr.ranks[ev.rank] = [ev]   # (kept for the moved-trace test at the finalisation)
                    for cfg in with_config(tr, ev.rank, [])[:1]:
                        if (cfg.epoch, cfg.seq) != (ev.epoch, ev.seq):   # (not the config record itself)
                            try:
                                live.lead(cfg)
                            except Exception as e:   # as in _feed: this trace is NOT checked from here on
                                self._broken(tr, e)
                    if tr.live is None:
                        live = None
                        continue
                if not live.push(ev, now):
                    self.past_window += 1
            tr.records += n
            if len(tr.refs) >= self.max_trace_records:
                self._segment(tr)
            if live is not None:
                touched[key] = tr
        for key, tr in touched.items():
            if self.traces.get(key) is tr:   # not finalised early by a later span of this request (a bound)
                self.due.append((now, key))
                self._feed(tr, now)

    def _feed(self, tr: TraceState, now: float, final: bool = False, lockstep: bool = True) -> None:
        """Live: feed what ``tr``'s reorder windows let go (``final``: all, and the end of stream); report the
        findings decided. A check that raises leaves the trace NOT checked from there on (said, counted).
        ``lockstep``: report C3-C5 (before the end, the merge joins only whole, stamped groups; at the end the
        caller decides as the idle path does)."""
        live = tr.live
        if live is None:
            return
        before = live.fed
        try:
            found = live.finish(now) if final else live.release(now)
        except Exception as e:   # a bug or an input no rule foresaw: this trace is unchecked, the replica goes on
            self._broken(tr, e)
            return
        self._counted(tr, live.fed - before, found, final, lockstep=lockstep)

    def _broken(self, tr: TraceState, e: Exception) -> None:
        self.errors += 1
        self.note(f"run {tr.run_id} trace {tr.trace_id}: NOT checked ({tr.records} records"
                  f"{', some checked before' if tr.live is not None and tr.live.fed else ''}): "
                  f"{type(e).__name__}: {str(e)[:200]}")
        tr.ranks.clear()
        tr.live, tr.broken = None, True

    def _counted(self, tr: TraceState, fed: int, found: list[Finding], final: bool = False,
                 lockstep: bool = False) -> None:
        """Count ``fed`` records as checked and report the reported rules' findings (the others: suppressed);
        ``lockstep``: :data:`LOCKSTEP_RULES` are reported too (idle-only, every rank stamped)."""
        run = self.runs[tr.run_id]
        kept = self._trusted(found, lockstep)
        if self.confirm is not None:
            if final and not tr.segmented and any(f.rule in END_DECIDED for f in kept):
                kept = self._confirmed(tr, kept)
            elif not final and kept:   # (live: what a recheck from the store must not report again)
                tr.reported = (tr.reported or set()) | {finding_id(tr.run_id, tr.trace_id, f) for f in kept}
        if self.journal is not None:   # journaled before they are emitted; none emitted twice across restarts
            kept = self.journal.fresh(tr.run_id, tr.trace_id, kept)
        self.events_checked += fed
        run.events += fed
        run.findings += len(kept)
        for f in kept:
            self.findings[(tr.run_id, f.code)] += 1
        if kept or final:
            self.report(tr, kept)

    def _trusted(self, found: list[Finding], lockstep: bool) -> list[Finding]:
        """The findings of the reported rules (:data:`LOCKSTEP_RULES` only with ``lockstep``; scope run: all); the
        rest counted in :attr:`suppressed`."""
        if self.scope == "run":
            return found
        kept = []
        for f in found:
            if f.rule in TRACE_RULES or f.rule in PARTIAL_RULES or (lockstep and f.rule in LOCKSTEP_RULES):
                kept.append(f)
            else:
                self.suppressed[f.rule] += 1
        return kept

    def _confirmed(self, tr: TraceState, kept: list[Finding]) -> list[Finding]:
        """``kept`` less its :data:`END_DECIDED` findings when the span store holds records of ``tr`` that never came
        here (then ``tr`` is reported UNCHECKED, :data:`~.serve_confirm.MOVED`); all of ``kept`` when it holds none,
        or when that is not known (the store could not be asked: said once per failure)."""
        conf = self.confirm
        assert conf is not None
        moved = conf.missing(tr.trace_id, tr.refs.keys())
        if moved is None:
            self._store_failed(tr, "whether the trace was whole here", "its end-of-trace findings are reported "
                                                                        "unconfirmed")
            return kept
        if not moved:
            return kept
        out = [f for f in kept if f.rule not in END_DECIDED]
        for f in kept:
            if f.rule in END_DECIDED:
                self.withheld[f.rule] += 1
        self.note(f"run {tr.run_id} trace {tr.trace_id}: {moved} record(s) of it in the span store never came here: "
                  f"{len(kept) - len(out)} end-of-trace finding(s) not reported, the trace reported UNCHECKED")
        self.lost(tr.run_id, tr.trace_id, MOVED)
        return out

    def _rechecked(self, tr: TraceState) -> bool:
        """A tail ``tr`` (first records not seen here) checked whole from the span store: True when done. Reported:
        the whole trace's findings less those the head's replica reported (:meth:`_head_reported`) and those
        reported here before the end (live). False, the caller reports ``tr`` UNCHECKED as before: the store could
        not be asked, lacks a record that came here (it lags), or lacks a rank's first records too."""
        got = self._whole(tr)
        if got is None:
            return False
        mine, whole = got
        try:
            lockstep, short = joins_trusted(whole)
            found = self._trusted(check_trace(whole).findings, lockstep)
            before = self._head_reported(tr, mine) | (tr.reported or set())
        except Exception as e:   # as in _finalise: a bug or an input no rule foresaw
            self._broken(tr, e)
            return True
        self.rechecked += 1
        kept = [f for f in found if finding_id(tr.run_id, tr.trace_id, f) not in before and not (
            # live, a join whose deciding record the head holds may have been reported there before its end
            self.live and f.rule in LOCKSTEP_RULES and (f.rank, f.evidence[-1] if f.evidence else -1) not in tr.refs)]
        self.note(f"run {tr.run_id} trace {tr.trace_id}: its first records came to another replica; checked whole "
                  f"from the span store ({whole.records} records, {len(tr.refs)} of them here): "
                  f"{len(kept)} finding(s) the head's replica did not report")
        fed = tr.records - tr.segmented if tr.live is None else 0   # (live: its records were counted when fed)
        self.events_checked += fed
        self.runs[tr.run_id].events += fed
        tr.ranks.clear()
        tr.live = None
        self._emit(whole, kept)
        if short:
            self.lost(tr.run_id, tr.trace_id, GROUP_SHORT)
        return True

    def _whole(self, tr: TraceState) -> tuple[list[SpanRecords], TraceState] | None:
        """(the store's spans of ``tr``'s run, the whole trace they hold); None, said when the store failed, when
        it could not be asked, lags (a record that came here is not in it yet) or lacks a rank's first records."""
        conf = self.confirm
        assert conf is not None
        spans = conf.whole(tr.trace_id)
        if spans is None:
            self._store_failed(tr, "for the whole trace", "it is reported UNCHECKED")
            return None
        mine = [s for s in spans if s.run_id == tr.run_id]
        whole = from_spans(tr.run_id, tr.trace_id, mine, tr.changed)
        if any(rk not in whole.refs for rk in tr.refs) or is_cut(whole):
            return None
        return mine, whole

    def _short_rechecked(self, tr: TraceState) -> bool:
        """A node trace ``tr`` short of a rank of its CP group (each rank here whole: the others' records went to
        another replica) whose joins C3-C5 were checked over the whole trace from the span store: True when they
        were, here or, by the same rule, on the replica holding the first records of the trace's lowest rank (the
        one that reports them, so none is doubled). False: the caller reports it UNCHECKED (GROUP_SHORT)."""
        if self.confirm is None or tr.segmented:
            return False
        got = self._whole(tr)
        if got is None:
            return False
        whole = got[1]
        lockstep, short = joins_trusted(whole)
        if short or not lockstep:
            return False
        first = min(whole.ranks)
        node = trace_node(tr.run_id, tr.trace_id, whole.events())
        assert node is not None   # (a short trace is a node trace)
        self.rechecked += 1
        if lane_span_id(tr.run_id, node[0], node[1], first).hex() not in {r.span_id for r in tr.refs.values()}:
            self.note(f"run {tr.run_id} trace {tr.trace_id}: records of fewer ranks than its CP group came here; its "
                      f"joins C3-C5 are checked whole from the span store by the replica holding rank {first}'s")
            return True
        try:
            found = [f for f in check_trace(whole).findings if f.rule in LOCKSTEP_RULES]
        except Exception as e:   # as in _finalise: a bug or an input no rule foresaw
            self._broken(tr, e)
            return True
        self.note(f"run {tr.run_id} trace {tr.trace_id}: records of fewer ranks than its CP group came here; its "
                  f"joins C3-C5 checked whole from the span store: {len(found)} finding(s)")
        self._emit(whole, found)
        return True

    def _emit(self, tr: TraceState, found: list[Finding]) -> None:
        """Report ``found`` of ``tr`` (a trace read from the span store), journaled and counted."""
        if self.journal is not None:
            found = self.journal.fresh(tr.run_id, tr.trace_id, found)
        self.runs[tr.run_id].findings += len(found)
        for f in found:
            self.findings[(tr.run_id, f.code)] += 1
        self.report(tr, found)

    def _head_reported(self, tr: TraceState, spans: list[SpanRecords]) -> set[str]:
        """The ids of the findings the replica that held the head of ``tr`` (the records of ``spans``, the store's
        whole trace, that never came here) reported: a replica set up as this one, given the head and asking a
        store that holds ``spans`` (so its end-of-trace findings were withheld there). Empty when there is no head or
        it lacks a rank's first records too (a trace moved twice: that replica reported it UNCHECKED)."""
        head = [SpanRecords(s.run_id, s.trace_id, s.ref, s.level, evs, s.config) for s in spans
                if (evs := [ev for ev in s.events if (ev.rank, ev.seq) not in tr.refs])]
        if not head or is_cut(from_spans(tr.run_id, tr.trace_id, head)):
            return set()
        head.sort(key=lambda s: min((ev.epoch, ev.seq) for ev in s.events))   # each rank's in order, as sent
        got: set[str] = set()
        sim = ServeState(lambda t, found: got.update(finding_id(t.run_id, t.trace_id, f) for f in found),
                         idle_s=self.idle_s, live=self.live, window=self.window, window_s=self.window_s,
                         merge_cap=self.merge_cap, confirm=StoreConfirm(lookup=lambda _tid: spans))
        sim.add(head, now=0.0)
        sim.finish_all()
        return got

    def _store_failed(self, tr: TraceState, asked: str, so: str) -> None:
        """Say the span store's failure just now (once per failure: not a query skipped on hold)."""
        conf = self.confirm
        if conf is not None and conf.last_error:
            self.note(f"run {tr.run_id} trace {tr.trace_id}: the span store at {conf.base_url} could not be asked "
                      f"{asked} ({conf.last_error}): {so}; no store query for {conf.backoff_s:g}s")
            conf.last_error = ""

    def sweep(self, now: float | None = None) -> int:
        """Finalise the traces idle past ``idle_s`` and finish the runs idle past ``run_idle_s``; traces
        finalised."""
        now = time.monotonic() if now is None else now
        due, cut_at = self.due, now - self.window_s
        while due and due[0][0] <= cut_at:   # live: records whose reorder time is up are fed
            tr = self.traces.get(due.popleft()[1])
            if tr is not None:
                self._feed(tr, now)
        n = 0
        while self.traces:
            tr = next(iter(self.traces.values()))
            if now - tr.changed < self.idle_s:
                break
            self._finalise(tr)
            n += 1
        for run in [r for r in self.runs.values() if not r.traces and now - r.changed >= self.run_idle_s]:
            self._finish_run(run, "")
        return n

    def finish_all(self) -> None:
        """Finalise every held trace and finish every run (shutdown)."""
        for run in list(self.runs.values()):
            self._finish_run(run, "")

    def _finish_run(self, run: RunState, why: str) -> None:
        for key in [k for k in self.traces if k[0] == run.run_id]:
            self._finalise(self.traces[key], early=bool(why))
        self.runs.pop(run.run_id, None)
        self.note(f"run {run.run_id}: {run.events} records checked, {run.findings} finding(s)"
                  f"{'; ' + why if why else ''}: finished")

    def _finalise(self, tr: TraceState, early: bool = False) -> None:
        del self.traces[(tr.run_id, tr.trace_id)]
        run = self.runs[tr.run_id]
        run.traces -= 1
        run.done[tr.trace_id] = None
        if len(run.done) > MAX_DONE:
            run.done.popitem(last=False)
        if early:
            self.early += 1
        if tr.ranks and is_cut(tr):
            if self.confirm is not None and not tr.segmented and self._rechecked(tr):
                if self.journal is not None:
                    self.journal.finalised(tr.run_id, tr.trace_id)
                return
            tr.ranks.clear()   # a tail alone: reported, not checked (live: what was reported of it stands)
            tr.live = None
            self.lost(tr.run_id, tr.trace_id, CUT, tr.records)
            if self.journal is not None:
                self.journal.finalised(tr.run_id, tr.trace_id)
            return
        if tr.live is not None:
            live = tr.live
            lockstep, short = joins_trusted(tr)
            self._feed(tr, time.monotonic(), final=True, lockstep=lockstep and not live.cross_gone)
            tr.live = None   # spent: its state freed now
            tr.ranks.clear()
            if live.past_window:
                self.note(f"run {tr.run_id} trace {tr.trace_id}: {live.past_window} record(s) came behind their "
                          f"rank's reorder window ({self.window} records, {self.window_s:g}s): NOT checked")
            if short and not self._short_rechecked(tr):
                self.lost(tr.run_id, tr.trace_id, GROUP_SHORT)
            elif live.cross_gone and live.node is not None:   # (C3-C5 join a node's records: node traces only)
                self.lost(tr.run_id, tr.trace_id, MERGE_GONE)
        elif not tr.broken:
            try:
                res = check_trace(tr)
            except Exception as e:   # a bug or an input no rule foresaw: this trace is unchecked, the replica goes on
                self._broken(tr, e)
            else:
                lockstep, short = joins_trusted(tr)
                tr.ranks.clear()
                self._counted(tr, tr.records - tr.segmented, res.findings, final=True, lockstep=lockstep)
                if short and not self._short_rechecked(tr):
                    self.lost(tr.run_id, tr.trace_id, GROUP_SHORT)
        if self.journal is not None:
            self.journal.finalised(tr.run_id, tr.trace_id)

    def _segment(self, tr: TraceState) -> None:
        """``tr`` holds :attr:`max_trace_records` records (idle-only) or record refs (live): idle-only, its records
        so far are checked now as one segment and dropped (the trace stays held: later records make the next);
        live, where the records are already fed, the refs are dropped (a finding's evidence before them is then
        written back without its span link). Either way a resent batch of those records is no longer known as a
        duplicate, and a node trace's later part lacks its ranks' first lane spans, so its end is reported
        UNCHECKED: a node trace this long is not expected; a rank trace is one (it lives as long as its run)."""
        self.segments += 1
        held = sum(len(v) for v in tr.ranks.values())
        what = ("checked as one segment; the rest is checked on its own" if tr.live is None else
                "their span refs dropped (a finding's evidence among them is written back without its span link)")
        self.note(f"run {tr.run_id} {'trace ' + tr.trace_id if self.scope == 'trace' else '(whole)'}: {tr.records} "
                  f"records, --max-trace-records {self.max_trace_records} reached: {what}")
        if tr.live is None and not tr.broken:
            try:
                res = check_trace(tr)
            except Exception as e:   # as in _finalise: this trace is unchecked from here on
                self._broken(tr, e)
                return
            lockstep, _short = joins_trusted(tr)
            tr.ranks.clear()
            tr.segmented += held
            self._counted(tr, held, res.findings, lockstep=lockstep)
        else:
            tr.segmented += len(tr.refs)
        tr.refs.clear()

    def lost(self, run_id: str, trace_id: str, why: str, records: int = 0) -> None:
        """Report a trace NOT checked (its state died with a previous process): counted by run and reason,
        passed to ``unchecked``."""
        self.unchecked[(run_id, why)] += 1
        self.unchecked_records += records
        self.on_unchecked(run_id, trace_id, why, records)

    def stats(self) -> dict[str, Any]:
        return {"events_checked": self.events_checked, "traces_held": len(self.traces), "runs": len(self.runs),
                "trace_segments": self.segments,
                "late_records": self.late, "finalised_early": self.early, "check_errors": self.errors,
                "findings": sum(self.findings.values()), "suppressed": dict(self.suppressed),
                "past_window": self.past_window, "duplicate_records": self.duplicates,
                "unchecked": sum(self.unchecked.values()), "withheld": dict(self.withheld),
                "rechecked": self.rechecked,
                "lost_records": self.journal.lost_records if self.journal is not None else 0}
