"""deploy/jaeger/up against the running Jaeger: idempotent (a healthy instance is left alone, exit 0, the query URL
printed). The start/stop paths of deploy/{prometheus,alertmanager}/{up,down} run in test_alerting's fixture."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_jaeger_up_is_idempotent_when_running(jaeger):
    if not (DEPLOY / "jaeger" / ".run" / "jaeger.pid").is_file():
        pytest.skip("the running Jaeger was not started by deploy/jaeger/up (no pid file)")
    r = subprocess.run(["bash", str(DEPLOY / "jaeger" / "up")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already running" in r.stdout and "http://127.0.0.1:16686" in r.stdout
    assert "building" not in r.stderr   # nothing rebuilt, nothing restarted
    jaeger.client.services()            # still answering
