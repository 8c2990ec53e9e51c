"""Real SGLang 0.5.23 over a DSA KV pool (``DSATokenToKVPool`` and its indexer sidecar, assembled by SGLang's own
``_DsaStrategy``; dsa_driver.py) on CPU: the sidecar's fingerprints in the records, and the SIDE rules, offline
(``check``) and online (the exporter's checks, the same rule code), on a healthy run and on the fault SGLang had
before its DSA index buffers were backed up to host (the indexer dropped from the backup op)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from cptrace_otel.model import semconv as sc
from tests.helpers.otlp_twins import assert_file_alike
from tests.sglang_real import runtime
from tests.sglang_real.test_sglang_real import _check_json as _check, _records  # (the same readers)

pytestmark = pytest.mark.sglang
VERSION = "0.5.23"
RUN = """
import json
from tests.sglang_real import dsa_driver
out = []
for fault in (None, "dsa_no_idx_backup"):
    r = dsa_driver.run_dsa({out!r} + "/" + str(fault), fault=fault, batch=3, checks=True, exact=True)
    out.append(r)
print(json.dumps(out))
"""


def _online(otlp: str) -> list[str]:
    """The rule names of the exporter's online findings (``cptrace.violation.rules`` span attributes)."""
    out: list[str] = []
    with open(otlp, encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        for a in span.get("attributes", []):
                            if a["key"] == sc.VIOLATION_RULES:
                                out.extend(a["value"]["stringValue"].split(","))
    return out


def _both(tmp_path_factory: Any, script: str, name: str) -> list[dict]:
    """``script`` (:data:`RUN`'s shape) in a process with SGLang 0.5.23: the healthy run's and the fault's summary."""
    runtime.need(VERSION)
    out = str(tmp_path_factory.mktemp(name))
    p = subprocess.run([sys.executable, "-c", script.format(out=out)], env=runtime.sglang_env(VERSION),
                       capture_output=True, text=True, timeout=600, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    runs = json.loads(p.stdout.strip().splitlines()[-1])
    # every record of both runs delivered to both files (else the tests below would judge a partial run)
    assert all(r["flushed"] and os.path.exists(r["log"]) and os.path.exists(r["otlp"]) for r in runs), p.stderr[-4000:]
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _both(tmp_path_factory, RUN, "dsa")


def test_the_dsa_indexer_is_fingerprinted_with_the_kv(runs):
    healthy, _ = runs
    assert healthy["corruption"] == [] and healthy["stats"]["loads"] > 0
    recs = _records(healthy["log"])
    cfg = [f for t, f in recs if t == "config"]
    assert cfg and all(f[sc.SIDECARS] == "indexer" for f in cfg)
    side_h, side_hp = sc.side_field(sc.SIDE_H, "indexer"), sc.side_field(sc.SIDE_HP, "indexer")
    backups = [f for t, f in recs if t == "backup"]
    h2d = [f for t, f in recs if t == "ack" and f.get("dir") == "h2d"]
    reloads = [f for t, f in recs if t == "reload"]
    assert backups and h2d and reloads
    for f in backups + h2d:
        # one page hash per KV page, each a real hash (not a sentinel): the indexer pages the node's slots use
        assert type(f[side_h]) is int and f[side_h] > 0, f
        assert len(f[side_hp]) == len(f["hp"]) and all(x > 0 for x in f[side_hp]), f
    assert all(f[sc.SIDE_MOVED] == "indexer" for f in backups + reloads)


def test_a_healthy_dsa_run_has_no_finding_of_any_severity(runs):
    healthy, _ = runs
    rep = _check(healthy["log"])
    assert rep["findings"] == [] and rep["unchecked"] == [], (rep["findings"][:3], rep["unchecked"])
    assert _online(healthy["otlp"]) == []


def test_the_indexer_left_out_of_the_backup_is_found(runs):
    """SGLang before its DSA index buffers were backed up to host: the KV round trip is right, the indexer on the
    device after a load-back is stale (the driver sees it), and SIDE names both the copy and the stale load."""
    _, fault = runs
    assert fault["dsa_fault_hits"] and all(h["dropped"] == 1 for h in fault["dsa_fault_hits"])
    dev = [c for c in fault["corruption"] if c["where"] == "device"]
    assert dev and {c["pool"] for c in dev} == {"indexer"}
    rep = _check(fault["log"])
    rules = {f["rule"] for f in rep["findings"]}
    assert rules == {"SIDE-missing", "SIDE-hash"}, rules
    assert all(f["severity"] == "ERROR" and f["certainty"] == "exact" for f in rep["findings"])
    assert len([f for f in rep["findings"] if f["rule"] == "SIDE-missing"]) == len(fault["dsa_fault_hits"])
    assert set(_online(fault["otlp"])) == {"SIDE-missing", "SIDE-hash"}
    # the file sink's output with the online findings on it: the C reader of OTLP JSON lines reads every line
    # itself, as its Python twin does
    got = assert_file_alike(fault["otlp"])
    assert got["answered"] == got["lines"] and got["events"] > 0, got


RUN_L3 = RUN.replace('(None, "dsa_no_idx_backup")', '(None, "dsa_l3_no_idx")').replace(
    "exact=True)", "exact=True, l3=True, host_ratio=1.5)")


@pytest.fixture(scope="module")
def l3_runs(tmp_path_factory):
    return _both(tmp_path_factory, RUN_L3, "dsa_l3")


def test_the_indexer_goes_to_l3_and_back_fingerprinted(l3_runs):
    """SGLang's ``file`` backend stores each page's indexer as its own object; a healthy run with L3 prefetches
    has no finding, and its L3 records carry the indexer pages' fingerprints."""
    healthy, _ = l3_runs
    assert healthy["corruption"] == [] and healthy["stats"]["l3_loaded_tokens"] > 0
    side_hp = sc.side_field(sc.SIDE_HP, "indexer")
    recs = _records(healthy["log"])
    l3 = [f for t, f in recs if t == "l3_backup" or (t == "l3_ack" and f.get("dir") == "prefetch")]
    assert l3 and all(len(f[side_hp]) == len(f["keys"]) for f in l3)
    rep = _check(healthy["log"])
    assert rep["findings"] == []
    # the fetched nodes enter the tree without a backup in this trace: counted, never passed
    assert {u["rule"] for u in rep["unchecked"]} <= {"HASH-skipped(no backup)", "SIDE-skipped(no backup)"}
    assert _online(healthy["otlp"]) == []


def test_a_store_that_leaves_the_indexer_out_of_an_l3_hit_is_found(l3_runs):
    """The shape of a store that registered ``kv_buffer`` but not ``index_k_with_scale_buffer``: the L3 hit brings
    the KV back and reports the indexer read, which it was not. SIDE-l3 finds it at the prefetch's ack."""
    _, fault = l3_runs
    assert fault["dsa_fault_hits"]
    assert {c.get("pool") for c in fault["corruption"] if c["where"] == "device"} == {"indexer"}
    rep = _check(fault["log"])
    rules = {f["rule"] for f in rep["findings"]}
    assert "SIDE-l3" in rules and rules <= {"SIDE-l3", "SIDE-hash"}, rules
    assert "SIDE-l3" in set(_online(fault["otlp"]))
