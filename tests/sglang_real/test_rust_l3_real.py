"""The L3 storage tier over 0.5.23's Rust tree core (the default, traced at its boundary), on real SGLang code on
CPU: SGLang's ``file`` backend under l3_driver.py's scheduler calls (``run_l3(..., boundary=True)``: the
``RustUnifiedTreeCore`` SGLang selects, asserted, read through its interface only). The ``l3_hit`` records come from
the core's ``insert_host`` (the node it added and the refilled nodes of its path, read with ``collect_path_info``).

* Healthy (write_through pages of 1 with exact sets; write_back pages of 4): the driver's KV checks see no
  corruption, ``check`` gives no finding, and every L3 record is there (backups acknowledged, prefetches
  acknowledged, hits).
* The faults of test_l3_real.py on the Rust core: a flipped byte of a stored page is L3a at that prefetch, naming its
  key; host pages freed during their prefetch are L3b, exact, on that prefetch's op and node.

One subprocess runs every case, with the torch the Rust core loads with.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.sglang_real import runtime
from tests.sglang_real.test_l3_real import assert_l3b

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

MATRIX = [{"seed": 0, "exact": True},                                          # 0: write_through, pages of 1
          {"seed": 1, "policy": "write_back", "page_size": 4, "exact": True},  # 1: write_back, pages of 4
          {"seed": 0, "exact": True, "fault": "l3_flip"},                      # 2: a byte of a stored page
          {"seed": 0, "exact": True, "fault": "l3_free"}]                      # 3: pages freed mid-prefetch
RUNS = """
import json, sys
from tests.sglang_real import l3_driver
out = []
for i, kw in enumerate(json.loads(sys.argv[2])):
    r = l3_driver.run_l3("0.5.23", sys.argv[1] + "/" + str(i), boundary=True, **kw)
    out.append({k: r[k] for k in ("corruption", "fault_hits", "l3_fault_hits", "stats", "log", "l3_files")})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    runtime.need("0.5.23", rust=True)
    return list(runtime.run_json(RUNS, str(tmp_path_factory.mktemp("rust-l3")), json.dumps(MATRIX),
                                 env=runtime.rust_default_env(), timeout=850))


@pytest.mark.parametrize("i", [0, 1], ids=["write_through-p1", "write_back-p4"])
def test_healthy_l3_run_on_the_rust_core_has_no_finding(runs, i):
    run = runs[i]
    st = run["stats"]
    assert st["tree_core"] == "RustUnifiedTreeCore", st
    assert run["corruption"] == [] and st["l3_loaded_tokens"] > 0 and run["l3_files"] > 0, st
    d = runtime.check_json([run["log"]])
    assert d["findings"] == [], runtime.fmt_findings(d)
    c = Counter(e.tag + (f"-{e.fields.get('dir')}" if e.tag == "l3_ack" else "")
                for e in runtime.log_events([run["log"]]))
    for tag in ("l3_backup", "l3_ack-backup", "l3_query", "l3_prefetch", "l3_ack-prefetch", "l3_hit", "insert"):
        assert c[tag] > 0, (tag, c)
    assert c["l3_backup"] == c["l3_ack-backup"] and c["l3_prefetch"] == c["l3_ack-prefetch"], c


def test_flipped_byte_in_a_stored_page_is_l3a_on_the_rust_core(runs):
    run = runs[2]
    assert run["stats"]["tree_core"] == "RustUnifiedTreeCore"
    hit = run["l3_fault_hits"][0]
    d = runtime.check_json([run["log"]])
    assert {f["rule"] for f in d["findings"]} == {"L3a"} and all(f["certainty"] == "exact" for f in d["findings"]), \
        runtime.fmt_findings(d)
    assert d["findings"][0]["op"] == hit["op"] and all(hit["key"] in f["message"] for f in d["findings"]), \
        (hit, runtime.fmt_findings(d))
    assert run["corruption"], "the driver did not see the flipped page"


def test_host_pages_freed_during_their_prefetch_are_l3b_on_the_rust_core(runs):
    assert runs[3]["stats"]["tree_core"] == "RustUnifiedTreeCore"
    assert_l3b(runs[3])
