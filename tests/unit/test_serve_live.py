"""The live path of a ``serve`` replica (records fed to the rules as they arrive) against its idle-only path, over
the simulator's faulted runs (real OTLP protobuf bytes from ``cptrace-otel demo``, decoded by the replica's own
intake): the same findings (codes, nodes, evidence, messages; none twice), every finding but the end-of-stream ones
reported before its trace is finalised, the same findings under any record order the reorder window absorbs
(Hypothesis), and what happens past the window, to duplicates and to a check that raises. Plus the ``serve``
process: a finding is printed while its trace is still held, and posted to Alertmanager at once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cptrace_otel.analyze.otlp_intake import SpanRecords, decode
from cptrace_otel.analyze.serve_state import LOCKSTEP_RULES, ServeState
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import parse_json_line
from tests.unit.test_serve import Serve, demo_bodies  # noqa: F401  (the fixture, shared)

# per-rank faults with findings of the reported rules, and a cross-rank one (its findings are suppressed alike)
RUNS = [("HASH_flip,ZERO_nostore,H1_ack,H4_nolock", "replicated", "wt", 2),
        ("H2_release,H3_noinval,H1_swap", "none", "wt", 1),
        ("H2_stale,ZERO_race,C1_div", "replicated", "wt", 3),
        ("H4_wb_noflush", "none", "wb", 1),
        ("C3_writer", "sharded", "wt", 4)]   # a cross-rank finding the live merge decides before the trace ends
END_RULES = {"H4-open"}   # decided by the end of the stream (a copy whose ack never came)


def _key(run: str, trace: str, f) -> tuple:
    return (run, trace, f.code, f.rule, f.rank, f.epoch, f.node_id, f.op, f.certainty, tuple(f.evidence),
            f.message, f.severity)


@pytest.fixture(scope="module")
def faulted_spans(tmp_path_factory) -> list[list[SpanRecords]]:
    """Per simulator run: its spans as the replica decodes them, in the order the exporters sent them."""
    runs = []
    for i, (faults, mode, policy, ranks) in enumerate(RUNS):
        out = tmp_path_factory.mktemp(f"run{i}")
        p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", str(ranks), "--faults",
                            faults, "--mode", mode, "--policy", policy, "--seed", str(7 + i), "--out", str(out),
                            "--json"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert p.returncode in (0, 1), p.stderr[-2000:]
        spans = []
        for f in sorted(out.glob("*.otlp.jsonl")):
            for ln in f.read_text().splitlines():
                if ln.strip():
                    spans += decode(parse_json_line(ln).SerializeToString()).spans
        runs.append(spans)
    return runs


class Got:
    """What a state reported: finding keys in order, and which were reported before any finalisation."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []

    def __call__(self, tr, found) -> None:
        self.keys += [_key(tr.run_id, tr.trace_id, f) for f in found]


def _run(spans: list[SpanRecords], live: bool, batch: int = 50, **kw) -> tuple[Got, ServeState, list[tuple]]:
    got = Got()
    st = ServeState(got, idle_s=3600, live=live, **kw)
    for i in range(0, len(spans), batch):
        st.add(spans[i:i + batch], now=float(i))
    st.sweep(now=float(len(spans)) + 10.0)   # every reorder window's time is up; nothing idle yet
    before = list(got.keys)
    st.finish_all()
    return got, st, before


def test_live_findings_equal_the_idle_path_on_the_simulators_faulted_runs(faulted_spans):
    codes: set[str] = set()
    lockstep: set[str] = set()
    for spans in faulted_spans:
        idle, ist, _ = _run(spans, live=False)
        live, lst, before = _run(spans, live=True, window=64, window_s=5.0)
        assert idle.keys, "a faulted run without findings proves nothing"
        # same findings, none doubled, the cross-rank C3-C5 among them (the live merge orders the ranks as the idle
        # path's merge does)
        assert Counter(live.keys) == Counter(idle.keys)
        assert len(set(live.keys)) == len(live.keys)
        assert lst.events_checked == ist.events_checked == sum(len(s.events) for s in spans)
        assert lst.past_window == lst.duplicates == lst.errors == 0
        # everything but the end-of-stream findings was reported while the traces were still held
        # ... and the cross-rank ones whose trace lacks a rank of the group (C1_div's rank 2 never prepares nodes
        # 1 and 2): their merge waits for that rank until the trace is finalised, as the idle path's does
        assert not Counter(before) - Counter(idle.keys)
        assert {k[3] for k in (Counter(idle.keys) - Counter(before))} <= END_RULES | LOCKSTEP_RULES
        codes |= {k[2] for k in idle.keys}
        lockstep |= {k[3] for k in before} & LOCKSTEP_RULES
    assert {"HASH", "ZERO", "H2", "H3", "H4"} <= codes   # (H1a/H1b are not reported by a replica)
    assert lockstep == {"C3"}, "a cross-rank finding decided live, before its trace was finalised"


def test_records_are_fed_as_they_come_not_held(faulted_spans):
    """Live, a trace holds only its reorder windows: the records behind them are already checked by the per-rank
    rules, and by the cross-rank ones as far as every rank of the group has sent."""
    spans = faulted_spans[0]
    st = ServeState(lambda tr, f: None, idle_s=3600, live=True, window=8, window_s=1.0)
    st.add(spans, now=0.0)
    windows = sum(t.live.held for t in st.traces.values())
    merging = sum(t.live.xheld for t in st.traces.values())
    assert st.records_held == windows + merging
    assert st.events_checked > 0 and st.events_checked + windows == sum(len(s.events) for s in spans)
    assert windows <= 8 * sum(len(t.live.bufs) for t in st.traces.values())
    st.sweep(now=1.0)
    # the windows are empty; what the merges hold is each trace's tail after its slowest rank's last record, which
    # another record of that rank, or the trace's end, lets go
    assert sum(t.live.held for t in st.traces.values()) == 0 and st.traces
    assert all(t.live.xheld <= 8 for t in st.traces.values())
    st.finish_all()
    assert st.records_held == 0 and not st.traces


def _one_record_spans(spans: list[SpanRecords]) -> list[SpanRecords]:
    """One span per record, each rank's in (epoch, seq) order (an exporter sends a span when it ends, so records
    of spans open longer come later: the displacement the test adds is then the only one)."""
    one = [SpanRecords(s.run_id, s.trace_id, s.ref, s.level, [ev]) for s in spans for ev in s.events]
    return sorted(one, key=lambda s: (s.events[0].rank, s.events[0].epoch, s.events[0].seq))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_any_order_within_the_window_gives_the_same_findings(faulted_spans, data):
    """Records moved at most W places (a collector retry, batches racing) with a window of W records: each rank
    still reaches the rules in (epoch, seq) order, so the findings are the in-order ones."""
    spans = _one_record_spans(faulted_spans[data.draw(st.integers(0, len(faulted_spans) - 1), label="run")])
    w = data.draw(st.integers(1, 40), label="window")
    shift = data.draw(st.lists(st.integers(0, w - 1), min_size=len(spans), max_size=len(spans)), label="shift")
    moved = [s for _, s in sorted(zip((i + d for i, d in enumerate(shift)), spans, strict=True),
                                  key=lambda p: p[0])]
    idle, _, _ = _run(spans, live=False)
    live, lst, _ = _run(moved, live=True, batch=7, window=w, window_s=3600.0)
    assert lst.past_window == 0
    assert Counter(live.keys) == Counter(idle.keys)


def test_a_record_behind_the_window_is_not_fed_and_is_said(faulted_spans):
    spans = _one_record_spans(faulted_spans[0])
    notes: list[str] = []
    st = ServeState(lambda tr, f: None, idle_s=3600, live=True, window=0, window_s=0.0, note=notes.append)
    # the first record of some trace held back until its rank fed later ones: it cannot be fed in order
    first = next(i for i, s in enumerate(spans)
                 if sum(1 for t in spans if t.trace_id == s.trace_id and t.events[0].rank == s.events[0].rank) > 1)
    late = spans[first]
    st.add(spans[:first] + spans[first + 1:], now=0.0)
    st.add([late], now=1.0)
    assert st.past_window == 1 and st.events_checked == len(spans) - 1
    st.finish_all()
    assert sum("came behind their rank's reorder window" in n and late.trace_id in n for n in notes) == 1
    assert st.stats()["past_window"] == 1


def test_a_resent_batch_is_checked_once(faulted_spans):
    spans = faulted_spans[0]
    once, _, _ = _run(spans, live=True)
    twice, st, _ = _run(spans[:200] + spans, live=True)
    assert Counter(twice.keys) == Counter(once.keys)
    assert st.duplicates == sum(len(s.events) for s in spans[:200])


def test_a_live_check_that_raises_leaves_the_trace_not_checked(faulted_spans, monkeypatch):
    from cptrace_otel.analyze import engine

    notes: list[str] = []
    got: list = []
    st = ServeState(lambda tr, f: got.append(f), idle_s=3600, live=True, window=0, note=notes.append)
    monkeypatch.setattr(engine.Analysis, "feed_rank", lambda self, ev: (_ for _ in ()).throw(KeyError("boom")))
    st.add(faulted_spans[0], now=0.0)
    n = len(st.traces)
    st.add(faulted_spans[0][:5], now=1.0)   # more records of a broken trace: not fed, no second error
    st.finish_all()
    assert st.errors == n and not got and not st.traces and st.events_checked == 0
    assert sum("NOT checked" in x and "KeyError" in x for x in notes) == n


def test_serve_prints_a_finding_while_its_trace_is_held(tmp_path, demo_bodies):  # noqa: F811
    """The process: with --idle 1h a trace is not finalised during the test, yet its HASH finding is printed
    (live); without --live nothing is printed before the shutdown."""
    s = Serve(tmp_path, "--idle", "1h", "--live", "--reorder", "0.2s")
    try:
        for b in demo_bodies:
            assert s.post(b)[0] == 200
        deadline = time.monotonic() + 30
        while " HASH " not in s.out.read_text():
            assert time.monotonic() < deadline, s.err.read_text()[-2000:]
            time.sleep(0.2)
        assert s.metrics()["cptrace_serve_traces_held"] > 0
    finally:
        s.stop()
    (tmp_path / "idle").mkdir()
    s = Serve(tmp_path / "idle", "--idle", "1h")
    try:
        for b in demo_bodies:
            assert s.post(b)[0] == 200
        time.sleep(2.0)
        assert s.out.read_text() == ""
    finally:
        s.stop()
    assert " HASH " in s.out.read_text()


def test_a_new_finding_is_posted_to_alertmanager_at_once(tmp_path, demo_bodies):  # noqa: F811
    """--alert-interval 1h: the re-post would come an hour later, yet the live finding's alert arrives within
    seconds (the alert thread is woken by it). An in-test endpoint of Alertmanager's API: the real Alertmanager is
    in bench/serve_latency.py."""
    from tests.helpers.otlp_receiver import AlertSink

    am = AlertSink()
    s = Serve(tmp_path, "--idle", "1h", "--live", "--reorder", "0.2s", "--alertmanager",
              am.url, "--alert-interval", "1h")
    try:
        for b in demo_bodies:
            assert s.post(b)[0] == 200
        t0 = time.monotonic()
        while not any(a["labels"]["code"] == "HASH" for a in am.alerts()):
            assert time.monotonic() - t0 < 30, s.err.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        s.stop()
        am.close()


def test_traces_finalised_early_by_the_bound_match_the_idle_path(faulted_spans):
    """--max-nodes hit inside one request: a trace finalised early is checked once, as the idle-only path checks it
    (nothing of it fed or reported again by the request that evicted it)."""
    for spans in faulted_spans:
        idle, ist, _ = _run(spans, live=False, batch=len(spans), max_nodes=3)
        live, lst, _ = _run(spans, live=True, batch=len(spans), max_nodes=3, window=0, window_s=0.0)
        assert lst.early == ist.early > 0
        assert Counter(live.keys) == Counter(idle.keys)
        assert lst.events_checked == ist.events_checked and lst.errors == 0


def test_a_run_finished_by_the_bound_inside_one_request_is_not_fed_again(faulted_spans):
    """--max-runs hit inside one request: the first run's trace is finalised (its run finished) by the second run's
    span of the same request, and the request's end does not touch it again."""
    sp = faulted_spans[0][0]
    other = SpanRecords("other-run", sp.trace_id, sp.ref, sp.level, sp.events)
    got: list = []
    st = ServeState(lambda tr, found: got.append(tr.run_id), idle_s=3600, max_runs=1, live=True, window=0,
                    window_s=0.0)
    st.add([sp, other], now=0.0)
    assert list(st.runs) == ["other-run"] and st.early == 1 and got == [sp.run_id]
    st.finish_all()
    assert got == [sp.run_id, "other-run"] and st.errors == 0


def _lane_starts(spans: list[SpanRecords]) -> set[str]:
    """The span ids of each rank's first lane span of each node trace in ``spans``."""
    from cptrace_otel.analyze.serve_journal import trace_node
    from cptrace_otel.model.trace_ids import lane_span_id

    out = set()
    for s in spans:
        node = trace_node(s.run_id, s.trace_id, s.events)
        if node is not None and s.events:
            want = lane_span_id(s.run_id, node[0], node[1], s.events[0].rank).hex()
            if s.ref.span_id == want:
                out.add(want)
    return out


def test_a_tail_moved_here_never_starts_its_cross_rank_merge(faulted_spans):
    """Every node trace without its ranks' first lane spans (a resolver change moved them here mid-life): no
    cross-rank finding is reported, live or at the end, and each such trace is reported UNCHECKED."""
    from cptrace_otel.analyze.serve_state import CUT

    spans = faulted_spans[-1]   # C3_writer, 4 sharded ranks: its whole run gives a live C3
    starts = _lane_starts(spans)
    assert starts
    tails = [s for s in spans if s.ref.span_id not in starts]
    got = Got()
    st = ServeState(got, idle_s=3600, live=True, window=64, window_s=5.0)
    for i in range(0, len(tails), 50):
        st.add(tails[i:i + 50], now=float(i))
    st.sweep(now=float(len(tails)) + 10.0)
    assert not [k for k in got.keys if k[3] in LOCKSTEP_RULES]
    assert all(not t.live.starts for t in st.traces.values() if t.live.node is not None)
    st.finish_all()
    assert not [k for k in got.keys if k[3] in LOCKSTEP_RULES]
    assert sum(n for (_, why), n in st.unchecked.items() if why == CUT) > 0


def test_a_merge_waiting_past_its_bound_gives_its_cross_rank_rules_up_and_says_so(faulted_spans):
    """One rank's spans held back until the others' are all in: its traces' merges overflow, so C3 (decided live
    on the whole run) is not reported, and those traces are named UNCHECKED for C3-C5; nothing else changes."""
    from cptrace_otel.analyze.serve_state import MERGE_GONE

    spans = faulted_spans[-1]
    late_rank = [s for s in spans if s.events and s.events[0].rank == 3]
    order = [s for s in spans if not (s.events and s.events[0].rank == 3)] + late_rank
    idle, _, _ = _run(spans, live=False)
    live, lst, _ = _run(order, live=True, window=64, window_s=5.0, merge_cap=4)
    gone = sum(n for (_, why), n in lst.unchecked.items() if why == MERGE_GONE)
    assert gone > 0
    assert Counter(live.keys) == Counter(k for k in idle.keys if k[3] not in LOCKSTEP_RULES)
    assert any(k[3] in LOCKSTEP_RULES for k in idle.keys)


def test_a_rank_without_a_config_stamp_holds_the_merge_to_the_end(faulted_spans):
    """The CP group is known only from every rank's stamp: without one the merge waits for the trace's end, and
    the end decides as the idle path does (C3-C5 not reported: the group is not known)."""
    spans = [SpanRecords(s.run_id, s.trace_id, s.ref, s.level, s.events,
                         None if s.events and s.events[0].rank == 2 else s.config) for s in faulted_spans[-1]]
    got = Got()
    st = ServeState(got, idle_s=3600, live=True, window=64, window_s=5.0)
    st.add(spans, now=0.0)
    st.sweep(now=10.0)
    assert all(t.live.group is None for t in st.traces.values() if t.live.node is not None and 2 in t.ranks)
    st.finish_all()
    idle, _, _ = _run(spans, live=False)
    assert Counter(got.keys) == Counter(idle.keys)
    assert not [k for k in got.keys if k[3] in LOCKSTEP_RULES]


def _rank_trace_spans(run: str, n: int, per_span: int = 10) -> list[SpanRecords]:
    """A rank trace of ``n`` device frees by index (SGLang records one per finished request): it lives as long as
    its run."""
    from cptrace_otel.analyze.incremental import SpanRef
    from cptrace_otel.model.events import Event
    from cptrace_otel.model.trace_ids import rank_trace_id

    tid = rank_trace_id(run, 0).hex()
    out = []
    for i in range(0, n, per_span):
        evs = [Event("free", 0, s, 1000 + s, 0, {"pool": "dev", "idx": s, "node_id": -1, "why": "finish"}, 2)
               for s in range(i, min(n, i + per_span))]
        out.append(SpanRecords(run, tid, SpanRef(tid, f"{i:016x}", 0, frozenset()), 2, evs))
    return out


@pytest.mark.parametrize("live", [False, True])
def test_a_trace_as_long_as_its_run_is_checked_in_segments_within_its_bound(live):
    notes: list[str] = []
    st = ServeState(lambda tr, f: None, idle_s=3600, live=live, max_trace_records=100, note=notes.append)
    spans = _rank_trace_spans("long", 1000)
    peak = 0
    for i in range(0, len(spans), 3):
        st.add(spans[i:i + 3], now=float(i))
        st.sweep(now=float(i) + 10.0)
        tr = next(iter(st.traces.values()))
        peak = max(peak, len(tr.refs), sum(len(v) for v in tr.ranks.values()))
    assert peak < 100 + 30 and st.segments >= 9
    assert sum("--max-trace-records 100 reached" in x for x in notes) == st.segments
    st.finish_all()
    assert st.events_checked == 1000 and not st.unchecked and not st.traces


def test_a_long_request_trace_past_the_merge_bound_is_not_called_unchecked():
    """A request trace (level 3 ``fwd_hash`` records of every rank) has no node records for C3-C5 to join: its merge
    waits for the end and may pass the bound, which then says nothing."""
    from cptrace_otel.analyze.incremental import SpanRef
    from cptrace_otel.model.events import Event
    from cptrace_otel.model.trace_ids import request_trace_id

    tid = request_trace_id("req", "r1").hex()
    spans = []
    for rank in (0, 1):
        for i in range(0, 300, 10):
            evs = [Event("fwd_hash", rank, s, 1000 + s, 0, {"rid": "r1", "layer": s, "h": s, "nz": 1}, 3)
                   for s in range(i, i + 10)]
            spans.append(SpanRecords("req", tid, SpanRef(tid, f"{rank}{i:015x}", 0, frozenset()), 3, evs))
    st = ServeState(lambda tr, f: None, idle_s=3600, live=True, merge_cap=50)
    st.add(spans, now=0.0)
    st.finish_all()
    assert st.events_checked == 600 and not st.unchecked


def test_findings_only_gives_the_findings_of_the_whole_result(faulted_spans):
    """``Analysis.result(findings_only=True)`` (what a replica asks for: no unchecked list, stats or localization)
    gives the same findings, in the same order, as the whole result, on every faulted run."""
    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.otlpfile import merge_streams

    for spans in faulted_spans:
        by_rank: dict[int, list] = {}
        for s in spans:
            for ev in s.events:
                by_rank.setdefault(ev.rank, []).append(ev)
        streams = [sorted(evs, key=lambda e: (e.epoch, e.seq)) for _, evs in sorted(by_rank.items())]
        whole = Analysis().run(merge_streams(streams))
        only = Analysis().run(merge_streams(streams), findings_only=True)
        assert whole.findings and [_key("", "", f) for f in only.findings] == [_key("", "", f) for f in whole.findings]
        assert only.unchecked == []
