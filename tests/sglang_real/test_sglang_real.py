"""Real SGLang (the wheels deploy/sglang/install puts in .sglang/<version>/) on CPU, with the instrumentation.

Each test runs SGLang in a subprocess (two SGLang versions cannot share one interpreter; importing SGLang takes
seconds, so one subprocess runs several scenarios). Without the installed SGLang the tests skip with the reason;
with ``CPTRACE_REQUIRE_SGLANG=1`` (as .ci/run sets) they fail instead.

What is asserted here, for sglang 0.5.20 (``HiRadixCache``) and 0.5.23 (``UnifiedRadixCache``): the
instrumentation applies and un-applies, refuses other versions with one warning and builds with their own call sites;
the driver's healthy runs see no corruption and their records are complete and
readable by ``cptrace-otel check``; each injected fault is seen by the driver's own content check (and, where the
rules already decide it, by its code). That healthy runs give 0 findings is the rules' side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cptrace_otel.model.logline import parse_line
from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang
VERSION = "0.5.20"   # HiRadixCache (the version-independent tests); 0.5.23: UnifiedRadixCache
VERSIONS = runtime.VERSIONS
# per version: a module and a method the instrumentation wraps, and the cache module a build's call sites live in
TARGETS = {"0.5.20": ("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache", "insert"),
           "0.5.23": ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache", "_track_write_through_node")}


def _need(version: str = VERSION) -> None:
    runtime.need(version)


def _py(code: str, version: str = VERSION, timeout: int = 300, **env: str) -> dict:
    """Run ``code`` with SGLang ``version`` importable; its last stdout line is JSON."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=runtime.sglang_env(version, **env),
                       capture_output=True, text=True, timeout=timeout, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _drive(out: str, matrix: list[dict], version: str = VERSION, timeout: int = 600) -> list[dict]:
    p = subprocess.run(runtime.module_cmd("driver", "--version", version, "--out", out, "--matrix", json.dumps(matrix)),
                       env=runtime.sglang_env(version), cwd=runtime.ROOT, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _records(log: str) -> list[tuple[str, dict]]:
    out = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            pl = parse_line(line)
            if pl is not None:
                assert not pl.bad_tokens, line
                out.append((pl.tag, pl.fields))
    return out


def _check_json(path: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json", "--no-progress", path],
                       capture_output=True, text=True, timeout=300, cwd=runtime.ROOT,
                       env={**os.environ, "PYTHONPATH": runtime.ROOT})
    assert p.returncode in (0, 1, 2), p.stderr[-3000:]
    return json.loads(p.stdout)


WRAPPED = """
import json, importlib
def owners():
    from cptrace_otel.traced.sglang import sites
    out = []
    for mod, attr, _ in sites():
        obj = importlib.import_module(mod)
        *path, name = attr.split(".")
        for o in path:
            obj = getattr(obj, o)
        out.append((obj, name))
    return out
def wrapped():
    import wrapt
    return [isinstance(obj.__dict__[name], wrapt.FunctionWrapper) for obj, name in owners()]
def methods():
    return [obj.__dict__[name] for obj, name in owners()]
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_instrument_then_uninstrument_restores_every_method(version):
    """At level 0 ``instrument()`` wraps the cache constructor sites only (``ALWAYS``); tracing turned on wraps every
    other site, once, and turned off unwraps them again (SGLang's own functions back, the same objects), a change
    between levels that trace changes nothing; ``uninstrument()`` restores every method."""
    _need(version)
    mod, cls, meth = TARGETS[version]
    r = _py(WRAPPED + f"""
import cptrace_otel
import {mod} as h
from cptrace_otel.traced.sglang import ALWAYS, SGLangInstrumentor, sites, SITES23
cptrace_otel.reload_config(level=0)
orig = methods()
before = wrapped()
inst = SGLangInstrumentor()
inst.instrument()
at0 = wrapped()
cptrace_otel.reload_config(level=1)
during = wrapped()
inst.instrument()   # a second call changes nothing
cptrace_otel.reload_config(level=2)
twice = [type(h.{cls}.__dict__["{meth}"].__wrapped__).__name__]
still = wrapped()
cptrace_otel.reload_config(level=0)
off = wrapped()
off_same = [m is o for m, o, w in zip(methods(), orig, off) if not w]
cptrace_otel.reload_config(level=1)
inst.uninstrument()
after = wrapped()
print(json.dumps({{"before": before, "at0": at0, "during": during, "still": still, "off": off, "after": after,
                  "twice": twice, "n": len(during), "always": [a in ALWAYS for _, a, _ in sites()],
                  "table23": sites() is SITES23, "same": [m is o for m, o in zip(methods(), orig)],
                  "off_same": off_same}}))
""", version=version)
    assert r["n"] > 10 and r["table23"] == (version == "0.5.23")
    assert not any(r["before"]) and all(r["during"]) and all(r["still"]) and not any(r["after"])
    assert r["at0"] == r["off"] == r["always"] and 1 <= sum(r["always"]) <= 2, r
    assert all(r["off_same"]) and len(r["off_same"]) == r["n"] - sum(r["always"]), r
    assert r["twice"] == ["function"]   # wrapped once, not a wrapper of a wrapper
    assert all(r["same"]), r


def test_version_outside_the_range_warns_once_and_wraps_nothing():
    _need()
    r = _py(WRAPPED + """
import logging
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append((rec.levelname, rec.getMessage()))
logging.getLogger("cptrace_otel.sglang").addHandler(H())
import sglang.version
sglang.version.__version__ = "0.6.1"
from cptrace_otel.traced.sglang import SGLangInstrumentor, instrument_from_env
res = [SGLangInstrumentor().instrument(), instrument_from_env(), SGLangInstrumentor().instrument()]
print(json.dumps({"res": res, "wrapped": wrapped(), "msgs": msgs}))
""")
    assert r["res"] == [None, False, None]
    assert not any(r["wrapped"])
    assert len(r["msgs"]) == 1 and r["msgs"][0][0] == "WARNING"
    assert "0.6.1 is outside the supported range" in r["msgs"][0][1]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_build_with_its_own_call_sites_is_not_instrumented(tmp_path, version):
    _need(version)
    name = TARGETS[version][0].rsplit(".", 1)[1] + ".py"
    src = os.path.join(runtime.sglang_dir(version), "sglang", "srt", "mem_cache", name)
    with open(src, encoding="utf-8") as f:
        text = f.read()
    (tmp_path / name).write_text(
        text + "\nfrom sglang.srt.mem_cache import cp_hicache_trace as _t  # the private builds' call sites\n")
    (tmp_path / "cp_hicache_trace.py").write_text("from cptrace_otel import *  # the build's own tracer module\n")
    r = _py(WRAPPED + f"""
import logging
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append((rec.levelname, rec.getMessage()))
lg = logging.getLogger("cptrace_otel.sglang"); lg.addHandler(H()); lg.setLevel(logging.INFO)
import sglang.srt.mem_cache as mc
mc.__path__ = [{str(tmp_path)!r}, *mc.__path__]   # this build's cache module ships call sites
from cptrace_otel.traced.sglang import SGLangInstrumentor
print(json.dumps({{"res": SGLangInstrumentor().instrument(), "wrapped": wrapped(), "msgs": msgs}}))
""", version=version)
    assert r["res"] is None and not any(r["wrapped"])
    assert [m[0] for m in r["msgs"]] == ["INFO"] and "calls cp_hicache_trace itself" in r["msgs"][0][1]


@pytest.mark.parametrize("version", VERSIONS)
def test_switch_applies_it_lazily_when_sglang_imports_its_cache(version):
    """``CPTRACE_SGLANG=1``: nothing is imported until SGLang imports its cache module (0.5.20's
    ``hiradix_cache``, 0.5.23's ``unified_radix_cache``); then every site of that version is wrapped, no warning."""
    _need(version)
    r = _py(WRAPPED + f"""
import sys, logging
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append(rec.getMessage())
logging.getLogger("cptrace_otel.sglang").addHandler(H())
from cptrace_otel.traced import sglang_shim
sglang_shim.install()           # what the .pth does with CPTRACE_SGLANG=1
pre = ["cptrace_otel.traced.sglang" in sys.modules, "sglang" in sys.modules]
import {TARGETS[version][0]}
print(json.dumps({{"pre": pre, "wrapped": wrapped(), "msgs": msgs}}))
""", version=version, CPTRACE_LEVEL="1")
    assert r["pre"] == [False, False]
    assert r["wrapped"] and all(r["wrapped"])
    assert r["msgs"] == []


def test_0_5_23_with_another_tree_core_is_not_traced_at_all(tmp_path):
    """0.5.23 picks its tree core at run time (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``; the Rust one is the
    default where its extension loads, traced at its boundary). A tree core that is neither the Python
    ``UnifiedTreeCore`` nor the Rust one fires none of the tree sites, so the cache gets one warning and no record
    at all (partial records would give false findings);
    SGLang runs as without tracing. The other core here is one registered the way SGLang lets external backends
    register (``register_tree_core_backend``): a delegating wrapper of the Python core, which is not one."""
    _need("0.5.23")
    r = _py(f"""
import json, logging, os
msgs = []
class H(logging.Handler):
    def emit(self, rec): msgs.append(rec.getMessage())
logging.getLogger("cptrace_otel.sglang").addHandler(H())
from sglang.srt.mem_cache.unified_cache import tree_core_registry as reg
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
class Other:
    def __init__(self, inner): object.__setattr__(self, "_inner", inner)
    def __getattr__(self, k): return getattr(self._inner, k)
    def __setattr__(self, k, v): setattr(self._inner, k, v)
reg.register_tree_core_backend("other", lambda p, c: Other(UnifiedTreeCore(p, c)))
from tests.sglang_real import driver
r = driver.run("0.5.23", {str(tmp_path)!r}, requests=40)
n = 0
if os.path.exists(r["log"]):
    with open(r["log"]) as f:
        n = sum("[CPTRACE" in line for line in f)
print(json.dumps({{"msgs": msgs, "records": n, "corruption": r["corruption"], "admitted": r["stats"]["admitted"]}}))
""", version="0.5.23", SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="other")
    assert len(r["msgs"]) == 1, r
    assert "its tree core is Other, neither the Python UnifiedTreeCore nor the Rust one" in r["msgs"][0], r
    assert r["records"] == 0 and r["corruption"] == [] and r["admitted"] == 40, r


@pytest.mark.parametrize(("chosen", "option", "after"), [(None, None, "rust"), (None, "rust", "rust"),
                                                         (None, "python", "python"), ("rust", "python", "rust")])
def test_0_5_23_keeps_the_users_tree_core_unless_the_python_option_asks(chosen, option, after):
    """0.5.23's default tree core is the Rust one. Instrumenting leaves ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``
    alone by default (SGLang's own selection stays ``rust``: its Rust core is traced at its boundary); the option
    ``CPTRACE_SGLANG_TREE_CORE=python`` sets it to ``python`` where it is unset, and an explicit choice is kept."""
    _need("0.5.23")
    env = {} if chosen is None else {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": chosen}
    if option is not None:
        env["CPTRACE_SGLANG_TREE_CORE"] = option
    r = _py("""
import json, os
from cptrace_otel.traced.sglang import SGLangInstrumentor
from sglang.srt.environ import envs
before = os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND")
SGLangInstrumentor().instrument()
print(json.dumps({"before": before, "after": envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.get(),
                  "set": os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND")}))
""", version="0.5.23", **env)
    assert r["before"] == chosen
    assert r["after"] == after
    assert r["set"] == (chosen or ("python" if option == "python" else None)), r


HEALTHY = [
    {"policy": "write_through", "page_size": 1, "exact": True, "seed": 1},
    {"policy": "write_through_selective", "page_size": 4, "seed": 2},
    {"policy": "write_back", "page_size": 1, "exact": True, "seed": 3},
    {"policy": "write_back", "page_size": 4, "seed": 4, "max_lag": 2},
]


@pytest.fixture(scope="module", params=VERSIONS)
def healthy(request, tmp_path_factory):
    _need(request.param)
    out = str(tmp_path_factory.mktemp("sglang-healthy"))
    common = {"requests": 100, "dev_tokens": 256, "batch": 4}
    return _drive(out, [{**common, **m} for m in HEALTHY], version=request.param)


def test_healthy_runs_see_no_corruption(healthy):
    for m, r in zip(HEALTHY, healthy, strict=False):
        assert r["corruption"] == [], (m, r["corruption"][:5])
        assert r["stats"]["loads"] > 0 and r["stats"]["resets"] == 1 and r["stats"]["host_audits"] > 0, m


def test_healthy_records_are_complete(healthy):
    seen: set[tuple] = set()
    for m, r in zip(HEALTHY, healthy, strict=False):
        recs = _records(r["log"])
        tags = {t for t, _ in recs}
        assert {"config", "reset", "rid_map", "insert", "split", "prepare", "backup", "ack", "evict", "free",
                "reload"} <= tags, (m, tags)
        cfg = [f for t, f in recs if t == "config"]
        assert len(cfg) == 1 and cfg[0]["page_size"] == m["page_size"] and cfg[0]["cp_size"] == 1
        for t, f in recs:
            if t == "backup":
                assert isinstance(f["h"], int) and f["h"] > 0 and f["nz"] > 0
                assert isinstance(f["hp"], list) and all(isinstance(x, int) for x in f["hp"])
                assert len(f["hp"]) * m["page_size"] == f["dev"].cnt   # one hash per page
            if t == "ack" and f["dir"] == "d2h":
                assert {"op", "node_id", "blen", "clen", "pub"} <= set(f)
            if t == "ack" and f["dir"] == "h2d":
                assert {"op", "node_id", "h", "nz", "hp"} <= set(f)
            if t == "free":
                # dup: 0.5.23's write_back reclaims a host copy of a node still on the device
                assert f["pool"] in ("dev", "host") and f["why"] in ("evict", "finish", "dup")
                assert f["why"] != "dup" or (f["pool"] == "host" and m["policy"] == "write_back"), f
            if t == "evict":
                seen.add(("evict", f["tier"], f["kind"]))
            if t in ("insert", "free"):
                seen.add((t, f.get("kind") or f["pool"]))
            if m.get("exact") and t in ("insert", "prepare", "reload", "free"):
                assert any(k in f for k in ("devx", "hostx", "idx_x")), (t, f)
        # every node of every reload's chain gets an h2d ack of that load (with the splits while in flight)
        acks = {(f["op"], f["node_id"]) for t, f in recs if t == "ack" and f["dir"] == "h2d"}
        for t, f in recs:
            if t == "reload":
                for nid in f["chain"]:
                    assert (f["op"], nid) in acks, (m, f)
        # a split while a write is pending is recorded with its pending ack id
        if m["policy"] != "write_back":
            seen.add(("split-pending-write", any(f["pend"] != -1 for t, f in recs if t == "split")))
    assert {("evict", "dev", "backuped"), ("evict", "host", "host"), ("insert", "new"), ("insert", "revive"),
            ("free", "dev"), ("free", "host"), ("split-pending-write", True)} <= seen, seen


def test_loads_split_in_flight_get_an_ack_per_fragment(healthy):
    """A split of a node whose load is in flight (match then load, request by request): the load's acks cover
    both fragments, each with its own hash."""
    found = 0
    for r in healthy:
        recs = _records(r["log"])
        inflight: dict[int, set] = {}
        for t, f in recs:
            if t == "reload":
                inflight[f["op"]] = set(f["chain"])
            elif t == "split":
                for _op, chain in inflight.items():
                    if f["node_id"] in chain:
                        chain.add(f["new_id"])
                        found += 1
            elif t == "ack" and f["dir"] == "h2d" and f["op"] in inflight:
                inflight[f["op"]].discard(f["node_id"])
                if not inflight[f["op"]]:
                    del inflight[f["op"]]
        assert not inflight, inflight
    assert found > 0


def test_write_back_staging_evicts_after_the_flush_acks(healthy):
    """write_back: 0.5.20's ``_evict_write_back`` detaches a staged node before the flush's acks and frees its device
    pages in the flush's ``evict_device``; ``evict tier=dev`` is recorded there. 0.5.23 demotes a node only after
    ``writing_check(write_back=True)`` consumed its ack. Either way the eviction follows the ack of the node's
    write and is followed by the free of those pages."""
    staged = 0
    for m, r in zip(HEALTHY, healthy, strict=False):
        if m["policy"] != "write_back":
            continue
        recs = _records(r["log"])
        pending: set[int] = set()
        for i, (t, f) in enumerate(recs):
            if t == "reset":
                pending.clear()
            elif t == "prepare":
                pending.add(f["node_id"])
            elif t == "ack" and f["dir"] == "d2h":
                pending.discard(f["node_id"])
            elif t == "evict" and f["tier"] == "dev":
                assert f["node_id"] not in pending, (m, i, f)
                if f["kind"] == "backuped":
                    staged += 1
                    nxt = recs[i + 1]
                    assert nxt[0] == "free" and nxt[1]["node_id"] == f["node_id"] and nxt[1]["why"] == "evict"
    assert staged > 0


def test_check_reads_the_records(healthy):
    for r in healthy:
        n = len(_records(r["log"]))
        for path in (r["log"], r["otlp"]):
            d = _check_json(path)
            assert d["stats"]["events"] == n, (path, d["stats"])
            assert d["stats"].get("malformed", 0) == 0


FAULTS = [
    {"fault": "flip", "nth": 2},   # the 2nd copy's node is reloaded later in this stream (seed 0); 0.5.23: the 1st
    {"fault": "unpinned", "nth": 10},
    {"fault": "midchain", "nth": 1},
    {"fault": "early_release", "nth": 1},
    {"fault": "split_no_rewrite", "nth": 1},
]
FLIP_NTH = {"0.5.20": 2, "0.5.23": 1}


@pytest.fixture(scope="module", params=VERSIONS)
def faulty(request, tmp_path_factory):
    _need(request.param)
    out = str(tmp_path_factory.mktemp("sglang-faults"))
    common = {"requests": 100, "dev_tokens": 256, "exact": True, "reset": False}
    m = [{**common, **f, **({"nth": FLIP_NTH[request.param]} if f["fault"] == "flip" else {})} for f in FAULTS]
    return _drive(out, m, version=request.param)


@pytest.mark.parametrize("i", range(len(FAULTS)), ids=[f["fault"] for f in FAULTS])
def test_fault_is_injected_and_seen(faulty, i):
    f, r = FAULTS[i], faulty[i]
    assert len(r["fault_hits"]) == 1 and r["fault_hits"][0]["kind"] == f["fault"], r["fault_hits"]
    hit = r["fault_hits"][0]
    bad = {n for c in r["corruption"] for n in c.get("nodes", [])}
    if f["fault"] == "split_no_rewrite":
        # no KV is wrong (SGLang without L3 never reads the pending entry's list for data); the records
        # show the shape: the write's ack publishes the old id only, not the prefix the split made
        assert r["corruption"] == []
        acks = [x for t, x in _records(r["log"]) if t == "ack" and x["dir"] == "d2h" and x["node_id"] == hit["node_id"]]
        assert acks and hit["new_id"] not in acks[0]["pub"]
    elif f["fault"] == "flip":
        assert any(c["where"] == "host" for c in r["corruption"]), r["corruption"]
    else:
        assert hit["node_id"] in bad, (hit, r["corruption"][:5])


@pytest.mark.parametrize("i,code", [(0, "HASH"), (1, "H4"), (3, "H2"), (4, "H1")],
                         ids=["flip-HASH", "unpinned-H4a", "early-release-H2c", "split-no-rewrite-H1b"])
def test_fault_found_by_check(faulty, i, code):
    """The rules that already decide these shapes name the fault's node (the flip's: a node whose reloaded KV the
    driver saw corrupted). The mid-chain corruption is the rules' open item."""
    r = faulty[i]
    hit = r["fault_hits"][0]
    d = _check_json(r["log"])
    found = {x["node_id"] for x in d["findings"] if x["code"] == code}
    if "node_id" in hit:
        assert hit["node_id"] in found, (hit, d["findings"])
    else:
        bad = {n for c in r["corruption"] if c["where"] == "device" for n in c["nodes"]}
        assert found & bad, (found, bad)


# 0.5.20 only: test_ranks_real.py runs 4 ranks of each version (the same stream on every rank, C1 comparing the
# ranks' decisions, one rank's faults found on that rank); this one costs another 70 s of CI per version
@pytest.mark.parametrize("version", ["0.5.20"])
def test_four_ranks_one_faulty(tmp_path, version):
    _need(version)
    from tests.sglang_real import driver

    outs = driver.run_ranks(version, str(tmp_path), world=4, fault_rank=2, fault="early_release", requests=60,
                            dev_tokens=256, exact=True, reset=False)
    assert [len(o["fault_hits"]) for o in outs] == [0, 0, 1, 0]
    assert [bool(o["corruption"]) for o in outs] == [False, False, True, False]
    shapes = []
    for r, o in enumerate(outs):
        recs = _records(o["log"])
        cfg = next(f for t, f in recs if t == "config")
        assert (cfg["cp_size"], cfg["cp_rank"]) == (4, r)
        shapes.append([t for t, _ in recs if t in ("insert", "split", "prepare", "reload")])
    assert shapes[0] == shapes[1] == shapes[3]   # the same stream, the same decisions (all-reduced acks)
