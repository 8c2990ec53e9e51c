"""Our pipeline -> the real Jaeger (OTLP HTTP and gRPC) -> read back through /api/traces search, /api/traces/{id}
and api_v3: every event with its attributes and timestamp, node traces shared by two rank processes, each rank its own
process with its tags, and the node's trace found by node id and by rid.

Each rank is a real subprocess configured only through CPTRACE_* / OTEL_EXPORTER_OTLP_* variables.
"""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest

from cptrace_otel.analyze import links
from cptrace_otel.analyze.sources.jaeger import events_from_otlp, iter_spans, otlp_attrs, run_events
from cptrace_otel.model import spans
from cptrace_otel.model.attrs import fields_to_attributes
from cptrace_otel.model.logline import parse_value, render_value
from tests.helpers.integration import rank_env, start_rank, wait_for

pytestmark = pytest.mark.integration

SERVICE = "sglang-hicache"


def _rng(lo: int, n: int) -> str:
    return f"(cnt={n},min={lo},max={lo + n - 1},first={lo},last={lo + n - 1})"


def rank_records(rank: int, rid: str) -> list:
    """A clean lifecycle of nodes 5 and 6 on one rank (replicated mode): no invariant is broken."""
    dev5, host5, dev5b = _rng(900 + rank * 1000, 64), _rng(0, 64), _rng(300 + rank * 1000, 64)
    dev6 = _rng(100 + rank * 1000, 32)
    return [
        [1, "config", {"cp_size": 2, "cp_rank": rank, "mode": "replicated", "page_size": 1, "policy": "wt"}],
        [1, "insert", {"node_id": 5, "parent": 0, "len": 64, "dev": dev5, "kind": "new"}],
        [1, "rid_map", {"rid": rid, "node_id": 5, "hit": "miss", "plen": 64}],
        [1, "prepare", {"node_id": 5, "op": 12, "len": 64, "dev": dev5, "host": host5, "policy": "wt"}],
        [1, "backup", {"op": 12, "node_id": 5, "dev": dev5, "host": host5, "io": 1, "h": 8070450532247928832 + rank,
                       "nz": 4096}],
        [2, "ack", {"dir": "d2h", "op": 12, "node_id": 5, "blen": 64, "clen": 64, "pub": [5]}],
        [1, "insert", {"node_id": 6, "parent": 5, "len": 32, "dev": dev6, "kind": "new"}],
        [1, "evict", {"tier": "dev", "node_id": 5, "kind": "backuped", "dev": dev5}],
        [2, "free", {"pool": "dev", "idx": dev5, "node_id": 5, "why": "evict"}],
        [1, "reload", {"node_id": 5, "chain": [5], "op": 13, "host": host5, "dev": dev5b}],
        [2, "ack", {"dir": "h2d", "op": 13, "node_id": 5, "h": 8070450532247928832 + rank, "nz": 4096}],
    ]


def expected_fields(fields: dict) -> dict:
    """What a reader must get back for the fields passed to cptrace (the Record rendering, then parse_value)."""
    return {k: v if type(v) is int else parse_value(v if isinstance(v, str) else render_value(v))
            for k, v in fields.items()}


def _events_by_rank(td: dict) -> dict[int, list]:
    out: dict[int, list] = {}
    for ev in events_from_otlp(td):
        out.setdefault(ev.rank, []).append(ev)
    return out


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_two_ranks_roundtrip_through_jaeger(jaeger, run_id, tmp_path, protocol):
    rid = f"req-{run_id}"
    go = tmp_path / "go"
    runs = {r: start_rank(tmp_path, f"rank{r}", rank_env(run_id, r, jaeger.endpoint(protocol), protocol, tmp=tmp_path),
                          rank_records(r, rid), go_file=str(go))
            for r in (0, 1)}
    go.touch()
    results = {r: run.wait() for r, run in runs.items()}
    for r, res in results.items():
        assert res["flushed"] is True, runs[r].stderr
        assert "unreachable" not in runs[r].stderr, runs[r].stderr

    node5 = spans.node_trace_id(run_id, 0, 5).hex()
    node6 = spans.node_trace_id(run_id, 0, 6).hex()
    emitted5 = {r: [(tag, f, t0, t1) for tag, f, t0, t1 in res["emitted"] if f.get("node_id") == 5]
                for r, res in results.items()}

    # -- api_v3: the lossless read-back. Wait until both ranks' events of node 5 are in.
    def full_trace():
        td = jaeger.client.get_trace_v3(node5)
        if td is None:
            return None
        by_rank = _events_by_rank(td)
        return td if all(len(by_rank.get(r, [])) == len(emitted5[r]) for r in (0, 1)) else None

    td = wait_for(full_trace, 30, f"node 5 trace {node5} with every event of both ranks")
    by_rank = _events_by_rank(td)
    for r in (0, 1):
        got = by_rank[r]
        assert [e.tag for e in got] == [tag for tag, *_ in emitted5[r]]      # in per-rank emission order
        for ev, (tag, fields, t0, t1) in zip(got, emitted5[r], strict=False):
            assert ev.fields == expected_fields(fields), (tag, ev.fields)
            assert t0 <= ev.ts <= t1, (tag, t0, ev.ts, t1)                  # the call time, in ns
            assert ev.rank == r and ev.epoch == 0
        assert len({e.seq for e in got}) == len(got)

    # attribute types survive: ints stay OTLP ints (Jaeger tag search and TraceQL rely on it), rng -> 5 ints
    res_by_rank = {}
    for res, span in iter_spans(td):
        res_by_rank.setdefault(res["sglang.cp.rank"], res)
        for ev in span.get("events", []):
            if ev["name"] == "backup":
                raw = {a["key"]: a["value"] for a in ev["attributes"]}
                want = fields_to_attributes(expected_fields(dict(
                    (k, v) for k, v in rank_records(res["sglang.cp.rank"], rid)[4][2].items())))
                for k, v in want.items():
                    assert ("intValue" if type(v) is int else "stringValue") in raw[k], (k, raw[k])
                    assert otlp_attrs([{"key": k, "value": raw[k]}])[0][1] == v
    # each rank is its own resource: its pid, its rank, the run id, the service
    assert set(res_by_rank) == {0, 1}
    for r, res in res_by_rank.items():
        assert res["process.pid"] == results[r]["pid"]
        assert res["cptrace.run_id"] == run_id and res["service.name"] == SERVICE

    # -- /api/traces/{id}: Jaeger JSON; two processes (one per rank) with their tags; events as logs
    jt = jaeger.client.get_trace(node5)
    assert jt is not None and jt["traceID"] == node5
    procs = {pid: {t["key"]: t["value"] for t in p["tags"]} | {"serviceName": p["serviceName"]}
             for pid, p in jt["processes"].items()}
    by_rank_proc = {tags["sglang.cp.rank"]: pid for pid, tags in procs.items()}
    assert set(by_rank_proc) == {0, 1} and len(procs) == 2
    for r, pid in by_rank_proc.items():
        assert procs[pid]["process.pid"] == results[r]["pid"] and procs[pid]["serviceName"] == SERVICE
        assert procs[pid]["cptrace.run_id"] == run_id
    logs = Counter()
    for sp in jt["spans"]:
        rank_tag = {t["key"]: t["value"] for t in sp["tags"]}["sglang.cp.rank"]
        assert by_rank_proc[rank_tag] == sp["processID"]     # a span sits in its own rank's process
        for lg in sp["logs"]:
            f = {x["key"]: x["value"] for x in lg["fields"]}
            logs[(rank_tag, f["event"])] += 1
            assert f["hicache.node_id"] == 5
    assert logs == Counter((r, tag) for r in (0, 1) for tag, *_ in emitted5[r])

    # -- search by node id (narrowed to this run) and by rid
    found = jaeger.client.search(SERVICE, {"hicache.node_id": 5, "cptrace.run_id": run_id}, lookback_s=3600,
                                 limit=20)
    ids = {t["traceID"] for t in found}
    assert node5 in ids and node6 not in ids
    found6 = jaeger.client.search(SERVICE, {"hicache.node_id": 6, "cptrace.run_id": run_id}, lookback_s=3600)
    assert node6 in {t["traceID"] for t in found6} and node5 not in {t["traceID"] for t in found6}
    by_rid = jaeger.client.search(SERVICE, {"hicache.rid": rid}, lookback_s=3600, limit=20)
    assert node5 in {t["traceID"] for t in by_rid}
    assert node6 not in {t["traceID"] for t in by_rid}
    # an int attribute matches its string form (Jaeger compares AsString), and a wrong value matches nothing
    assert not jaeger.client.search(SERVICE, {"hicache.node_id": 5, "cptrace.run_id": run_id + "-other"},
                                    lookback_s=3600)

    # -- the analyzer's read path: every record of the run (both ranks, node, rank and request traces), in order
    evs = wait_for(lambda: (lambda e: e if len(e) == sum(len(r["emitted"]) for r in results.values()) else None)(
        run_events(jaeger.client, run_id)), 30, "all records of the run through run_events")
    assert not evs.truncated and evs.traces >= 3
    for r in (0, 1):
        mine = [e for e in evs if e.rank == r]
        assert [(e.tag, e.fields) for e in mine] == [(tag, expected_fields(f)) for tag, f, *_ in results[r]["emitted"]]
        assert [e.seq for e in mine] == sorted(e.seq for e in mine)

    # -- the links people click lead to the same trace: the trace page's id, and the search page's service + tags
    # (the UI turns them into this same /api/traces query) select the node's trace and not its neighbour
    assert links.trace_url(jaeger.query_url, spans.node_trace_id(run_id, 0, 5)).endswith("/trace/" + node5)
    assert links.node_trace_url(jaeger.query_url, run_id, 0, 5) == f"{jaeger.query_url}/trace/{node5}"
    for url, want in ((links.node_search_url(jaeger.query_url, 5, run_id=run_id, rank=1), node5),
                      (links.rid_search_url(jaeger.query_url, rid, run_id=run_id), node5),
                      (links.node_search_url(jaeger.query_url, 6, run_id=run_id), node6)):
        q = parse_qs(urlsplit(url).query)
        hits = {t["traceID"] for t in jaeger.client.search(q["service"][0], json.loads(q["tags"][0]),
                                                           lookback_s=3600, limit=int(q["limit"][0]))}
        assert want in hits and ({node5, node6} - {want}).isdisjoint(hits), (url, hits)


def test_api_v3_search_by_service_and_time(jaeger, run_id, tmp_path):
    """api_v3 search (no attribute filter over HTTP at v1.76) returns our spans in OTLP form for a time window."""
    import time

    svc = f"cptrace-it-{run_id}"
    t0 = time.time_ns()
    run = start_rank(tmp_path, "rank0", rank_env(run_id, 0, jaeger.otlp_http, tmp=tmp_path, OTEL_SERVICE_NAME=svc),
                     rank_records(0, "r-v3"))
    res = run.wait()
    assert res["flushed"] is True, run.stderr

    def found():
        td = jaeger.client.find_traces_v3(svc, t0 - 10**9, time.time_ns() + 10**9, num_traces=50)
        evs = events_from_otlp(td)
        return evs if len(evs) == len(res["emitted"]) else None

    evs = wait_for(found, 30, f"api_v3 search for service {svc}")
    assert sorted(e.tag for e in evs) == sorted(tag for tag, *_ in res["emitted"])
