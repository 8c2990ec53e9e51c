"""Node traces link to SGLang's own request spans, against SGLang's real tracing module (tests/sglang_real/
reqlink_main.py): SGLang's ``process_tracing_init`` exports its request spans with the real opentelemetry-sdk over
OTLP/HTTP to an in-repo loopback receiver that decodes the real OTLP bytes (tests/helpers/otlp_receiver.py), and
cptrace-otel exports its node spans to the same receiver.

Asserted from the decoded spans: every ``rid_map`` record names SGLang's request span (``hicache.req_span`` = the
trace id and span id of ``Req <rid>``), the node lane holding it has an OTLP link with exactly those ids
(``cptrace.link.kind=request``, ``hicache.rid``), a node used by several requests links each of them once, and the
way back: SGLang's own request trace carries a ``cptrace.node`` event naming that node and the run id.

Both versions run through the instrumented cache (0.5.20's HiRadixCache, 0.5.23's UnifiedRadixCache: ``match_prefix``
and ``init_load_back`` record ``rid_map`` at their real sites); the capture helpers alone, called with 0.5.23's real
request objects, are tested too (its tracing module, without a cache).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from cptrace_otel.model import semconv as sc
from tests.helpers.otlp_receiver import HttpReceiver
from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang


def _run(version: str, mode: str) -> tuple[dict, list]:
    runtime.need(version)
    with HttpReceiver() as rx:
        p = subprocess.run(runtime.module_cmd("reqlink_main", version, rx.url, mode), env=runtime.sglang_env(version),
                           capture_output=True, text=True, timeout=300, cwd=runtime.ROOT)
        assert p.returncode == 0, p.stderr[-4000:]
        return json.loads(p.stdout.strip().splitlines()[-1]), rx.spans()


def _check(out: dict, spans: list) -> dict[str, set[int]]:
    """The assertions common to both versions; returns rid -> the node ids whose lanes link that request."""
    sglang = [s for s in spans if s.resource.get(sc.SERVICE_NAME) == "sglang"]
    ours = [s for s in spans if s.resource.get(sc.SERVICE_NAME) == sc.DEFAULT_SERVICE_NAME]
    roots = {s.attrs["rid"]: s for s in sglang
             if s.parent_span_id == "" and s.name.endswith(f"Req {s.attrs.get('rid')}")}
    assert sorted(roots) == sorted(out["rids"]), [s.name for s in sglang]
    linked: dict[str, set[int]] = {rid: set() for rid in roots}
    for lane in (s for s in ours if s.attrs.get(sc.SPAN_KIND) == sc.SPAN_NODE):
        recs = [e for e in lane.events if e.name == "rid_map"]
        links = [lk for lk in lane.links if lk[2].get(sc.LINK_KIND) == "request"]
        want = []
        for e in recs:
            root = roots[e.attrs[sc.RID]]
            assert e.attrs[sc.field_key("req_span")] == f"{root.trace_id}-{root.span_id}"
            if (root.trace_id, root.span_id, {sc.LINK_KIND: "request", sc.RID: root.attrs["rid"]}) not in want:
                want.append((root.trace_id, root.span_id, {sc.LINK_KIND: "request", sc.RID: root.attrs["rid"]}))
            linked[e.attrs[sc.RID]].add(lane.attrs[sc.NODE_ID])
        assert links == want, (lane.name, lane.attrs)
    assert all(linked.values()), linked
    # the way back: each request's own trace (SGLang's spans) names the nodes that link to it
    for rid, root in roots.items():
        noted = {e.attrs[sc.NODE_ID] for s in sglang if s.trace_id == root.trace_id for e in s.events
                 if e.name == "cptrace.node" and e.attrs.get(sc.RUN_ID) == out["run_id"]}
        assert noted == linked[rid], (rid, noted, linked[rid])
    return linked


@pytest.mark.parametrize("version", runtime.VERSIONS)
def test_node_lanes_link_sglang_request_spans_at_the_real_rid_map_site(version):
    out, spans = _run(version, "cache")
    linked = _check(out, spans)
    by_node: dict[int, set[str]] = {}
    for rid, nodes in linked.items():
        for n in nodes:
            by_node.setdefault(n, set()).add(rid)
    # the prompts share prefixes: some node was used by several requests, and links each of them
    assert any(len(rids) >= 2 and n != 0 for n, rids in by_node.items()), by_node


def test_the_capture_reads_sglang_0_5_23_request_contexts():
    out, spans = _run("0.5.23", "capture")
    linked = _check(out, spans)
    assert set().union(*linked.values()) == {100, 101}
