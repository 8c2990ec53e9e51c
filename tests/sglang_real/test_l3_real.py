"""The L3 storage tier on real SGLang: stock SGLang's HiCache with the ``file`` storage backend
(``HiCacheFile`` writing real files, its storage threads running), driven on CPU by ``l3_driver.py`` with the
scheduler's storage calls and the instrumentation's L3 sites, the records read back by ``cptrace-otel check`` as a
user runs it. Every test runs on 0.5.20 (``HiRadixCache``, ``_l3_sites.py``) and on 0.5.23 (``UnifiedRadixCache``
over the Python tree core, ``_l3_sites23.py``).

* Healthy runs (write_through pages of 1 and 4, write_back pages of 4; two seeds; a reset mid-run, after which the
  requests' prefixes come back from storage; device and host evicted under pressure; one run at the storage
  threads' own pace): the driver's KV check sees no corruption (fetched pages reach the device through
  ``init_load_back`` and are compared with the expected bytes), and the checker reports no finding of any severity.
* A flipped byte in a stored page file is L3a; a prefetch's host pages freed and reused before its ack is
  processed is L3b; under CP (2 gloo ranks, mode ``sharded``, the file backend's per-rank keys) a rank that never
  writes its shard is L3c, and a healthy CP run has no finding.
* Persisted storage (:data:`PERSISTED`): later runs start from a copy of run A's store. One of A's configuration
  reads A's objects with no finding, its hits judged by the metadata beside the objects, or, with that metadata
  gone, by A's trace given to the same ``check``; one of another KV dtype or model (the ``file`` backend's keys
  name neither the dtype nor the weights) is FOREIGN, from the metadata or from A's trace, and silent without both.

One subprocess runs the single-rank matrix, two (one per rank) the CP matrix. Without the SGLang folder the tests
skip, unless ``CPTRACE_REQUIRE_SGLANG=1`` (``.ci/run``), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from tests.helpers.otlp_twins import assert_file_alike
from tests.sglang_real import l3_driver, runtime

VERSIONS = ("0.5.20", "0.5.23")
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

SINGLE = [
    {"seed": 0, "exact": True},                                                 # 0: write_through, pages of 1
    {"seed": 1, "page_size": 4, "exact": False},                                # 1: write_through, pages of 4
    {"seed": 1, "policy": "write_back", "page_size": 4, "exact": True},         # 2: write_back, pages of 4
    {"seed": 0, "exact": True, "fault": "l3_flip"},                             # 3: a byte of a stored page
    {"seed": 0, "exact": True, "fault": "l3_free"},                             # 4: pages freed mid-prefetch
    {"seed": 1, "policy": "write_back", "exact": True, "sync_storage": False},  # 5: the threads' own timing
]
HEALTHY = [0, 1, 2]
CP_WORLD, CP_FAULT_RANK = 2, 1
CP = [
    {"seed": 0, "cp_mode": "sharded", "exact": True},                           # 0: healthy
    {"seed": 0, "cp_mode": "sharded", "fault": "l3_skip"},                      # 1: rank 1 never writes its shard
]


# run A writes a store; the others start from a copy of it (its files' times kept), each under a run id of its own
PERSISTED = [
    {"seed": 0, "exact": True, "run_id": "l3-a"},                                                # 0: A
    {"seed": 0, "exact": True, "run_id": "l3-same"},                                             # 1: A's config
    {"seed": 0, "exact": True, "run_id": "l3-dtype", "kv_dtype": "int32"},                       # 2: another dtype
    {"seed": 0, "exact": True, "run_id": "l3-same-bare", "drop_meta": True},                     # 3: 1, no metadata
    {"seed": 0, "exact": True, "run_id": "l3-dtype-bare", "kv_dtype": "int32", "drop_meta": True},  # 4: 2, no metadata
    {"seed": 0, "exact": True, "run_id": "l3-model", "model_path": "other-org/other-model"},     # 5: other weights
]


@pytest.fixture(scope="module", params=VERSIONS)
def version(request) -> str:
    """Every test runs against both SGLang releases: 0.5.20's ``HiRadixCache`` (:mod:`._l3_sites`) and 0.5.23's
    ``UnifiedRadixCache`` (:mod:`._l3_sites23`)."""
    runtime.need(request.param)
    return request.param


@pytest.fixture(scope="module")
def single(version, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("l3")
    return l3_driver.run_matrix(version, str(out), SINGLE)


@pytest.fixture(scope="module")
def persisted(version, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("l3persist")
    a_store = os.path.join(str(out), "0", "l3store")
    matrix = [PERSISTED[0]] + [{**kw, "l3_from": a_store} for kw in PERSISTED[1:]]
    return l3_driver.run_matrix(version, str(out), matrix)


@pytest.fixture(scope="module")
def cp(version, tmp_path_factory) -> list[list[dict]]:
    from tests.sglang_real import driver

    out = tmp_path_factory.mktemp("l3cp")
    return driver.run_ranks(version, str(out), world=CP_WORLD, fault_rank=CP_FAULT_RANK, matrix=CP,
                            module="l3_driver")


_check, _events, _fmt = runtime.check_json, runtime.log_events, runtime.fmt_findings


def _tags(events, rank: int | None = None) -> Counter:
    return Counter(e.tag + (f"-{e.fields.get('dir') or e.fields.get('tier')}" if e.tag in ("l3_ack", "evict") else "")
                   for e in events if rank is None or e.rank == rank)


def _by_op(events, tag: str, op: int) -> list:
    return [e for e in events if e.tag == tag and e.fields.get("op") == op]


# -- healthy ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", HEALTHY, ids=["wt-p1-exact", "wt-p4-range", "wb-p4-exact"])
def test_healthy_run_with_storage_has_no_finding(single, i):
    run = single[i]
    assert run["corruption"] == [], run["corruption"][:3]
    st = run["stats"]
    assert st["admitted"] == 60 and st["resets"] == 1 and st["l3_loaded_tokens"] > 0 and run["l3_files"] > 0, st
    d = _check([run["log"]])
    assert d["findings"] == [], _fmt(d)
    l3_unchecked = [u for u in d["unchecked"] if u["code"] == "L3"]
    if SINGLE[i]["exact"]:
        assert l3_unchecked == [], l3_unchecked   # nothing undecidable, every fetched key was written in the trace
    else:
        assert {u["rule"] for u in l3_unchecked} <= {"L3b-undecidable"}, l3_unchecked
    c = _tags(_events([run["log"]]))
    # the L3 lifecycle happened: backups acknowledged, queries, prefetches read back and entering the tree,
    # and the device and host tiers evicted under pressure
    for tag in ("l3_backup", "l3_ack-backup", "l3_query", "l3_prefetch", "l3_ack-prefetch", "l3_hit", "evict-dev",
                "evict-host", "reload"):
        assert c[tag] > 0, (tag, c)
    assert c["l3_backup"] == c["l3_ack-backup"] and c["l3_prefetch"] == c["l3_ack-prefetch"], c


def test_healthy_run_at_the_storage_threads_own_pace_has_no_finding(single):
    """The steps do not wait for SGLang's storage threads: which step sees which ack is the threads' timing (the
    records differ from run to run); still no finding and no corruption."""
    run = single[5]
    assert run["corruption"] == [], run["corruption"][:3]
    d = _check([run["log"]])
    assert d["findings"] == [], _fmt(d)
    assert not [u for u in d["unchecked"] if u["code"] == "L3"], d["unchecked"]
    c = _tags(_events([run["log"]]))
    assert c["l3_backup"] and c["l3_backup"] == c["l3_ack-backup"] and c["l3_prefetch"] == c["l3_ack-prefetch"], c


def test_l3_records_become_stage_spans_of_the_nodes(single):
    """The exporter's OTLP file of a healthy run: ``rank 0 · l3-backup`` and ``rank 0 · l3-prefetch`` stage spans,
    one per backup and per prefetch (not counting continuations of a span cut by the span timeout), and every
    storage hit's span links to the prefetch span that fetched it."""
    run = single[0]
    names: Counter = Counter()
    links = 0
    with open(run["otlp"], encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        # a stage span cut by span_timeout_s (a loaded machine) goes on in a continuation span: the
                        # stage is still one backup or prefetch, so continuations are not counted as stages
                        if not any(a["key"] == "cptrace.span.continues" for a in sp.get("attributes", [])):
                            names[sp["name"]] += 1
                        links += sum(a["key"] == "cptrace.link.kind" and a["value"].get("stringValue") == "l3-prefetch"
                                     for ln in sp.get("links") or [] for a in ln.get("attributes", []))
    c = _tags(_events([run["log"]]))
    assert names["rank 0 · l3-backup"] == c["l3_backup"] and names["rank 0 · l3-prefetch"] == c["l3_prefetch"], names
    assert links == c["l3_hit"] > 0, (links, c["l3_hit"])


def test_the_l3_rules_judge_these_logs(single, tmp_path):
    """The 0 of a healthy run is not the rules' silence: the same log with one fetched page's fingerprint altered
    (the first ``l3_ack dir=prefetch``) gives L3a on that prefetch."""
    src = single[0]["log"]
    dst = str(tmp_path / "rank-0.log")
    op = None
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            if op is None and "[CPTRACE l3_ack]" in line and " dir=prefetch" in line and " hp=[" in line:
                op = int(re.search(r" op=(\d+)", line).group(1))
                line = re.sub(r" hp=\[(\d+)", lambda m: f" hp=[{int(m.group(1)) + 1}", line, count=1)
            g.write(line)
    assert op is not None
    d = _check([dst])
    assert [(f["rule"], f["op"]) for f in d["findings"]] == [("L3a", op)], _fmt(d)


# -- faults -----------------------------------------------------------------------------------------------------------

def test_flipped_byte_in_a_stored_page_is_l3a(single):
    """A byte of the stored file of the first page a prefetch reads is flipped before the read: L3a at that
    prefetch (and at every later prefetch of the same key), on the node the fetched pages extend, naming the key;
    the node that took the pages is the one the driver saw come back wrong."""
    run = single[3]
    hit = run["l3_fault_hits"][0]
    d = _check([run["log"]])
    events = _events([run["log"]])
    assert {f["rule"] for f in d["findings"]} == {"L3a"} and all(f["certainty"] == "exact" for f in d["findings"]), \
        _fmt(d)
    first = d["findings"][0]
    (pf,) = _by_op(events, "l3_prefetch", hit["op"])
    assert first["op"] == hit["op"] and first["node_id"] == pf.fields["node_id"], (hit, _fmt(d))
    assert hit["key"] in first["message"]
    assert all(hit["key"] in f["message"] for f in d["findings"])
    took = {e.fields["node_id"] for e in _by_op(events, "l3_hit", hit["op"])}
    seen = {n for c in run["corruption"] for n in c["nodes"]}
    assert took and took & seen, (took, run["corruption"][:3])


def test_host_pages_freed_during_their_prefetch_are_l3b(single):
    """The first host page of a prefetch is freed (and taken by another writer, which overwrites it) after the
    storage read was issued and before the scheduler processed its ack: L3b, exact, on that prefetch's op and node.
    The overwritten page then enters the tree with the writer's bytes: L3a at the same ack, and the driver saw it."""
    assert_l3b(single[4])


def assert_l3b(run: dict) -> None:
    """The ``l3_free`` fault's run: L3b, exact, on the freed prefetch alone (L3a besides), its bytes on the device."""
    hit = run["l3_fault_hits"][0]
    d = _check([run["log"]])
    l3b = [f for f in d["findings"] if f["rule"] == "L3b"]
    assert [(f["op"], f["node_id"], f["certainty"]) for f in l3b] == [(hit["op"], hit["node_id"], "exact")], _fmt(d)
    assert {f["rule"] for f in d["findings"]} <= {"L3b", "L3a"}, _fmt(d)
    assert run["corruption"], "the reused page's bytes did not reach the device"


# -- context parallelism ----------------------------------------------------------------------------------------------

def test_healthy_cp_run_has_no_finding_and_ranks_write_keys_of_their_own(cp, tmp_path):
    ranks = cp[0]
    logs = [r["log"] for r in ranks]
    for r, keys in enumerate(assert_healthy_cp(ranks)):
        assert all(k.endswith(f"_cp{r}_{CP_WORLD}") for k in keys), (r, keys[:2])
    # the cross-rank L3 rules judge these logs: rank 1 writing under rank 0's keys is L3d
    altered = str(tmp_path / "rank-1.log")
    with open(logs[1], encoding="utf-8") as f, open(altered, "w", encoding="utf-8") as g:
        g.write(f.read().replace(f"_cp1_{CP_WORLD}", f"_cp0_{CP_WORLD}"))
    d2 = _check([logs[0], altered])
    assert "L3d" in {f["rule"] for f in d2["findings"]}, _fmt(d2)


def assert_healthy_cp(ranks: list[dict]) -> list[list[str]]:
    """A healthy CP run: no corruption, prefixes loaded back on every rank, no finding; each rank's backup keys."""
    assert [r["corruption"] for r in ranks] == [[]] * CP_WORLD
    assert all(r["stats"]["l3_loaded_tokens"] > 0 for r in ranks)
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    assert d["findings"] == [], _fmt(d)
    events = _events(logs)
    keys = [[k for e in events if e.rank == r and e.tag == "l3_backup" for k in e.fields["keys"]]
            for r in range(CP_WORLD)]
    assert all(keys), [len(k) for k in keys]
    return keys


def test_cp_rank_that_never_writes_its_shard_is_l3c(cp):
    assert_l3c(cp[1])


def assert_l3c(ranks: list[dict]) -> None:
    """Rank 1 skips every storage write (``backup_skip``; its acks still come): L3c on rank 1 for every node rank 0
    wrote, nothing else; with rank 1's shard missing, no prefix ever hits in storage on both ranks."""
    assert [bool(r["l3_fault_hits"]) for r in ranks] == [r == CP_FAULT_RANK for r in range(CP_WORLD)]
    logs = [r["log"] for r in ranks]
    d = _check(logs)
    events = _events(logs)
    skipped = {e.fields["node_id"] for e in events if e.rank == CP_FAULT_RANK and e.tag == "l3_backup"
               and e.fields["io"] == 0}
    written = {e.fields["node_id"] for e in events if e.rank == 0 and e.tag == "l3_backup" and e.fields["io"] == 1}
    assert skipped and skipped == written
    assert {(f["rule"], f["rank"]) for f in d["findings"]} == {("L3c", CP_FAULT_RANK)}, _fmt(d)
    assert {f["node_id"] for f in d["findings"]} == skipped
    assert all(r["stats"]["l3_loaded_tokens"] == 0 for r in ranks)


# -- what 0.5.23 leaves untraced -----------------------------------------------------------------------------------

def test_0_5_23_cache_given_another_backend_at_run_time_stops_being_traced(tmp_path):
    """The L3 sites of 0.5.23 are verified with the ``file`` backend only. A traced cache that gets another backend
    attached at run time (here SGLang's ``dynamic`` backend, loading a ``HiCacheFile`` subclass) gets one warning
    and is no longer traced: the cache, its tree core, controller, allocator and host pool lose their state, so
    none of its wrappers finds it any more. The ``file`` backend keeps it traced."""
    runtime.need("0.5.23")
    (tmp_path / "other_backend.py").write_text(
        "from sglang.srt.mem_cache.hicache_storage import HiCacheFile\n"
        "class OtherFile(HiCacheFile):\n"
        "    def __init__(self, storage_config, kwargs):\n"
        f"        super().__init__(storage_config, file_path={str(tmp_path / 'store')!r})\n")
    code = f"""
import json, logging
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append(rec.getMessage())
logging.getLogger("cptrace_otel.sglang").addHandler(H())
import cptrace_otel
from tests.sglang_real import driver, l3_driver, runtime
log = {str(tmp_path / "rank-0.log")!r}
cptrace_otel.configure(level=2, log_file=log, file=log + ".otlp.jsonl", exporter="thread", checks=False)
from cptrace_otel.traced.sglang import SGLangInstrumentor
SGLangInstrumentor().instrument()
cp, tp = driver._init_group(1, 0, {str(tmp_path / "gloo")!r})
out = {{}}
for backend, extra in (("file", None), ("dynamic", {{"backend_name": "other", "module_path": "other_backend",
                                                    "class_name": "OtherFile"}})):
    cache, kv, alloc = driver.build23("write_through", 1, 64, 2.0, cp, tp)
    l3_driver.attach_file_storage(cache, backend, extra)
    objs = (cache, cache.tree_core, cache.cache_controller, alloc, runtime.host_pool(cache))
    out[backend] = [getattr(o, "_cptrace_sg", None) is not None for o in objs]
cptrace_otel.flush(30)
cptrace_otel.shutdown(30)
print(json.dumps({{"msgs": msgs, "traced": out}}))
"""
    env = runtime.sglang_env("0.5.23")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)   # (where the dynamic backend imports its module from)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["traced"] == {"file": [True] * 5, "dynamic": [False] * 5}, r
    assert len(r["msgs"]) == 1 and "no longer traced" in r["msgs"][0] and "'dynamic'" in r["msgs"][0], r


# -- L3 objects another run wrote --------------------------------------------------------------------------------------

def _rules(d: dict) -> Counter:
    return Counter(f["rule"] for f in d["findings"])


def _l3_skipped(d: dict) -> int:
    return sum(u.get("count", 1) for u in d["unchecked"] if u["rule"] == "L3a-skipped(no backup)")


def test_a_run_of_the_same_config_reading_another_runs_l3_objects_has_no_finding(persisted):
    """Run A's configuration over A's store: its prefetches are storage hits on objects A wrote (every one judged by
    the metadata beside it: nothing counted as never written), no corruption, no finding of any severity."""
    run = persisted[1]
    assert run["corruption"] == [], run["corruption"][:3]
    assert run["stats"]["l3_loaded_tokens"] > 0, run["stats"]
    evs = _events([run["log"]])
    acks = [e for e in evs if e.tag == "l3_ack" and e.fields.get("dir") == "prefetch" and e.fields.get("keys")]
    assert acks and all("wid" in e.fields for e in acks[:3]), acks[:3]
    d = _check([run["log"]])
    assert d["findings"] == [], _fmt(d)
    assert _l3_skipped(d) == 0, d["unchecked"]


def test_l3_objects_written_with_another_kv_dtype_are_foreign(persisted):
    """Another KV dtype of the same size (int32 over A's float32): SGLang's keys are the same, the file backend
    loads A's bytes (the driver sees its KV corrupted) and the metadata beside the objects makes it FOREIGN."""
    run = persisted[2]
    assert run["corruption"], "the foreign bytes were expected to reach the device"
    d = _check([run["log"]])
    foreign = [f for f in d["findings"] if f["code"] == "FOREIGN"]
    assert foreign, _fmt(d)
    assert "kv_dtype float32 (this run: int32)" in foreign[0]["message"], foreign[0]["message"]
    assert "metadata beside the object" in foreign[0]["message"], foreign[0]["message"]


def test_l3_objects_written_for_another_model_are_foreign(persisted):
    """Other weights served under the same name: the ``file`` backend's keys carry the served model name only, so
    the hits load A's KV; FOREIGN names the model."""
    d = _check([persisted[5]["log"]])
    foreign = [f for f in d["findings"] if f["code"] == "FOREIGN"]
    assert foreign, _fmt(d)
    assert "model dummy (this run: other-org/other-model)" in foreign[0]["message"], foreign[0]["message"]


def test_an_earlier_runs_trace_resolves_hits_on_its_objects(persisted, tmp_path):
    """The metadata gone: alone, the hits on A's objects are counted as never written; given A's trace (log
    folders, and OTLP files) together with the run, check resolves them against A's backups: no finding, nothing
    skipped, and the two runs still analysed apart."""
    a, b = persisted[0], persisted[3]
    alone = _check([b["log"]])
    assert alone["findings"] == [] and _l3_skipped(alone) > 0, alone["unchecked"]
    for paths in ([a["log"], b["log"]], [a["otlp"], b["otlp"]]):
        d = _check(paths)
        assert d["findings"] == [], _fmt(d)
        assert _l3_skipped(d) == 0 and d["stats"]["runs"] == 2, (d["unchecked"], d["stats"])
    for run in (a, b):   # the C reader of OTLP JSON lines reads every line itself, as its Python twin does
        got = assert_file_alike(run["otlp"])
        assert got["answered"] == got["lines"] and got["events"] > 0, got


def test_an_earlier_runs_trace_finds_foreign_hits_on_its_objects(persisted):
    """The metadata gone, another KV dtype: alone the collision is silent (no FOREIGN); with A's trace it is
    FOREIGN, named after A's run, and the other rules judge each run alone (the later run's findings other than
    FOREIGN are those it has alone, none on A)."""
    a, b = persisted[0], persisted[4]
    alone = _check([b["log"]])
    assert "FOREIGN" not in _rules(alone), _fmt(alone)
    assert _check([a["log"]])["findings"] == []
    for paths in ([a["log"], b["log"]], [a["otlp"], b["otlp"]]):
        d = _check(paths)
        foreign = [f for f in d["findings"] if f["code"] == "FOREIGN"]
        assert foreign and "the backups of run" in foreign[0]["message"], _fmt(d)
        assert "kv_dtype float32 (this run: int32)" in foreign[0]["message"], foreign[0]["message"]
        assert d["stats"]["runs"] == 2, d["stats"]
        rest = _rules(d)
        del rest["FOREIGN"]
        assert rest == _rules(alone), (rest, _rules(alone))
