"""``cptrace-otel serve``'s checking side: the queue the receivers offer requests to, the one checking thread that
owns the :class:`~cptrace_otel.analyze.serve_state.ServeState`, the journal (``--state-dir``), the finding sinks
(stdout, write-back, Alertmanager through its own thread).

Contract (:class:`Checker`):

* :meth:`Checker.offer` (any thread): queues a decoded request, writing its traces to the journal first (before the
  200: once answered, the collector forgets the spans); returns why not (``"stopping"``, ``"queue full"``) without
  queueing, so the receiver answers 503 / ``UNAVAILABLE`` and the collector sends it again.
* The checking thread takes the requests in order, adds their records to the state and sweeps it (a trace idle past
  ``--idle`` is checked; ``--live``: records are fed through the reorder window, ticking within ``--reorder``). An
  exception there is said on stderr, counted as a check error, and the thread goes on (a dead one would stall the
  intake). The state is changed under :attr:`Checker.lock`, which :meth:`Checker.read` takes to read it.
* A finding is reported once (stdout, ``--endpoint``, ``--alertmanager``): the alert thread posts new findings at
  once (at most every :data:`ALERT_GAP` seconds) and every alert again each ``--alert-interval``, so a slow
  Alertmanager never holds the checking back.
* :meth:`Checker.stop`: everything queued is checked, every held trace finalised, the journal closed, the last
  alerts posted and the sinks flushed; :meth:`Checker.summary` then says what was checked, what not
  and why, with the exit code.
"""

from __future__ import annotations

import argparse
import gc
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ..model.exits import EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from .finding_sinks import FindingSinks, SinkSetupError
from .serve_confirm import StoreConfirm
from .serve_journal import Journal, JournalError, default_dir
from .serve_live import MERGE_CAP, RUN_MERGE_CAP
from .serve_state import ServeState, unchecked_rules
from .serve_trace import TraceState

if TYPE_CHECKING:
    from .otlp_intake import Intake

T = TypeVar("T")

LOST = "state lost: held when a previous process of this replica died, its records were not checked"
ALERT_GAP = 0.25   # seconds between two posts of new findings to Alertmanager
GC_THRESHOLD = (50_000, 20, 20)   # the collector's thresholds while the replica runs (Checker.start), as check's


class SetupError(Exception):
    """The checking side could not start: ``code`` is the exit code (bad journal folder: usage; a sink that cannot
    be reached: unreachable)."""

    def __init__(self, msg: str, code: int) -> None:
        super().__init__(msg)
        self.code = code


class Checker:
    """One replica's checking side (see the module doc). ``idle``, ``reorder``, ``alert_every``: the parsed
    ``--idle``, ``--reorder``, ``--alert-interval``; ``port``: the HTTP port (names the default journal folder);
    ``note``: a line on stderr. Raises :class:`SetupError`."""

    def __init__(self, args: argparse.Namespace, idle: float, reorder: float, alert_every: float, port: int,
                 out: TextIO, note: Callable[[str], None]) -> None:
        self.live, self.idle, self.reorder, self.alert_every = args.live, idle, reorder, alert_every
        self.note = note
        try:
            self.sinks = FindingSinks(args, alert_every, args.jaeger_url, out, note)
        except SinkSetupError as e:
            raise SetupError(str(e), EXIT_UNREACHABLE) from None
        self.fresh = threading.Event()   # a finding not posted yet (wakes the alert thread)
        self.journal: Journal | None = None
        state_dir = args.state_dir or (default_dir(port) if port else "off")
        lost: list = []
        if state_dir != "off":
            self.journal = Journal(state_dir, note=note)
            try:
                lost = self.journal.open()
            except JournalError as e:
                raise SetupError(str(e), EXIT_USAGE) from None
        self.state = ServeState(self._report, idle_s=idle, max_nodes=args.max_nodes, max_runs=args.max_runs,
                                note=note, journal=self.journal, unchecked=self.sinks.unchecked, live=args.live,
                                window=args.reorder_records, window_s=reorder,
                                max_trace_records=args.max_trace_records, confirm=_store(args, note),
                                scope=args.scope, merge_cap=RUN_MERGE_CAP if args.scope == "run" else MERGE_CAP)
        if self.journal is not None:
            j = self.journal
            note(f"journal in {state_dir}: {len(lost)} trace(s) held when the previous process died, reported "
                 f"UNCHECKED{f'; {j.skipped} unreadable line(s) skipped' if j.skipped else ''}")
            for run_id, trace_id, records in lost:
                self.state.lost(run_id, trace_id, LOST, records)
        else:
            note("no journal (--state-dir off, or an ephemeral port): after a kill what was held is lost silently")
        self.lock = threading.Lock()        # the state: the checking thread changes it, /metrics reads it
        self.work: queue.Queue[Intake | None] = queue.Queue(maxsize=args.queue)
        self.stopping = threading.Event()
        self._checker = threading.Thread(target=self._check_loop, name="cptrace-serve-check", daemon=True)
        self._poster = threading.Thread(target=self._alert_loop, name="cptrace-serve-alerts", daemon=True)
        self._gc_was = gc.get_threshold()

    def _report(self, tr: TraceState, found: list) -> None:   # the checking thread, under `lock`
        self.sinks.report(tr.run_id, tr, found)
        if found and self.sinks.alerts is not None:
            self.fresh.set()

    def start(self) -> None:
        # From here to the end of stop(), the young generation is collected every 50,000 allocations instead of 700
        # (the process's setting: a replica is a process of its own). A live replica holds every trace's rule state
        # (many objects) while it allocates a few short-lived ones per record, and with the default the collector
        # took a third of its CPU (in-process, 100,012 records: 58.8k -> 88.9k records per CPU second). The rule
        # checkers leave no reference cycles, so what waits for a collection is young garbage, bounded by the
        # threshold.
        self._gc_was = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLD)
        self._checker.start()
        if self.sinks.alerts is not None:
            self._poster.start()

    def offer(self, intake: Intake) -> str | None:
        """Queue a decoded request for the checking thread; None when queued, else why not."""
        if self.stopping.is_set():
            return "stopping"
        try:
            self.work.put_nowait(intake)
        except queue.Full:
            return "queue full"
        if self.journal is not None:   # before the 200: once answered, the collector forgets these spans
            self.journal.opened(_records_by_trace(intake.spans, self.state.held_id))
        return None

    def ready(self) -> bool:
        """Accepting data: not stopping and the queue not full (``/readyz``)."""
        return not (self.stopping.is_set() or self.work.full())

    def read(self, fn: Callable[[ServeState, int], T]) -> T:
        """``fn(state, requests queued)`` under the state's lock (what ``/metrics`` reads)."""
        with self.lock:
            return fn(self.state, self.work.qsize())

    def _check_loop(self) -> None:
        # live, a record waits at most --reorder plus one tick before it is checked
        tick = min(1.0, max(0.05, self.idle / 4), max(0.05, self.reorder / 2) if self.live else 1.0)
        state, journal = self.state, self.journal
        while True:
            got = True
            try:
                item = self.work.get(timeout=tick)
            except queue.Empty:
                got, item = False, None
            if got and item is None:   # the end mark, queued after everything else
                return
            try:
                with self.lock:
                    if item is not None:
                        state.add(item.spans)
                    state.sweep()
                if journal is not None:
                    journal.tick()
            except Exception as e:   # a bug: said and counted, the thread goes on (a dead one would stall intake)
                state.errors += 1
                self.note(f"internal error while checking (some records NOT checked): {type(e).__name__}: "
                          f"{str(e)[:200]}")

    def _alert_loop(self) -> None:
        # a new finding is posted at once (at most every ALERT_GAP s: a burst of findings is one post), and every
        # alert again each --alert-interval (Alertmanager resolves an alert not re-posted)
        while not self.stopping.is_set():
            self.fresh.wait(self.alert_every)
            self.fresh.clear()
            if self.stopping.is_set():
                return
            self.sinks.post_alerts()
            self.stopping.wait(min(ALERT_GAP, self.alert_every))

    def begin_stop(self) -> None:
        """Refuse new requests (``offer`` says ``stopping``) and end the alert thread; the receivers stop next."""
        self.stopping.set()
        self.fresh.set()             # the alert thread ends (the last post is made by stop())

    def stop(self) -> None:
        """Once the receivers have stopped: check everything queued, finalise every held trace, close the journal,
        post the last alerts and flush the sinks."""
        self.begin_stop()
        self.work.put(None)          # after everything queued
        self._checker.join()
        with self.lock:
            self.state.finish_all()
        if self.journal is not None:
            self.journal.close()
        self.sinks.post_alerts()
        self.sinks.close()
        gc.set_threshold(*self._gc_was)

    def summary(self) -> tuple[str, int]:
        """What was checked and what not (the stop line's part after the receivers' counts) and the exit code: 0
        when no finding was reported, 1 when some was, 4 when none was but traces held by a killed earlier process
        were reported UNCHECKED."""
        state, sinks = self.state, self.sinks
        st = state.stats()
        suppressed = ", ".join(f"{r} ({n})" for r, n in sorted(state.suppressed.items())) or "none"
        withheld = ", ".join(f"{r} ({n})" for r, n in sorted(state.withheld.items()))
        line = (f"{st['events_checked']} records checked, {sinks.total} finding(s), "
                f"{st['late_records']} late record(s) not checked, {st['past_window']} behind the reorder window not "
                f"checked, {st['finalised_early']} trace(s) checked early, {st['check_errors']} trace(s) NOT checked "
                f"(an error, said above), {st['unchecked']} trace(s) UNCHECKED (state lost at a kill, or moved) and "
                f"{st['lost_records']} later record(s) of them; UNCHECKED here (a rank's whole stream or the run's "
                f"order needed): {', '.join(unchecked_rules(state.scope)) or 'none'}; their findings on one trace, not "
                f"trusted and not reported: {suppressed}"
                f"{'; of traces the span store showed cut here, not reported: ' + withheld if withheld else ''}")
        # no finding but traces whose state was lost: not a clean run (as check's 4 when rules could not run)
        return line, EXIT_FINDINGS if sinks.total else EXIT_INCOMPLETE if st["unchecked"] else EXIT_OK


def _store(args: argparse.Namespace, note: Callable[[str], None]) -> StoreConfirm | None:
    """The span store ``--confirm-url`` names, asked once now (:meth:`StoreConfirm.probe`): one that cannot be
    asked raises :class:`SetupError` (exit 3, its URL without the password), before anything listens."""
    if not getattr(args, "confirm_url", None):
        return None
    from .sources.jaegerquery import parse_duration

    store = StoreConfirm(args.confirm_url, args.confirm_store, timeout_s=parse_duration(args.confirm_timeout))
    try:
        store.probe()
    except (OSError, RuntimeError) as e:
        raise SetupError(f"--confirm-url: {e}", EXIT_UNREACHABLE) from None
    note(f"span store {store.base_url} ({store.store}) asked at a trace's end when it decided C3-C5 or H4-open")
    return store


def _records_by_trace(spans: Any, held_id: Callable[[Any], str]) -> list[tuple[str, str, int]]:
    """(run id, held id, records) of what a decoded request adds to each held trace (``held_id``: the state's,
    a trace id or a run scope's), what the journal writes for it."""
    from collections import Counter

    n: Counter[tuple[str, str]] = Counter()
    for sp in spans:
        n[(sp.run_id, held_id(sp))] += len(sp.events)
    return [(r, t, k) for (r, t), k in n.items()]
