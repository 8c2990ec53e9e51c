"""Two traced processes with one CPTRACE_RUN_ID emit 50,000 events each over 500 shared node
ids, flush, and every event arrives exactly once, each node id is one trace holding both processes' spans,
attributes are typed and the two resources differ. Through OTLP/HTTP, OTLP/gRPC and the OTLP JSON-lines file sink,
each decoded with opentelemetry-proto (tests/otlp_receiver.py)."""

from __future__ import annotations

import collections
import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.otlp_receiver import GrpcReceiver, HttpReceiver, RxSpan, read_jsonl

N_EVENTS = 50_000
N_NODES = 500
REPO = Path(__file__).resolve().parents[2]

# Per node: prepare (op=c) / backup (op=c-1) / ack d2h (op=c-2) / evict, cycling, so both stage spans and node spans
# are exercised; every record carries a unique i, an rng summary, a 63-bit hash, a float and a string.
CHILD = textwrap.dedent("""
    import json, sys
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline
    n, nodes, rank = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for k in range(n):
        node, cyc = k % nodes, k // nodes
        kind = cyc % 4
        common = dict(node_id=node, i=k, src="p%d" % rank,
                      dev="(cnt=4,min=%d,max=%d,first=%d,last=%d)" % (k, k + 3, k, k + 3),
                      h=(k * 2654435761 + rank) % (1 << 63), f=k + 0.5)
        if kind == 0:
            ct.cptrace(1, "prepare", op=cyc, **common)
        elif kind == 1:
            ct.cptrace(1, "backup", op=cyc - 1, **common)
        elif kind == 2:
            ct.cptrace(2, "ack", dir="d2h", op=cyc - 2, **common)
        else:
            ct.cptrace(1, "evict", tier="dev", **common)
    ok = ct.flush(120)
    print(json.dumps({"ok": ok, "stats": pipeline.stats()}))
""")


def _run_two(env_extra: dict[str, str], tmp_path: Path) -> list[dict]:
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
        env.update({"CPTRACE_LEVEL": "2", "CPTRACE_RUN_ID": "mp-run", "CPTRACE_CP_RANK": str(rank),
                    "CPTRACE_TP_RANK": str(rank), "CPTRACE_SPOOL_DIR": str(tmp_path / "spool"),
                    "PYTHONPATH": str(REPO)})
        env.update(env_extra)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(N_EVENTS), str(N_NODES), str(rank)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        res = json.loads(out.strip().splitlines()[-1])
        assert res["ok"] is True, (res, err)
        assert res["stats"]["dropped"] == 0, res
        results.append(res)
    return results


def _check(spans: list[RxSpan]) -> None:
    seen: collections.Counter = collections.Counter()
    node_traces: dict[int, set[str]] = collections.defaultdict(set)
    trace_ranks: dict[str, set[int]] = collections.defaultdict(set)
    resources = {}
    for sp in spans:
        rank = sp.resource["sglang.cp.rank"]
        resources[rank] = sp.resource
        trace_ranks[sp.trace_id].add(rank)
        if "hicache.node_id" in sp.attrs:
            node_traces[sp.attrs["hicache.node_id"]].add(sp.trace_id)
        assert sp.attrs["sglang.cp.rank"] == rank
        # trace model v2: a stage span's parent is its rank's lane, which must be sent too (checked below)
        assert sp.parent_span_id == "" or sp.attrs.get("cptrace.span.kind") in ("hicache.d2h", "hicache.h2d",
                                                                                 "hicache.node")
        for ev in sp.events:
            if ev.name == "hicache.violation":
                continue
            a = ev.attrs
            seen[(rank, a["hicache.i"])] += 1
            # typed attributes: ints stay ints, floats doubles, strings strings, rng as five ints
            assert type(a["hicache.i"]) is int and type(a["hicache.node_id"]) is int
            assert type(a["hicache.h"]) is int and a["hicache.h"] >= 0
            assert type(a["hicache.f"]) is float and a["hicache.f"] == a["hicache.i"] + 0.5
            assert a["hicache.src"] == f"p{rank}"
            assert a["hicache.dev.cnt"] == 4 and a["hicache.dev.min"] == a["hicache.i"]
            assert type(a["cptrace.seq"]) is int and a["cptrace.seq"] == a["hicache.i"]
            assert ev.name in ("prepare", "backup", "ack", "evict")
            assert a["hicache.node_id"] == sp.attrs["hicache.node_id"]
    ids = {(sp.trace_id, sp.span_id) for sp in spans}
    assert all(sp.parent_span_id == "" or (sp.trace_id, sp.parent_span_id) in ids for sp in spans), \
        "no parent that is never sent"
    # every event exactly once
    assert len(seen) == 2 * N_EVENTS
    dup = [k for k, c in seen.items() if c != 1]
    assert not dup, dup[:5]
    assert {r for r, _ in seen} == {0, 1}
    # one trace per node id, holding both processes' spans
    assert set(node_traces) == set(range(N_NODES))
    for node, traces in node_traces.items():
        assert len(traces) == 1, (node, traces)
        assert trace_ranks[next(iter(traces))] == {0, 1}, node
    # resources tell the processes apart
    r0, r1 = resources[0], resources[1]
    assert r0["process.pid"] != r1["process.pid"]
    assert r0["service.instance.id"] != r1["service.instance.id"]
    assert r0["cptrace.run_id"] == r1["cptrace.run_id"] == "mp-run"
    assert (r0["sglang.tp.rank"], r1["sglang.tp.rank"]) == (0, 1)
    # span ids are unique
    ids = collections.Counter(sp.span_id for sp in spans)
    assert max(ids.values()) == 1


@pytest.mark.slow
def test_two_processes_http(tmp_path: Path) -> None:
    with HttpReceiver() as rx:
        _run_two({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
                 tmp_path)
        assert not rx.errors
        assert max(rx.raw_sizes) < int(3.5 * 1024 * 1024)
        assert all(h.get("content-encoding") == "gzip" for h in rx.headers)
        _check(rx.spans())


@pytest.mark.slow
def test_two_processes_grpc(tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    with GrpcReceiver() as rx:
        # online checks off here and for the file sink: the HTTP variant already runs them; this keeps CI time down
        _run_two({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "CPTRACE_CHECKS": "0"}, tmp_path)
        _check(rx.spans())


@pytest.mark.slow
def test_two_processes_file(tmp_path: Path) -> None:
    _run_two({"CPTRACE_FILE": str(tmp_path / "out" / "rank{rank}-{pid}.otlp.jsonl"), "CPTRACE_CHECKS": "0"},
             tmp_path)
    files = sorted(glob.glob(str(tmp_path / "out" / "*.otlp.jsonl")))
    assert len(files) == 2 and "rank0-" in files[0] and "rank1-" in files[1]
    _check(read_jsonl(files))
