"""Whether SGLang 0.5.23's kv-canary stamps survive a HiCache load-back, on real code (``canary_driver.py``): the
canary's own stamp and verify code (its torch references, SGLang's path off CUDA) on buffers attached by SGLang's MHA
attacher, its own ``ViolationReporter`` logging each violation, the instrumentation's handler turning each into a
``kv_canary`` record, and ``check`` reading the log as a user runs it.

Measured: they do not. The canary keeps its stamps in buffers of its own, one entry per device slot, and nothing in
HiCache (host pool, load-back, storage) copies them: a load-back fills fresh device slots with the right KV and
leaves their stamps as the slots' previous use left them, so the next forward's verify of the prefix fails on
them (position, chain hash) and a forward seeded by one fails its write-position check. A run without load-backs
has none. The driver's own KV check finds the KV correct throughout, so every one of these violations is false;
the CANARY rule counts those on a reloaded node's slots as ``CANARY-skipped(reloaded)`` (docs/deploy.md).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.sglang_real import runtime

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

MATRIX = [
    {"seed": 0, "exact": True},                                           # 0: device pressure: load-backs
    {"seed": 0, "exact": True, "dev_tokens": 4000, "host_ratio": 2.0},    # 1: nothing evicted: no load-back
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    runtime.need("0.5.23")
    out = tmp_path_factory.mktemp("canary")
    p = subprocess.run(runtime.module_cmd("canary_driver", "--version", "0.5.23", "--out", str(out), "--matrix",
                                          json.dumps(MATRIX)), env=runtime.sglang_env("0.5.23"), cwd=runtime.ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_without_load_backs_the_canary_is_silent(runs):
    run = runs[1]
    assert run["stats"]["loads"] == 0 and run["corruption"] == [], run["stats"]
    assert run["canary"]["verified"] > 1000 and run["canary"]["violations"] == [], run["canary"]["violations"][:3]
    d = runtime.check_json([run["log"]])
    assert [f for f in d["findings"] if f["code"] == "CANARY"] == [], runtime.fmt_findings(d)


def test_canary_stamps_do_not_survive_a_load_back(runs):
    """Load-backs fill device slots with the right KV (the driver's check: no corruption), and the canary fails
    every violation it reports on a slot a load-back filled and no forward stamped since (position, or position
    and chain hash)."""
    run = runs[0]
    c = run["canary"]
    assert run["stats"]["loads"] > 0 and run["corruption"] == [], run["stats"]
    assert c["loaded_slots_verified"] > 0 and c["violations"], c
    assert all(v["loaded"] for v in c["violations"]), [v for v in c["violations"] if not v["loaded"]][:3]
    position, chain = 1 << 1, 1 << 0   # SGLang's FailReason bits
    assert {v["reason"] for v in c["violations"]} <= {position, position | chain}, c["violations"][:3]


def test_no_false_canary_on_reloaded_nodes(runs):
    """What ``check`` makes of them: no CANARY finding on a node whose device slots a load-back filled (each such
    violation is counted as ``CANARY-skipped(reloaded)``). What remains is reported for the run: violations whose
    owner the range summaries cannot decide, and the write-position checks of forwards seeded by a reloaded slot
    (the record names the written slot, not its seed): docs/deploy.md."""
    run = runs[0]
    d = runtime.check_json([run["log"]])
    skipped = sum(u["count"] for u in d["unchecked"] if u["rule"] == "CANARY-skipped(reloaded)")
    assert skipped > len(run["canary"]["violations"]) // 2, (skipped, len(run["canary"]["violations"]))
    canary = [f for f in d["findings"] if f["code"] == "CANARY"]
    on_reloaded = [f for f in canary if "reload)" in f["message"] or "ack h2d)" in f["message"]]
    assert on_reloaded == [], runtime.fmt_findings(d)
    assert all(f["node_id"] is None or "fail_reason=write_position" in f["message"] for f in canary), \
        runtime.fmt_findings(d)
