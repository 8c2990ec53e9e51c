"""What ``check`` accepts: inputs told by content, Jaeger JSON exports checked like the run's OTLP files
(events ordered by seq whatever order the backend gave), folders, the same run given twice counted once (or refused
with the files named), and input with no cptrace record rejected with what it looked like (exit 3)."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from cptrace_otel.analyze.sources.detect import HEAD, sniff
from tests.helpers.checks_util import FIXTURES
from tests.helpers.demo_run import check, core, run_demo
from tests.helpers.jaeger_fixtures import read_requests, to_v2, to_v3


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A 4-rank sharded demo with the faults C1_div, C3_writer, HASH_flip: log files and OTLP files in one folder."""
    return run_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def baseline(demo):
    rc, out, err = check("--json", *demo["otlp"])
    assert rc == 1, err
    rc2, out2, _ = check("--json", *demo["logs"])
    assert rc2 == 1 and core(out2) == core(out)
    assert {f["code"] for f in core(out)} >= {"C1", "C3", "HASH"}
    return core(out)


# -- what a file is -------------------------------------------------------------------------------------------------
def test_sniff_tells_every_kind_by_content(tmp_path, demo):
    reqs = read_requests(demo["otlp"][:1])

    def put(name: str, data: bytes | str) -> str:
        p = tmp_path / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(p)

    log_late = "starting server\n" * (HEAD // 10) + "[CPTRACE reset] rank=0 ts=1\n"
    cases = {
        put("a", open(demo["logs"][0], "rb").read()): ("log", ""),
        put("b", log_late): ("log", ""),                                  # the marker after the first 64 KiB
        put("c", open(demo["otlp"][0], "rb").read()): ("otlp", ""),
        put("d", json.dumps(to_v2(reqs), indent=2)): ("jaeger", ""),      # pretty-printed api_v2
        put("e", json.dumps(to_v3(reqs))): ("jaeger", ""),                # compact api_v3 (one long line)
        put("f", json.dumps(to_v3(reqs), indent=1)): ("jaeger", ""),
        put("g", json.dumps(to_v2(reqs)["data"][0])): ("jaeger", ""),     # one trace object
        put("h.gz", gzip.compress(json.dumps(to_v2(reqs)).encode())): ("jaeger", ""),
        put("o", json.dumps(to_v2(reqs)["data"], indent=1)): ("jaeger", ""),   # a list of traces
        put("p", b"\x00\x00garbage\n[CPTRACE reset] rank=0 ts=1\n"): ("log", ""),  # NULs before the records
        put("i", b""): (None, "empty"),
        put("j", b"  \n\n\t\n"): (None, "only whitespace"),
        put("k", os.urandom(5000)): (None, "binary data"),
        put("l", "hello\nworld\n"): (None, "plain text with no [CPTRACE record (2 lines, the first: 'hello')"),
        put("m", '{"status": "ok", "items": [1, 2]}\n'): (None, "JSON of another kind (keys: status, items)"),
        # fixed bytes: random ones now and then inflate to something, and the sniff then names that instead
        put("n", b"\x1f\x8b\x08\x00" + random.Random(7).randbytes(300)): (None, "gzip"),
    }
    for path, (kind, what) in cases.items():
        s = sniff(path)
        assert s.kind == kind and what in s.what, (os.path.basename(path), s)


def test_input_without_a_record_exits_3_with_what_it_looked_like(tmp_path, demo):
    other_v2 = {"data": [{"traceID": "ab" * 16, "processes": {"p1": {"serviceName": "frontend", "tags": [
        {"key": "host.name", "type": "string", "value": "web1"}]}}, "spans": [{
            "traceID": "ab" * 16, "spanID": "cd" * 8, "operationName": "GET /", "references": [], "startTime": 1,
            "duration": 5, "tags": [{"key": "http.status_code", "type": "int64", "value": 200}],
            "logs": [{"timestamp": 2, "fields": [{"key": "event", "type": "string", "value": "cache miss"}]}],
            "processID": "p1"}]}], "total": 0, "limit": 0, "offset": 0, "errors": None}
    other_v3 = {"result": {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "redis"}}]}, "scopeSpans": [{"spans": [
            {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "GET",
             "events": [{"name": "x", "attributes": []}]}]}]}]}}
    files = {"random.bin": os.urandom(4096), "notes.txt": b"just some text\nwith no records\n", "empty.log": b"",
             "frontend.json": json.dumps(other_v2).encode(), "redis.json": json.dumps(other_v3, indent=2).encode(),
             "other.otlp.jsonl": (json.dumps(other_v3["result"]) + "\n").encode()}
    want = {"random.bin": "binary data", "notes.txt": "plain text", "empty.log": "empty",
            "frontend.json": "Jaeger JSON (api_v2 /api/traces) of service frontend",
            "redis.json": "Jaeger JSON (api_v3 /api/v3/traces) of service redis",
            "other.otlp.jsonl": "OTLP JSON lines of service redis"}
    for name, data in files.items():
        p = tmp_path / name
        p.write_bytes(data)
        rc, out, err = check(str(p))
        assert rc == 3 and out == "", (name, err)
        assert f"{p}: no cptrace record found: {want[name]}" in err and "Traceback" not in err, (name, err)
    # one bad file among good ones: refused, naming that file only
    rc, out, err = check(*demo["logs"], str(tmp_path / "notes.txt"))
    assert rc == 3 and "notes.txt" in err and "rank0.log" not in err
    # through the real entry point: no traceback
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", str(tmp_path / "random.bin")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "binary data" in r.stderr and "Traceback" not in r.stderr


# -- Jaeger exports -------------------------------------------------------------------------------------------------
def test_jaeger_exports_give_the_findings_of_the_otlp_files(tmp_path, demo, baseline):
    reqs = read_requests(demo["otlp"])
    rc0, text0, _ = check(*demo["otlp"])
    exports = {
        "v2.json": json.dumps(to_v2(reqs, seed=1), indent=2),         # /api/traces?...&prettyPrint=true
        "v2-compact.json": json.dumps(to_v2(reqs, seed=2)),           # curl /api/traces
        "v3.json": json.dumps(to_v3(reqs, seed=3)),                   # curl /api/v3/traces
        "v3-pretty.json": json.dumps(to_v3(reqs, seed=4), indent=2),
        "unwrapped.json": json.dumps(to_v3(reqs, seed=5)["result"]),  # the result object alone
    }
    for name, text in exports.items():
        p = tmp_path / name
        p.write_text(text)
        rc, out, err = check("--json", str(p))
        assert rc == 1 and core(out) == baseline, (name, err)
        st = json.loads(out)["stats"]
        assert st["events"] == 832 and st["ranks"] == [0, 1, 2, 3]
        # (an unwrapped result on one line is an OTLP JSON line: read as such)
        assert st["sources"].get("jaeger", []) + st["sources"]["otlp"] == [str(p)]
        rc, text, _ = check(str(p))
        assert rc == rc0 and text == text0, name   # the same table, trace ids included (run id from the resource)
    gz = tmp_path / "v3.json.1"
    gz.write_bytes(gzip.compress(exports["v3.json"].encode()))
    rc, out, _ = check("--json", str(gz))
    assert rc == 1 and core(out) == baseline


def test_events_in_the_backends_order_are_put_in_seq_order(tmp_path, demo, baseline):
    """No false C1 from span order: span events and spans in the order Jaeger returns them, not the ranks' order."""
    reqs = read_requests(demo["otlp"])
    doc = to_v3(reqs, seed=9)
    doc["result"]["resourceSpans"].reverse()
    for rs in doc["result"]["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["events"].reverse()
    p = tmp_path / "reversed.json"
    p.write_text(json.dumps(doc))
    rc, out, _ = check("--json", str(p))
    assert rc == 1 and core(out) == baseline


def test_a_browser_rounded_hash_is_warned_about(tmp_path, demo):
    doc = to_v2(read_requests(demo["otlp"][:1]))
    field = next(f for tr in doc["data"] for sp in tr["spans"] for lg in sp["logs"] for f in lg["fields"]
                 if f["key"] == "hicache.h")
    field["value"] = 8070450532247929000   # what JSON.stringify prints for 8070450532247928832
    p = tmp_path / "traces-1700000000000.json"
    p.write_text(json.dumps(doc))
    rc, _, err = check(str(p))
    assert rc in (0, 1) and "look rounded by a browser" in err


# -- folders and the same run twice ---------------------------------------------------------------------------------
def test_a_run_folder_is_checked_once_not_twice(demo, baseline):
    rc, out, err = check("--json", demo["dir"])
    assert rc == 1 and core(out) == baseline, err     # 4 findings, not 8: logs and OTLP hold the same records
    assert "hold the same records for ranks 0-3" in err and "counted once, from the log files" in err
    assert "rank3.log = rank3.otlp.jsonl" in err and "not read: rank0.otlp.jsonl" in err
    st = json.loads(out)["stats"]
    assert st["events"] == 832 and st["sources"]["otlp"] == [] and len(st["sources"]["logs"]) == 4
    # the run id comes from the OTLP files, so the log findings link to their traces
    assert all(f.get("trace_id") for f in json.loads(out)["findings"])
    # the files named one by one: the same
    rc2, out2, err2 = check("--json", *demo["logs"], *demo["otlp"])
    assert rc2 == 1 and core(out2) == baseline and "counted once" in err2


def test_folders_recursive_with_other_files_skipped(tmp_path, demo, baseline):
    top = tmp_path / "runs"
    sub = top / "node0" / "logs"
    sub.mkdir(parents=True)
    for p in demo["otlp"]:
        shutil.copy(p, sub)
    (top / "README.txt").write_text("run of 2026-12-01\n")
    (top / "node0" / "core.bin").write_bytes(os.urandom(2048))
    (top / ".hidden.log").write_text("[CPTRACE reset] rank=9 ts=1\n")
    rc, out, err = check("--json", str(top))
    assert rc == 1 and core(out) == baseline
    assert "skipped 2 file(s)" in err and "README.txt: plain text" in err and "core.bin: binary data" in err
    assert json.loads(out)["stats"]["ranks"] == [0, 1, 2, 3]       # the hidden file is not read
    # a folder with nothing to read: exit 3, listing what it holds
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.txt").write_text("nothing\n")
    rc, out, err = check(str(junk))
    assert rc == 3 and "no cptrace input in this folder (1 files: a.txt: plain text" in err
    empty = tmp_path / "none"
    empty.mkdir()
    rc, _, err = check(str(empty))
    assert rc == 3 and "(no files)" in err


def test_overlapping_sources_pick_the_covering_one_or_refuse(demo, baseline):
    logs, otlp = demo["logs"], demo["otlp"]
    rc, out, err = check("--json", *logs, *otlp[:2])       # the logs hold ranks 0-3, the OTLP files 0-1
    assert rc == 1 and core(out) == baseline and "counted once, from the log files" in err
    rc, out, err = check("--json", *logs[:2], *otlp)       # and the other way round
    assert rc == 1 and core(out) == baseline and "counted once, from the trace files" in err
    assert "not read: rank0.log, rank1.log" in err
    rc, out, err = check(*logs[:3], *otlp[1:])             # ranks 0-2 from logs, 1-3 from OTLP: the run in parts
    assert rc == 2 and out == ""
    assert "same records for ranks 1, 2" in err and "ranks 0 only in the log files" in err
    assert "rank1.log = rank1.otlp.jsonl" in err


def test_different_runs_with_the_same_rank_numbers_stay_two_runs(demo):
    other = os.path.join(FIXTURES, "domain", "h4_bad.log")   # rank 0, other records
    rc, out, err = check("--json", other, *demo["otlp"])
    assert rc == 1 and "counted once" not in err
    codes = [f["code"] for f in json.loads(out)["findings"]]
    assert "H4" in codes and "C1" in codes


def test_trace_files_holding_the_same_records_count_once(tmp_path, demo, baseline):
    v3 = tmp_path / "export.json"
    v3.write_text(json.dumps(to_v3(read_requests(demo["otlp"]))))
    rc, out, err = check("--json", *demo["otlp"], str(v3))
    assert rc == 1 and core(out) == baseline
    assert json.loads(out)["stats"]["events"] == 832
    assert "rank0.otlp.jsonl and " + str(v3) + " hold the same" in err and "counted once" in err
    rc, out, err = check("--json", demo["otlp"][0], demo["otlp"][0])   # one file named twice
    assert "given more than once, read once" in err and json.loads(out)["stats"]["events"] < 832
