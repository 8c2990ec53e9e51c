"""Four processes of a torch.distributed (gloo, CPU) job export through the real exporter into the real Jaeger with
no rank and no run id given to cptrace_otel; read back, every node trace holds all four ranks, each rank is its own
process with its rank in the resource, the counts are what was emitted, and ``check --jaeger`` finds the injected
C1_div and C3_writer faults."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cptrace_otel.analyze.sources.jaeger import events_from_otlp
from tests.helpers import free_port
from tests.helpers.integration import _BASE_ENV, ROOT, wait_for

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.integration
MAIN = Path(__file__).with_name("torchdist_main.py")


def test_four_torch_distributed_ranks_into_jaeger(jaeger, tmp_path):
    service = f"cptrace-td-{tmp_path.name[-12:]}"
    env = dict(_BASE_ENV, PYTHONPATH=str(ROOT), CPTRACE_LEVEL="2", OTEL_SERVICE_NAME=service,
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=jaeger.otlp_http + "/v1/traces",
               OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", CPTRACE_SPOOL_DIR=str(tmp_path / "spool"))
    p = subprocess.run([sys.executable, str(MAIN), str(tmp_path), str(free_port()), "sharded", "C1_div,C3_writer"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "CP rank is unknown" not in p.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["flushed"] for r in reports), reports
    run_ids = {r["run_id"] for r in reports}
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("ds-"), run_ids   # agreed through the store
    run_id = run_ids.pop()
    emitted = {r["torch_rank"]: sum(r["counts"].values()) for r in reports}

    def all_in():
        found = jaeger.client.search(service, {"cptrace.run_id": run_id}, lookback_s=3600, limit=5000)
        traces = {t["traceID"]: jaeger.client.get_trace_v3(t["traceID"]) for t in found}
        evs = {tid: events_from_otlp(td) for tid, td in traces.items() if td is not None}
        n = sum(len(e) for e in evs.values())
        return (traces, evs) if n >= sum(emitted.values()) else None

    traces, evs = wait_for(all_in, 90, f"all records of run {run_id} in Jaeger", interval_s=1)

    # each rank a distinct process, its rank (from torch.distributed) in the resource
    procs = collections.defaultdict(set)
    for td in traces.values():
        for rs in td.get("resourceSpans", []):
            attrs = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
            procs[int(attrs["sglang.cp.rank"])].add(attrs["service.instance.id"])
            assert attrs["cptrace.rank.source"] == "torch.distributed"
    assert sorted(procs) == [0, 1, 2, 3] and all(len(v) == 1 for v in procs.values())
    assert len({next(iter(v)) for v in procs.values()}) == 4

    # counts equal to what was emitted, per rank
    per_rank = collections.Counter(e.rank for es in evs.values() for e in es)
    assert dict(per_rank) == emitted

    # every node trace holds spans of all four ranks
    node_traces = {tid: es for tid, es in evs.items() if any("node_id" in e.fields and e.fields["node_id"] >= 0
                                                               and e.tag != "free" for e in es)}
    assert node_traces
    partial = {tid: sorted({e.rank for e in es}) for tid, es in node_traces.items()
               if {e.rank for e in es} != {0, 1, 2, 3}}
    assert not partial, list(partial.items())[:5]

    # check reads the run back from Jaeger and finds the injected faults
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json", "--jaeger", jaeger.query_url,
                        "--run-id", run_id, "--service", service, "--since", "1h"],
                       env=dict(_BASE_ENV, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert c.returncode == 1, c.stderr
    codes = {f["code"] for f in json.loads(c.stdout)["findings"]}
    assert {"C1", "C3"} <= codes, codes
