"""``cptrace-otel check``: exit codes, the JSON object, the text table, source detection, trace links."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

from cptrace_otel.cli import main
from cptrace_otel.commands import check as check_cmd
from tests.helpers.checks_util import FIXTURES

DOMAIN = os.path.join(FIXTURES, "domain")


class Args:
    def __init__(self, paths, json=False, level=None, jaeger_url=None, run_id=None):
        self.paths, self.json, self.level, self.jaeger_url, self.run_id = paths, json, level, jaeger_url, run_id


def run(args):
    out, err = io.StringIO(), io.StringIO()
    rc = check_cmd.run(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def test_exit_codes_clean_findings_usage_unreadable(tmp_path):
    assert run(Args([os.path.join(DOMAIN, "h4_good.log")]))[0] == 0
    assert run(Args([os.path.join(DOMAIN, "h4_bad.log")]))[0] == 1
    assert run(Args([os.path.join(DOMAIN, "h4_bad.log")], level=7))[0] == 2
    assert run(Args([]))[0] == 2
    rc, _, err = run(Args([str(tmp_path / "missing.log")]))
    assert rc == 3 and "missing.log" in err
    # through the real CLI entry point (argparse usage errors exit 2)
    assert main(["check", os.path.join(DOMAIN, "h4_good.log")]) == 0
    assert main(["check"]) == 2


def test_json_object(tmp_path):
    rc, out, _ = run(Args([os.path.join(DOMAIN, "h1b_bad.log"), os.path.join(FIXTURES, "real", "malformed.log")],
                          json=True, run_id="r1", jaeger_url="http://127.0.0.1:16686/"))
    assert rc == 1
    obj = json.loads(out)
    assert set(obj) == {"findings", "unchecked", "stats", "localization"}
    assert obj["localization"] == []   # no fwd_hash records in these logs
    h1 = next(f for f in obj["findings"] if f["code"] == "H1")
    for k in ("code", "rule", "rank", "epoch", "node_id", "op", "certainty", "evidence", "message"):
        assert k in h1
    # two folders, two runs (log lines carry no run id: rank 0 in two folders is two launches), both named by
    # --run-id: h1b_bad.log's records are a stream of their own, not merged with malformed.log's rank 0
    assert (h1["rule"], h1["node_id"], h1["op"], h1["evidence"]) == ("H1b", 3, 7, [0, 1, 2])
    assert h1["run"] == "r1"
    assert h1["evidence_lines"] == [1, 2, 3] and h1["line_no"] == 3 and h1["src"].endswith("h1b_bad.log")
    tid = hashlib.blake2b(b"r1|0|3", digest_size=16).hexdigest()
    assert h1["trace_id"] == tid and h1["jaeger_url"].endswith("/trace/" + tid)
    st = obj["stats"]
    assert st["malformed"] == 3 and st["events"] == 6 and st["ranks"] == [0] and st["nodes"] >= 2
    assert {"rule", "code", "need_level", "kind"} <= set(obj["unchecked"][0]) if obj["unchecked"] else True


def test_text_table_groups_by_node_most_severe_first(tmp_path):
    p = tmp_path / "mix.log"
    sparse = "(cnt=2,min=500,max=600,first=500,last=600)"
    lines = open(os.path.join(DOMAIN, "h4_bad.log")).read().splitlines()
    # an H4-open WARN on node 1 (evicted while its copy was in flight, the ack never came), before the exact H4
    # ERROR on node 6; and an interval-only overlap of node 2's copy: undecidable, listed, not a finding
    lines = [
        "[CPTRACE prepare] node_id=2 op=2 len=2 dev=" + sparse
        + " host=(cnt=2,min=2,max=3,first=2,last=3) policy=wt rank=0 ts=1",
        "[CPTRACE free] pool=dev idx=(cnt=2,min=550,max=560,first=550,last=560) node_id=-1 why=finish rank=0 ts=2",
        "[CPTRACE ack] dir=d2h op=2 node_id=2 blen=2 clen=2 pub=[2] rank=0 ts=3",
        "[CPTRACE prepare] node_id=1 op=1 len=2 dev=(cnt=2,min=700,max=701,first=700,last=701)"
        " host=(cnt=2,min=0,max=1,first=0,last=1) policy=wt rank=0 ts=4",
        "[CPTRACE evict] tier=dev node_id=1 kind=backuped dev=(cnt=2,min=700,max=701,first=700,last=701) rank=0 ts=5",
    ] + lines
    p.write_text("\n".join(lines) + "\n")
    rc, out, _ = run(Args([str(p)]))
    assert rc == 1
    rows = out.splitlines()
    assert "2 findings (1 ERROR, 1 WARN) on 2 nodes" in out
    i6 = next(i for i, r in enumerate(rows) if r.startswith("node 6"))
    i1 = next(i for i, r in enumerate(rows) if r.startswith("node 1"))
    assert i6 < i1 and "ERROR H4" in rows[i6 + 1] and "WARN  H4" in rows[i1 + 1] and "H4-open" in rows[i1 + 1]
    und = [r for r in rows if r.strip().startswith("UNDECIDED")]
    assert len(und) == 1 and "H4a" in und[0] and "1x" in und[0] and "nodes [2]" in und[0]
    assert "mix.log:" in rows[i6 + 1]


def test_otlp_and_log_sources_detected_by_content(tmp_path):
    from cptrace_otel.model import semconv as sc
    from cptrace_otel.model.attrs import fields_to_attributes
    lines = open(os.path.join(DOMAIN, "h4_bad.log")).read().splitlines()
    from cptrace_otel.analyze.sources.logs import parse_trace_line
    events = []
    for i, ln in enumerate(lines):
        _, tag, fields, _ = parse_trace_line(ln)
        attrs = [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}}
                 for k, v in {**fields_to_attributes(fields), sc.SEQ: i, sc.EPOCH: 0}.items()]
        events.append({"name": tag, "timeUnixNano": str(100 + i), "attributes": attrs})
    req = {"resourceSpans": [{"resource": {"attributes": [
        {"key": sc.CP_RANK, "value": {"intValue": "0"}}, {"key": sc.RUN_ID, "value": {"stringValue": "RUN"}}]},
        "scopeSpans": [{"spans": [{"name": "hicache.node", "events": events}]}]}]}
    p = tmp_path / "trace.otlp"      # the extension says nothing: the content does
    p.write_text(json.dumps(req) + "\n")
    rc, out, _ = run(Args([str(p)], json=True))
    obj = json.loads(out)
    assert rc == 1 and [(f["rule"], f["node_id"]) for f in obj["findings"]] == [("H4a", 6)]
    assert obj["findings"][0]["trace_id"] == hashlib.blake2b(b"RUN|0|6", digest_size=16).hexdigest()
    assert obj["stats"]["sources"]["otlp"] == [str(p)]


def test_cli_subprocess_json(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        os.path.join(DOMAIN, "hash_bad.log")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert [f["code"] for f in json.loads(r.stdout)["findings"]] == ["HASH"]


def _big_log(tmp_path, copies: int = 600) -> str:
    """A log of many chunks: a fixture's lines repeated, each copy with its own node ids (no findings added)."""
    lines = [x for x in open(os.path.join(DOMAIN, "h4_good.log")).read().splitlines() if "[CPTRACE" in x]
    out = []
    for k in range(copies):
        out.extend(x.replace("node_id=", f"node_id={k}0") for x in lines)
    p = tmp_path / "rank0.log"
    p.write_text("\n".join(out) + "\n")
    return str(p)


def test_reader_progress_is_per_chunk_monotonic_and_ends_at_the_size(tmp_path):
    import gzip

    from cptrace_otel.analyze.sources.logs import read_log_events
    plain = _big_log(tmp_path)
    packed = str(tmp_path / "rank1.log.gz")
    with open(plain, "rb") as f, gzip.open(packed, "wb") as g:
        g.write(f.read())
    for path in (plain, packed):
        calls: list = []
        n = sum(1 for _ in read_log_events([path], progress=lambda d, t, calls=calls: calls.append((d, t))))
        size = os.path.getsize(path)
        assert n > 2000 and 2 <= len(calls) < n / 100      # once per chunk, not per event
        assert all(t == size for _, t in calls) and calls[-1] == (size, size)
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_progress_bar_on_request_only_and_the_report_unchanged(tmp_path):
    path = _big_log(tmp_path)
    a = Args([path], json=True)
    rc0, out0, err0 = run(a)                  # stderr is not a terminal: no bar by default
    a.progress = True
    rc1, out1, err1 = run(a)
    a.progress = False
    rc2, out2, err2 = run(a)
    assert rc0 == rc1 == rc2 == 0 and out0 == out1 == out2
    assert err0 == err2 == "" and "check:" in err1 and "100%" in err1
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--progress", "--no-progress", path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not allowed with" in r.stderr
