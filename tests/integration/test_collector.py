"""Scale-out through a real OpenTelemetry Collector: 4 rank processes -> the collector built from
deploy/collector/builder.yaml (load_balancing exporter, routing key traceID) -> two Jaeger shards, read back through
each shard's query API.

Proves: every trace lands whole in exactly one shard (a node trace with all 4 ranks' spans), each shard holds at
least 25% of the node traces, and nothing is lost or duplicated (every emitted record comes back once, in per-rank
order, with its fields). Ranks 0 and 1 send OTLP/HTTP, ranks 2 and 3 OTLP/gRPC, so both receivers are used.

The tier is the one ``deploy/collector/up`` starts (``.ci/run`` does); when it is not running but its binaries are
built, the test starts it with that script and stops it afterwards. Without the collector binary (or Jaeger's) the
test skips with the reason, unless ``CPTRACE_REQUIRE_COLLECTOR`` is set (``.ci/run`` sets it): then it fails, so CI
cannot pass by skipping. Ports come from the config files under deploy/collector/, the single source of truth.
"""

from __future__ import annotations

import collections
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from cptrace_otel.analyze.sources.jaeger import JaegerClient, JaegerUnreachable, events_from_otlp
from tests.helpers.integration import _BASE_ENV, DEPLOY, collector_binary, rank_env, start_rank, wait_for

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.integration

# Read at import: the root conftest clears CPTRACE_* from os.environ for every test.
REQUIRE = bool(os.environ.get("CPTRACE_REQUIRE_COLLECTOR", "").strip())
COLLECTOR_DIR = DEPLOY / "collector"
SHARD_CONFIGS = ("jaeger-shard-a.yaml", "jaeger-shard-b.yaml")
SERVICE = "sglang-hicache"
RANKS = 4
NODES = 240          # shared node ids: one node trace each, spans from all 4 ranks
MIN_SHARE = 0.25


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"{reason} (CPTRACE_REQUIRE_COLLECTOR is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(f"{reason}; build and start it with deploy/collector/up (set CPTRACE_REQUIRE_COLLECTOR=1 to fail "
                f"instead)")


def _load(name: str) -> dict:
    return yaml.safe_load((COLLECTOR_DIR / name).read_text())


def _http(endpoint: str) -> str:
    return "http://" + endpoint


class Tier:
    """Endpoints of the loopback tier, read from deploy/collector/config-loopback.yaml and the shard configs."""

    def __init__(self) -> None:
        col = _load("config-loopback.yaml")
        protocols = col["receivers"]["otlp"]["protocols"]
        self.otlp_http = _http(protocols["http"]["endpoint"])
        self.otlp_grpc = _http(protocols["grpc"]["endpoint"])
        self.health = _http(col["extensions"]["health_check"]["endpoint"]) + "/"
        self.resolver = list(col["exporters"]["load_balancing"]["resolver"]["static"]["hostnames"])
        self.shards = {}
        self.shard_otlp = {}
        for name in SHARD_CONFIGS:
            cfg = _load(name)
            url = _http(cfg["extensions"]["jaeger_query"]["http"]["endpoint"])
            self.shards[name] = JaegerClient(url, timeout_s=20)
            self.shard_otlp[name] = cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health, timeout=10) as r:
                if r.status != 200:
                    return False
            for client in self.shards.values():
                client.services()
        except (OSError, JaegerUnreachable):
            return False
        return True


def test_loopback_config_routes_by_trace_id_to_both_shards():
    """Static: the collector routes by trace id to exactly the two shards' OTLP gRPC receivers (no server needed)."""
    tier = Tier()
    col = _load("config-loopback.yaml")
    lb = col["exporters"]["load_balancing"]
    assert lb["routing_key"] == "traceID"
    assert lb["protocol"]["otlp"]["tls"]["insecure"] is True
    assert sorted(tier.resolver) == sorted(tier.shard_otlp.values())
    assert col["service"]["pipelines"]["traces"]["exporters"] == ["load_balancing"]
    ports = [int(e.rsplit(":", 1)[1]) for e in [tier.otlp_http, tier.otlp_grpc, *tier.resolver]]
    assert not set(ports) & {4317, 4318}, "the default Jaeger's OTLP ports stay free"
    for cfg in [col] + [_load(n) for n in SHARD_CONFIGS]:
        text = yaml.safe_dump(cfg)
        assert "0.0.0.0" not in text, "loopback only"


@pytest.mark.parametrize("config", ["config-loopback.yaml", "config.yaml", "config-tempo.yaml", "config-checkers.yaml"])
def test_built_collector_accepts_every_config(config):
    """The binary built from builder.yaml has every component the compose, Tempo and loopback configs use
    (``otelcol validate`` resolves the config and builds each component's config, starting nothing)."""
    b = collector_binary()
    r = subprocess.run([str(b), "validate", f"--config={COLLECTOR_DIR / config}"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def tier():
    t = Tier()
    if t.healthy():
        yield t
        return
    collector_binary()   # skips (or fails under CPTRACE_REQUIRE_COLLECTOR) when the binary up starts is missing
    jaeger_bin = Path(os.environ.get("JAEGER_BIN") or DEPLOY / "jaeger" / "bin" / "jaeger")
    if not jaeger_bin.is_file():
        _unavailable(f"the scale-out tier is not running and there is no Jaeger binary for its shards at {jaeger_bin}")
    env = dict(_BASE_ENV)
    r = subprocess.run(["bash", str(COLLECTOR_DIR / "up")], env=env, capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        pytest.fail(f"deploy/collector/up failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", pytrace=False)
    if r.stdout.count("already running") == 3:   # it was up, only slow to answer: leave it running
        yield t
        return
    try:
        yield t
    finally:
        subprocess.run(["bash", str(COLLECTOR_DIR / "down")], env=env, capture_output=True, timeout=120)


def _rng(lo: int, n: int) -> str:
    return f"(cnt={n},min={lo},max={lo + n - 1},first={lo},last={lo + n - 1})"


def rank_records(rank: int) -> list:
    """A clean write-through lifecycle of every shared node on one rank (replicated mode): config, then per node
    insert, prepare, backup, ack d2h; pages never reused, so no invariant is broken."""
    recs: list = [[1, "config", {"cp_size": RANKS, "cp_rank": rank, "mode": "replicated", "page_size": 1,
                                 "policy": "wt"}]]
    for n in range(1, NODES + 1):
        dev, host = _rng(rank * 1_000_000 + n * 16, 16), _rng(n * 16, 16)
        op = 1000 + n
        recs += [
            [1, "insert", {"node_id": n, "parent": 0, "len": 16, "dev": dev, "kind": "new"}],
            [1, "prepare", {"node_id": n, "op": op, "len": 16, "dev": dev, "host": host, "policy": "wt"}],
            [1, "backup", {"op": op, "node_id": n, "dev": dev, "host": host, "io": 1, "h": 7 * n + rank,
                           "nz": 256}],
            [2, "ack", {"dir": "d2h", "op": op, "node_id": n, "blen": 16, "clen": 16, "pub": [n]}],
        ]
    return recs


def _shard_traces(client: JaegerClient, run_id: str) -> dict[str, list]:
    """trace id -> events of that trace held by one shard, for every trace of ``run_id`` (api_v3, lossless)."""
    found = client.search(SERVICE, {"cptrace.run_id": run_id}, lookback_s=3600, limit=10 * NODES)
    out = {}
    for tr in found:
        td = client.get_trace_v3(tr["traceID"])
        if td is not None:
            out[tr["traceID"]] = events_from_otlp(td)
    return out


def test_four_ranks_through_collector_land_whole_in_one_shard(tier, run_id, tmp_path):
    go = tmp_path / "go"
    records = {r: rank_records(r) for r in range(RANKS)}
    runs = {}
    for r in range(RANKS):
        protocol = "http/protobuf" if r < 2 else "grpc"
        endpoint = tier.otlp_http if r < 2 else tier.otlp_grpc
        runs[r] = start_rank(tmp_path, f"rank{r}", rank_env(run_id, r, endpoint, protocol, tmp=tmp_path),
                             records[r], go_file=str(go))
    go.touch()
    results = {r: run.wait() for r, run in runs.items()}
    for r, res in results.items():
        assert res["flushed"] is True, runs[r].stderr
        assert "unreachable" not in runs[r].stderr, runs[r].stderr
    emitted = sum(len(recs) for recs in records.values())

    # The collector acked every request; it forwards within its batch timeout. Wait until both shards together
    # hold every record (a late shard would show up as a shortfall here, a duplicate as an excess below).
    def all_in():
        per = {name: _shard_traces(c, run_id) for name, c in tier.shards.items()}
        n = sum(len(evs) for traces in per.values() for evs in traces.values())
        return per if n >= emitted else None

    per_shard = wait_for(all_in, 60, f"all {emitted} records of run {run_id} in the two shards", interval_s=1)

    # -- every trace in exactly one shard
    where = collections.defaultdict(list)
    for name, traces in per_shard.items():
        for tid in traces:
            where[tid].append(name)
    split = {tid: names for tid, names in where.items() if len(names) != 1}
    assert not split, f"traces found in more than one shard: {list(split.items())[:5]}"

    # -- nothing lost, nothing duplicated: per rank, the records come back once each, in emission order
    by_rank = collections.defaultdict(list)
    node_trace: dict[int, set[str]] = collections.defaultdict(set)
    trace_ranks: dict[str, set[int]] = collections.defaultdict(set)
    for traces in per_shard.values():
        for tid, evs in traces.items():
            for ev in evs:
                by_rank[ev.rank].append(ev)
                trace_ranks[tid].add(ev.rank)
                if "node_id" in ev.fields:
                    node_trace[ev.fields["node_id"]].add(tid)
    assert sorted(by_rank) == list(range(RANKS))
    for r in range(RANKS):
        got = sorted(by_rank[r], key=lambda e: (e.epoch, e.seq))
        assert len({(e.epoch, e.seq) for e in got}) == len(got), f"rank {r}: a record arrived twice"
        assert [(e.tag, e.fields.get("node_id")) for e in got] == \
            [(tag, f.get("node_id")) for _, tag, f in records[r]], f"rank {r}: records lost or reordered"

    # -- every node is one trace holding all 4 ranks' spans (so it is whole in its one shard)
    assert sorted(node_trace) == list(range(1, NODES + 1))
    for node, tids in node_trace.items():
        assert len(tids) == 1, (node, tids)
        assert trace_ranks[next(iter(tids))] == set(range(RANKS)), node

    # -- both shards carry a fair share of the node traces
    node_tids = {next(iter(t)) for t in node_trace.values()}
    share = {name: len(node_tids & set(traces)) / NODES for name, traces in per_shard.items()}
    assert all(s >= MIN_SHARE for s in share.values()), share


def test_collector_up_is_idempotent_when_running(tier):
    """A second deploy/collector/up leaves the healthy tier alone: nothing rebuilt, nothing restarted."""
    pids = {n: (COLLECTOR_DIR / ".run" / f"{n}.pid") for n in ("collector", "jaeger-shard-a", "jaeger-shard-b")}
    if not all(p.is_file() for p in pids.values()):
        pytest.skip("the running tier was not started by deploy/collector/up (no pid files)")
    before = {n: p.read_text() for n, p in pids.items()}
    r = subprocess.run(["bash", str(COLLECTOR_DIR / "up")], env=dict(_BASE_ENV), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("already running") == 3 and "building" not in r.stderr, (r.stdout, r.stderr)
    assert {n: p.read_text() for n, p in pids.items()} == before
    assert tier.healthy()
