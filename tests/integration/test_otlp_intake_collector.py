"""The C reader of OTLP protobuf requests (``_speedups/otlpin.c``) on the real OTel Collector's re-encoding of our
exporter's bytes: a 2-rank simulator run exports OTLP/HTTP into the collector built from deploy/collector/builder.yaml
(otlp receiver, batch processor, otlp exporter), which re-batches and re-encodes the spans and sends them over
OTLP/gRPC to a raw capture server here (the request bytes as they come off the wire, not parsed). Each captured
body: the C reader answers it itself, and it equals the Python twin (records, field types, span references, rejects),
and the records add up to what the run exported.

Without the collector binary the test skips, unless ``CPTRACE_REQUIRE_COLLECTOR`` is set: then it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from concurrent import futures

import pytest

from cptrace_otel._speedups.otlpin import load
from cptrace_otel.analyze import otlp_intake
from cptrace_otel.analyze.incremental import WATCH_SERVICE
from tests.helpers import free_port
from tests.helpers.integration import ROOT, collector_binary, wait_for
from tests.unit.test_otlp_intake_c import read_in_c_alike

grpc = pytest.importorskip("grpc")
yaml = pytest.importorskip("yaml")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"



def _config(http: int, sink: int, health: int, metrics: int) -> dict:
    return {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{http}"}}}},
        "processors": {"batch": {"send_batch_size": 512, "timeout": "200ms"}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{sink}", "tls": {"insecure": True}}},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{health}"}},
        "service": {"extensions": ["health_check"],
                    "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp"]}},
                    "telemetry": {"metrics": {"level": "basic", "readers": [{"pull": {"exporter": {"prometheus": {
                        "host": "127.0.0.1", "port": metrics}}}}]}}},
    }


def test_collector_reencoded_requests_read_in_c_equal_the_python_twin(tmp_path):
    if load(otlp_intake.SRC, WATCH_SERVICE) is None:
        if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS"):
            pytest.fail("the C speedups are not built (CPTRACE_REQUIRE_SPEEDUPS is set)")
        pytest.skip("the C speedups are not built")
    b = collector_binary()

    got: list[bytes] = []
    lock = threading.Lock()

    def export(body: bytes, _context: object) -> bytes:
        with lock:
            got.append(body)
        return b""   # an empty ExportTraceServiceResponse: everything accepted

    # no (de)serializers: the handler gets the request's bytes as the collector encoded them
    handler = grpc.method_handlers_generic_handler(SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)})
    sink = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    sink_port = sink.add_insecure_port("127.0.0.1:0")
    sink.start()
    http, health, metrics = free_port(), free_port(), free_port()
    (tmp_path / "col.yaml").write_text(yaml.safe_dump(_config(http, sink_port, health, metrics)))
    col = subprocess.Popen([str(b), f"--config={tmp_path / 'col.yaml'}"], stdout=open(tmp_path / "col.log", "w"),
                           stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, 60, "collector healthy")
        d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", "HASH_flip",
                            "--level", "3", "--endpoint", f"http://127.0.0.1:{http}/v1/traces", "--out",
                            str(tmp_path / "demo"), "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert d.returncode in (0, 1), d.stderr[-2000:]
        sent = json.loads(d.stdout)["events"]["simulated"]

        def records() -> int:
            with lock:
                bodies = list(got)
            return sum(otlp_intake.decode(x).records for x in bodies)

        wait_for(lambda: records() >= sent, 60, f"the collector's {sent} records at the sink")
    finally:
        col.terminate()
        col.wait(timeout=30)
        sink.stop(0)
    assert read_in_c_alike(got, "a collector-encoded") == sent
