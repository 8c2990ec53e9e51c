"""The real Jaeger UI with deploy/jaeger/ui-config.json: from a demo node's error span, its ``hicache.node_id``,
``sglang.cp.rank`` and ``cptrace.run_id`` tags link to the matching searches (which list the trace), and the trace
header links to the run's HTML report at ``#trace=<id>``, which names the node.

Needs the shared Jaeger serving the jaeger-ui build (``deploy/jaeger/up`` does when ``../shared/jaeger-ui/build``
exists next to the repository) and headless Chromium (see tests/helpers/browser.py). Without the UI build it skips
with the reason; with the build present but not served it is an error under ``CPTRACE_REQUIRE_JAEGER``.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.helpers.browser import ROOT, chromium_page, cli, screenshot
from tests.helpers.integration import REQUIRE_JAEGER, unavailable, wait_for

# where deploy/jaeger/up looks for the UI build (JAEGER_UI_ASSETS overrides it there and here)
UI_BUILD = Path(os.environ.get("JAEGER_UI_ASSETS") or ROOT.parent / "shared" / "jaeger-ui" / "build")


def _ui_served(query_url: str) -> str:
    with urllib.request.urlopen(query_url + "/", timeout=10) as r:
        page = r.read().decode("utf-8", "replace")
    if "not the Jaeger UI you are looking for" in page or "linkPatterns" not in page:
        why = (f"Jaeger at {query_url} serves no jaeger-ui with our ui-config.json (was it started by "
               "deploy/jaeger/up with ../shared/jaeger-ui/build present?)")
        unavailable(why) if REQUIRE_JAEGER else pytest.skip(why)
    return page


def test_tag_links_search_and_trace_links_report(jaeger, tmp_path):
    if not (UI_BUILD / "index.html").is_file():
        pytest.skip(f"no jaeger-ui build at {UI_BUILD}: a Jaeger built from its Go module has no UI to test")
    page_html = _ui_served(jaeger.query_url)
    assert '"hicache.node_id"' in page_html   # deploy/jaeger/ui-config.json, injected by Jaeger into the page
    p = cli("demo", "--ranks", "4", "--mode", "sharded", "--faults", "HASH_flip", "--out", str(tmp_path),
            "--endpoint", jaeger.otlp_http, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    demo = json.loads(p.stdout)
    run_id, f = demo["run_id"], demo["findings"][0]
    tid = f["trace_id"]
    wait_for(lambda: jaeger.client.get_trace(tid), 30, f"trace {tid} in Jaeger")
    report = tmp_path / "report.html"
    otlp = sorted(str(x) for x in tmp_path.glob("rank*.otlp.jsonl"))
    assert cli("report", "-o", str(report), "--jaeger-url", jaeger.query_url, *otlp).returncode == 1

    with chromium_page(1400, 900) as (page, errors):
        page.goto(f"{jaeger.query_url}/trace/{tid}")
        page.wait_for_selector(".span-row", timeout=30_000)
        # trace level: one link, to this node in the run's report
        head = page.query_selector("a.TracePageHeader--back")
        assert head is not None and head.get_attribute("href").endswith(f"/report.html#trace={tid}")
        # the error span (the reload of the faulty rank), its tags with links
        page.query_selector(".span-row:has([class*=errorIcon]) .span-name").click()
        page.query_selector(".AccordianKeyValues--header:has-text('Tags')").click()
        node_row = page.query_selector(".KeyValueTable--row:has(td:text-is('hicache.node_id'))")
        node_row.query_selector("a.ant-dropdown-trigger").click()
        page.wait_for_selector(".ant-dropdown-menu a")
        items = {a.inner_text().strip(): a.get_attribute("href")
                 for a in page.query_selector_all(".ant-dropdown-menu a")}
        node_link = next(h for t, h in items.items() if "every epoch" in t)
        rank_link = next(h for t, h in items.items() if f"on rank {f['rank']}" in t)
        assert json.loads(unquote(node_link.split("tags=")[1].split("&")[0])) == {
            "hicache.node_id": str(f["node_id"]), "cptrace.run_id": run_id}
        assert json.loads(unquote(rank_link.split("tags=")[1].split("&")[0])) == {
            "hicache.node_id": str(f["node_id"]), "sglang.cp.rank": str(f["rank"]), "cptrace.run_id": run_id}
        rank_tag = page.query_selector(".KeyValueTable--row:has(td:text-is('sglang.cp.rank')) a")
        assert "%22sglang.cp.rank%22" in rank_tag.get_attribute("href")
        node_row.scroll_into_view_if_needed()
        screenshot(page, "jaeger-ui-links.png", full_page=False)
        # the node search lists this trace
        page.goto(jaeger.query_url + node_link)
        page.wait_for_selector(f"a[href*='/trace/{tid}']", timeout=30_000)
        screenshot(page, "jaeger-ui-node-search.png", full_page=False)
        # and the report resolves the trace id to its node
        page.goto(report.as_uri() + f"#trace={tid}")
        banner = page.query_selector("#banner")
        assert banner.is_visible() and f"node {f['node_id']} of epoch {f['epoch']}" in banner.inner_text()
        ui_errors = [e for e in errors if "127.0.0.1:8765" not in e]
        assert ui_errors == []
