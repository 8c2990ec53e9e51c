"""Real SGLang 0.5.23 over a DSA KV pool (``DSATokenToKVPool`` and its indexer sidecar, assembled by SGLang's own
``_DsaStrategy``; dsa_driver.py) on CPU: the sidecar's fingerprints in the records, and the SIDE rules, offline
(``check``) and online (the exporter's checks, the same rule code), on a healthy run and on the fault SGLang had
before its DSA index buffers were backed up to host (the indexer dropped from the backup op)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import runtime  # noqa: E402
from test_sglang_real import _check_json as _check, _records  # noqa: E402  (the same readers)

from cptrace_otel.model import semconv as sc  # noqa: E402

pytestmark = pytest.mark.sglang
VERSION = "0.5.23"
RUN = """
import json, sys
sys.path.insert(0, {here!r})
import dsa_driver
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runtime.need(VERSION)
    out = str(tmp_path_factory.mktemp("dsa"))
    p = subprocess.run([sys.executable, "-c", RUN.format(here=HERE, out=out)], env=runtime.sglang_env(VERSION),
                       capture_output=True, text=True, timeout=600, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    healthy, fault = json.loads(p.stdout.strip().splitlines()[-1])
    return healthy, fault


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
