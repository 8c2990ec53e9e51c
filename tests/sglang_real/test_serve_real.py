"""Real SGLang's streams behind the real OTel Collector and two ``cptrace-otel serve`` replicas find what ``check``
finds on the same records.

The streams: SGLang 0.5.23's own HiCache code on CPU, rank processes in one gloo group (``driver.run_ranks``), each
rank's exporter writing its OTLP requests to a file. Five runs, each under its own run id:

* 4 ranks, mode ``replicated`` (``driver.py``): healthy; rank 2's host pin released before the load's ack
  (``early_release``: H2c, and HASH where the reused slots are reloaded);
* 1 rank (``driver.py``): a backup's source evicted from the device before its ack (``unpinned``: H4a);
* 3 ranks, stock prefill CP (``cp_driver.py``, mode ``prefill_cp`` from SGLang's server arguments, the ``file``
  storage backend): healthy; rank 1's copy of one position unequal (``cp_unequal``: C5, a cross-rank rule).

Every request of every rank (interleaved across ranks, as concurrent ranks send) is POSTed as OTLP/HTTP protobuf to
the collector built from deploy/collector/builder.yaml and configured from deploy/collector/config-checkers.yaml
(ports replaced; its Jaeger exporter left out), whose ``load_balancing/checkers`` exporter (routing key
``traceID``) sends each node trace to one of two replicas.

Proves, for each run: both replicas together check every record once (the records checked add up to ``check``'s
count of the same files); no finding is printed twice; the union of the replicas' findings equals ``check``'s on the
same OTLP files for the rules a replica reports exactly (``TRACE_RULES``, and ``LOCKSTEP_RULES`` on these runs,
whose ranks stay in lockstep), and is contained in it for the rules that may miss evidence in another trace
(``PARTIAL_RULES``); every rule ``check`` found that a replica does not report is named UNCHECKED in both replicas'
summaries, and so is every rule whose findings a replica suppressed. The faulted runs give findings of the exact
rules (H2c, H4a, C5), so the comparison is not of two empty sets, and each fault's rule is found by a replica.
``early_release``'s H2c: SGLang frees the load's host slots by index (a ``free`` record without a node), which the
exporter puts in the load's node trace, and the load is split while in flight (its first h2d ack is the new
fragment's, in another trace), so H2c is reported at the reload node's own ack: the replica holding that trace
gives check's finding (exported with the online checks off, the free stays in the rank trace and no node trace
gives check's one H2c).

Without SGLang 0.5.23 (``deploy/sglang/install``) or the collector binary (``deploy/collector/up``) the test skips
with the reason, unless ``CPTRACE_REQUIRE_SGLANG=1`` / ``CPTRACE_REQUIRE_COLLECTOR`` is set (``.ci/run``): then it
fails.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import urllib.request

import pytest

from cptrace_otel.analyze.serve_state import LOCKSTEP_RULES, PARTIAL_RULES, TRACE_RULES, unchecked_rules
from tests.helpers.integration import ROOT, collector_binary
from tests.integration.test_serve_collector import LINE, _env, two_replicas
from tests.sglang_real import runtime

VERSION = "0.5.23"
pytestmark = [pytest.mark.sglang, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

# (``checks``: the exporter's online checks, on as deployed (CPTRACE_CHECKS=1): they put a free by index that breaks
# a copy into the copy's node trace)
BASE = {"requests": 60, "dev_tokens": 256, "seed": 1, "policy": "write_through", "exact": True, "reset": False,
        "checks": True}
# run id -> (the driver's matrix entry, the rule its fault makes check find: the replicas too where it is exact)
REPLICATED = {"rep-healthy": ({}, None), "rep-early-release": ({"fault": "early_release"}, "H2c")}
ONE_RANK = {"one-unpinned": ({"fault": "unpinned", "nth": 10, "requests": 120}, "H4a")}
PREFILL_CP = {"cp-healthy": ({}, None), "cp-unequal": ({"fault": "cp_unequal"}, "C5")}
RUNS = {**REPLICATED, **ONE_RANK, **PREFILL_CP}
SUMMARY = re.compile(r"UNCHECKED here \([^)]*\): ([^;]*);")


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> dict[str, list[str]]:
    """run id -> its ranks' OTLP files (the exporter's requests, one JSON line each)."""
    collector_binary()   # (before the SGLang runs: skip or fail at once without it)
    runtime.need(VERSION)
    from tests.sglang_real import driver

    out = tmp_path_factory.mktemp("serve-real")
    got: dict[str, list[str]] = {}
    for name, world, fault_rank, module, base, runs in (
            ("rep", 4, 2, None, BASE, REPLICATED),
            ("one", 1, 0, None, BASE, ONE_RANK),
            ("cp", 3, 1, "cp_driver", {"kv": "mha", "exact": True, "checks": True}, PREFILL_CP)):
        matrix = [{**base, **entry, "run_id": rid} for rid, (entry, _rule) in runs.items()]
        res = driver.run_ranks(VERSION, str(out / name), world=world, fault_rank=fault_rank, matrix=matrix,
                               module=module)
        for rid, ranks in zip(runs, res, strict=True):
            assert all(r["flushed"] for r in ranks), (rid, [r["flushed"] for r in ranks])
            got[rid] = [r["otlp"] for r in ranks]
    return got


def _requests(files: list[str]) -> list[bytes]:
    """Every rank's requests as OTLP protobuf bytes, interleaved across the ranks in each rank's order."""
    from tests.helpers.otlp_receiver import parse_json_line

    per_rank = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            per_rank.append([parse_json_line(ln).SerializeToString() for ln in fh if ln.strip()])
    out: list[bytes] = []
    for i in range(max(map(len, per_rank))):
        out += [reqs[i] for reqs in per_rank if i < len(reqs)]
    return out


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200, r.status


def test_real_sglang_streams_through_the_collector_find_what_check_finds(streams, tmp_path):
    checked_by_check: dict[str, dict] = {}
    for rid, files in streams.items():
        c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json", "--no-progress", *files],
                           capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
        assert c.returncode in (0, 1), c.stderr[-2000:]
        checked_by_check[rid] = json.loads(c.stdout)

    def replay(url: str) -> int:
        for files in streams.values():
            for body in _requests(files):
                _post(url, body)
        return sum(d["stats"]["events"] for d in checked_by_check.values())

    ms, codes, n = two_replicas(tmp_path, replay, wait_s=180)
    replicas = ("a", "b")
    checked = {name: m["cptrace_serve_events_checked_total"] for name, m in ms.items()}
    assert all(v > 0 for v in checked.values()), f"both replicas get traffic: {checked}"
    assert sum(checked.values()) == n, f"each record is checked by exactly one replica: {checked} vs {n}"
    for m in ms.values():
        assert (m["cptrace_serve_spans_dropped_total"], m["cptrace_serve_late_records_total"],
                m["cptrace_serve_check_errors_total"], m["cptrace_serve_spans_rejected_total"]) == (0, 0, 0, 0), m

    got: dict[str, list[tuple]] = collections.defaultdict(list)
    for name in replicas:
        for ln in (tmp_path / f"{name}.out").read_text().splitlines():
            if ln.strip():
                m = LINE.match(ln)
                assert m, ln
                got[m[4]].append((m[2], m[3], int(m[5]), int(m[6]) if m[6] else None, int(m[7]), m[8]))
        assert codes[name] == (1 if (tmp_path / f"{name}.out").read_text().strip() else 0), codes
    assert set(got) <= set(streams), sorted(got)

    unchecked = set(unchecked_rules())
    suppressed = {k.split('"')[1] for m in ms.values() for k, v in m.items()
                  if k.startswith("cptrace_serve_suppressed_total{") and v > 0}
    assert suppressed <= unchecked, "a replica suppresses only the rules it names UNCHECKED"
    for name in replicas:   # the summary names them, as documented
        last = (tmp_path / f"{name}.err").read_text().strip().splitlines()[-1]
        s = SUMMARY.search(last)
        assert s and set(s[1].split(", ")) == unchecked, last

    exact = TRACE_RULES | LOCKSTEP_RULES
    counts = {}
    for rid, d in checked_by_check.items():
        have = got.get(rid, [])
        assert len(have) == len(set(have)), f"{rid}: no finding is printed twice"
        want = {(f["code"], f["rule"], f["rank"], f["node_id"], f["epoch"], str(f["evidence"][-1]))
                for f in d["findings"]}
        assert {f for f in have if f[1] in exact} == {f for f in want if f[1] in exact}, rid
        assert {f for f in have if f[1] in PARTIAL_RULES} <= {f for f in want if f[1] in PARTIAL_RULES}, rid
        assert {f[1] for f in have} <= exact | PARTIAL_RULES, rid
        assert {f[1] for f in want} - exact - PARTIAL_RULES <= unchecked, rid
        rule = RUNS[rid][1]
        if rule is None:
            assert not want and not have, (rid, sorted(want), have)
        else:
            assert rule in {f[1] for f in want}, f"{rid}: check finds the fault's {rule}"
            assert rule not in exact or rule in {f[1] for f in have}, f"{rid}: the replicas find the fault's {rule}"
        counts[rid] = {"records": d["stats"]["events"], "check": collections.Counter(f[1] for f in want),
                       "replicas": collections.Counter(f[1] for f in have)}
    per_rule = collections.Counter({k.split('"')[1]: int(v) for m in ms.values() for k, v in m.items()
                                    if k.startswith("cptrace_serve_suppressed_total{")})
    print(json.dumps({"runs": counts, "suppressed": per_rule, "unchecked": sorted(unchecked)}, default=dict))
