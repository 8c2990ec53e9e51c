"""SGLang 0.5.23's ``seaweedfs`` L3 backend on real parts: ``SeaweedFSStore`` (each KV page one object, through
SeaweedFS's S3 gateway with boto3, the zero-copy ``batch_exists``/``batch_get_v1``/``batch_set_v1`` path) against a
real SeaweedFS server on loopback, under ``l3_driver.py``'s scheduler steps on CPU, the records read back by
``cptrace-otel check``. (0.5.20's wheel has no such backend.)

* Healthy runs (write_through pages of 1, write_back pages of 4): no corruption, no finding of any severity; backups,
  queries, prefetches and storage hits recorded, prefixes loaded back from the store, objects in the bucket.
* An object overwritten through S3 with a flipped byte before a prefetch reads it is L3a, naming the object key;
  host pages freed and reused mid-prefetch are L3b; an object the store lost ends that prefetch at the hole (the
  leading run is ``done``), with no finding.
* CP (2 gloo ranks, sharded): a healthy run has no finding and each rank's keys carry its ``cp<r>of<w>`` scope; a
  rank that never writes its shard is L3c.

The server is the one at ``SEAWEEDFS_ENDPOINT`` when set; otherwise the test starts ``deploy/seaweedfs/up`` on free
ports (its binary built by ``deploy/seaweedfs/up --build-only``, as ``.ci/run`` does) and stops it after. Without the
binary or boto3 the tests skip with the reason, unless ``CPTRACE_REQUIRE_SEAWEEDFS`` is set (``.ci/run``): then they
fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.sglang_real import runtime, test_l3_real

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200)]

# Read at import: the root conftest clears CPTRACE_* from os.environ for every test.
REQUIRE = bool(os.environ.get("CPTRACE_REQUIRE_SEAWEEDFS", "").strip())
DEPLOY = Path(runtime.ROOT) / "deploy" / "seaweedfs"
VERSION = "0.5.23"
CREDS = {"access_key": "cptrace", "secret_key": "cptrace"}   # the loopback server accepts any key

SINGLE = [
    {"seed": 0, "exact": True},                                            # 0: write_through, pages of 1
    {"seed": 1, "policy": "write_back", "page_size": 4, "exact": True},    # 1: write_back, pages of 4
    {"seed": 0, "exact": True, "fault": "l3_flip"},                        # 2: a byte of a stored object
    {"seed": 0, "exact": True, "fault": "l3_free"},                        # 3: pages freed mid-prefetch
    {"seed": 0, "exact": True, "fault": "l3_drop"},                        # 4: an object lost by the store
]
HEALTHY = [0, 1]
CP_WORLD, CP_FAULT_RANK = test_l3_real.CP_WORLD, test_l3_real.CP_FAULT_RANK
CP = [
    {"seed": 0, "cp_mode": "sharded", "exact": True},                      # 0: healthy
    {"seed": 0, "cp_mode": "sharded", "fault": "l3_skip"},                 # 1: rank 1 never writes its shard
]


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"{reason} (CPTRACE_REQUIRE_SEAWEEDFS is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(f"{reason}; build it with deploy/seaweedfs/up --build-only (set CPTRACE_REQUIRE_SEAWEEDFS=1 to fail "
                "instead)")


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _free_ports(n: int) -> list[int]:
    """``n`` ports free on loopback whose +10000 (weed's gRPC port for each) is free too."""
    out: list[int] = []
    while len(out) < n:
        socks = []
        try:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            p = s.getsockname()[1]
            if p + 10000 > 65535 or p in out:
                continue
            g = socket.socket()
            socks.append(g)
            g.bind(("127.0.0.1", p + 10000))
            out.append(p)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    return out


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> object:
    """The S3 endpoint of a running SeaweedFS (see the module doc)."""
    runtime.need(VERSION)
    try:
        import boto3  # noqa: F401 - SGLang's backend imports it when it attaches
    except ImportError:
        _unavailable("boto3 is not installed (deploy/sglang/requirements-cpu.txt)")
    given = os.environ.get("SEAWEEDFS_ENDPOINT", "").rstrip("/")
    if given:
        if not _answers(given):
            _unavailable(f"SEAWEEDFS_ENDPOINT={given} does not answer")
        yield given
        return
    binary = os.environ.get("SEAWEEDFS_BIN") or str(DEPLOY / "bin" / "weed")
    if not os.access(binary, os.X_OK):
        _unavailable(f"no SeaweedFS binary at {binary}")
    s3, master, volume, filer = _free_ports(4)
    env = {**os.environ, "SEAWEEDFS_BIN": binary, "SEAWEEDFS_RUN_DIR": str(tmp_path_factory.mktemp("seaweedfs")),
           "SEAWEEDFS_S3_PORT": str(s3), "SEAWEEDFS_MASTER_PORT": str(master), "SEAWEEDFS_VOLUME_PORT": str(volume),
           "SEAWEEDFS_FILER_PORT": str(filer)}
    up = subprocess.run(["bash", str(DEPLOY / "up")], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        _SERVER_LOG.append(Path(env["SEAWEEDFS_RUN_DIR"]) / "seaweedfs.log")
        yield f"http://127.0.0.1:{s3}"
    finally:
        subprocess.run(["bash", str(DEPLOY / "down")], env=env, capture_output=True, timeout=60)


_SERVER_LOG: list[Path] = []   # the log of the server the endpoint fixture started, if it started one


def _with_server_log(run):
    """``run()``; when it fails, the error also carries the server's own words (its log's warnings and errors: an
    S3 InternalError says nothing of the cause)."""
    try:
        return run()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        if not _SERVER_LOG or not _SERVER_LOG[-1].exists():
            raise
        lines = _SERVER_LOG[-1].read_text(errors="replace").splitlines()
        said = [ln for ln in lines if ln[:1] in ("W", "E", "F")] or lines
        raise RuntimeError(f"{e}\n--- SeaweedFS log ({_SERVER_LOG[-1]}), last warnings and errors:\n"
                           + "\n".join(said[-40:])) from e


def _backend_args(endpoint: str) -> list[str]:
    return ["--backend", "seaweedfs", "--backend-config", json.dumps({"endpoint": endpoint, **CREDS})]


@pytest.fixture(scope="module")
def single(endpoint, tmp_path_factory) -> list[dict]:
    from tests.sglang_real import l3_driver

    out = tmp_path_factory.mktemp("l3s3")
    return _with_server_log(lambda: l3_driver.run_matrix(VERSION, str(out), SINGLE, *_backend_args(endpoint),
                                                         timeout=1100))


@pytest.fixture(scope="module")
def cp(endpoint, tmp_path_factory) -> list[list[dict]]:
    from tests.sglang_real import driver

    out = tmp_path_factory.mktemp("l3s3cp")
    return _with_server_log(lambda: driver.run_ranks(
        VERSION, str(out), world=CP_WORLD, fault_rank=CP_FAULT_RANK, matrix=CP, module="l3_driver",
        backend="seaweedfs", backend_config=json.dumps({"endpoint": endpoint, **CREDS})))


_check, _events, _fmt = runtime.check_json, runtime.log_events, runtime.fmt_findings


def _tags(events, rank: int | None = None) -> Counter:
    return Counter(e.tag + (f"-{e.fields.get('dir')}" if e.tag == "l3_ack" else "")
                   for e in events if rank is None or e.rank == rank)


@pytest.mark.parametrize("i", HEALTHY, ids=["wt-p1", "wb-p4"])
def test_healthy_seaweedfs_run_has_no_finding(single, i):
    run = single[i]
    assert run["corruption"] == [], run["corruption"][:3]
    st = run["stats"]
    assert st["admitted"] == 60 and st["resets"] == 1 and st["l3_loaded_tokens"] > 0, st
    assert run["l3_files"] > 0 and run["l3_store"].startswith("s3://sglang-hicache/cptrace-"), run["l3_store"]
    d = _check([run["log"]])
    assert d["findings"] == [], _fmt(d)
    assert not [u for u in d["unchecked"] if u["code"] == "L3"], d["unchecked"]
    evs = _events([run["log"]])
    c = _tags(evs)
    for tag in ("l3_backup", "l3_ack-backup", "l3_query", "l3_prefetch", "l3_ack-prefetch", "l3_hit"):
        assert c[tag] > 0, (tag, c)
    assert c["l3_backup"] == c["l3_ack-backup"] and c["l3_prefetch"] == c["l3_ack-prefetch"], c
    # the records name the objects as the backend stores them: <prefix>/<model>/tp0of1/<page hash>
    prefix = run["l3_store"].removeprefix("s3://sglang-hicache/")
    keys = [k for e in evs if e.tag == "l3_backup" for k in e.fields["keys"]]
    assert keys and all(k.startswith(prefix + "/dummy/tp0of1/") for k in keys), keys[:2]


def test_the_l3_rules_judge_seaweedfs_logs(single, tmp_path):
    """The 0 of a healthy run is not the rules' silence: one fetched page's fingerprint altered is L3a there."""
    src, dst = single[0]["log"], str(tmp_path / "rank-0.log")
    done = False
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            if not done and "[CPTRACE l3_ack]" in line and " dir=prefetch" in line and " hp=[" in line:
                line, done = line.replace(" hp=[", " hp=[1", 1), True
            g.write(line)
    assert done
    assert {f["rule"] for f in _check([dst])["findings"]} == {"L3a"}


def test_object_overwritten_with_a_flipped_byte_is_l3a(single):
    """The first object a prefetch reads is rewritten through S3 with its first byte flipped, before the read: L3a
    at that prefetch, exact, naming the object's key; the flipped page reached the device."""
    run = single[2]
    (hit,) = run["l3_fault_hits"]
    d = _check([run["log"]])
    assert {f["rule"] for f in d["findings"]} == {"L3a"} and all(f["certainty"] == "exact" for f in d["findings"]), \
        _fmt(d)
    first = d["findings"][0]
    assert first["op"] == hit["op"] and hit["key"] in first["message"], (hit, _fmt(d))
    assert run["corruption"], "the flipped object's bytes did not reach the device"


def test_host_pages_freed_during_a_seaweedfs_prefetch_are_l3b(single):
    test_l3_real.assert_l3b(single[3])


def test_object_lost_by_the_store_ends_the_prefetch_there_without_finding(single):
    """The object of a prefetch's middle page is deleted before the read: ``batch_get_v1`` still reads every page
    into the host pool, the controller counts the leading run that came back, and that run alone is ``done`` with
    fingerprints; the pages past the hole never enter the tree. Not a fault of the cache: no finding, no corruption."""
    run = single[4]
    (hit,) = run["l3_fault_hits"]
    assert run["corruption"] == [], run["corruption"][:3]
    d = _check([run["log"]])
    assert d["findings"] == [], _fmt(d)
    evs = _events([run["log"]])
    (ack,) = [e for e in evs if e.tag == "l3_ack" and e.fields.get("dir") == "prefetch" and e.fields["op"] == hit["op"]]
    assert ack.fields["done"] == hit["page"] and len(ack.fields["hp"]) == hit["page"], (ack.fields, hit)
    (pf,) = [e for e in evs if e.tag == "l3_prefetch" and e.fields["op"] == hit["op"]]
    assert len(pf.fields["keys"]) == hit["pages"] and pf.fields["keys"][hit["page"]] == hit["key"], (pf.fields, hit)


def test_healthy_seaweedfs_cp_run_has_no_finding_and_rank_scoped_keys(cp):
    for r, keys in enumerate(test_l3_real.assert_healthy_cp(cp[0])):
        assert all(f"/dummy/tp0of1/cp{r}of{CP_WORLD}/" in k for k in keys), (r, keys[:2])


def test_seaweedfs_cp_rank_that_never_writes_its_shard_is_l3c(cp):
    test_l3_real.assert_l3c(cp[1])


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_only_0_5_23_ships_the_seaweedfs_backend(version):
    """docs/deploy.md says 0.5.20 has no seaweedfs backend: its wheel has neither the module nor a factory entry."""
    runtime.need(version)
    storage = Path(runtime.sglang_dir(version)) / "sglang" / "srt" / "mem_cache" / "storage"
    factory = (storage / "backend_factory.py").read_text(encoding="utf-8")
    has = (storage / "seaweedfs" / "seaweedfs_store.py").is_file() and '"seaweedfs"' in factory
    assert has == (version == "0.5.23")
