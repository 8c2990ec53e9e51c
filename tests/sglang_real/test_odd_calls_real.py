"""The instrumentation never changes what SGLang does, costs O(1) per call, and says so when a cache escapes it;
on SGLang's real HiCache code (0.5.20 and 0.5.23, CPU), through tests/sglang_real/oddcalls.py.

* Odd direct calls (a host free of a list or of an object without ``numel``, a split length that works as an index
  but not as ``int()``, a node missing ``lock_ref``/``host_ref_counter``, a queued write without ``.id``, a host leaf
  whose ``host_value`` raises, ``None`` nodes, ...), each on a fresh populated cache: the outcome (return type, or
  exception type and message) and the tree afterwards are the same with and without the instrumentation.
* ``evict_host`` over N host leaves: the wrappers read O(N) ``host_value``s in all (they used to scan every host leaf
  per evicted node: N²/4 reads).
* A cache built before ``instrument()``: one warning, no records (never partial ones); a cache built after is traced.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang


def _odd(version: str, *flags: str) -> dict:
    runtime.need(version)
    p = subprocess.run(runtime.module_cmd("oddcalls", "--version", version, *flags), env=runtime.sglang_env(version),
                       cwd=runtime.ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", runtime.VERSIONS)
def test_odd_calls_behave_as_stock(version: str) -> None:
    stock = _odd(version)
    traced = _odd(version, "--instrument")
    assert set(stock) == set(traced) and len(stock) >= 6
    differ = {k: (stock[k]["outcome"], traced[k]["outcome"]) for k in stock
              if stock[k]["outcome"] != traced[k]["outcome"]}
    assert differ == {}, differ
    trees = [k for k in stock if stock[k]["tree"] != traced[k]["tree"]]
    assert trees == [], trees
    assert any(v["outcome"][0] == "raise" for v in stock.values())   # the cases do reach SGLang's own errors


def test_evict_host_reads_each_leaf_a_bounded_number_of_times() -> None:
    n = 2000
    stock = _odd("0.5.20", "--evict-host", str(n))
    traced = _odd("0.5.20", "--evict-host", str(n), "--instrument")
    assert stock["leaves"] == traced["leaves"] == n and stock["left"] == traced["left"] == 0
    assert stock["visits"] == n                      # SGLang reads each evicted leaf's host_value once
    assert traced["visits"] <= 4 * n, traced         # the wrappers add a constant per leaf, not a scan per node


@pytest.mark.parametrize("version", runtime.VERSIONS)
def test_a_cache_built_before_instrument_is_said_once_and_not_half_traced(version: str) -> None:
    res = _odd(version, "--late")
    assert len(res["warnings"]) == 1 and "built before" in res["warnings"][0]
    assert res["records_late"] == 0
    assert res["records_after"] > 0
