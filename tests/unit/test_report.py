"""``cptrace-otel report``: exit codes, a self-contained page, its lanes, bars, findings and links (DOM read with the
standard library's HTML parser; the browser test in tests/integration opens the page in Chromium)."""

from __future__ import annotations

import io
import json
import os
import re
from html.parser import HTMLParser

from cptrace_otel.analyze import links
from cptrace_otel.analyze.report_bars import holds, stage_bars
from cptrace_otel.cli import main
from cptrace_otel.commands import report as report_cmd
from cptrace_otel.model.events import Event
from tests.helpers.checks_util import FIXTURES

DOMAIN = os.path.join(FIXTURES, "domain")
JAEGER = "http://127.0.0.1:16686"


class Dom(HTMLParser):
    """Every start tag as ``(tag, attrs)``, plus the JSON data block of the page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.els: list[tuple[str, dict]] = []
        self._in_data = False
        self.data: dict = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.els.append((tag, a))
        self._in_data = a.get("id") == "cptrace-data"

    def handle_data(self, data):
        if self._in_data:
            self.data = json.loads(data)
            self._in_data = False

    def find(self, tag=None, cls=None, **attrs):
        out = []
        for t, a in self.els:
            if tag and t != tag:
                continue
            if cls and cls not in (a.get("class") or "").split():
                continue
            if all(a.get(k.replace("_", "-")) == str(v) for k, v in attrs.items()):
                out.append(a)
        return out


class Args:
    def __init__(self, paths, out, **kw):
        self.paths, self.out = paths, out
        self.level = self.node = self.epoch = self.jaeger_url = self.run_id = None
        self.max_records = self.top = None
        self.progress = False
        for k, v in kw.items():
            setattr(self, k, v)


def run(args):
    out, err = io.StringIO(), io.StringIO()
    rc = report_cmd.run(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def two_ranks(tmp_path, bad="hash_bad.log", good="hash_good.log"):
    """Rank 0 replays ``bad``, rank 1 ``good``: one log file per rank."""
    paths = []
    for r, name in enumerate((bad, good)):
        lines = open(os.path.join(DOMAIN, name)).read().replace("rank=0", f"rank={r}")
        p = tmp_path / f"rank{r}.log"
        p.write_text(lines)
        paths.append(str(p))
    return paths


def test_exit_codes(tmp_path):
    out = str(tmp_path / "r.html")
    assert run(Args([os.path.join(DOMAIN, "hash_good.log")], out))[0] == 0
    assert run(Args([os.path.join(DOMAIN, "hash_bad.log")], out))[0] == 1 and os.path.getsize(out) > 0
    assert run(Args([], out))[0] == 2
    assert run(Args([os.path.join(DOMAIN, "hash_bad.log")], out, level=9))[0] == 2
    rc, _, err = run(Args([os.path.join(DOMAIN, "hash_bad.log")], out, epoch=0))
    assert rc == 2 and "--epoch needs --node" in err
    rc, _, err = run(Args([os.path.join(DOMAIN, "hash_bad.log")], out, node=12345))
    assert rc == 2 and "node 12345" in err
    rc, _, err = run(Args([str(tmp_path / "missing.log")], out))
    assert rc == 3 and "missing.log" in err
    (tmp_path / "file").write_text("x")
    rc, _, err = run(Args([os.path.join(DOMAIN, "hash_good.log")], str(tmp_path / "file" / "r.html")))
    assert rc == 3 and "cannot write" in err
    assert main(["report"]) == 2
    assert main(["report", "-o", out, os.path.join(DOMAIN, "hash_bad.log")]) == 1


def test_self_contained_lanes_findings_evidence(tmp_path):
    out = tmp_path / "r.html"
    rc, text, _ = run(Args(two_ranks(tmp_path), str(out), run_id="r1"))
    assert rc == 1 and str(out) in text
    page = out.read_text()
    # nothing is fetched: no external script, style sheet, image or font; the only URL is the SVG namespace
    assert not re.search(r"<script[^>]+src=|<link[^>]+stylesheet|@import|url\(", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    dom = Dom(page)
    assert {a["data-rank"] for a in dom.find("g", "lane")} == {"0", "1"}
    rows = dom.find("tr", "finding")
    assert [a["data-code"] for a in rows] == ["HASH"]
    marks = dom.find("path", "fmark", data_code="HASH")
    assert len(marks) == 1
    f = dom.data["findings"][0]
    assert (f["code"], f["rank"], f["node"]) == ("HASH", 0, 6)
    # the evidence records are drawn, outlined, and tied to the finding
    ev = [(dom.data["records"][int(a["data-i"])][1], dom.data["records"][int(a["data-i"])][2])
          for a in dom.find("rect", "ev")]
    assert sorted(ev) == sorted((0, s) for s in f["evidence"])
    assert all(a["data-ev"] == "0" for a in dom.find("rect", "ev"))
    # each record carries its fields for the hover text
    rec = next(r for r in dom.data["records"] if r[0] == "reload")
    assert "chain=[6]" in rec[5] and rec[6].endswith("rank0.log:7")
    # stage bars: d2h (prepare..ack d2h) and h2d (reload..ack h2d) on both ranks, closed
    for _r in ("0", "1"):
        kinds = [a["class"] for a in dom.find("rect", "bar") if a["class"]]
        assert "bar b-d2h" in kinds and "bar b-h2d" in kinds
    # the page names its trace ids so a link from Jaeger (#trace=<id>) can be resolved
    tid = links.trace_id_hex(__import__("cptrace_otel.model.spans", fromlist=["x"]).node_trace_id("r1", 0, 6))
    assert dom.data["traces"][tid] == [0, 6]


def test_node_report_holds_and_jaeger_links(tmp_path):
    out = tmp_path / "n.html"
    rc, _, _ = run(Args(two_ranks(tmp_path), str(out), node=6, epoch=0, run_id="r1", jaeger_url=JAEGER))
    assert rc == 1
    dom = Dom(out.read_text())
    panels = dom.find("section", "panel")
    trace = links.node_trace_url(JAEGER, "r1", 0, 6)
    assert [p["data-node"] for p in panels] == ["6"] and panels[0]["id"] == "trace-" + trace.rsplit("/", 1)[1]
    lanes = dom.find("g", "lane")
    assert [a["data-rank"] for a in lanes] == ["0", "1"]
    hrefs = [a["href"] for a in dom.find("a")]
    for r in (0, 1):   # a Jaeger link per lane: the node's trace with that rank's spans found
        assert f"{trace}?uiFind=sglang.cp.rank%3D{r}" in hrefs
    assert trace in [a["href"] for a in dom.find("a", "jlink")]   # the finding's trace
    classes = [a["class"] for a in dom.find("rect", "bar")]
    assert "bar b-dev" in classes and "bar b-host open" in classes   # device hold closed by evict; host still held
    # only records of node 6 are drawn
    assert all("node_id=6" in dom.data["records"][int(a["data-i"])][5] for a in dom.find("rect", "rec"))


def test_summarised_run_draws_top_nodes(tmp_path):
    out = tmp_path / "s.html"
    paths = two_ranks(tmp_path, "h4_bad.log", "hash_bad.log")
    rc, text, _ = run(Args(paths, str(out), max_records=5, top=1, run_id="r1"))
    assert rc == 1 and "summarised" in text
    dom = Dom(out.read_text())
    assert dom.find("rect", "dens")                       # lanes as densities
    node_panels = [p for p in dom.find("section", "panel") if "data-node" in p]
    assert len(node_panels) == 1                          # --top 1
    # every finding is in the table and drawn in red in its lane, though its lane is only a density
    drawn = {int(a["data-f"]) for a in dom.find("path", "fmark")}
    assert len(dom.data["findings"]) >= 2 and drawn == set(range(len(dom.data["findings"])))
    assert len(dom.find("tr", "finding")) == len(dom.data["findings"])
    assert dom.find("tr", data_node="6")                  # the top-nodes table


def test_findings_beyond_the_cap_are_counted_not_listed(tmp_path, monkeypatch):
    from cptrace_otel.analyze import report_model

    monkeypatch.setattr(report_model, "FINDINGS_SHOWN", 1)
    out = tmp_path / "c.html"
    rc, _, _ = run(Args(two_ranks(tmp_path, "h4_bad.log", "hash_bad.log"), str(out)))
    assert rc == 1
    page = out.read_text()
    dom = Dom(page)
    assert len(dom.find("tr", "finding")) == len(dom.data["findings"]) == 1
    total = sum(int(n) for n in re.findall(r'class="badge bad">\w+ × (\d+)<', page))
    assert total >= 2 and f"{total} findings: the first 1 (most severe first)" in page


def test_stdout_and_otlp_sources(tmp_path):
    otlp = str(tmp_path / "rank0.otlp.jsonl")
    assert main(["ingest", "--file", otlp, "--run-id", "run-x", "--no-progress",
                 os.path.join(DOMAIN, "hash_bad.log")]) in (0, 1)
    rc, page, _ = run(Args([otlp], "-"))
    assert rc == 1 and page.startswith("<!DOCTYPE html>")
    dom = Dom(page)
    assert dom.data["run_id"] == "run-x" and dom.find("tr", "finding", data_code="HASH")


def _ev(tag, seq, **f):
    return Event(tag, 0, seq, seq * 10, 0, dict(f, ts=seq * 10))


def test_stage_bars_follow_merged_ops_and_holds():
    evs = [_ev("insert", 0, node_id=1), _ev("prepare", 1, node_id=1, op=1), _ev("prepare", 2, node_id=2, op=2),
           _ev("backup", 3, node_id=1, op=3), _ev("backup", 4, node_id=2, op=3),
           _ev("ack", 5, dir="d2h", node_id=1, op=3), _ev("ack", 6, dir="d2h", node_id=2, op=3),
           _ev("evict", 7, tier="dev", node_id=1), _ev("reload", 8, node_id=1, chain=[1], op=4),
           _ev("ack", 9, dir="h2d", node_id=1, op=4), _ev("prepare", 10, node_id=1, op=5)]
    bars = stage_bars(evs)
    assert [(b.kind, b.op, b.start, b.end, sorted(b.nodes)) for b in bars] == [
        ("d2h", 1, 10, 50, [1]), ("d2h", 2, 20, 60, [2]), ("h2d", 4, 80, 90, [1]), ("d2h", 5, 100, None, [1])]
    assert bars[0].seqs == [1, 3, 5]
    h = holds([e for e in evs if e.fields.get("node_id") == 1], 1)
    assert [(b.kind, b.start, b.end) for b in h] == [("dev", 0, 70), ("host", 10, None), ("dev", 80, None)]


def test_l3_bars_in_the_stage_rows_and_the_page(tmp_path):
    """The L3 tier's stages: an l3_backup to its l3_ack dir=backup, an l3_prefetch to its l3_ack dir=prefetch (by
    op; an ack of another op closes nothing); drawn as b-l3b / b-l3p bars with the node's other stages."""
    evs = [_ev("insert", 0, node_id=1), _ev("l3_backup", 1, node_id=1, op=7, keys=["k1"], hp=[5]),
           _ev("l3_prefetch", 2, node_id=0, op=8, keys=["k1"]), _ev("l3_ack", 3, dir="backup", node_id=1, op=9),
           _ev("l3_ack", 4, dir="backup", node_id=1, op=7, done=1),
           _ev("l3_ack", 5, dir="prefetch", node_id=0, op=8, done=1, keys=["k1"], hp=[5]),
           _ev("l3_prefetch", 6, node_id=0, op=10)]
    assert [(b.kind, b.op, b.start, b.end, b.seqs) for b in stage_bars(evs)] == [
        ("l3b", 7, 10, 40, [1, 4]), ("l3p", 8, 20, 50, [2, 5]), ("l3p", 10, 60, None, [6])]
    log = tmp_path / "rank0.log"
    log.write_text(
        "[CPTRACE insert] node_id=1 parent=0 len=4 dev=(cnt=4,min=0,max=3,first=0,last=3) rank=0 ts=10\n"
        "[CPTRACE l3_backup] node_id=1 op=7 keys=[k1] hp=[5] host=(cnt=4,min=8,max=11,first=8,last=11) io=1 rank=0 "
        "ts=20\n"
        "[CPTRACE l3_ack] dir=backup op=7 node_id=1 done=1 rank=0 ts=30\n")
    out = tmp_path / "r.html"
    rc, _, err = run(Args([str(log)], str(out)))
    assert rc == 0, err
    dom = Dom(out.read_text())
    assert len(dom.find("rect", cls="b-l3b")) == 1 and not dom.find("rect", cls="open")
