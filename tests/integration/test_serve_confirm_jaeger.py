"""``serve --confirm-url`` against a real Jaeger: a replica holding only the heads of traces a resolver change cut
asks Jaeger, which the collector also writes to, whether each trace was whole here.

The run: a faulted 4-rank sharded simulator run (C3_writer among its faults). Its real OTLP requests all go to
Jaeger's OTLP/HTTP port (the whole run is in the store); each trace is cut after a random number of its spans
(seeded) and only the heads reach the replica. Proves, with Jaeger's own answers (api_v3):

* the heads alone give false C3 (the precondition: what the store is for);
* with the store, the replica reports no finding the whole trace does not give, and each trace whose end-of-trace
  findings it held back is reported UNCHECKED with the moved reason; the ``serve`` process does the same (its
  stdout lines, its /metrics);
* the whole run with the store gives exactly the findings it gives without one.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cptrace_otel.analyze.serve_confirm import MOVED, StoreConfirm
from tests.unit.test_serve import Serve
from tests.unit.test_serve_confirm import demo_spans, findings, heads

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
        if recs <= store.lookup(tid):
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


def test_a_cut_head_is_confirmed_against_jaeger(tmp_path, jaeger):
    bodies, spans = demo_spans(tmp_path / "run", seed=1)
    for b in bodies:
        _post(f"{jaeger.otlp_http}/v1/traces", b)
    store = StoreConfirm(jaeger.query_url)
    _in_jaeger(store, spans)

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
