"""A replica that asks the span store at a trace's end (``serve --confirm-url``,
:mod:`cptrace_otel.analyze.serve_confirm`) over the simulator's faulted 4-rank sharded runs (real OTLP bytes from
``cptrace-otel demo``, decoded by the replica's intake), each trace cut as a resolver change cuts it (its first
spans here, the rest elsewhere):

* the heads checked alone give false C3 (the precondition: what the store is for);
* with a store holding the whole run, no head gives a finding the whole trace does not, each trace whose end-of-trace
  findings were held back is reported UNCHECKED (reason MOVED): none is dropped silently;
* the whole run with the store gives exactly the findings it gives without one (a whole trace is never withheld);
* a store that cannot be asked leaves the findings reported as without one, counted, and is not asked again within
  its backoff; ``serve`` refuses a store it cannot reach at start (exit 3, the URL without its password)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import defaultdict

import pytest

from cptrace_otel.analyze.otlp_intake import SpanRecords, decode
from cptrace_otel.analyze.serve_confirm import MOVED, StoreConfirm
from cptrace_otel.analyze.serve_state import CUT, END_DECIDED, ServeState
from tests.helpers import free_port
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import parse_json_line

FAULTS = "HASH_flip,ZERO_nostore,H1_ack,H4_nolock,C3_writer"
CUTS = 8   # random cuts per run (seeded): enough that some head holds every rank, one only in part


def demo_spans(tmp, seed: int) -> tuple[list[bytes], list[SpanRecords]]:
    """A faulted 4-rank sharded simulator run: its OTLP requests (protobuf) and their spans as a replica decodes
    them, in the order the exporters sent them."""
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", "sharded",
                        "--seed", str(seed), "--faults", FAULTS, "--out", str(tmp), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    bodies = [parse_json_line(ln).SerializeToString() for f in sorted(tmp.glob("*.otlp.jsonl"))
              for ln in f.read_text().splitlines() if ln.strip()]
    return bodies, [sp for b in bodies for sp in decode(b).spans]


def split(spans: list[SpanRecords], cut: int) -> tuple[list[SpanRecords], list[SpanRecords]]:
    """Each trace's first k spans and the rest (k random per trace, seeded by ``cut``): what the old replica holds
    when the resolver moved the rest, and what the new one receives."""
    by: dict[str, list[SpanRecords]] = defaultdict(list)
    for sp in spans:
        by[sp.trace_id].append(sp)
    rnd = random.Random(f"cut{cut}")
    head: list[SpanRecords] = []
    tail: list[SpanRecords] = []
    for sps in by.values():
        k = rnd.randrange(len(sps) + 1)
        head += sps[:k]
        tail += sps[k:]
    return head, tail


def heads(spans: list[SpanRecords], cut: int) -> list[SpanRecords]:
    """The heads of :func:`split`."""
    return split(spans, cut)[0]


def findings(spans: list[SpanRecords], live: bool = False, confirm: StoreConfirm | None = None
             ) -> tuple[set[tuple], dict[str, set[str]], ServeState]:
    """(finding keys, trace -> reasons reported UNCHECKED, the state) of one replica given ``spans``."""
    got: set[tuple] = set()
    unchecked: dict[str, set[str]] = defaultdict(set)
    st = ServeState(lambda tr, found: got.update((tr.trace_id, f.code, f.rule, f.rank, f.node_id, f.epoch,
                                                  tuple(f.evidence)) for f in found),
                    idle_s=3600, live=live, unchecked=lambda run, trace, why, n: unchecked[trace].add(why),
                    confirm=confirm)
    for i in range(0, len(spans), 50):
        st.add(spans[i:i + 50], now=float(i))
    st.finish_all()
    return got, unchecked, st


@pytest.fixture(scope="module")
def run_spans(tmp_path_factory) -> list[list[SpanRecords]]:
    return [demo_spans(tmp_path_factory.mktemp(f"seed{seed}"), seed)[1] for seed in (1, 2)]


@pytest.mark.parametrize("live", [False, True], ids=["idle-only", "live"])
def test_a_head_cut_by_a_resolver_change_gives_no_false_finding_with_the_store(run_spans, live):
    false_alone = 0
    for spans in run_spans:
        whole, _, _ = findings(spans, live)
        for cut in range(CUTS):
            part = heads(spans, cut)
            alone, _, _ = findings(part, live)
            false_alone += len(alone - whole)
            got, unchecked, st = findings(part, live, StoreConfirm.holding(spans))
            assert got <= whole, sorted(got - whole)
            withheld = alone - got
            assert all(k[2] in END_DECIDED for k in withheld)
            assert all(MOVED in unchecked[k[0]] for k in withheld)   # said, never passed silently
            assert sum(st.withheld.values()) >= len(withheld)
    assert false_alone > 0, "no cut head gave a false finding alone: the test would prove nothing"


@pytest.mark.parametrize("live", [False, True], ids=["idle-only", "live"])
def test_a_whole_trace_gives_the_same_findings_with_the_store(run_spans, live):
    for spans in run_spans:
        alone, u_alone, _ = findings(spans, live)
        store = StoreConfirm.holding(spans)
        got, unchecked, st = findings(spans, live, store)
        assert got == alone and unchecked == u_alone
        assert store.asked > 0 and store.moved == 0 and not st.withheld   # it was asked, and said "whole"


@pytest.mark.parametrize("live", [False, True], ids=["idle-only", "live"])
def test_a_moved_tail_is_checked_whole_from_the_store_and_no_finding_is_doubled(run_spans, live):
    """Both replicas of a cut (head and tail) ask the store: the tail's replica checks the whole trace and reports
    what the head's did not. Idle-only, the two report exactly the whole run's findings, each once; live, no
    finding twice and none false, and one not reported (a join the head's replica decided) belongs to a trace
    the head's replica said UNCHECKED."""
    missed_alone = rechecked = 0
    for spans in run_spans:
        whole, _, _ = findings(spans, live)
        for cut in range(CUTS):
            head, tail = split(spans, cut)
            got_h, u_h, _ = findings(head, live, StoreConfirm.holding(spans))
            got_t_alone, _, _ = findings(tail, live)
            got_t, u_t, st = findings(tail, live, StoreConfirm.holding(spans))
            missed_alone += len(whole - got_h - got_t_alone)
            rechecked += st.rechecked
            assert not got_h & got_t, sorted(got_h & got_t)   # none doubled
            assert got_h | got_t <= whole, sorted((got_h | got_t) - whole)
            missed = whole - got_h - got_t
            if not live:
                assert not missed, sorted(missed)
            assert all(k[2] in END_DECIDED and MOVED in u_h[k[0]] for k in missed), sorted(missed)
            assert not any(CUT in why for why in u_t.values())   # every tail checked whole
    assert missed_alone > 0 and rechecked > 0, "no tail lost a finding alone: the test would prove nothing"


def test_a_tail_the_store_lags_on_is_reported_unchecked_as_without_it(run_spans):
    head, tail = split(run_spans[0], 1)
    lagging = StoreConfirm.holding(head)   # the store has the head only: records that came here are not in it yet
    got, unchecked, st = findings(tail, confirm=lagging)
    assert st.rechecked == 0 and any(CUT in why for why in unchecked.values())
    alone, u_alone, _ = findings(tail)
    assert got == alone and unchecked == u_alone


def test_a_store_that_cannot_be_asked_leaves_the_findings_reported_and_backs_off(run_spans):
    spans = run_spans[0]
    now = [0.0]
    calls = []

    def down(tid: str) -> list[SpanRecords]:
        calls.append(tid)
        raise OSError("Jaeger query service unreachable at http://store:16686: connection refused")

    store = StoreConfirm(lookup=down, backoff_s=30.0, clock=lambda: now[0])
    notes: list[str] = []
    part = spans + heads(run_spans[1], 3)   # traces whose ends decide C3 (whole and cut): more than one query due
    alone, _, _ = findings(part)
    got: set[tuple] = set()
    st = ServeState(lambda tr, found: got.update((tr.trace_id, f.code, f.rule, f.rank, f.node_id, f.epoch,
                                                  tuple(f.evidence)) for f in found),
                    idle_s=3600, confirm=store, note=notes.append)
    st.add(part, now=0.0)
    st.finish_all()
    assert got == alone                        # nothing dropped because the store was down
    assert len(calls) == 1 and store.asked == 1   # on hold after the failure: one query, the rest skipped
    assert store.unknown >= 2, "fewer than two traces asked about: the hold would prove nothing"
    assert sum("could not be asked" in n and "connection refused" in n for n in notes) == 1
    now[0] = 31.0
    assert store.missing("ab" * 16, set()) is None and len(calls) == 2   # asked again after the backoff


def test_serve_refuses_a_store_it_cannot_reach_and_prints_no_password(tmp_path):
    port = free_port()
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0",
                        "--confirm-url", f"http://ops:s3cret-pw@127.0.0.1:{port}", "--confirm-timeout", "1s"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 3, p.stderr
    assert f"127.0.0.1:{port}" in p.stderr and "--confirm-url" in p.stderr
    assert "s3cret-pw" not in p.stderr + p.stdout
