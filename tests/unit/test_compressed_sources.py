"""gzip-compressed and piped sources: ``check`` and ``ingest`` read rotated ``.gz`` logs and OTLP files like plain
ones, a gzip stream that breaks keeps the events before the break and is reported with file and line, and ``-``
reads standard input (plain or gzip, log or OTLP)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

from cptrace_otel.analyze.sources import inputs as files, logs
from cptrace_otel.analyze.sources.logs import LogStats, read_log_events
from cptrace_otel.analyze.sources.otlpfile import OtlpInfo, looks_like_otlp, read_otlp_events
from cptrace_otel.commands import check as check_cmd


def _gzip(src: str, dst: str) -> str:
    with open(src, "rb") as f, gzip.open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A demo run with faults (so there are findings to compare): its two rank logs and two OTLP files, plain and
    gzip-compressed under names that do not say so."""
    out = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--out", str(out), "--json", "--seed", "3"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr
    plain = {k: [str(out / f"rank{r}.{k}") for r in (0, 1)] for k in ("log", "otlp.jsonl")}
    packed = {k: [_gzip(x, x + ".1") for x in v] for k, v in plain.items()}
    return plain, packed


class _Args:
    def __init__(self, paths):
        self.paths, self.json, self.level, self.jaeger_url, self.run_id = paths, True, None, None, None


def _check(paths: list[str]) -> tuple[int, dict, str]:
    import io
    out, err = io.StringIO(), io.StringIO()
    rc = check_cmd.run(_Args(paths), out, err)
    return rc, json.loads(out.getvalue()), err.getvalue()


def _strip_sources(rep: dict) -> str:
    """The report without file names (they differ between the plain and the compressed copies)."""
    rep = dict(rep)
    rep["stats"] = {k: v for k, v in rep["stats"].items() if k != "sources"}
    return json.dumps(rep, sort_keys=True).replace(".1", "")


def test_gzip_is_told_by_content_not_name(run_files):
    plain, packed = run_files
    assert not files.is_gzip(plain["log"][0]) and files.is_gzip(packed["log"][0])
    assert looks_like_otlp(packed["otlp.jsonl"][0]) and not looks_like_otlp(packed["log"][0])


@pytest.mark.parametrize("kind", ["log", "otlp.jsonl"])
def test_compressed_files_give_the_same_check(run_files, kind):
    plain, packed = run_files
    rc_p, rep_p, _ = _check(plain[kind])
    rc_z, rep_z, err = _check(packed[kind])
    assert rc_p == rc_z == 1 and rep_p["findings"] and not err
    assert _strip_sources(rep_z) == _strip_sources(rep_p)


@pytest.mark.parametrize("use_c", [False, True])
def test_broken_stream_keeps_the_events_before_it_and_reports_the_line(run_files, tmp_path, request, use_c):
    if use_c and logs.c_reader() is None:
        pytest.skip("_logc not built")
    if not use_c:
        request.getfixturevalue("python_log_reader")
    plain, packed = run_files
    whole = list(read_log_events([plain["log"][0]]))
    data = open(packed["log"][0], "rb").read()
    cut = tmp_path / "rank0.log.gz"
    cut.write_bytes(data[:len(data) * 2 // 3])
    bad: list = []
    st = LogStats()
    got = list(read_log_events([str(cut)], bad.append, st))
    assert 0 < len(got) < len(whole)
    # every complete line before the break is an event, identical to the plain file's (the cut line may be lost)
    assert [(e.tag, e.seq, e.fields) for e in got[:-1]] == [(e.tag, e.seq, e.fields) for e in whole[:len(got) - 1]]
    assert len(bad) >= 1 and bad[-1].path == str(cut) and "gzip stream ends early" in bad[-1].reason
    assert bad[-1].line_no == st.lines + 1


def test_broken_otlp_stream_is_a_malformed_line_not_an_error(run_files, tmp_path):
    import zlib
    plain, _ = run_files
    lines = open(plain["otlp.jsonl"][0], "rb").read().splitlines(keepends=True)
    cut = tmp_path / "rank0.otlp.jsonl.gz"
    with open(cut, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as g:
        g.write(lines[0])
        g.flush(zlib.Z_SYNC_FLUSH)   # the first line's compressed bytes are all out before the cut
        keep = raw.tell()
        g.write(b"".join(lines[1:]) or b"x" * 1000)
    cut.write_bytes(cut.read_bytes()[:keep + 5])
    info = OtlpInfo()
    evs = list(read_otlp_events([str(cut)], info))
    assert evs and any("gzip stream ends early" in why for _, _, why in info.malformed)
    rc, rep, err = _check([str(cut)])
    assert rc in (0, 1) and rep["stats"]["malformed"] >= 1 and "gzip stream ends early" in err


def test_ingest_progress_counts_records_of_compressed_logs(run_files):
    from cptrace_otel.commands.ingest import count_trace_lines
    plain, packed = run_files
    n = count_trace_lines(plain["log"])
    assert n > 100 and count_trace_lines(packed["log"]) == n


def _cli(*args: str, stdin: bytes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *args], input=stdin, capture_output=True,
                          timeout=120, env=env)


def _findings(rep: dict) -> list:
    """Findings without where they were read (file, line and the run id in the trace id and run differ between
    sources)."""
    return [{k: v for k, v in f.items() if k not in ("src", "line_no", "trace_id", "evidence_lines", "run")}
            for f in rep["findings"]]


def test_check_reads_standard_input(run_files):
    plain, _packed = run_files
    want = _check(plain["log"][:1])[1]
    log0 = open(plain["log"][0], "rb").read()
    for data in (log0, gzip.compress(log0)):
        p = _cli("check", "--json", "-", stdin=data)
        assert p.returncode == 1, p.stderr
        got = json.loads(p.stdout)
        assert _findings(got) == _findings(want) and got["stats"]["events"] == want["stats"]["events"]
        assert got["stats"]["sources"] == {"logs": ["-"], "otlp": []}
    otlp0 = open(plain["otlp.jsonl"][0], "rb").read()
    p = _cli("check", "--json", "-", stdin=otlp0)
    got = json.loads(p.stdout)
    assert got["stats"]["sources"] == {"logs": [], "otlp": ["-"]}
    assert _findings(got) == _findings(_check(plain["otlp.jsonl"][:1])[1])
    # a file and standard input together; standard input twice is a usage error
    p = _cli("check", "--json", plain["log"][1], "-", stdin=log0)
    assert json.loads(p.stdout)["stats"]["ranks"] == [0, 1]
    p = _cli("check", "-", "-", stdin=b"")
    assert p.returncode == 2 and b"standard input" in p.stderr
    # empty input is no clean pass: exit 3 with what it was
    p = _cli("check", "-", stdin=b"")
    assert p.returncode == 3 and b"standard input: no cptrace record found: empty" in p.stderr and not p.stdout


def test_ingest_reads_standard_input(run_files, tmp_path):
    plain, _ = run_files
    out = tmp_path / "in.jsonl"
    with open(plain["log"][0], "rb") as fh:
        packed = gzip.compress(fh.read())
    p = _cli("ingest", "-", "--file", str(out), "--no-progress", stdin=packed)
    assert p.returncode == 0, p.stderr
    assert _findings(_check([str(out)])[1]) == _findings(_check(plain["log"][:1])[1])


def test_ingest_progress_counts_a_marker_split_between_read_blocks(tmp_path):
    from cptrace_otel.commands.ingest import count_trace_lines
    block = 1 << 22   # the counter's read size
    data = b"x" * (block - 4) + b"[CPTRACE a] x=1\n" + b"y" * (block - 30) + b"[CPTRACE b] y=2\n[CPTRACE c]\n"
    p = tmp_path / "rank0.log"
    p.write_bytes(data)
    assert count_trace_lines([str(p)]) == data.count(b"[CPTRACE ") == 3


def test_concatenated_ranks_in_one_stream_are_flagged_interleaved_ones_are_not(run_files, tmp_path):
    """One stream holding several ranks must be in time order for the cross-rank rules; ranks pasted one after
    another are counted (``stats.behind``) and ``check`` warns, a time-ordered stream of the same records is not."""
    import heapq
    plain, _ = run_files
    files = [open(p).read().splitlines(keepends=True) for p in plain["log"]]

    def ts(line: str) -> int:
        return int(line.rsplit(" ts=", 1)[1])

    cat = tmp_path / "cat.log"
    cat.write_text("".join(files[1] + files[0]))
    mixed = tmp_path / "mixed.log"
    mixed.write_text("".join(heapq.merge(*files, key=ts)))
    for path, flagged in ((cat, True), (mixed, False)):
        st = LogStats()
        evs = list(read_log_events([str(path)], stats=st))
        assert {e.rank for e in evs} == {0, 1} and st.disordered() is flagged, (path, st.behind, len(evs))
    assert st.behind == 0
    p = _cli("check", "--json", "-", stdin=cat.read_bytes())
    assert b"not interleaved in time" in p.stderr and json.loads(p.stdout)["stats"]["out_of_order"] > 50
    p = _cli("check", "--json", "-", stdin=mixed.read_bytes())
    assert b"not interleaved" not in p.stderr and json.loads(p.stdout)["stats"]["out_of_order"] == 0
