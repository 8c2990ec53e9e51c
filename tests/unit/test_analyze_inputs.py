"""The analyzer without a backend: a Jaeger document on disk is read trace by trace in bounded memory (a trace too
large is named and skipped), ``ingest`` of input with no record is exit 3, the HTML report's embedded JSON cannot
end or comment out its script element, and link bases are http(s) only."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from cptrace_otel.cli import main
from tests.helpers.checks_util import FIXTURES
from tests.helpers.demo_run import check, run_demo
from tests.helpers.jaeger_fixtures import read_requests, v2_traces


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *argv], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = run_demo(tmp_path_factory.mktemp("demo"))
    d["traces"] = v2_traces(read_requests(d["otlp"]))
    return d


def test_a_jaeger_document_is_read_trace_by_trace_in_bounded_memory(demo, tmp_path, monkeypatch):
    """The run's traces with a 60 MB trace in the middle, as a gzip'd Jaeger document (well inside the gzip ratio
    cap): the huge trace is named in a warning and skipped, every other trace is checked (the findings of the run),
    and the read's peak memory stays far below the trace's size (before: the document was read whole, and its text,
    decoded and parsed, cost several times its size)."""
    monkeypatch.setenv("CPTRACE_QUERY_MAX_TRACE_BYTES", str(4 << 20))
    big = {"traceID": "b" * 32, "processes": {"p1": {"serviceName": "x", "tags": []}},
           "spans": [{"traceID": "b" * 32, "spanID": f"{j:016x}", "startTime": j, "logs": [], "processID": "p1",
                      "tags": [{"key": "k", "type": "string", "value": os.urandom(300).hex()}]}
                     for j in range(90_000)]}
    half = len(demo["traces"]) // 2
    doc = tmp_path / "run.json.gz"
    with gzip.open(doc, "wt") as f:
        f.write('{"data":[')
        for i, tr in enumerate(demo["traces"][:half] + [big] + demo["traces"][half:]):
            f.write(("," if i else "") + json.dumps(tr))
        f.write('],"total":0,"errors":null}')
    del big
    tracemalloc.start()
    try:
        rc, out, err = check("--json", str(doc))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 1, err
    rep = json.loads(out)
    assert rep["stats"]["events"] == 832 and rep["stats"]["malformed"] == 1
    assert f"trace {'b' * 32}: trace too large to check" in err
    assert peak < 120 << 20, peak   # the run's own events and 4 MiB of trace text, not the 60 MB trace


def test_a_big_document_of_another_layout_is_refused_not_read_into_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("CPTRACE_QUERY_MAX_BYTES", str(1 << 20))
    doc = tmp_path / "big.json"
    doc.write_text('{"result": {"resourceSpans": [\n' + ",\n".join(['{"resource": {}}'] * 200_000) + "]}}\n")
    rc, _out, err = check(str(doc))
    assert rc == 3 and "more than 1048576 characters" in err and "CPTRACE_QUERY_MAX_BYTES" in err


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x02\xff" * 1000, b"\x0a\x8c\x01\x0a\x1f\x0a\x0cservice.name"])
def test_ingest_of_input_with_no_record_is_exit_3(data, tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    out = tmp_path / "out.jsonl"
    r = _cli("ingest", "--no-progress", "--file", str(out), str(src))
    assert r.returncode == 3 and "no cptrace record found in" in r.stderr and str(src) in r.stderr, r.stderr
    assert not out.exists()   # no empty output left to be taken for a replayed run
    good = Path(FIXTURES) / "domain" / "hash_good.log"
    r = _cli("ingest", "--no-progress", "--file", str(out), str(good))
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr


def test_report_values_cannot_end_or_comment_out_the_script(tmp_path):
    """A field value ``<!--<script>`` (and ``</script>``, ``&``) in a record: the page's data block holds no
    ``<``, ``>`` or ``&`` at all, parses back to the same values, and the script element after it is intact."""
    src = Path(FIXTURES) / "domain" / "hash_bad.log"
    lines = src.read_text().splitlines()
    evil = "<!--<script>x</script>&amp;"
    lines[0] = lines[0].replace("kind=new", f"kind={evil}")
    log = tmp_path / "evil.log"
    log.write_text("\n".join(lines) + "\n")
    page = tmp_path / "r.html"
    assert main(["report", "-o", str(page), str(log)]) == 1
    html = page.read_text()
    m = re.search(r'<script type="application/json" id="cptrace-data">(.*?)</script>', html, re.S)
    assert m and not set("<>&") & set(m.group(1))
    assert evil in json.dumps(json.loads(m.group(1)), ensure_ascii=False)
    assert html.count("<script") == 2 and html.rstrip().endswith("</html>")


@pytest.mark.parametrize("base", ["javascript:alert(1)", "javascript://x%0aalert(1)", "data:text/html,x",
                                  "file:///etc/passwd", " JavaScript://x"])
def test_link_bases_are_http_only(base, tmp_path):
    log = str(Path(FIXTURES) / "domain" / "hash_bad.log")
    for argv in (["check", "--jaeger-url", base, log], ["report", "-o", str(tmp_path / "r.html"), "--jaeger-url",
                                                          base, log]):
        err = io.StringIO()
        old, sys.stderr = sys.stderr, err
        try:
            rc = main(argv)
        finally:
            sys.stderr = old
        assert rc == 2 and "--jaeger-url: not an http(s) URL" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "r.html").exists()
    assert main(["check", "--jaeger-url", "127.0.0.1:16686", log]) == 1   # host:port is still taken (http)
