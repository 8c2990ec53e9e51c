"""The HTML report (``cptrace-otel report``) in headless Chromium: a demo run with an injected HASH fault shows every
rank's lane and the finding with its evidence, without a console error; a 100k-record run gives a page under 5 MB
(its time is printed, not asserted). Screenshots are saved (see tests/helpers/browser.py)."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from tests.helpers.browser import ROOT, chromium_page, cli, screenshot

RANKS = 4


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo")
    p = cli("demo", "--ranks", str(RANKS), "--mode", "sharded", "--faults", "HASH_flip", "--out", str(out), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    demo = json.loads(p.stdout)
    otlp = sorted(str(x) for x in out.glob("rank*.otlp.jsonl"))
    assert len(otlp) == RANKS
    html = out / "report.html"
    r = cli("report", "-o", str(html), "--jaeger-url", "http://127.0.0.1:16686", *otlp)
    assert r.returncode == 1, r.stdout + r.stderr          # 1: findings
    return html, demo


def test_demo_report_in_chromium(demo_report):
    html, demo = demo_report
    with chromium_page() as (page, errors):
        page.goto(html.as_uri())
        page.wait_for_selector("section.panel")
        # every epoch panel has one lane per rank, labelled with it
        for panel in page.query_selector_all("section.panel"):
            ranks = [g.get_attribute("data-rank") for g in panel.query_selector_all("g.lane")]
            assert ranks == [str(r) for r in range(RANKS)]
            for r in range(RANKS):
                assert panel.query_selector(f"g.lane[data-rank='{r}'] >> text=rank {r}") is not None
        # the injected finding: in the table and as a red mark on the faulty rank's lane, its evidence outlined
        row = page.query_selector("tr.finding[data-code='HASH']")
        assert row is not None and "backup h=" in row.inner_text()
        mark = page.query_selector("path.fmark[data-code='HASH']")
        assert mark is not None and mark.is_visible()
        lane = mark.evaluate("m => m.closest('g.lane').dataset.rank")
        assert lane == str(demo["injected"][0]["rank"])
        evidence = page.query_selector_all("rect.rec.ev")
        f = page.evaluate("JSON.parse(document.getElementById('cptrace-data').textContent).findings[0]")
        assert f["code"] == "HASH" and len(evidence) == len(f["evidence"])
        assert page.evaluate("getComputedStyle(document.querySelector('path.fmark')).fill") == "rgb(214, 39, 40)"
        # hover: the mark explains itself; a click on the row selects the evidence
        mark.hover()
        tip = page.query_selector("#tip")
        assert tip.is_visible() and "HASH" in tip.inner_text()
        page.query_selector("rect.rec.ev").hover()
        assert "seq" in tip.inner_text() and "node_id=" in tip.inner_text()
        row.click()
        assert len(page.query_selector_all("rect.rec.sel")) == len(f["evidence"])
        assert page.query_selector_all("g.lane a[href*='/search?']"), "no Jaeger link per lane"
        page.mouse.move(0, 0)
        screenshot(page, "report-demo.png")
        assert errors == []


def test_node_report_in_chromium(demo_report, tmp_path):
    html, _demo = demo_report
    otlp = sorted(str(x) for x in html.parent.glob("rank*.otlp.jsonl"))
    f = json.loads(cli("check", "--json", *otlp).stdout)["findings"][0]
    node_html = tmp_path / "node.html"
    r = cli("report", "-o", str(node_html), "--node", str(f["node_id"]), "--epoch", str(f["epoch"]),
            "--jaeger-url", "http://127.0.0.1:16686", *otlp)
    assert r.returncode == 1, r.stderr
    with chromium_page() as (page, errors):
        page.goto(node_html.as_uri() + "#trace=" + f["trace_id"])
        panel = page.query_selector(f"section.panel#trace-{f['trace_id']}")
        assert panel is not None and "flash" in panel.get_attribute("class")
        assert len(panel.query_selector_all("g.lane")) == RANKS
        assert panel.query_selector_all("rect.bar.b-h2d") and panel.query_selector_all("rect.bar.b-dev")
        assert panel.query_selector(f"g.lane[data-rank='{f['rank']}'] path.fmark[data-code='HASH']") is not None
        assert len(panel.query_selector_all("g.lane a[href*='uiFind=']")) == RANKS
        # hovering the reload (evidence) lists every record drawn at that pixel, with its fields
        reload = panel.query_selector_all("rect.rec.ev.t-reload")
        assert len(reload) == 1
        reload[0].hover(force=True)   # records drawn on top of it take the pointer: the tip lists them all
        assert "[reload]" in page.inner_text("#tip") and "chain=[" in page.inner_text("#tip")
        screenshot(page, "report-node.png")
        assert errors == []


def _bench_generator():
    spec = importlib.util.spec_from_file_location("check_throughput", ROOT / "bench" / "check_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.generate


@pytest.mark.slow
def test_100k_records_report_is_small_and_opens(tmp_path):
    paths = _bench_generator()(str(tmp_path / "rank{rank}.log"), 25_000, ranks=RANKS)
    html = tmp_path / "big.html"
    t0 = time.perf_counter()
    r = cli("report", "-o", str(html), "--run-id", "big", "--jaeger-url", "http://127.0.0.1:16686", *paths)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    size = html.stat().st_size
    events = sum(1 for p in paths for _ in open(p))
    print(f"report of {events} records: {size / 1e6:.2f} MB in {took:.2f} s (CLI process, wall clock) | {r.stdout}")
    assert events >= 100_000
    assert size < 5_000_000
    assert "summarised" in r.stdout
    with chromium_page() as (page, errors):
        t1 = time.perf_counter()
        page.goto(html.as_uri())
        page.wait_for_selector("section.panel")
        print(f"opened in Chromium in {time.perf_counter() - t1:.2f} s")
        first = page.query_selector("section.panel")
        assert [g.get_attribute("data-rank") for g in first.query_selector_all("g.lane")] == \
            [str(x) for x in range(RANKS)]
        assert page.query_selector_all("section.panel[data-node]")      # the top nodes, drawn
        screenshot(page, "report-100k.png", full_page=False)
        assert errors == []
