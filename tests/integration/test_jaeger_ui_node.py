"""A 16-rank node in the real Jaeger UI (trace model v2): the trace of a 16-rank demo node with an injected HASH fault,
opened in headless Chromium, asserted from the page.

- collapsed, the trace has one top-level row per rank, each labelled ``rank R · node``;
- expanding a rank shows its spans (stages, later lane segments) in time order;
- the error mark is on the faulty rank's reload span (``rank R · h2d``), whose references include the backup's span;
- Trace Graph draws nodes;
- a search for the HASH code (``cptrace.violation.HASH=true``) finds every trace that the demo's check reports.

Needs Jaeger serving the jaeger-ui build (``deploy/jaeger/up`` does when ``../shared/jaeger-ui/build`` exists; tests
skip with the reason otherwise) and headless Chromium (tests/helpers/browser.py). Screenshots go to its ARTIFACTS.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers.browser import ROOT, chromium_page, cli, screenshot
from tests.helpers.integration import REQUIRE_JAEGER, unavailable, wait_for

UI_BUILD = Path(os.environ.get("JAEGER_UI_ASSETS") or ROOT.parent / "shared" / "jaeger-ui" / "build")
RANKS = 16
# the timeline header's four buttons, in order: Expand +1, Collapse +1, Expand All, Collapse All (icons, no titles)
COLLAPSER = ".TimelineCollapser svg"


def _require_ui(query_url: str) -> None:
    import urllib.request

    if not (UI_BUILD / "index.html").is_file():
        pytest.skip(f"no jaeger-ui build at {UI_BUILD}: a Jaeger built from its Go module has no UI to test")
    with urllib.request.urlopen(query_url + "/", timeout=10) as r:
        page = r.read().decode("utf-8", "replace")
    if "not the Jaeger UI you are looking for" in page:
        why = f"Jaeger at {query_url} serves no jaeger-ui (started without JAEGER_UI_ASSETS?)"
        unavailable(why) if REQUIRE_JAEGER else pytest.skip(why)


def _rows(page) -> list[tuple[str, int, bool]]:
    """The rendered span rows: (operation name, depth, has the error mark)."""
    out = []
    for row in page.query_selector_all(".span-row"):
        name = row.query_selector(".endpoint-name")
        depth = len(row.query_selector_all(".SpanTreeOffset--indentGuide"))
        err = row.query_selector("[class*=errorIcon]") is not None
        out.append((name.inner_text().strip() if name else "", depth, err))
    return out


def test_sixteen_rank_node_in_the_jaeger_ui(jaeger, tmp_path):
    _require_ui(jaeger.query_url)
    p = cli("demo", "--ranks", str(RANKS), "--faults", "HASH_flip", "--out", str(tmp_path), "--endpoint",
            jaeger.otlp_http, "--json", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    demo = json.loads(p.stdout)
    run_id = demo["run_id"]
    hash_findings = [f for f in demo["findings"] if f["code"] == "HASH"]
    assert hash_findings
    f = hash_findings[0]
    tid, bad_rank = f["trace_id"], f["rank"]

    def complete():
        t = jaeger.client.get_trace(tid)
        ranks = {next(x["value"] for x in s["tags"] if x["key"] == "sglang.cp.rank")
                 for s in (t or {}).get("spans", [])}
        return t if len(ranks) == RANKS else None

    trace = wait_for(complete, 60, f"trace {tid} with all {RANKS} ranks in Jaeger")
    spans = {s["spanID"]: s for s in trace["spans"]}
    parent = {sid: next((r["spanID"] for r in s.get("references", []) if r["refType"] == "CHILD_OF"), None)
              for sid, s in spans.items()}
    (bad,) = [s for s in spans.values() if any(t["key"] == "cptrace.violation.HASH" for t in s["tags"])]
    backups = [r["spanID"] for r in bad.get("references", []) if r["refType"] == "FOLLOWS_FROM"]
    assert backups and all(spans[b]["operationName"] == f"rank {bad_rank} \u00b7 d2h" for b in backups)

    with chromium_page(1500, 1000) as (page, errors):
        page.goto(f"{jaeger.query_url}/trace/{tid}")
        page.wait_for_selector(".span-row", timeout=30_000)
        # collapsed to the top level: one row per rank, labelled with its rank
        page.locator(COLLAPSER).nth(3).click()  # Collapse All
        page.wait_for_function("document.querySelectorAll('.span-row').length <= %d" % (RANKS + 1))
        top = _rows(page)
        assert sorted(n for n, _, _ in top) == sorted(f"rank {r} \u00b7 node" for r in range(RANKS))
        screenshot(page, "jaeger-node-ranks.png", full_page=False)

        # expanding the faulty rank: its spans in time order (what the API says are its lane's children)
        lane = next(s for s in spans.values() if parent[s["spanID"]] is None
                    and s["operationName"] == f"rank {bad_rank} \u00b7 node")
        kids = sorted((s for s in spans.values() if parent[s["spanID"]] == lane["spanID"]),
                      key=lambda s: s["startTime"])
        row = page.locator(".span-row", has_text=f"rank {bad_rank} \u00b7 node").first
        row.locator(".SpanTreeOffset").click()
        page.wait_for_function("document.querySelectorAll('.span-row').length > %d" % len(top))
        shown = _rows(page)
        i = [n for n, _, _ in shown].index(f"rank {bad_rank} \u00b7 node")
        assert [n for n, _, _ in shown[i + 1:i + 1 + len(kids)]] == [k["operationName"] for k in kids]
        assert all(d > shown[i][1] for _, d, _ in shown[i + 1:i + 1 + len(kids)])
        screenshot(page, "jaeger-node-rank-expanded.png", full_page=False)

        # everything expanded: the one error mark is on the faulty rank's reload span
        page.locator(COLLAPSER).nth(2).click()  # Expand All
        page.wait_for_function("document.querySelectorAll('.span-row').length > %d" % len(shown))
        errs = [n for n, _, e in _rows(page) if e]
        assert errs == [f"rank {bad_rank} \u00b7 h2d"]
        err_row = page.locator(".span-row:has([class*=errorIcon])").first
        err_row.locator(".span-name").click()
        detail = page.locator(".detail-row").first
        refs = detail.locator(".AccordianReferences--header")
        refs.click()
        # the section is drawn once it opens: wait for that state (its text naming every backup span), not a time
        page.wait_for_function("([sel, ids]) => { const d = document.querySelector(sel); "
                               "return !!d && ids.every((i) => d.innerText.includes(i)); }",
                               arg=[".detail-row", backups], timeout=30_000)
        text = detail.inner_text()
        assert all(b in text for b in backups), text        # the references name the backup span(s)
        assert f"rank {bad_rank} \u00b7 d2h" in text
        detail.scroll_into_view_if_needed()
        screenshot(page, "jaeger-node-hash-span.png", full_page=False)

        # Trace Graph draws the nodes. The view menu slides in when opened; on a loaded machine a pointer click on
        # its item can land while it still moves or under another layer ("not stable", "intercepts pointer
        # events"). So: open it, wait until the menu has finished its entry animation (antd's *-enter classes
        # gone), click the item, and wait for the graph; a menu that closed without switching is opened again.
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        graph = ".TraceGraph--graphWrapper .OpNode"
        for attempt in range(3):
            if page.query_selector(graph) is None:
                page.locator(".ant-dropdown-trigger", has_text="Trace Timeline").click()
                item = page.locator(".ant-dropdown-menu-item", has_text="Trace Graph")
                item.wait_for(state="visible", timeout=30_000)
                page.wait_for_function("() => [...document.querySelectorAll('.ant-dropdown')].some((d) => "
                                       "!d.className.includes('-enter') && !d.className.includes('-leave') && "
                                       "!d.className.includes('hidden'))", timeout=30_000)
                try:
                    item.click(timeout=15_000)
                    page.wait_for_selector(graph, timeout=15_000)
                except PlaywrightTimeout:
                    if attempt == 2:
                        raise
                    page.keyboard.press("Escape")
        page.wait_for_selector(graph, timeout=30_000)
        nodes = page.query_selector_all(".TraceGraph--graphWrapper .OpNode")
        assert len(nodes) >= RANKS  # (nodes group spans by operation: at least each rank's lane)
        assert page.query_selector_all(".TraceGraph--graphWrapper .plexus-Digraph--SvgEdge")
        screenshot(page, "jaeger-node-graph.png", full_page=False)

        # one-code search: every trace the demo's check reports for HASH (combined codes included: the tag is
        # one boolean per code, see tests/unit/test_trace_model.py)
        tags = json.dumps({"cptrace.violation.HASH": "true", "cptrace.run_id": run_id})
        page.goto(f"{jaeger.query_url}/search?service=sglang-hicache&lookback=2h&limit=200&tags="
                  + urllib.parse.quote(tags))
        page.wait_for_selector(".ResultItem", timeout=30_000)
        found = {a.get_attribute("href").rsplit("/", 1)[1].split("?")[0]
                 for a in page.query_selector_all(".ResultItem a[href*='/trace/']")}
        assert found == {h["trace_id"] for h in hash_findings}
        screenshot(page, "jaeger-node-search-hash.png", full_page=False)
        assert [e for e in errors if "favicon" not in e] == []
