"""Bad input to ``check`` and ``ingest`` : never a traceback, never exit 1 for a crash,
a bad record reported with its file and line and skipped, memory bounded, nothing that blocks for ever."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from cptrace_otel import cli
from cptrace_otel.analyze.sources import inputs as files, logs
from tests.helpers.demo_run import check

GOOD = "[CPTRACE prepare] rank=0 node_id=7 op=1 ts=10\n"
BIG = "9" * 5000   # over Python's int-string limit (4300 digits)


def otlp_line(seq: int = 0, node: str = '{"intValue":"7"}', op: str = '{"intValue":"1"}') -> str:
    """One ExportTraceServiceRequest line with one cptrace record (a prepare of rank 0)."""
    ev = {"timeUnixNano": "1000", "name": "prepare", "attributes": [
        {"key": "hicache.node_id", "value": json.loads(node)}, {"key": "hicache.op", "value": json.loads(op)},
        {"key": "hicache.ts", "value": {"intValue": str(10 + seq)}},
        {"key": "cptrace.seq", "value": {"intValue": str(seq)}},
        {"key": "cptrace.epoch", "value": {"intValue": "0"}}]}
    req = {"resourceSpans": [{"resource": {"attributes": [{"key": "sglang.cp.rank", "value": {"intValue": "0"}}]},
                              "scopeSpans": [{"spans": [{"name": "hicache.d2h", "events": [ev]}]}]}]}
    return json.dumps(req) + "\n"


def cli_run(*argv: str, env: dict | None = None, stdin: bytes | None = None, timeout: float = 60):
    """The real command in a subprocess: (exit code, stdout, stderr)."""
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *argv], input=stdin, capture_output=True,
                       timeout=timeout, env=e)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def events(out: str) -> int:
    return json.loads(out)["stats"]["events"]


# -- no traceback, exit codes 0/1/2/3 ---------------------------------------------------------------------
@pytest.mark.parametrize("line", [f"[CPTRACE prepare] rank=0 node_id={BIG} op=1 ts=5\n",
                                  f"[CPTRACE prepare] rank=0 node_id=3 op=1 x={BIG} ts=5\n",
                                  f"[CPTRACE prepare] rank=0 node_id=3 op=1 ts={BIG}\n",
                                  f"[CPTRACE prepare] rank=0 node_id=3 op=[1,{BIG}]\n"])
def test_an_int_over_the_str_limit_is_a_malformed_line(tmp_path, line):
    p = tmp_path / "rank0.log"
    p.write_text(line + GOOD)
    rc, out, err = check("--json", str(p))
    assert rc == 0, err
    assert f"{p}:1: malformed line (an integer of more than 4300 digits)" in err
    assert events(out) == 1 and json.loads(out)["stats"]["malformed"] == 1


def test_the_python_reader_skips_a_huge_int_too(tmp_path, python_log_reader):
    p = tmp_path / "rank0.log"
    p.write_text(f"[CPTRACE prepare] rank=0 node_id={BIG} op=1 ts=5\n" + GOOD)
    bad: list = []
    evs = list(logs.read_log_events([str(p)], bad.append))
    assert [e.fields["node_id"] for e in evs] == [7]
    assert [(m.line_no, m.reason) for m in bad] == [(1, "an integer of more than 4300 digits")]


@pytest.mark.parametrize("text, why", [
    ('{"resourceSpans":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"resourceSpans": [{"resource": 5, "scopeSpans": "x"}]}', "not an OTLP request of the expected shape"),
    ('{"resourceSpans": {"a": 1}}', "not an OTLP request of the expected shape"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"events": [7]}]}]}]}', "span event skipped"),
    (otlp_line(5, node='{"intValue":"abc"}').strip(), "span event skipped"),
    (otlp_line(5, node=f'{{"intValue":"{BIG}"}}').strip(), "an integer of more than 4300 digits"),
    (otlp_line(5, node='{"arrayValue": 3}').strip(), "span event skipped"),
    ("[1, 2]", "a JSON list, not an object"),
])
def test_otlp_json_of_the_wrong_shape_is_a_malformed_line(tmp_path, text, why):
    p = tmp_path / "rank0.otlp.jsonl"
    p.write_text(otlp_line(0) + text + "\n" + otlp_line(1))
    rc, out, err = check("--json", str(p))
    assert rc in (0, 1), err
    assert f"{p}:2: malformed line (" in err and why in err
    assert events(out) == 2


def test_a_deep_or_wrong_typed_jaeger_document_costs_only_its_trace(tmp_path):
    good = {"traceID": "ab", "processes": {"p1": {"serviceName": "s", "tags": [
        {"key": "sglang.cp.rank", "type": "int64", "value": 0}]}},
        "spans": [{"traceID": "ab", "spanID": "01", "processID": "p1", "operationName": "hicache.d2h", "tags": [],
                   "logs": [{"timestamp": 1, "fields": [
                       {"key": "event", "type": "string", "value": "prepare"},
                       {"key": "hicache.node_id", "type": "int64", "value": 7},
                       {"key": "hicache.op", "type": "int64", "value": 1},
                       {"key": "cptrace.seq", "type": "int64", "value": 0}]}]}]}
    bad = dict(good, spans=[{"processID": "p1", "logs": [5]}])
    p = tmp_path / "export.json"
    p.write_text(json.dumps({"data": [bad, good]}))
    rc, out, err = check("--json", str(p))
    assert rc in (0, 1), err
    assert f"{p}:1: malformed line (not an OTLP request of the expected shape (AttributeError" in err
    assert events(out) == 1
    deep = tmp_path / "deep.json"
    deep.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rc, _, err = check(str(deep))
    assert rc == 3 and "Traceback" not in err


def test_ingest_skips_a_record_the_span_builder_rejects(tmp_path, capsys):
    p = tmp_path / "rank0.log"
    p.write_text("[CPTRACE prepare] rank=0 node_id=1 op=[1,2] ts=5\n"
                 "[CPTRACE prepare] rank=0 node_id=2 op=\"[1,2]\" ts=6\n" + GOOD)
    out = tmp_path / "o.jsonl"
    rc = cli.main(["ingest", "--no-progress", "--file", str(out), str(p)])
    text = capsys.readouterr().out
    assert rc == 0
    assert f"{p}:1: not replayed: TypeError" in text
    assert "ingested 2 events" in text or "ingested 1 events" in text
    assert '"intValue":"7"' in out.read_text()


def test_an_unexpected_exception_is_exit_3_with_one_line(monkeypatch, capsys):
    from cptrace_otel.commands import check as check_cmd

    def boom(args, out=None, err=None):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(check_cmd, "run", boom)
    monkeypatch.delenv("CPTRACE_DEBUG", raising=False)
    assert cli.main(["check", "x.log"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error at " in err and "RuntimeError: a bug over two lines" in err
    assert "Traceback" not in err
    monkeypatch.setenv("CPTRACE_DEBUG", "1")
    assert cli.main(["check", "x.log"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "internal error" in err.splitlines()[-1]


# -- bounded memory, nothing that hangs -------------------------------------------------------------------
# VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork and exec (this pytest process)
_RSS = ("import sys; from cptrace_otel import cli; rc = cli.main(sys.argv[1:]); "
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]; "
        "print('maxrss_kib', hwm, file=sys.stderr); sys.exit(rc)")


def run_rss(*argv: str, stdin=None, timeout: float = 120):
    """``cptrace-otel ARGV`` in a subprocess: (exit code, stderr, its peak RSS in MiB)."""
    p = subprocess.run([sys.executable, "-c", _RSS, *argv], stdin=stdin, capture_output=True, timeout=timeout)
    err = p.stderr.decode(errors="replace")
    rss = int(err.rsplit("maxrss_kib ", 1)[1].split()[0]) >> 10
    return p.returncode, err, rss


def test_a_line_longer_than_the_cap_is_reported_not_held(tmp_path):
    p = tmp_path / "rank0.log"
    with open(p, "w") as f:
        f.write(GOOD.replace("7", "1"))
        f.write("[CPTRACE prepare] rank=0 a=")
        for _ in range(300):   # 300 MiB in one line
            f.write("a" * (1 << 20))
        f.write("\n")
        f.write(GOOD)
    rc, err, rss = run_rss("check", "--no-progress", str(p))
    assert rc == 0, err
    assert f"{p}:2: malformed line (a line longer than 1048576 bytes" in err
    assert rss < 200, rss


def test_the_python_reader_caps_the_line_length(tmp_path, monkeypatch, python_log_reader):
    monkeypatch.setattr(files, "MAX_LINE", 1000)
    p = tmp_path / "rank0.log"
    p.write_text("[CPTRACE prepare] rank=0 a=" + "a" * 5000 + "\n" + GOOD)
    bad: list = []
    evs = list(logs.read_log_events([str(p)], bad.append))
    assert [e.line_no for e in evs] == [2]
    assert [m.line_no for m in bad] == [1] and "a line longer than 1000 bytes" in bad[0].reason


def test_a_gzip_bomb_stops_with_a_message(tmp_path):
    p = tmp_path / "rank0.log.gz"
    with gzip.open(p, "wb", compresslevel=9) as g:
        g.write(GOOD.encode())
        zeros = b"\0" * (1 << 24)
        for _ in range(16):   # 256 MiB of NULs in about 250 KiB
            g.write(zeros)
    rc, err, rss = run_rss("check", "--no-progress", str(p))
    assert rc == 0, err
    assert "times its compressed size (a gzip bomb?): reading stopped after" in err
    assert rss < 200, rss


def test_an_endless_line_on_standard_input_is_bounded():
    src = subprocess.Popen([sys.executable, "-c", "import sys\nw = sys.stdout.buffer\n"
                            f"w.write({GOOD!r}.encode() + b'[CPTRACE x] a=')\n"
                            "for _ in range(400): w.write(b'a' * (1 << 20))\n"], stdout=subprocess.PIPE)
    try:
        rc, err, rss = run_rss("check", "-", stdin=src.stdout)
    finally:
        src.stdout.close()
        src.wait()
    assert rc == 0, err
    assert "standard input:2: malformed line (a line longer than" in err or "-:2: malformed line" in err
    assert rss < 200, rss


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_a_fifo_or_device_by_path_is_refused_not_waited_on(tmp_path, kind):
    if kind == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    for cmd in (["check", path], ["ingest", "--no-progress", "--file", str(tmp_path / "o.jsonl"), path]):
        rc, _, err = cli_run(*cmd, timeout=30)
        assert rc == 3, err
        assert "not a regular file" in err and f"- < {path}" in err and "Traceback" not in err


def test_a_fifo_in_a_folder_is_skipped(tmp_path):
    (tmp_path / "rank0.log").write_text(GOOD)
    os.mkfifo(tmp_path / "pipe")
    rc, _out, err = cli_run("check", "--json", str(tmp_path), timeout=30)
    assert rc == 0, err
    assert "pipe: unreadable (a FIFO (named pipe), not a regular file" in err


def test_in_process_check_of_standard_input_still_reads(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(GOOD.encode()))))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(["check", "--json", "-"])
    assert rc == 0, err.getvalue()
    assert events(out.getvalue()) == 1
