"""A write error never turns a file sink off and never leaves a torn line.

* A full disk (a 2 MiB tmpfs, mounted when running as root, as CI does): the file always ends with a whole line,
  lines are kept (bounded) and written once space is freed, what could not be kept is counted.
* An int of more than 4,300 digits (beyond Python's int-to-str limit) keeps both the OTLP file and the log sink
  writing, through the whole pipeline; the value is ``(err:ValueError)`` in both, as on the network sink.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptrace_otel.export.file_sinks import LogLinesSink, OtlpJsonFileSink
from cptrace_otel.model.logline import parse_line


def _records(n: int, start: int = 0, pad: int = 0) -> list[tuple]:
    return [(i, 1_700_000_000_000_000_000 + i, 1, "backup", (("rid", f"r{i}"), ("node", i), ("pad", "x" * pad)))
            for i in range(start, start + n)]


def _mount_tmpfs(tmp_path: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size} tmpfs needs root (CI runs as root)")
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    yield from _mount_tmpfs(tmp_path, "2m")


@pytest.fixture
def one_mib_disk(tmp_path: Path):
    yield from _mount_tmpfs(tmp_path, "1m")


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte (a filler file written until ENOSPC); the filler's path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def _whole_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "torn last line"
    return data.decode().splitlines()


def test_disk_full_then_freed_resumes_without_torn_lines(tiny_disk: Path) -> None:
    filler = tiny_disk / "filler"
    filler.write_bytes(b"\0" * (1200 << 10))  # leaves ~800 KiB
    sink = LogLinesSink(str(tiny_disk / "rank0.log"), 0, 0)
    sink.CHUNK = 64 << 10          # write often, so the disk fills part-way through a chunk
    sink.MAX_PENDING = 256 << 10   # keep a little while failing; older lines are dropped and counted
    seq = 0
    for _ in range(40):            # ~1.6 MiB of lines: more than fits
        sink.write(_records(100, seq, pad=300))
        seq += 100
    assert sink.flush() is False
    st = sink.stats()
    assert st["log_write_errors"] >= 1 and st["log_dropped_lines"] > 0
    lines = _whole_lines(tiny_disk / "rank0.log")
    assert all(parse_line(x) is not None for x in lines)
    written_while_full = len(lines)
    # space comes back: pending lines and later ones are written, the loss stays counted
    filler.unlink()
    sink.write(_records(100, seq, pad=300))
    seq += 100
    assert sink.flush() is False  # False: lines were lost, even though everything pending is written now
    st = sink.stats()
    assert st["log_pending_bytes"] == 0
    lines = _whole_lines(tiny_disk / "rank0.log")
    assert len(lines) > written_while_full
    nodes = [parse_line(x).fields["node"] for x in lines]
    assert nodes[-1] == seq - 1                      # the newest record made it
    assert nodes == sorted(nodes)                    # order kept, nothing written twice
    assert len(nodes) + st["log_dropped_lines"] == seq  # every record written or counted
    sink.close()


def test_disk_full_for_the_otlp_file_sink(tiny_disk: Path) -> None:
    from cptrace_otel.model.spans import Span

    (tiny_disk / "filler").write_bytes(b"\0" * (1500 << 10))
    sink = OtlpJsonFileSink(str(tiny_disk / "out.otlp.jsonl"))
    sink.CHUNK = 32 << 10
    sink.MAX_PENDING = 64 << 10
    res = {"service.name": "t"}
    total = 0
    for _i in range(300):
        sps = [Span(os.urandom(16), os.urandom(8), "hicache.node", 1, 2, ("k",), {"pad": "y" * 400})
               for _ in range(8)]
        total += len(sps)
        sink.export([(res, sps)])
    sink.flush()
    (tiny_disk / "filler").unlink()
    assert sink.flush() is False
    lines = _whole_lines(tiny_disk / "out.otlp.jsonl")
    spans = sum(len(json.loads(x)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for x in lines)
    st = sink.stats()
    assert st["file_write_errors"] >= 1
    assert spans + st["file_dropped_spans"] == total
    sink.close()


def test_huge_int_keeps_both_file_sinks_writing(tmp_path: Path) -> None:
    """Through the real pipeline (exporter thread): records after an int of 5,000 digits still reach both files,
    and the big value itself is written with all its digits."""
    out, log = tmp_path / "o.jsonl", tmp_path / "r.log"
    code = f"""
import cptrace_otel as c
c.configure(level=1, file={str(out)!r}, log_file={str(log)!r}, exporter="thread", checks=False, run_id="t")
for i in range(50):
    c.cptrace(1, "backup", node_id=i, op=i)
c.cptrace(1, "backup", node_id=50, op=50, big=10**5000)
for i in range(51, 100):
    c.cptrace(1, "backup", node_id=i, op=i)
c.flush(30)
print(c.shutdown(30))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "write failed" not in r.stderr
    lines = log.read_text().splitlines()
    # (reading a 5,000-digit value back is the log reader's business: only the lines are checked here)
    assert sum("[CPTRACE backup]" in x for x in lines) == 100
    big = [x for x in lines if "big=" in x]
    assert len(big) == 1 and big[0].split("big=")[1].split()[0] == "(err:ValueError)"  # as the OTLP sinks
    text = out.read_text()
    assert text.endswith("\n")
    n_events = 0
    bigs: list = []
    for line in text.splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for e in sp.get("events", []):
                        if e["name"] == "backup":
                            n_events += 1
                            bigs += [a["value"] for a in e["attributes"] if a["key"] == "hicache.big"]
    assert n_events == 100
    assert bigs == [{"stringValue": "(err:ValueError)"}]


def test_a_backlog_larger_than_the_space_freed_still_resumes_and_every_loss_is_counted(one_mib_disk: Path,
                                                                                         tmp_path: Path) -> None:
    """the log file's disk is full while 6,000 records (~1.5 MiB of lines) are traced, then only 256 KiB
    are freed: the sink writes what fits (whole lines, in order) instead of retrying the whole backlog for ever, and
    what never fits is counted in the traced process's ``stats()["dropped"]`` (before: 0 written, 0 counted)."""
    filler = _fill(one_mib_disk)
    log = one_mib_disk / "rank0.log"
    code = """
import sys, cptrace_otel as ct
from cptrace_otel.traced import pipeline
for i in range(6000):
    ct.cptrace(1, "evict", node_id=i, pad="p" * 200)
print("FLUSH1", ct.flush(20), flush=True)
sys.stdin.readline()                     # the parent frees some space
print("FLUSH2", ct.flush(20), flush=True)
ct.shutdown(20)
print("DROPPED", pipeline.stats()["dropped"], flush=True)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CPTRACE_"))}
    env.update(CPTRACE_LEVEL="1", CPTRACE_RUN_ID="full", CPTRACE_CP_RANK="0", CPTRACE_CHECKS="0",
               CPTRACE_FILE=str(tmp_path / "out.jsonl"), CPTRACE_LOG_FILE=str(log),
               CPTRACE_SPOOL_DIR=str(tmp_path / "spool"))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "FLUSH1 False"
    before = _whole_lines(log) if log.exists() else []
    with open(filler, "r+b") as f:
        f.truncate(max(0, filler.stat().st_size - (256 << 10)))
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    lines = _whole_lines(log)
    nodes = [parse_line(x).fields["node_id"] for x in lines]
    assert len(lines) > len(before) + 500, err          # it resumed with the room that came back
    assert nodes == sorted(set(nodes))                   # in order, nothing twice
    dropped = int(out.split("DROPPED")[1].split()[0])
    assert len(nodes) + dropped >= 6000, (len(nodes), dropped)   # every record written or counted
    assert "is written again" in err or "cannot write" in err
