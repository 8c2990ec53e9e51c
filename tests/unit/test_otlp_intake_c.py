"""The C reader of OTLP protobuf requests (``_speedups/otlpin.c``) against its Python twin
(``analyze.otlp_intake.from_request`` through opentelemetry-proto): the same records (every Event field and every
field value with its type), the same span references, rejects and reasons, and the same ``Undecodable`` message, on

* the bytes our exporter posts (a simulator run with a fault, each rank's exporter sending OTLP/HTTP to a raw
  capture server here), where the C reader must answer itself (no fall back to Python);
* Hypothesis-generated requests: odd resources (no run id, the checker's own service, ranks of every type), spans
  with violation codes and ranks, events with every AnyValue kind, record texts of every value shape, range
  summaries in and out of the exporter's order, missing or non-int seq / epoch / level;
* the same requests truncated, with a byte changed or junk inserted.

The collector's re-encoding of our bytes is held equal in tests/integration/test_otlp_intake_collector.py.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from cptrace_otel._speedups import twin_off
from cptrace_otel._speedups.otlpin import load
from cptrace_otel.analyze import otlp_intake
from cptrace_otel.analyze.incremental import WATCH_SERVICE
from cptrace_otel.analyze.otlp_intake import Undecodable, decode
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.attrs import RNG_SUFFIXES
from tests.helpers.integration import ROOT

C = load(otlp_intake.SRC, WATCH_SERVICE)
needs_c = pytest.mark.skipif(C is None and not os.environ.get("CPTRACE_REQUIRE_SPEEDUPS"),
                             reason="the C speedups are not built")


# -- comparing ---------------------------------------------------------------------------------------------------
def typed(v: Any) -> Any:
    """``v`` with the type of every part (``1 == True`` and ``[1] == (1,)`` must not pass)."""
    if isinstance(v, dict):
        return ("dict", [(typed(k), typed(x)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [typed(x) for x in v])
    return (type(v).__name__, repr(v))


def snapshot(body: bytes) -> Any:
    """What decode gives for ``body``, every part typed (or the Undecodable message)."""
    try:
        got = decode(body)
    except Undecodable as e:
        return ("undecodable", str(e))
    def ev(e: Any) -> Any:
        return (e.tag, typed(e.rank), typed(e.seq), typed(e.ts), typed(e.epoch), typed(e.level), e.src, e.line_no,
                typed(e.fields))

    spans = [(s.run_id, s.trace_id, s.level, s.ref.trace_id, s.ref.span_id, s.ref.start_us, sorted(s.ref.codes),
              None if s.config is None else ev(s.config), [ev(e) for e in s.events]) for s in got.spans]
    return (got.spans_seen, got.rejected, got.reasons, spans)


def both(body: bytes) -> tuple[Any, Any]:
    """(the C reader's answer through decode, the Python twin's)."""
    c = snapshot(body)
    with twin_off(vars(otlp_intake), "_C"):
        return c, snapshot(body)


# -- our exporter's bytes ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def capture() -> Iterator[tuple[str, list[bytes]]]:
    """A raw OTLP/HTTP sink: (its URL, the request bodies it got, un-gzipped)."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            b = self.rfile.read(int(self.headers["Content-Length"]))
            bodies.append(gzip.decompress(b) if self.headers.get("Content-Encoding") == "gzip" else b)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}/v1/traces", bodies
    finally:
        srv.shutdown()
        srv.server_close()


def exporter_bodies(out: str, faults: str = "HASH_flip") -> list[bytes]:
    """The requests a 2-rank simulator run at trace level 3 posts (each rank's exporter, OTLP/HTTP protobuf)."""
    with capture() as (url, bodies):
        p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", faults,
                            "--level", "3", "--endpoint", url, "--out", out], capture_output=True, text=True,
                           timeout=180, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    assert bodies, "the exporter posted nothing"
    return bodies


@pytest.fixture(scope="module")
def our_bodies(tmp_path_factory) -> list[bytes]:
    return exporter_bodies(str(tmp_path_factory.mktemp("demo")))


def read_in_c_alike(bodies: list[bytes], who: str) -> int:
    """Assert the C reader answers each body itself, equal to the Python twin; the records read."""
    assert C is not None
    records = 0
    for body in bodies:
        assert C(body) is not None, f"the C reader left {who} request to Python"
        c, py = both(body)
        assert c == py
        records += sum(len(s[-1]) for s in c[3])
    return records


@needs_c
def test_our_exporters_bytes_read_in_c_equal_the_python_twin(our_bodies):
    assert read_in_c_alike(our_bodies, "our own exporter's") > 100
    # the exporter stamps each rank's config record on its resource (model/config_stamp.py): both read it alike
    stamped = [s for body in our_bodies for s in decode(body).spans if s.config is not None]
    assert stamped and {s.config.tag for s in stamped} == {"config"}


@needs_c
def test_a_violation_span_the_checker_wrote_and_its_codes(our_bodies):
    """The checker's own write-back spans are skipped by both, and violation codes on a span are read alike."""
    req = ExportTraceServiceRequest.FromString(our_bodies[0])
    own = req.resource_spans.add()
    own.CopyFrom(req.resource_spans[0])
    for kv in own.resource.attributes:
        if kv.key == sc.SERVICE_NAME:
            kv.value.string_value = WATCH_SERVICE
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    kv = sp.attributes.add()
    kv.key, kv.value.string_value = sc.VIOLATION, "HASH,H1"
    body = req.SerializeToString()
    assert C is not None and C(body) is not None
    c, py = both(body)
    assert c == py
    assert c[0] == 2 * len(req.resource_spans[0].scope_spans[0].spans)   # the own spans are seen, not read
    assert ["H1", "HASH"] in [s[6] for s in c[3]]


# -- generated requests ------------------------------------------------------------------------------------------
TEXTS = st.sampled_from(["7", "007", "-3", "-0", "1.5", "1e5", "inf", "abc", "", "a b", "x\ty", "ünï", "(none)",
                         "(cnt=2,min=1,max=3,first=1,last=3)", "(cnt=2,min=1,max=3,first=1)", "[1,2]", "[]",
                         "[1,", "[[1],[2,3]]", "[a,b]", "9" * 30]) | st.text(max_size=6)
SCALARS = st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1), TEXTS, st.floats(allow_nan=False),
                    st.booleans(), st.binary(max_size=3))
VALUES = st.recursive(SCALARS, lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=3), ch,
                                                                                     max_size=2), max_leaves=4)
NAMES = st.sampled_from(["node_id", "n", "a.b", "hash", "x.cnt", ""])


def set_any(av: AnyValue, v: Any) -> None:
    if v is None:
        return
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, str):
        av.string_value = v
    elif isinstance(v, bytes):
        av.bytes_value = v
    elif isinstance(v, list):
        av.array_value.SetInParent()
        for x in v:
            set_any(av.array_value.values.add(), x)
    else:
        av.kvlist_value.SetInParent()
        for k, x in v.items():
            kv = av.kvlist_value.values.add()
            kv.key = k
            set_any(kv.value, x)


@st.composite
def range_run(draw) -> list[tuple[str, Any]]:
    """The five parts of a range summary: as the exporter writes them, shuffled, cut short, or with a text part."""
    base = sc.FIELD_PREFIX + draw(NAMES)
    parts = [(base + s, draw(st.integers(-5, 1 << 40) | TEXTS)) for s in RNG_SUFFIXES]
    how = draw(st.sampled_from(["ordered", "ordered", "ordered", "shuffled", "short"]))
    if how == "shuffled":
        parts = draw(st.permutations(parts))
    elif how == "short":
        parts = parts[:draw(st.integers(1, 4))]
    return parts


META = st.sampled_from([sc.SEQ, sc.SEQ, sc.EPOCH, sc.LEVEL, "other.key"])
ATTRS = st.lists(st.one_of(st.tuples(NAMES.map(lambda n: sc.FIELD_PREFIX + n), VALUES).map(lambda t: [t]),
                           range_run(),
                           st.tuples(META, st.integers(-3, 1 << 40) | VALUES).map(lambda t: [t])),
                 max_size=5).map(lambda xs: [a for x in xs for a in x])
SEQ_LAST = st.tuples(ATTRS, st.none() | st.integers(0, 1 << 40)).map(
    lambda t: t[0] + ([] if t[1] is None else [(sc.SEQ, t[1])]))   # most records: a seq after the fields
EVENTS = st.lists(st.tuples(st.sampled_from(["insert", "backup", sc.EVENT_VIOLATION, "ünï"]),
                            st.integers(0, (1 << 64) - 1), SEQ_LAST), max_size=3)
SPANS = st.lists(st.tuples(st.binary(min_size=0, max_size=16), st.binary(max_size=8), st.integers(0, (1 << 64) - 1),
                           st.lists(st.tuples(st.sampled_from([sc.RANK, sc.VIOLATION, "k"]),
                                              st.sampled_from(["HASH", "H1,ZERO", ""]) | VALUES), max_size=2),
                           EVENTS), max_size=3)
RESOURCE = st.lists(st.tuples(st.sampled_from([sc.SERVICE_NAME, sc.RUN_ID, sc.RUN_ID, sc.CP_RANK, sc.TRACE_LEVEL]),
                              st.sampled_from(["run-1", "", WATCH_SERVICE, "sglang"]) | VALUES), max_size=4)


def build(resources: list) -> bytes:
    req = ExportTraceServiceRequest()
    for res_attrs, spans in resources:
        rs = req.resource_spans.add()
        for k, v in res_attrs:
            kv = rs.resource.attributes.add()
            kv.key = k
            set_any(kv.value, v)
        ss = rs.scope_spans.add()
        ss.scope.name = "cptrace"
        for tid, sid, start, sattrs, events in spans:
            sp = ss.spans.add()
            sp.trace_id, sp.span_id, sp.start_time_unix_nano, sp.name = tid, sid, start, "stage"
            for k, v in sattrs:
                kv = sp.attributes.add()
                kv.key = k
                set_any(kv.value, v)
            for name, ts, attrs in events:
                ev = sp.events.add()
                ev.name, ev.time_unix_nano = name, ts
                for k, v in attrs:
                    kv = ev.attributes.add()
                    kv.key = k
                    set_any(kv.value, v)
    return req.SerializeToString()


REQUESTS = st.lists(st.tuples(RESOURCE, SPANS), max_size=2).map(build)


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS)
def test_generated_requests_read_alike(body):
    c, py = both(body)
    assert c == py


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS, st.data())
def test_broken_requests_read_or_refused_alike(body, data):
    how = data.draw(st.sampled_from(["cut", "flip", "junk"]))
    i = data.draw(st.integers(0, len(body)))
    if how == "cut":
        body = body[:i]
    elif how == "flip" and body:
        i = min(i, len(body) - 1)
        body = body[:i] + bytes([body[i] ^ data.draw(st.integers(1, 255))]) + body[i + 1:]
    else:
        body = body[:i] + data.draw(st.binary(min_size=1, max_size=6)) + body[i:]
    c, py = both(body)
    assert c == py


@needs_c
def test_exporter_shaped_records_are_read_in_c():
    """A request of the exporter's shape (run id, rank, fields of each kind, a range summary in order) is answered
    by the C reader itself, equal to the twin; the same request with its range parts reordered is left to Python."""
    rng = [(sc.FIELD_PREFIX + "pages" + s, v) for s, v in zip(RNG_SUFFIXES, (3, 1, 9, 1, 9), strict=True)]
    attrs = [(sc.FIELD_PREFIX + "node_id", 5), (sc.FIELD_PREFIX + "hash", "(none)"), *rng, (sc.SEQ, 1),
             (sc.EPOCH, 2), (sc.LEVEL, 1)]
    res = [(sc.RUN_ID, "run-1"), (sc.CP_RANK, 3)]
    ok = build([(res, [(b"t" * 16, b"s" * 8, 5000, [], [("backup", 7, attrs)])])])
    assert C is not None and C(ok) is not None
    c, py = both(ok)
    assert c == py and c[3][0][-1][0][-1][1][2][1][0] == "Rng"
    swapped = build([(res, [(b"t" * 16, b"s" * 8, 5000, [], [("backup", 7, attrs[:2] + rng[::-1] + attrs[-3:])])])])
    assert C(swapped) is None
    assert both(swapped)[0] == both(swapped)[1]
