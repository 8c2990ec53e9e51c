"""Stock prefill context parallelism on real SGLang 0.5.23: 3 rank processes (gloo), each with its own
``UnifiedRadixCache`` and the ``file`` storage backend, built under SGLang's own ``ServerArgs`` for prefill CP
(``attn_cp_size=3``, ``enable_prefill_cp``, interleave) and SGLang's parallel state of such a deployment, driven on
CPU by ``cp_driver.py``. The instrumentation is given no mode: the ``config`` record's mode is what it derives from
those server arguments (``prefill_cp``: equal copies on every rank under per-rank L3 keys).

* Healthy runs (a GQA model's pool; the DSA pool, MLA with its indexer, with the storage writer elected within the
  attention TP group) give 0 findings of any severity, with every cross-rank rule run: C5 compares the ranks' backup
  hashes, L3c every rank's page keys.
* SGLang #37149, as stock 0.5.23 does it: SGLang's own election over the deployment's parallel state makes only global
  TP rank 0 the MLA storage writer; the other CP ranks' keys are never written and no prefix ever hits in storage.
  L3c on every other rank, for every node rank 0 wrote, and nothing else.
* One rank's copy unequal (its forward write of one position differs): C5 on that rank, on that node, and nothing
  else; under the label every CP run used to get (``sharded``) the same logs give no finding at all.
* ``CPTRACE_CP_MODE`` overrides the derived mode, with one warning naming both; the one-switch path
  (``CPTRACE_SGLANG=1``) reads it, and ignores a value that is no mode with a warning.

Without the SGLang folder the tests skip, unless ``CPTRACE_REQUIRE_SGLANG=1`` (``.ci/run``), where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.sglang_real import runtime

VERSION = "0.5.23"
WORLD, FAULT_RANK = 3, 1
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

MATRIX = [
    {"kv": "mha", "exact": True},                                   # 0: healthy, a GQA model's pool
    {"kv": "dsa", "exact": True},                                   # 1: healthy, MLA (DSA), writer per attention TP
    {"kv": "dsa", "exact": True, "writer": "global_tp"},            # 2: stock 0.5.23's election (#37149)
    {"kv": "mha", "exact": True, "fault": "cp_unequal"},            # 3: rank 1's copy of one position differs
    {"kv": "mha", "exact": False, "requests": 24, "env_mode": "replicated"},   # 4: CPTRACE_CP_MODE set
]
HEALTHY = [0, 1]
CROSS = ("C1", "C2", "C3", "C4", "C5", "L3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[list[dict]]:
    """``runs[i][r]``: rank ``r``'s summary of MATRIX entry ``i``."""
    runtime.need(VERSION)
    from tests.sglang_real import driver

    out = tmp_path_factory.mktemp("cpmode")
    return driver.run_ranks(VERSION, str(out), world=WORLD, fault_rank=FAULT_RANK, matrix=MATRIX,
                            module="cp_driver")


def _configs(events) -> dict[int, dict]:
    return {e.rank: e.fields for e in events if e.tag == "config"}


def _relabel(src: str, dst: str, mode: str) -> None:
    """Log ``src`` copied to ``dst`` with its ``config`` record's mode replaced by ``mode``."""
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            if "[CPTRACE config]" in line:
                line = line.replace(" mode=prefill_cp ", f" mode={mode} ")
            g.write(line)


_check, _events, _fmt = runtime.check_json, runtime.log_events, runtime.fmt_findings


# -- the mode --------------------------------------------------------------------------------------------------------

def test_the_mode_is_derived_from_sglangs_server_arguments(runs):
    for i, m in enumerate(MATRIX):
        if "env_mode" in m:
            continue
        cfg = _configs(_events([r["log"] for r in runs[i]]))
        assert sorted(cfg) == list(range(WORLD))
        for r, c in cfg.items():
            assert (c["mode"], c["mode_src"], c["cp_size"], c["cp_rank"]) == ("prefill_cp", "server_args", WORLD, r), c
            why = list(c["mode_why"])
            assert {f"attn_cp_size:{WORLD}", "prefill_cp:1", "cp_strategy:interleave", "kv_cache_sharding:0",
                    f"mla:{int(m['kv'] == 'dsa')}", f"tp_size:{WORLD}", "attn_tp_size:1"} <= set(why), why
        assert all(r["warnings"] == [] for r in runs[i]), [r["warnings"] for r in runs[i]]


def test_cptrace_cp_mode_overrides_the_derived_mode_with_one_warning(runs):
    ranks = runs[4]
    cfg = _configs(_events([r["log"] for r in ranks]))
    assert {(c["mode"], c["mode_src"]) for c in cfg.values()} == {("replicated", "CPTRACE_CP_MODE")}
    for r in ranks:
        assert len(r["warnings"]) == 1 and "replicated" in r["warnings"][0] and "prefill_cp" in r["warnings"][0], \
            r["warnings"]
    assert _check([r["log"] for r in ranks])["findings"] == []


# -- healthy ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", HEALTHY, ids=["gqa", "mla-dsa"])
def test_healthy_prefill_cp_has_no_finding_and_the_cross_rank_rules_ran(runs, i):
    ranks = runs[i]
    assert [r["corruption"] for r in ranks] == [[]] * WORLD
    assert all(r["writer"] and r["stats"]["l3_loaded_tokens"] > 0 for r in ranks), \
        [(r["writer"], r["stats"]) for r in ranks]
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    assert d["findings"] == [], _fmt(d)
    assert [u for u in d["unchecked"] if u["code"] in CROSS] == [], d["unchecked"]

    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events

    an = Analysis(None)
    assert an.run(read_log_events(logs)).findings == []
    assert an.cross.mode == "prefill_cp" and an.cross._saw_hash and an.cross.ranks == set(range(WORLD))
    events = _events(logs)
    for r in range(WORLD):   # each rank writes its own copy under keys of its own CP rank
        keys = [k for e in events if e.rank == r and e.tag == "l3_backup" and e.fields["io"] == 1
                for k in e.fields["keys"]]
        assert keys and all(k.endswith(f"_cp{r}_{WORLD}") for k in keys), (r, keys[:2])


# -- SGLang #37149 -------------------------------------------------------------------------------------------------

def test_mla_writer_elected_by_global_tp_rank_is_l3c_on_the_other_cp_ranks(runs):
    """Stock 0.5.23's election (``is_storage_writer`` over the global TP rank) on an MLA pool under prefill CP: only
    CP rank 0 writes, ranks 1 and 2 skip every storage write of keys that only they look up. L3c on ranks 1 and 2,
    for every node rank 0 wrote, and no other finding; with their keys missing, no prefix hits in storage on any
    rank (the MIN over the group), the symptom reported. The healthy MLA run differs only in the election."""
    ranks = runs[2]
    assert [r["elected_by_sglang"] for r in ranks] == [True, False, False]
    assert [r["elected_by_sglang"] for r in runs[1]] == [True, False, False]   # the healthy run's stock election
    assert all(r["stats"]["l3_loaded_tokens"] == 0 for r in ranks) and [r["corruption"] for r in ranks] == [[]] * 3
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    events = _events(logs)
    written = {e.fields["node_id"] for e in events if e.rank == 0 and e.tag == "l3_backup" and e.fields["io"] == 1}
    assert written
    for r in (1, 2):
        skipped = {e.fields["node_id"] for e in events if e.rank == r and e.tag == "l3_backup"}
        assert skipped == written and all(e.fields["io"] == 0 for e in events if e.rank == r and e.tag == "l3_backup")
        assert {f["node_id"] for f in d["findings"] if f["rank"] == r} == written, _fmt(d)
    assert {(f["rule"], f["rank"]) for f in d["findings"]} == {("L3c", 1), ("L3c", 2)}, _fmt(d)
    assert all(f["certainty"] == "exact" and "_cp" in f["message"] for f in d["findings"])


# -- C5 --------------------------------------------------------------------------------------------------------------

def test_unequal_copy_on_one_rank_is_c5_on_that_rank_and_node(runs, tmp_path):
    """Rank 1's forward write of one position differs from the other ranks': C5 on rank 1 at the backup of the node
    holding that position (the node whose exact device set holds the slot), nothing else; the driver saw rank 1's
    KV wrong. The same logs labelled ``sharded`` (every CP run's label before the mode was derived) give no finding:
    under that label the unequal copy goes unseen."""
    ranks = runs[3]
    hit = ranks[FAULT_RANK]["cp_fault_hits"]
    assert [bool(r["cp_fault_hits"]) for r in ranks] == [r == FAULT_RANK for r in range(WORLD)]
    assert [bool(r["corruption"]) for r in ranks] == [r == FAULT_RANK for r in range(WORLD)]
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    assert [(f["rule"], f["rank"]) for f in d["findings"]] == [("C5", FAULT_RANK)], _fmt(d)
    from cptrace_otel.checks.ranges import parse_runs

    slot = hit[0]["dev_slot"]
    holders = {e.fields["node_id"] for e in _events(logs) if e.rank == FAULT_RANK and e.tag == "prepare"
               and any(a <= slot <= b for a, b in parse_runs(e.fields["devx"]) or ())}
    assert holders
    assert d["findings"][0]["node_id"] in holders, (holders, _fmt(d))
    relabelled = [str(tmp_path / f"rank-{r}.log") for r in range(WORLD)]
    for src, dst in zip(logs, relabelled, strict=False):
        _relabel(src, dst, "sharded")
    assert _check(relabelled)["findings"] == []


# -- the one-switch path ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,want", [("prefill_cp", ("prefill_cp", "CPTRACE_CP_MODE")), ("zigzag", ("", ""))])
def test_the_one_switch_path_reads_cptrace_cp_mode(value, want):
    """``CPTRACE_SGLANG=1`` (the shim, applied when SGLang imports its cache module) takes its mode from
    ``CPTRACE_CP_MODE``; a value that is no mode is warned about and ignored (the mode is then derived)."""
    runtime.need(VERSION)
    code = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    from cptrace_otel.traced import sglang_shim
    sglang_shim.install()
    import sglang.srt.mem_cache.unified_radix_cache
    from cptrace_otel.traced.sglang._state import Recorder
print(json.dumps({"mode": [Recorder.cp_mode, Recorder.cp_mode_src], "warned": [str(x.message) for x in w
                  if "CPTRACE_CP_MODE" in str(x.message)]}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=runtime.ROOT,
                       env=runtime.sglang_env(VERSION, CPTRACE_SGLANG="1", CPTRACE_LEVEL="1", CPTRACE_CP_MODE=value))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert tuple(r["mode"]) == want
    assert len(r["warned"]) == (0 if want[0] else 1), r["warned"]


# -- check -j --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", [0, 1, 2, 3], ids=["gqa", "mla-dsa", "37149", "cp-unequal"])
def test_check_with_workers_prints_what_one_process_prints(runs, i):
    """``check -j 3`` and ``-j 2`` over the real prefill-CP logs (healthy, L3c, C5): the same stdout, stderr and exit
    code as ``-j 1``, text and JSON, as a user runs it."""
    logs = [r["log"] for r in runs[i]]

    def check(*flags: str) -> tuple[int, str, str]:
        p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--no-progress", *flags, *logs],
                           capture_output=True, text=True, timeout=300, cwd=runtime.ROOT,
                           env={**os.environ, "PYTHONPATH": runtime.ROOT})
        return p.returncode, p.stdout, p.stderr

    for flags in ((), ("--json",)):
        one = check("-j", "1", *flags)
        assert one[0] in (0, 1), one[2][-2000:]
        for j in ("2", "3"):
            assert check("-j", j, *flags) == one, (j, flags)
