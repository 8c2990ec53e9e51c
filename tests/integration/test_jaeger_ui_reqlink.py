"""From a node to SGLang's requests and back, in the real Jaeger UI: real SGLang 0.5.20 (its own request tracing,
``process_tracing_init``, exporting to Jaeger over OTLP/HTTP) with the instrumented HiRadixCache and cptrace-otel
exporting to the same Jaeger (tests/sglang_real/reqlink_main.py).

- the lane of a node used by several requests references (``FOLLOWS_FROM``) each request's ``Req <rid>`` span, which
  Jaeger holds in SGLang's service;
- each of those request traces carries the ``cptrace.node`` event naming the node and the run;
- in the UI, the lane's References section lists the request spans (as "span in another trace", with their span
  ids), and following one opens the request's trace, whose scheduler stage span shows the ``cptrace.node`` event.

Screenshots ``jaeger-node-requests.png`` and ``jaeger-request-node-event.png`` (CPTRACE_TEST_ARTIFACTS). Needs
SGLang in .sglang/0.5.20, Jaeger serving the jaeger-ui build and headless Chromium.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.helpers.browser import chromium_page, screenshot
from tests.helpers.integration import wait_for
from tests.integration.test_jaeger_ui_node import COLLAPSER, _require_ui
from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang


def _tag(span: dict, key: str):
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


def test_from_a_node_to_sglang_requests_and_back_in_the_jaeger_ui(jaeger):
    runtime.need("0.5.20")
    _require_ui(jaeger.query_url)
    run_id = f"reqlink-ui-{uuid.uuid4().hex[:8]}"
    env = runtime.sglang_env("0.5.20")
    env = {k: v for k, v in env.items() if not k.startswith(("CPTRACE_", "OTEL_"))} | {"PYTHONPATH": env["PYTHONPATH"]}
    p = subprocess.run(runtime.module_cmd("reqlink_main", "0.5.20", jaeger.otlp_http + "/v1/traces", "cache", run_id),
                       env=env, capture_output=True, text=True, timeout=300, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    rids = json.loads(p.stdout.strip().splitlines()[-1])["rids"]

    def lanes():
        found = jaeger.client.search("sglang-hicache", tags={"cptrace.run_id": run_id}, lookback_s=3600, limit=100)
        # (node 0 is the tree's root: the requests that matched nothing; a node they share is the interesting one)
        out = [(t, s) for t in found for s in t["spans"] if _tag(s, "cptrace.span.kind") == "hicache.node"
               and _tag(s, "hicache.node_id") != 0
               and sum(r["refType"] == "FOLLOWS_FROM" for r in s.get("references", [])) >= 2]
        return out or None

    trace, lane = wait_for(lanes, 60, f"a node lane of run {run_id} referencing two requests")[0]
    node = _tag(lane, "hicache.node_id")
    refs = [r for r in lane["references"] if r["refType"] == "FOLLOWS_FROM"]
    req_traces = {}
    for r in refs:
        t = wait_for(lambda r=r: jaeger.client.get_trace(r["traceID"]), 60, f"SGLang's request trace {r['traceID']}")
        (sp,) = [s for s in t["spans"] if s["spanID"] == r["spanID"]]
        assert t["processes"][sp["processID"]]["serviceName"] == "sglang"
        assert sp["operationName"].strip() in {f"Req {rid}" for rid in rids}
        # the way back: the request's own trace names this node and the run
        notes = [{f["key"]: f["value"] for f in lg["fields"]} for s in t["spans"] for lg in s["logs"]
                 if any(f["key"] == "event" and f["value"] == "cptrace.node" for f in lg["fields"])]
        assert {"hicache.node_id": node, "cptrace.run_id": run_id}.items() <= notes[0].items(), notes
        req_traces[r["traceID"]] = (t, sp)

    with chromium_page(1400, 720) as (page, errors):
        page.goto(f"{jaeger.query_url}/trace/{trace['traceID']}")
        page.wait_for_selector(".span-row", timeout=30_000)
        page.locator(COLLAPSER).nth(2).click()  # Expand All
        row = page.locator(".span-row", has_text="rank 0 \u00b7 node").first
        row.locator(".span-name").click()
        detail = page.locator(".detail-row").first
        detail.locator(".AccordianReferences--header").click()
        # Jaeger's UI names a span of another trace "< span in another trace >", with its span id and a link to it
        ids = [r["spanID"] for r in refs]
        page.wait_for_function("([sel, ids]) => { const d = document.querySelector(sel); "
                               "return !!d && ids.every((i) => d.innerText.includes(i)); }",
                               arg=[".detail-row", ids], timeout=30_000)
        hrefs = [a.get_attribute("href") or "" for a in detail.locator(".ReferencesList--Item a").all()]
        assert sorted(h.split("uiFind=")[1] for h in hrefs) == sorted(ids)
        assert {h.split("/trace/")[1].split("?")[0].lstrip("0") for h in hrefs} == \
            {r["traceID"].lstrip("0") for r in refs}
        page.add_style_tag(content=".ant-tooltip { display: none !important; }")
        page.set_viewport_size({"width": 1400, "height": 560})
        screenshot(page, "jaeger-node-requests.png", full_page=False)
        page.set_viewport_size({"width": 1400, "height": 720})

        # following a reference opens the request's trace (SGLang's service) at that span
        page.goto(jaeger.query_url + hrefs[0])
        page.wait_for_selector(".span-row", timeout=30_000)
        assert any("Req " in r.inner_text() for r in page.query_selector_all(".span-row .endpoint-name"))
        req_trace = next(t for t, _ in req_traces.values() if hrefs[0].split("uiFind=")[1] in
                         {s["spanID"] for s in t["spans"]})
        page.locator(COLLAPSER).nth(2).click()  # Expand All
        page.wait_for_function("document.querySelectorAll('.span-row').length >= %d" % len(req_trace["spans"]))
        # the scheduler's stage span that spans the match (SGLang put the event there)
        (noted,) = [s for s in req_trace["spans"] for lg in s["logs"] for f in lg["fields"]
                    if f["key"] == "event" and f["value"] == "cptrace.node"]
        page.locator(".span-row", has_text=noted["operationName"]).first.locator(".span-name").click()
        # (the span named by uiFind, the request's root, has its detail open too: take the stage span's)
        d2 = page.locator(".detail-row", has=page.locator(".AccordianLogs--header")).first
        d2.locator(".AccordianLogs--header").click()
        page.wait_for_function("(sel) => [...document.querySelectorAll(sel)].some((d) => "
                               "d.innerText.includes('cptrace.node') && d.innerText.includes('hicache.node_id'))",
                               arg=".detail-row", timeout=30_000)
        d2.locator(".AccordianLogs").scroll_into_view_if_needed()
        page.add_style_tag(content=".ant-tooltip { display: none !important; }")
        screenshot(page, "jaeger-request-node-event.png", full_page=False)
        assert [e for e in errors if "favicon" not in e] == []
