"""``watch``'s C reader of Jaeger answers (``_speedups/jaegerin.c``) on what the real Jaeger returns for our
exporter's spans: a 4-rank sharded demo with the faults C1_div, C3_writer, HASH_flip goes into a Jaeger of the
test's own; the search answer is indexed and every trace read by C itself (no fall back to Python), equal to the
Python twin (every Event field and value with its type); and ``watch --once`` prints the same findings and checks
the same records on the C reader and on the pure-Python path (the C reader switched off), the findings ``check``
reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from cptrace_otel.analyze import jaeger_read
from cptrace_otel.analyze.jaeger_read import records_py
from cptrace_otel.model import semconv as sc
from tests.helpers.integration import ROOT
from tests.integration.test_watch_live import FAULTS, _env, demo
from tests.unit.test_jaegerin import needs_c, rows_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PY_WATCH = ("import sys; from cptrace_otel import cli; from cptrace_otel._speedups import twin_off; "
            "import cptrace_otel.analyze.jaeger_read as m\n"
            "with twin_off(vars(m), 'C_READER'):\n    sys.exit(cli.main(sys.argv[1:]))")


def watch(pj, run_id: str, python: bool) -> subprocess.CompletedProcess:
    args = ["watch", "--jaeger", pj.query_url, "--run-id", run_id, "--once", "--since", "1h"]
    head = ["-c", PY_WATCH] if python else ["-m", "cptrace_otel.cli"]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, timeout=300, env=_env(),
                          cwd=ROOT)


@needs_c
def test_real_answers_read_in_c_and_watch_alike(private_jaeger, tmp_path):
    pj = private_jaeger
    run_id, checked = demo(pj, tmp_path / "demo", FAULTS)
    n = checked["stats"]["events"]
    now = int(time.time() * 1e6)
    qs = urllib.parse.urlencode({"service": sc.DEFAULT_SERVICE_NAME, "limit": 5000, "raw": "true",
                                 "start": now - 3600 * 10**6, "end": now + 10**6,
                                 "tags": json.dumps({sc.RUN_ID: run_id})})
    with urllib.request.urlopen(f"{pj.query_url}/api/traces?{qs}", timeout=60) as r:
        body = r.read()
    C = jaeger_read.C_READER
    idx = C.index(body, 1 << 24)
    assert idx is not None, "the C index left Jaeger's answer to Python"
    records = 0
    for _tid, _starts, a, b in idx:
        got = C.records(body[a:b])
        assert got is not None, f"the C reader left a trace of our exporter to Python: {body[a:a + 300]!r}"
        assert rows_snapshot(got) == rows_snapshot(records_py(json.loads(body[a:b])))
        records += sum(len(row[8]) for row in got[1])
    assert records == n   # every record of the run, each once (a run's traces hold its records once)

    c, py = watch(pj, run_id, python=False), watch(pj, run_id, python=True)
    assert c.returncode == py.returncode == 1, (c.stderr[-2000:], py.stderr[-2000:])
    assert c.stdout == py.stdout
    assert len(c.stdout.splitlines()) == len(checked["findings"])
    assert f"{n} records checked" in c.stderr and f"{n} records checked" in py.stderr, (c.stderr, py.stderr)
