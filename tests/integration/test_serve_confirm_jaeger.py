"""``serve --confirm-url`` against a real Jaeger: a replica holding only the heads of traces a resolver change cut
asks Jaeger, which the collector also writes to, whether each trace was whole here.

The run: a faulted 4-rank sharded simulator run (C3_writer among its faults). Its real OTLP requests all go to
Jaeger's OTLP/HTTP port (the whole run is in the store); each trace is cut after a random number of its spans
(seeded) and only the heads reach the replica. Proves, with Jaeger's own answers (api_v3):

* the heads alone give false C3 (the precondition: what the store is for);
* with the store, the replica reports no finding the whole trace does not give, and each trace whose end-of-trace
  findings it held back is reported UNCHECKED with the moved reason; the ``serve`` process does the same (its
  stdout lines, its /metrics);
* the whole run with the store gives exactly the findings it gives without one;
* a replica holding the tails checks each trace whole from Jaeger's answer (records, span ids, config stamps as
  Jaeger gives them back): the two replicas report exactly the whole run's findings, none twice.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cptrace_otel.analyze.serve_confirm import MOVED, StoreConfirm
from tests.unit.test_serve import Serve
from tests.unit.test_serve_confirm import demo_spans, findings, heads, split

pytestmark = [pytest.mark.integration]


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def _in_jaeger(store: StoreConfirm, spans: list) -> None:
    """Wait until Jaeger holds every record of ``spans`` (its intake is asynchronous)."""
    want: dict[str, set[tuple[int, int]]] = {}
    for sp in spans:
        want.setdefault(sp.trace_id, set()).update((ev.rank, ev.seq) for ev in sp.events)
    deadline = time.monotonic() + 60
    while want:
        tid, recs = next(iter(want.items()))
        if recs <= {(ev.rank, ev.seq) for sp in store.lookup(tid) for ev in sp.events}:
            del want[tid]
            continue
        assert time.monotonic() < deadline, f"Jaeger does not hold trace {tid} whole after 60 s"
        time.sleep(0.2)


def _head_bodies(bodies: list[bytes], keep: set[str]) -> list[bytes]:
    """The requests re-encoded with only the spans whose id is in ``keep`` (what the old replica received)."""
    out = []
    for b in bodies:
        req = ExportTraceServiceRequest.FromString(b)
        n = 0
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                kept = [sp for sp in ss.spans if sp.span_id.hex() in keep]
                del ss.spans[:]
                ss.spans.extend(kept)
                n += len(kept)
        if n:
            out.append(req.SerializeToString())
    return out


def _run_in_jaeger(tmp_path, jaeger, seed: int) -> tuple[list[bytes], list, StoreConfirm]:
    """A faulted simulator run's requests, spans, and a store asking the Jaeger they were all sent to."""
    bodies, spans = demo_spans(tmp_path / "run", seed=seed)
    for b in bodies:
        _post(f"{jaeger.otlp_http}/v1/traces", b)
    store = StoreConfirm(jaeger.query_url)
    _in_jaeger(store, spans)
    return bodies, spans, store


def test_a_cut_head_is_confirmed_against_jaeger(tmp_path, jaeger):
    bodies, spans, store = _run_in_jaeger(tmp_path, jaeger, seed=1)

    whole, u_whole, _ = findings(spans)
    got_w, u_w, _ = findings(spans, confirm=store)
    assert got_w == whole and u_w == u_whole and store.asked > 0 and store.moved == 0

    cut = next((c for c in range(16) if findings(heads(spans, c))[0] - whole), None)
    assert cut is not None, "no cut head gave a false finding alone: the test would prove nothing"
    part = heads(spans, cut)
    got, unchecked, st = findings(part, confirm=store)
    assert got <= whole, sorted(got - whole)
    moved = {tid for tid, why in unchecked.items() if MOVED in why}
    assert moved and sum(st.withheld.values()) > 0

    # the serve process, given the same heads over OTLP/HTTP, asking the same Jaeger
    s = Serve(tmp_path, "--idle", "1h", "--state-dir", "off", "--confirm-url", jaeger.query_url)
    try:
        for b in _head_bodies(bodies, {sp.ref.span_id for sp in part}):
            assert s.post(b)[0] == 200
        time.sleep(0.5)
        assert s.metrics()["cptrace_serve_confirm_queries_total"] == 0   # nothing asked before a trace's end
    finally:
        s.stop()
    out = s.out.read_text().splitlines()
    said_moved = {ln.split(" trace ", 1)[1].split(":", 1)[0] for ln in out
                  if ln.startswith("UNCHECKED") and "span store never came here" in ln}
    assert said_moved == moved
    printed = [ln.split(" ", 3)[2] for ln in out if not ln.startswith("UNCHECKED")]   # SEVERITY CODE RULE run ...
    assert sorted(printed) == sorted(k[2] for k in got), out   # what the in-process replica reported, no more
    assert "of traces the span store showed cut here, not reported: C3" in s.err.read_text()


def test_moved_tails_are_checked_whole_from_jaeger(tmp_path, jaeger):
    bodies, spans, _ = _run_in_jaeger(tmp_path, jaeger, seed=2)
    whole, _, _ = findings(spans)
    lost_alone = 0
    for cut in range(3):
        head, tail = split(spans, cut)
        got_h, _, _ = findings(head, confirm=StoreConfirm(jaeger.query_url))
        lost_alone += len(whole - got_h - findings(tail)[0])
        got_t, u_t, st = findings(tail, confirm=StoreConfirm(jaeger.query_url))
        assert st.rechecked > 0
        assert not got_h & got_t, sorted(got_h & got_t)
        assert got_h | got_t == whole, (sorted(whole - got_h - got_t), sorted((got_h | got_t) - whole))
        assert not u_t, u_t   # every tail checked (whole from Jaeger)
    assert lost_alone > 0, "no tail lost a finding alone: the test would prove nothing"

    # the serve process, given the last cut's tails over OTLP/HTTP, asking the same Jaeger
    (tmp_path / "tails").mkdir()
    s = Serve(tmp_path / "tails", "--idle", "1s", "--state-dir", "off", "--confirm-url", jaeger.query_url)
    try:
        for b in _head_bodies(bodies, {sp.ref.span_id for sp in tail}):
            assert s.post(b)[0] == 200
        deadline = time.monotonic() + 60
        while s.metrics()["cptrace_serve_rechecked_total"] < st.rechecked:   # the tails checked at their idle end
            assert time.monotonic() < deadline, s.metrics()
            time.sleep(0.3)
    finally:
        s.stop()
    out = s.out.read_text().splitlines()
    assert not [ln for ln in out if ln.startswith("UNCHECKED")], out
    printed = [ln.split(" ", 3)[2] for ln in out]   # SEVERITY CODE RULE run ...
    assert sorted(printed) == sorted(k[2] for k in got_t), out
    assert "checked whole from the span store" in s.err.read_text()
