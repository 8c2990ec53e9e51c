"""Network sinks: spooling across outages, replay in order, bounded spool, outage reports; real HTTP/gRPC receivers."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from cptrace_otel.export.otlp_grpc import GrpcTransport, grpc_target
from cptrace_otel.export.otlp_http import HttpTransport
from cptrace_otel.export.otlp_proto import encode_requests
from cptrace_otel.export.spool import ReliableSender
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.spans import Span
from cptrace_otel.traced import api, pipeline
from tests.helpers.otlp_receiver import GrpcReceiver, HttpReceiver


class FakeTransport:
    """Up or down on command; records what got through."""

    url = "http://fake:4318/v1/traces"

    def __init__(self) -> None:
        self.up = True
        self.got: list[bytes] = []
        self.reject: set[bytes] = set()
        self.lock = threading.Lock()

    def send(self, body: bytes):
        with self.lock:
            if body in self.reject:
                return "drop", "HTTP 400"
            if not self.up:
                return "retry", "ConnectionError: refused"
            self.got.append(body)
            return "ok", ""

    def close(self) -> None:
        pass


def test_outage_spools_and_replays_in_order(tmp_path: Path) -> None:
    t = FakeTransport()
    reports: list[str] = []
    s = ReliableSender(t, str(tmp_path / "spool"), backoff_s=0.02, max_backoff_s=0.05, report_every_s=3600,
                       report=reports.append)
    s.submit(b"r0")
    assert s.flush(10) and t.got == [b"r0"]
    t.up = False
    for i in range(1, 30):
        s.submit(b"r%d" % i)
    assert s.flush(0.3) is False
    st = s.stats()
    assert st["backend_down"] and st["spool_pending"] >= 1
    assert len(os.listdir(tmp_path / "spool")) == st["spool_pending"]  # on disk, one file per request
    assert len([r for r in reports if "unreachable" in r]) == 1  # rate-limited
    assert "http://fake:4318/v1/traces" in reports[0] and str(tmp_path / "spool") in reports[0]
    t.up = True
    assert s.flush(10) is True
    assert t.got == [b"r%d" % i for i in range(30)]  # exactly once, in order
    assert not s.stats()["backend_down"] and any("reachable again" in r for r in reports)
    assert not (tmp_path / "spool").exists()  # emptied and removed
    assert s.close(5)


def test_spool_is_bounded_and_rejections_are_counted(tmp_path: Path) -> None:
    t = FakeTransport()
    t.up = False
    s = ReliableSender(t, str(tmp_path / "spool"), max_bytes=1000, backoff_s=0.02, max_backoff_s=0.05,
                       report=lambda m: None)
    for i in range(20):
        s.submit(bytes([i]) * 100)
    deadline = time.time() + 10
    while s.stats()["spool_dropped"] < 10 and time.time() < deadline:
        time.sleep(0.01)
    assert s.stats()["spool_dropped"] == 10  # 10 x 100 B fit in 1000 B
    t.reject.add(bytes([0]) * 100)
    t.up = True
    assert s.flush(10)
    assert t.got == [bytes([i]) * 100 for i in range(1, 10)]
    assert s.stats()["failed_requests"] == 1
    s.close(1)


def _body(i: int) -> bytes:
    sp = Span(os.urandom(16), os.urandom(8), "hicache.node", 1, 0, ("k",), {sc.NODE_ID: i})
    return encode_requests([({sc.SERVICE_NAME: "t"}, [sp])])[0]


def test_http_transport_against_a_restarting_receiver(tmp_path: Path) -> None:
    rx = HttpReceiver()
    port = rx.port
    tr = HttpTransport(rx.url, headers=[("x-tenant", "a b")], timeout_s=2)
    assert tr.send(_body(0)) == ("ok", "")
    assert rx.headers[0]["x-tenant"] == "a b" and rx.headers[0]["content-encoding"] == "gzip"
    s = ReliableSender(tr, str(tmp_path / "spool"), backoff_s=0.05, max_backoff_s=0.2, report=lambda m: None)
    rx.stop()
    for i in range(1, 6):
        s.submit(_body(i))
    time.sleep(0.3)
    assert s.stats()["backend_down"]
    rx2 = HttpReceiver(port=port)
    try:
        assert s.flush(20)
        assert [sp.attrs[sc.NODE_ID] for sp in rx2.spans()] == [1, 2, 3, 4, 5]
    finally:
        s.close(1)
        rx2.stop()


def test_http_status_classification() -> None:
    with HttpReceiver(fail_status=503) as rx:
        assert HttpTransport(rx.url).send(b"")[0] == "retry"
    with HttpReceiver(fail_status=400) as rx:
        res, detail = HttpTransport(rx.url, compression="none").send(b"")
        assert res == "drop" and "400" in detail


def test_grpc_transport_and_target_parsing() -> None:
    pytest.importorskip("grpc")
    assert grpc_target("http://localhost:4317") == ("localhost:4317", False)
    assert grpc_target("https://collector:443/v1/traces") == ("collector:443", True)
    assert grpc_target("127.0.0.1:4317") == ("127.0.0.1:4317", False)
    with GrpcReceiver() as rx:
        tr = GrpcTransport(rx.url, headers=[("X-Token", "t")], timeout_s=5)
        assert tr.send(_body(7)) == ("ok", "")
        assert [sp.attrs[sc.NODE_ID] for sp in rx.spans()] == [7]
        assert rx.headers[0]["x-token"] == "t"
        tr.close()
    tr = GrpcTransport(rx.url, timeout_s=0.5)
    res, detail = tr.send(_body(8))
    assert (res == "retry" and "UNAVAILABLE" in detail) or "DEADLINE" in detail
    tr.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_pipeline_outage_is_reported_and_nothing_is_lost(tmp_path: Path, capfd: pytest.CaptureFixture,
                                                         protocol: str) -> None:
    if protocol == "grpc":
        pytest.importorskip("grpc")
    api.shutdown(10)
    rx = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    port = rx.port
    try:
        api.configure(level=1, run_id="outage", endpoint=rx.url, protocol=protocol, exporter="process",
                      cp_rank=0, spool_dir=str(tmp_path / "spool"), timeout_s=1.0)
        for i in range(100):
            api.cptrace(1, "evict", node_id=i % 10, i=i)
        assert api.flush(30)
        rx.stop()
        for i in range(100, 300):
            api.cptrace(1, "evict", node_id=i % 10, i=i)
        assert api.flush(3) is False  # the backend is down: the records wait in the spool
        st = pipeline.stats()["worker"]
        assert st["backend_down"] is True and st["spool_pending"] >= 1
        err = capfd.readouterr().err
        assert "unreachable" in err and str(port) in err and str(tmp_path / "spool") in err
        rx2 = HttpReceiver(port=port) if protocol == "http/protobuf" else GrpcReceiver(port=port)
        try:
            for i in range(300, 400):
                api.cptrace(1, "evict", node_id=i % 10, i=i)
            assert api.flush(60) is True
            assert pipeline.stats()["worker"]["backend_down"] is False
            got = sorted(e.attrs["hicache.i"] for sp in rx.spans() + rx2.spans() for e in sp.events)
            assert got == list(range(400))  # every event exactly once across the outage
            assert "reachable again" in capfd.readouterr().err
        finally:
            api.shutdown(10)
            rx2.stop()
    finally:
        api.shutdown(10)
        rx.stop()
        api.reload_config()
