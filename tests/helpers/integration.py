"""Helpers for the integration tests, shared by conftest.py (fixtures) and the test modules: environment of a rank
process, rank subprocesses, a private Jaeger that can be stopped and restarted, polling, free ports.

Endpoints of the shared Jaeger (started by ``.ci/run`` with ``deploy/jaeger/up``) come from ``CPTRACE_JAEGER_URL``
(query, default http://127.0.0.1:16686), ``CPTRACE_JAEGER_OTLP_HTTP`` (http://127.0.0.1:4318),
``CPTRACE_JAEGER_OTLP_GRPC`` (http://127.0.0.1:4317) and ``CPTRACE_JAEGER_SPANMETRICS``
(http://127.0.0.1:8889/metrics).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cptrace_otel.analyze.sources.jaeger import JaegerClient, JaegerUnreachable
from tests.helpers import free_port
from tests.helpers.jaeger_config import LOOPBACK, PORTS, private_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RANK_PROC = Path(__file__).with_name("rank_proc.py")

# Read at import: the root conftest clears CPTRACE_*/OTEL_* from os.environ for every test.
REQUIRE_JAEGER = bool(os.environ.get("CPTRACE_REQUIRE_JAEGER", "").strip())
JAEGER_URL = os.environ.get("CPTRACE_JAEGER_URL", "http://127.0.0.1:16686").rstrip("/")
OTLP_HTTP = os.environ.get("CPTRACE_JAEGER_OTLP_HTTP", "http://127.0.0.1:4318").rstrip("/")
OTLP_GRPC = os.environ.get("CPTRACE_JAEGER_OTLP_GRPC", "http://127.0.0.1:4317").rstrip("/")
SPANMETRICS_URL = os.environ.get("CPTRACE_JAEGER_SPANMETRICS", "http://127.0.0.1:8889/metrics")
_BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE"))}


def unavailable(reason: str) -> None:
    """Skip (developer machine without the service) or fail (CI: CPTRACE_REQUIRE_JAEGER set)."""
    if REQUIRE_JAEGER:
        pytest.fail(f"{reason} (CPTRACE_REQUIRE_JAEGER is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(f"{reason}; start it with deploy/jaeger/up (set CPTRACE_REQUIRE_JAEGER=1 to fail instead)")


def collector_binary() -> Path:
    """The OTel Collector built by deploy/collector/up (``COLLECTOR_BIN`` overrides the path); skip when it is
    missing, fail instead when ``CPTRACE_REQUIRE_COLLECTOR`` is set (CI)."""
    b = Path(os.environ.get("COLLECTOR_BIN") or DEPLOY / "collector" / "bin" / "otelcol-cptrace")
    if not b.is_file():
        if os.environ.get("CPTRACE_REQUIRE_COLLECTOR", "").strip():
            pytest.fail(f"no collector binary at {b} (CPTRACE_REQUIRE_COLLECTOR is set)", pytrace=False)
        pytest.skip(f"no collector binary at {b}; build it with deploy/collector/up (or set COLLECTOR_BIN)")
    return b


def _port_open(url: str) -> bool:
    hostport = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@dataclasses.dataclass

class Jaeger:
    query_url: str
    otlp_http: str
    otlp_grpc: str
    client: JaegerClient

    def endpoint(self, protocol: str) -> str:
        return self.otlp_grpc if protocol == "grpc" else self.otlp_http




def wait_for(fn: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.25) -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` and the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = fn()
        except (JaegerUnreachable, OSError) as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}; last: {str(last)[:2000]}", pytrace=False)
        time.sleep(interval_s)


# -- rank processes ----------------------------------------------------------------------------------------------

def rank_env(run_id: str, rank: int, endpoint: str, protocol: str = "http/protobuf", level: int = 2,
             tmp: Path | None = None, **extra: str) -> dict[str, str]:
    """Environment of one rank process: the production variables only (plus PYTHONPATH to this checkout)."""
    env = dict(_BASE_ENV)
    env.update({
        "CPTRACE_LEVEL": str(level),
        "CPTRACE_RUN_ID": run_id,
        "CPTRACE_CP_RANK": str(rank),
        "CPTRACE_TP_RANK": "0",
        "CPTRACE_DP_RANK": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    if tmp is not None:
        env["CPTRACE_SPOOL_DIR"] = str(tmp / f"spool-rank{rank}")
    env.update(extra)
    return env


@dataclasses.dataclass

class RankRun:
    proc: subprocess.Popen
    spec_path: Path
    stderr_path: Path
    result: dict | None = None
    stderr: str = ""

    def wait(self, timeout_s: float = 120) -> dict:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            self.stderr = self.stderr_path.read_text()
            pytest.fail(f"rank process timed out; stderr:\n{self.stderr[-3000:]}", pytrace=False)
        self.stderr = self.stderr_path.read_text()
        if self.proc.returncode != 0:
            pytest.fail(f"rank process exited {self.proc.returncode}; stderr:\n{self.stderr[-3000:]}", pytrace=False)
        self.result = json.loads(out)
        return self.result


def start_rank(tmp: Path, name: str, env: dict[str, str], records: list, **spec: Any) -> RankRun:
    """Start ``rank_proc.py`` in a subprocess emitting ``records`` (``[[level, tag, fields], ...]``)."""
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps({"records": records, **spec}))
    err = tmp / f"{name}.stderr"
    errf = open(err, "w")
    proc = subprocess.Popen([sys.executable, str(RANK_PROC), str(spec_path)], env=env, cwd=str(tmp),
                            stdout=subprocess.PIPE, stderr=errf, text=True)
    errf.close()
    return RankRun(proc, spec_path, err)


# -- private Jaeger (own ports, Badger on disk so a restart keeps what it stored) --------------------------------------

def jaeger_binary() -> Path:
    b = Path(os.environ.get("JAEGER_BIN") or DEPLOY / "jaeger" / "bin" / "jaeger")
    if not b.is_file():
        unavailable(f"no Jaeger binary at {b} (deploy/jaeger/up builds it)")
    return b


class PrivateJaeger:
    """A Jaeger process of its own for tests that stop and restart the backend (never the shared one)."""

    def __init__(self, tmp: Path, spanmetrics: bool = False) -> None:
        import yaml

        self.bin = jaeger_binary()
        self.tmp = tmp
        self.ports = {k: free_port() for k in (*PORTS, "spanmetrics")}
        loop = LOOPBACK
        storage = {"badger": {
            "directories": {"keys": str(tmp / "badger" / "keys"), "values": str(tmp / "badger" / "values")},
            "ephemeral": False, "ttl": {"spans": "1h"}}}
        # span metrics, if wanted, on a port of their own (8889 belongs to the shared Jaeger)
        self.spanmetrics = f"{loop}:{self.ports['spanmetrics']}" if spanmetrics else None
        cfg = private_config(self.ports, storage, self.spanmetrics)
        self.config = tmp / "jaeger-private.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.log = tmp / "jaeger-private.log"
        self.proc: subprocess.Popen | None = None
        self.query_url = f"http://{loop}:{self.ports['query']}"
        self.otlp_http = f"http://{loop}:{self.ports['http']}"
        self.otlp_grpc = f"http://{loop}:{self.ports['grpc']}"
        self.client = JaegerClient(self.query_url, timeout_s=10)

    def start(self, timeout_s: float = 60) -> None:
        with open(self.log, "a") as logf:
            self.proc = subprocess.Popen([str(self.bin), "--config", str(self.config)], stdout=logf,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        health = f"http://127.0.0.1:{self.ports['health']}/status"
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"private Jaeger exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}",
                            pytrace=False)
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200 and _port_open(self.otlp_http) and _port_open(self.otlp_grpc):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"private Jaeger not healthy after {timeout_s}s:\n{self.log.read_text()[-3000:]}",
                            pytrace=False)
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# -- Prometheus + Alertmanager (Debian), short intervals, the repo's rule file -----------------------------------------

@dataclasses.dataclass

class AlertStack:
    prom_url: str
    am_url: str
    webhook_hits: list


def get_json(url: str, timeout_s: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())
