"""The L3 rules over stock SGLang's ``file`` storage backend (``HiCacheFile``, real files): the simulator's
backups and prefetches go through SGLang's own set/exists/get and its per-rank key suffixes (l3_file_main.py here,
a subprocess with ``.sglang/<version>`` on PYTHONPATH). Healthy runs give no finding; a bit flipped in a stored
file, a prefetch's pages freed before its read, a CP rank that never writes its shard, and a backend that does not
tell CP ranks apart are each found, as ``check`` reads the logs.

Skipped without SGLang in ``.sglang/<version>`` (deploy/sglang/install), failed then when
``CPTRACE_REQUIRE_SGLANG=1``. This covers the storage layer with SGLang's code; the record sites inside SGLang's
HiCache controller (the instrumentation) are not covered here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptrace_otel import cli

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.5.23"


def _run(tmp_path: Path, mode: str, ranks: int, seed: int, fault: str | None) -> tuple[dict, list]:
    sg = ROOT / ".sglang" / VERSION
    if not (sg / "sglang" / "srt" / "mem_cache" / "hicache_storage.py").is_file():
        if os.environ.get("CPTRACE_REQUIRE_SGLANG") == "1":
            pytest.fail(f"sglang {VERSION} is not installed in {sg} (deploy/sglang/install)")
        pytest.skip(f"sglang {VERSION} is not installed in {sg} (deploy/sglang/install)")
    out = tmp_path / f"{mode}-{ranks}-{seed}-{fault}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sg), str(ROOT)]), SGLANG_LOG_LEVEL="warning")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "e2e" / "l3_file_main.py"), mode, str(ranks), str(seed),
                        fault or "-", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    oracle = json.loads((out / "oracle.json").read_text())
    logs = sorted(str(p) for p in (out / "logs").glob("rank*.log"))
    return oracle, logs


def _check(logs: list, capsys) -> dict:
    capsys.readouterr()
    rc = cli.main(["check", "--json", *logs])
    doc = json.loads(capsys.readouterr().out)
    assert rc == (1 if doc["findings"] else 0)
    return doc


@pytest.mark.parametrize("mode,ranks", [("none", 1), ("sharded", 2)])
def test_healthy_runs_over_real_files_give_no_finding(tmp_path, capsys, mode, ranks):
    for seed in (0, 1):
        oracle, logs = _run(tmp_path, mode, ranks, seed, None)
        assert oracle["expected"] == []
        if mode == "sharded":   # each rank's shard in its own file, named by SGLang's suffix
            assert {f.rsplit("_cp", 1)[1] for f in oracle["files"]} == {"0_2.bin", "1_2.bin"}
        text = "".join(Path(p).read_text() for p in logs)
        assert text.count("[CPTRACE l3_ack] dir=prefetch") > 2 and text.count("[CPTRACE l3_backup]") > 2   # reads too
        doc = _check(logs, capsys)
        assert doc["findings"] == []
        assert not [u for u in doc["unchecked"] if u["code"] == "L3"]


@pytest.mark.parametrize("fault,mode", [("flip", "none"), ("free_prefetch", "none"), ("no_writer", "sharded"),
                                        ("same_keys", "sharded")])
def test_each_fault_over_real_files_is_found(tmp_path, capsys, fault, mode):
    oracle, logs = _run(tmp_path, mode, 2, 3, fault)
    doc = _check(logs, capsys)
    got = {f["rule"] for f in doc["findings"]}
    assert got == set(oracle["expected"]) and got, (fault, [f["message"] for f in doc["findings"]][:3])
    assert all(f["code"] == "L3" for f in doc["findings"])
    if fault == "same_keys":   # one file per page for both ranks: the first writer's shard is what both read
        assert not any("_cp" in f for f in oracle["files"])
