"""Trace model v2 with real rank processes: a 16-rank demo (16 exporter processes on this machine, so under load) with
an injected HASH fault, read back from the OTLP files the ranks wrote.

Counts misplaced records (a record of a stage instance, prepare .. its d2h ack or reload .. its h2d ack, outside a
span of that stage on its rank): must be 0, whatever the load cut. Also: no span names a parent that is not sent, no
span is sent twice, one top-level row per rank in every node trace, bounded span names, and the HASH span links to the
backup's span.
"""

from __future__ import annotations

import collections
import json
import re

from tests.helpers.demo_run import demo
from tests.helpers.otlp_receiver import read_jsonl

NAME = re.compile(r"^rank \d+ \u00b7 (node|d2h|h2d|process|request)$")
STAGE = {"prepare": "hicache.d2h", "backup": "hicache.d2h", "reload": "hicache.h2d"}
ACK = {"d2h": "hicache.d2h", "h2d": "hicache.h2d"}


def test_sixteen_ranks_every_stage_record_in_its_stage_span_and_the_trace_renders(tmp_path):
    p = demo("--ranks", "16", "--faults", "HASH_flip", "--out", str(tmp_path), "--json", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    spans = read_jsonl(rep["files"]["otlp"])
    assert {s.resource["sglang.cp.rank"] for s in spans} == set(range(16))

    misplaced = []
    for s in spans:
        kind = s.attrs.get("cptrace.span.kind")
        for e in s.events:
            want = ACK.get(e.attrs.get("hicache.dir")) if e.name == "ack" else STAGE.get(e.name)
            if want and (kind != want or s.resource["sglang.cp.rank"] != s.attrs["sglang.cp.rank"]):
                misplaced.append((s.name, e.name, e.attrs.get("cptrace.seq")))
    cut = collections.Counter(s.attrs.get("cptrace.span.closed_by") for s in spans
                              if s.attrs.get("cptrace.span.kind") in ACK.values())
    print(f"stage spans by closing reason: {dict(cut)}; continuations: "
          f"{sum(1 for s in spans if s.attrs.get('cptrace.span.continues'))}")
    assert misplaced == []

    ids = {(s.trace_id, s.span_id) for s in spans}
    assert len(ids) == len(spans)
    assert [s.name for s in spans if s.parent_span_id and (s.trace_id, s.parent_span_id) not in ids] == []
    assert all(NAME.match(s.name) for s in spans), {s.name for s in spans if not NAME.match(s.name)}
    node_traces = {s.trace_id for s in spans if s.attrs.get("cptrace.span.kind") == "hicache.node"}
    roots = collections.Counter((s.trace_id, s.attrs["sglang.cp.rank"]) for s in spans
                                if not s.parent_span_id and s.trace_id in node_traces)
    assert max(roots.values()) == 1  # one top-level row per rank in a node trace (later lane segments nest)
    assert all(s.attrs["cptrace.span.kind"] == "hicache.node" for s in spans
               if not s.parent_span_id and s.trace_id in node_traces)

    (f,) = rep["findings"]
    bad = [s for s in spans if s.attrs.get("cptrace.violation.HASH") is True]
    assert len(bad) == 1 and bad[0].trace_id == f["trace_id"] and bad[0].attrs["cptrace.span.kind"] == "hicache.h2d"
    assert bad[0].name == f"rank {f['rank']} \u00b7 h2d" and "HASH: " in bad[0].status_message
    (link,) = [lk for lk in bad[0].links if lk[2].get("cptrace.link.kind") == "evidence"]
    backup = next(s for s in spans if (s.trace_id, s.span_id) == link[:2])
    assert backup.attrs["cptrace.span.kind"] == "hicache.d2h"
    assert any(e.name == "backup" and str(e.attrs["cptrace.seq"]) in link[2]["evidence_seq"].split(",")
               for e in backup.events)
