"""A node whose lifecycle crosses L3, in the real Jaeger UI: the L3 simulator's records (cptrace_otel.sim.l3_tier, two
CP
ranks in mode sharded, a flipped byte in one stored page) ingested into Jaeger, the trace of a node that was backed
up to storage opened in headless Chromium and asserted from the page:

- fully expanded, each rank's lane (``rank R · node``) holds its ``rank R · d2h`` and ``rank R · l3-backup`` stage
  spans, in time order;
- the ``l3-backup`` span's logs are its ``l3_backup`` (the page keys) and ``l3_ack dir=backup`` records;
- the trace the stored page's flip came back in carries the L3a finding (code ``L3``) on ``rank 0 · l3-prefetch``.

The screenshot ``jaeger-node-l3.png`` (CPTRACE_TEST_ARTIFACTS) is the one in docs/img/. Needs Jaeger serving the
jaeger-ui build and headless Chromium, as tests/integration/test_jaeger_ui_node.py.
"""

from __future__ import annotations

import uuid

from cptrace_otel.model.trace_ids import node_trace_id
from cptrace_otel.sim.l3_tier import L3Sim
from tests.helpers.browser import chromium_page, cli, screenshot
from tests.helpers.integration import wait_for
from tests.integration.test_jaeger_ui_node import COLLAPSER, _require_ui, _rows

RANKS, SEED = 2, 3
DOT = "\u00b7"


def _tag(span: dict, key: str):
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


def test_a_node_crossing_l3_in_the_jaeger_ui(jaeger, tmp_path):
    _require_ui(jaeger.query_url)
    sim = L3Sim("sharded", RANKS, seed=SEED, fault="flip")
    assert sim.run(40) == {"L3a"}
    logs = sim.emitter.write(str(tmp_path))
    run_id = f"l3-ui-{uuid.uuid4().hex[:8]}"
    p = cli("ingest", "--endpoint", jaeger.otlp_http, "--run-id", run_id, "--no-progress", *logs)
    assert p.returncode in (0, 1), p.stdout + p.stderr

    # the first node the simulator computed: inserted, copied to host, backed up to storage, evicted, on both ranks
    node = 1
    tid = node_trace_id(run_id, 0, node).hex()

    def complete():
        t = jaeger.client.get_trace(tid)
        names = {s["operationName"] for s in (t or {}).get("spans", [])}
        want = {f"rank {r} {DOT} {k}" for r in range(RANKS) for k in ("node", "d2h", "l3-backup")}
        return t if want <= names else None

    trace = wait_for(complete, 60, f"node {node}'s trace {tid} with both ranks' L3 backups in Jaeger")
    spans = {s["spanID"]: s for s in trace["spans"]}
    parent = {sid: next((r["spanID"] for r in s.get("references", []) if r["refType"] == "CHILD_OF"), None)
              for sid, s in spans.items()}
    for sp in spans.values():
        if sp["operationName"].endswith("l3-backup"):
            assert [lg["fields"][0]["value"] for lg in sorted(sp["logs"], key=lambda lg: lg["timestamp"])] == \
                ["l3_backup", "l3_ack"]
            assert spans[parent[sp["spanID"]]]["operationName"] == sp["operationName"].replace("l3-backup", "node")

    # the L3a finding: on the prefetch that read the flipped page back (in the trace of the node it extends)
    # (the simulator's clock starts on 2026-09-21: search from the epoch, not Jaeger's default 48 h)
    found = jaeger.client.search("sglang-hicache", tags={"cptrace.violation.L3": True, "cptrace.run_id": run_id},
                                 start_us=1, limit=20)
    bad = [s for t in found for s in t["spans"] if _tag(s, "cptrace.violation.L3") is True]
    assert bad and {(s["operationName"], _tag(s, "cptrace.violation.rules")) for s in bad} == \
        {(f"rank 0 {DOT} l3-prefetch", "L3a")}

    with chromium_page(1400, 665) as (page, errors):
        page.goto(f"{jaeger.query_url}/trace/{tid}")
        page.wait_for_selector(".span-row", timeout=30_000)
        page.locator(COLLAPSER).nth(2).click()  # Expand All
        page.wait_for_function("document.querySelectorAll('.span-row').length >= %d" % len(spans))
        shown = [n for n, _, _ in _rows(page)]
        for r in range(RANKS):
            lane = next(s for s in spans.values() if parent[s["spanID"]] is None
                        and s["operationName"] == f"rank {r} {DOT} node")
            kids = sorted((s for s in spans.values() if parent[s["spanID"]] == lane["spanID"]),
                          key=lambda s: s["startTime"])
            i = shown.index(f"rank {r} {DOT} node")
            under = shown[i + 1:i + 1 + len(kids)]
            assert sorted(under) == [f"rank {r} {DOT} d2h", f"rank {r} {DOT} l3-backup"]
            # in time order (the simulator's records are nanoseconds apart: Jaeger's microseconds may tie them)
            start = {k["operationName"]: k["startTime"] for k in kids}
            assert [start[n] for n in under] == sorted(start.values())
        # the last rank's l3-backup opened (the ranks above stay in view): its records, the backup (page keys,
        # fingerprints) and the storage ack
        last = [n for n in shown if n.endswith("l3-backup")][-1]
        row = page.locator(".span-row", has_text=last).first
        row.locator(".span-name").click()
        detail = page.locator(".detail-row").first
        detail.locator(".AccordianLogs--header").click()
        page.wait_for_function("(sel) => { const d = document.querySelector(sel); "
                               "return !!d && d.innerText.includes('l3_backup') && d.innerText.includes('l3_ack'); }",
                               arg=".detail-row", timeout=30_000)
        # (the Expand All button's tooltip can stay up after the click: hidden for the picture)
        page.add_style_tag(content=".ant-tooltip { display: none !important; }")
        screenshot(page, "jaeger-node-l3.png", full_page=False)
        assert [e for e in errors if "favicon" not in e] == []
