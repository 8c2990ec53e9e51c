"""kv-canary violations as stock SGLang prints them (its ``ViolationReporter`` over a real ``ViolationLog``, its
``configure_logger`` prefix, its scheduler's exception report in mode raise; canary_sglang_main.py here) become
CANARY findings on the node that held the slot: read from the log by ``check`` and ``ingest``, and live through the
hook on the reporter's logger.

SGLang comes from ``.sglang/<version>`` (deploy/sglang/install, on PYTHONPATH of a subprocess only, so this test
process never imports it); without it the test is skipped, or fails when ``CPTRACE_REQUIRE_SGLANG=1``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptrace_otel import cli
from tests.helpers.otlp_receiver import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.5.23"   # the first release with --kv-canary's structured violation line


def _sglang() -> Path:
    p = ROOT / ".sglang" / VERSION
    if not (p / "sglang" / "srt" / "kv_canary" / "runner" / "violation_reporter.py").is_file():
        if os.environ.get("CPTRACE_REQUIRE_SGLANG") == "1":
            pytest.fail(f"sglang {VERSION} is not installed in {p} (deploy/sglang/install)")
        pytest.skip(f"sglang {VERSION} is not installed in {p} (deploy/sglang/install)")
    return p


def _run(mode: str, out: Path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_sglang()), str(ROOT)]))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "e2e" / "canary_sglang_main.py"), mode, str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def _findings(path: Path, capsys) -> list[tuple]:
    capsys.readouterr()
    assert cli.main(["check", "--json", str(path)]) == 1
    doc = json.loads(capsys.readouterr().out)
    return sorted((f["rank"], f["node_id"] if f["node_id"] is not None else -1, f["code"], f["message"])
                  for f in doc["findings"])


@pytest.mark.parametrize("mode", ["log", "raise"])
def test_sglangs_own_violation_lines_become_findings_on_the_node(tmp_path, capsys, mode):
    log = tmp_path / "server.log"
    log.write_text(_run(mode, tmp_path / "unused"))
    text = log.read_text()
    assert text.count("kv_canary violation: ") == 3 and "[CPTRACE insert]" in text
    if mode == "raise":
        assert "RuntimeError: kv_canary violation: launch_tag=HEAD_K_FULL" in text
    got = _findings(log, capsys)
    assert [(r, n, c) for r, n, c, _ in got] == [(1, -1, "CANARY"), (1, -1, "CANARY"), (1, 7, "CANARY")]
    msgs = {n: m for _, n, _, m in got if n == 7}
    assert "slot_idx=101" in msgs[7] and "verify_chain_hash+verify_real_kv_hash" in msgs[7]
    others = " | ".join(m for _, n, _, m in got if n == -1)
    assert "slot_idx=999" in others and "no node of the trace holds the slot" in others
    assert "launch_tag=HEAD_K_SWA" in others and "sliding-window" in others
    # ingest puts node 7's on its lane, the others on the rank span
    out = tmp_path / "o.jsonl"
    assert cli.main(["ingest", "--no-progress", "--file", str(out), "--run-id", "sgl", str(log)]) == 0
    stamped = sorted((sp.name, sp.attrs.get("hicache.node_id")) for sp in read_jsonl([str(out)])
                     if sp.attrs.get("cptrace.violation") == "CANARY")
    assert stamped == [("rank 1 · node", 7), ("rank 1 · process", None)]


def test_live_hook_on_sglangs_reporter_logger(tmp_path, capsys):
    out = tmp_path / "live.otlp.jsonl"
    _run("live", out)
    spans = read_jsonl([str(out)])
    lanes = [sp for sp in spans if sp.attrs.get("cptrace.violation") == "CANARY"]
    assert sorted((sp.name, sp.attrs.get("hicache.node_id")) for sp in lanes) == [("rank 1 · node", 7),
                                                                                  ("rank 1 · process", None)]
    assert sum(e.name == "kv_canary" for sp in spans for e in sp.events) == 3
    # and `check` over the exported trace finds the same three
    assert [(r, n) for r, n, _, _ in _findings(out, capsys)] == [(1, -1), (1, -1), (1, 7)]
