"""The audit of L3 copies at rest on real SGLang: 0.5.20's ``HiRadixCache`` and 0.5.23's ``UnifiedRadixCache`` with
the ``file`` storage backend (``HiCacheFile`` writing real files, its storage threads running), driven on CPU by
``l3_driver.py`` with the audit thread on (``audit_mbps``): it reads the objects of acked ``l3_backup`` records back
through ``HiCacheFile.get`` and writes ``audit tier=l3`` records, read back by ``cptrace-otel check`` as a user runs
it.

* Healthy runs (write-through pages of 1, write-back pages of 4; a reset mid-run, after which prefixes come back
  from storage): ``audit tier=l3`` records of the stored objects are written, every audited page is one this trace
  wrote, and the checker reports no finding of any severity.
* A byte of one stored object flipped in its file after the last step (``l3_rot``: no request reads it again, so
  L3a, which judges a prefetch, cannot see it): REST-l3 on the node whose ``l3_backup`` wrote that key, and nothing
  else; the exporter's online checks put it on the node's span (``cptrace.violation.REST``).
* A stored object removed after the last step: recorded as gone, counted (``REST-skipped(l3 gone)``), no finding.
* The ``file`` backend with its LRU eviction on (a size cap): its ``get`` would refresh what the audit reads, so its
  L3 copies are not audited (``l3_refused``, no ``tier=l3`` record); the host copies still are; no finding.

One driver process per version runs the five runs; without SGLang the tests skip, unless
``CPTRACE_REQUIRE_SGLANG=1``, where they fail.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.sglang_real import runtime

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

MBPS = 200
RUNS = [{"seed": 0, "exact": True},                                     # 0: write_through, pages of 1
        {"seed": 1, "policy": "write_back", "page_size": 4, "exact": True},   # 1: write_back, pages of 4
        {"seed": 0, "exact": True, "fault": "l3_rot", "checks": True},        # 2: a stored object rots at rest
        {"seed": 0, "exact": True, "fault": "l3_gone"},                       # 3: a stored object removed
        {"seed": 0, "exact": True, "l3_max_size": "1G"}]                      # 4: the file backend's LRU eviction on


@pytest.fixture(scope="module", params=["0.5.20", "0.5.23"])
def runs(request, tmp_path_factory) -> tuple[str, list[dict]]:
    version = request.param
    runtime.need(version)
    out = tmp_path_factory.mktemp("rest-l3")
    m = [{"audit_mbps": MBPS, **r} for r in RUNS]
    p = subprocess.run(runtime.module_cmd("l3_driver", "--version", version, "--out", str(out), "--matrix",
                                          json.dumps(m)), env=runtime.sglang_env(version), cwd=runtime.ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return version, json.loads(p.stdout.strip().splitlines()[-1])


def _l3_audits(events) -> list:
    return [e for e in events if e.tag == "audit" and e.fields.get("tier") == "l3"]


@pytest.mark.parametrize("i", [0, 1], ids=["wt-p1", "wb-p4"])
def test_healthy_runs_audit_their_stored_objects_and_find_nothing(runs, i):
    version, out = runs
    run = out[i]
    assert run["corruption"] == [], run["corruption"][:3]
    assert run["stats"]["resets"] == 1 and run["stats"]["l3_loaded_tokens"] > 0, run["stats"]
    st = run["audit"]
    assert st["l3_audited"] > 0 and st["l3_refused"] == 0 and st["l3_unreadable"] == 0 and st["errors"] == 0, st
    events = runtime.log_events([run["log"]])
    audits = _l3_audits(events)
    # (the counts are read while the thread may be between a record and its count: one more record at most)
    assert st["l3_audited"] <= len(audits) <= st["l3_audited"] + 1, (len(audits), st)
    written = {k for e in events if e.tag == "l3_backup" for k in e.fields["keys"]}
    read = [(k, h) for e in audits for k, h in zip(e.fields["keys"], e.fields["hp"], strict=True)]
    assert len({k for k, _ in read}) > 20 and {k for k, _ in read} <= written, version
    assert all(type(h) is int and h >= 0 for _, h in read), version   # every object read back (none gone)
    d = runtime.check_json([run["log"]])
    assert d["findings"] == [], (version, runtime.fmt_findings(d))
    assert not [u for u in d["unchecked"] if u["rule"].startswith("REST-skipped(l3")], d["unchecked"]


def test_a_stored_object_corrupted_at_rest_and_never_read_is_rest_l3_on_its_node(runs):
    version, out = runs
    run = out[2]
    hit = next(h for h in run["fault_hits"] if h["kind"] == "l3_rot")
    events = runtime.log_events([run["log"]])
    owners = {e.fields["node_id"] for e in events if e.tag == "l3_backup" and hit["key"] in e.fields["keys"]
              and e.fields.get("io", 1)}
    assert len(owners) == 1, owners
    # no request read the key after the flip: the stream had ended (no prefetch of it after its last audit)
    last = max(e.seq for e in _l3_audits(events) if hit["key"] in e.fields["keys"])
    assert not [e for e in events if e.tag in ("l3_prefetch", "l3_ack") and e.seq > last
                and hit["key"] in (e.fields.get("keys") or ())]
    d = runtime.check_json([run["log"]])
    assert [(f["rule"], f["node_id"], f["severity"]) for f in d["findings"]] == [("REST-l3", owners.pop(), "ERROR")], \
        (version, runtime.fmt_findings(d))
    assert hit["key"] in d["findings"][0]["message"]
    # the exporter's online checks (one rule definition with check's): the finding is on the node's span, alertable
    with open(run["otlp"], encoding="utf-8") as f:
        otlp = f.read()
    assert '"key":"cptrace.violation.REST","value":{"boolValue":true}' in otlp.replace(" ", "")


def test_a_stored_object_gone_is_counted_never_judged(runs):
    version, out = runs
    run = out[3]
    hit = next(h for h in run["fault_hits"] if h["kind"] == "l3_gone")
    assert run["audit"]["l3_gone"] >= 1 and run["audit"]["errors"] == 0, run["audit"]
    gone = [e for e in _l3_audits(runtime.log_events([run["log"]])) if -1 in e.fields["hp"]]
    assert [e.fields["keys"][e.fields["hp"].index(-1)] for e in gone] == [hit["key"]], version   # recorded once
    d = runtime.check_json([run["log"]])
    assert d["findings"] == [], (version, runtime.fmt_findings(d))
    assert [(u["rule"], u["count"]) for u in d["unchecked"] if u["rule"].startswith("REST-skipped(l3")] == \
        [("REST-skipped(l3 gone)", 1)], d["unchecked"]


def test_the_file_backend_with_its_lru_eviction_on_is_not_audited(runs):
    version, out = runs
    run = out[4]
    st = run["audit"]
    assert st["l3_refused"] == 1 and st["l3_audited"] == 0 and st["audited"] > 0, st
    events = runtime.log_events([run["log"]])
    assert not _l3_audits(events) and [e for e in events if e.tag == "l3_backup"], version
    d = runtime.check_json([run["log"]])
    assert d["findings"] == [], (version, runtime.fmt_findings(d))
