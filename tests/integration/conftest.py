"""Fixtures for tests against real services: the Jaeger that ``.ci/run`` starts with ``deploy/jaeger/up``, private
Jaeger instances for outage tests, and Prometheus + Alertmanager (Debian packages) started per test.

When Jaeger is not reachable the tests skip with the reason, unless ``CPTRACE_REQUIRE_JAEGER`` is set (``.ci/run``
sets it): then they fail, so CI can never pass by skipping. Override the endpoints with ``CPTRACE_JAEGER_URL``
(query, default http://127.0.0.1:16686), ``CPTRACE_JAEGER_OTLP_HTTP`` (default http://127.0.0.1:4318) and
``CPTRACE_JAEGER_OTLP_GRPC`` (default http://127.0.0.1:4317).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from cptrace_otel.analyze.sources.jaeger import JaegerClient, JaegerUnreachable
from tests.helpers import free_port
from tests.helpers.integration import (
    _BASE_ENV,
    DEPLOY,
    JAEGER_URL,
    OTLP_GRPC,
    OTLP_HTTP,
    SPANMETRICS_URL,
    AlertStack,
    Jaeger,
    PrivateJaeger,
    _port_open,
    unavailable,
)


@pytest.fixture(scope="session")
def jaeger() -> Jaeger:
    client = JaegerClient(JAEGER_URL, timeout_s=10)
    try:
        client.services()
    except JaegerUnreachable as e:
        unavailable(f"Jaeger is not running: {e}")
    for url in (OTLP_HTTP, OTLP_GRPC):
        if not _port_open(url):
            unavailable(f"Jaeger's query API answers at {JAEGER_URL} but its OTLP port {url} is closed")
    return Jaeger(JAEGER_URL, OTLP_HTTP, OTLP_GRPC, client)


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A run id unique to this test, so its traces never collide with another test's or an earlier run's."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:40]
    return f"it-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def private_jaeger(tmp_path: Path, jaeger: Jaeger):
    pj = PrivateJaeger(tmp_path)
    pj.start()
    try:
        yield pj
    finally:
        pj.stop()


@pytest.fixture
def alert_stack(tmp_path: Path, jaeger: Jaeger):
    """Alertmanager (webhook to a listener in this test) and Prometheus scraping Jaeger's :8889 every second with
    ``deploy/prometheus/rules.yml``, started through ``deploy/{alertmanager,prometheus}/up`` on free ports."""
    _need_alert_tools()
    if not _port_open(SPANMETRICS_URL):
        unavailable(f"Jaeger's span metrics endpoint {SPANMETRICS_URL} is closed")
    yield from _alert_stack(tmp_path, None)


@pytest.fixture
def watch_stack(tmp_path: Path, jaeger: Jaeger):
    """A private Jaeger with the repo's span metrics on its own port (the repo's dimensions, whatever config the
    shared Jaeger was started with) and an alert stack (as :func:`alert_stack`) whose Prometheus scrapes it:
    ``(private_jaeger, alert_stack)``."""
    _need_alert_tools()
    (tmp_path / "pj").mkdir()
    pj = PrivateJaeger(tmp_path / "pj", spanmetrics=True)
    pj.start()
    try:
        for stack in _alert_stack(tmp_path, pj.spanmetrics):
            yield pj, stack
    finally:
        pj.stop()


def _need_alert_tools() -> None:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (Debian package prometheus)")
    if shutil.which("prometheus-alertmanager") is None and shutil.which("alertmanager") is None:
        unavailable("Alertmanager is not installed (Debian package prometheus-alertmanager)")


def _alert_stack(tmp_path: Path, spanmetrics: str | None):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml

    hits: list = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.append((self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{hook.server_address[1]}"

    am = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    am["route"].update(group_wait="1s", group_interval="1s")
    for r in am["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = hook_url + "/" + w["url"].rsplit("/", 1)[1]
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am))

    am_listen, prom_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    prom["global"].update(scrape_interval="1s", evaluation_interval="1s")
    prom["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in prom["rule_files"]]
    prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [am_listen]
    target = spanmetrics or urllib.parse.urlsplit(SPANMETRICS_URL).netloc   # the Jaeger under test by default
    for job in prom["scrape_configs"]:
        if job["job_name"] == "jaeger-spanmetrics":
            job["static_configs"] = [{"targets": [target]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))

    env = dict(_BASE_ENV, AM_CONFIG=str(tmp_path / "alertmanager.yml"), AM_LISTEN=am_listen,
               AM_RUN_DIR=str(tmp_path / "am"), PROM_CONFIG=str(tmp_path / "prometheus.yml"),
               PROM_LISTEN=prom_listen, PROM_RUN_DIR=str(tmp_path / "prom"))

    def sh(script: str) -> None:
        r = subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, text=True, timeout=90)
        if r.returncode != 0:
            pytest.fail(f"deploy/{script} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", pytrace=False)

    try:
        sh("alertmanager/up")
        sh("prometheus/up")
        yield AlertStack(f"http://{prom_listen}", f"http://{am_listen}", hits)
    finally:
        for script in ("prometheus/down", "alertmanager/down"):
            subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, timeout=60)
        hook.shutdown()


