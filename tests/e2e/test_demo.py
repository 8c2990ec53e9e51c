"""``cptrace-otel demo`` for real: one OS process per rank through the public API and the real pipeline (exporter
processes, file sinks, or an OTLP/HTTP receiver), then the checker over the produced files, next to the oracle."""

from __future__ import annotations

import json
import os

import pytest

from cptrace_otel.model.trace_ids import node_trace_id
from tests.helpers.demo_run import demo
from tests.helpers.otlp_receiver import HttpReceiver, read_jsonl


def test_default_demo_finds_every_injected_fault_and_nothing_else(tmp_path):
    out = tmp_path / "demo"
    p = demo("--out", str(out), "--json", "--jaeger-url", "http://127.0.0.1:16686")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["ok"] and rep["recall"] == 1.0 and rep["false_positives"] == [] and rep["missed"] == []
    assert {i["fault"] for i in rep["injected"]} == {"H1_ack", "H2_release", "HASH_flip"}
    assert {f["code"] for f in rep["findings"]} == {"H1", "H2", "HASH"}
    assert rep["sources_agree"] and rep["events"]["logs"] == rep["events"]["otlp"] == rep["events"]["simulated"]
    assert "[demo" in p.stderr                                  # progress indication
    # every finding names its node's trace, and that trace is in the OTLP files the rank processes wrote
    spans = read_jsonl(rep["files"]["otlp"])
    trace_ids = {s.trace_id for s in spans}
    assert {s.resource["sglang.cp.rank"] for s in spans} == {0, 1}
    assert {s.resource["cptrace.run_id"] for s in spans} == {rep["run_id"]}
    for f in rep["findings"]:
        tid = node_trace_id(rep["run_id"], f["epoch"], f["node_id"]).hex()
        assert f["trace_id"] == tid and tid in trace_ids
        assert f["trace_url"] == f"http://127.0.0.1:16686/trace/{tid}"
        assert "hicache.node_id" in f["search_url"]
    # the exporters' online checks stamped the per-rank violations on the spans holding the evidence
    stamped = {(s.resource["sglang.cp.rank"], c) for s in spans
               for c in str(s.attrs.get("cptrace.violation", "")).split(",") if c}
    assert {(f["rank"], f["code"]) for f in rep["findings"]} <= stamped
    assert sorted(os.listdir(out)) >= ["rank0.log", "rank0.otlp.jsonl", "rank1.log", "rank1.otlp.jsonl"]


def test_clean_demo_has_no_findings_and_a_readable_report(tmp_path):
    p = demo("--out", str(tmp_path), "--faults", "none", "--mode", "shared", "--seed", "7", "--level", "3")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "findings (0)" in p.stdout and "false positives 0" in p.stdout and "PASS" in p.stdout
    assert "agree" in p.stdout


def test_demo_at_level_1_reports_level_2_rules_as_unchecked(tmp_path):
    p = demo("--out", str(tmp_path), "--faults", "H1_ack", "--level", "1", "--json", "--mode", "none")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["findings"] == [] and rep["injected"] and {"H1b", "H2c", "H4"} <= set(rep["unchecked"])


def test_demo_exports_to_an_otlp_endpoint(tmp_path):
    with HttpReceiver() as rx:
        p = demo("--out", str(tmp_path), "--faults", "ZERO_race", "--mode", "dcp", "--endpoint", rx.url, "--json")
        assert p.returncode == 0, p.stderr
        rep = json.loads(p.stdout)
        spans = rx.spans()
    assert rep["ok"] and {f["code"] for f in rep["findings"]} == {"ZERO", "HASH"}
    assert {s.resource["sglang.cp.rank"] for s in spans} == {0, 1}
    assert {s.resource["cptrace.run_id"] for s in spans} == {rep["run_id"]}
    n_events = sum(len(s.events) for s in spans if not s.name.startswith("cptrace."))
    assert n_events >= rep["events"]["simulated"]


def test_unreachable_endpoint_exits_3_with_the_url(tmp_path):
    from tests.helpers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    p = demo("--out", str(tmp_path), "--endpoint", url)
    assert p.returncode == 3
    assert url + "/v1/traces" in p.stderr


@pytest.mark.parametrize("args", [["--mode", "bogus"], ["--faults", "NOPE"], ["--faults", "H4_wb_noflush"],
                                  ["--faults", "C3_writer", "--mode", "replicated"], ["--level", "7"]])
def test_bad_arguments_exit_2(args, tmp_path):
    p = demo("--out", str(tmp_path), *args)
    assert p.returncode == 2, p.stderr
    assert "cptrace-otel demo:" in p.stderr


def test_shared_mode_store_fence_agrees_between_log_and_otlp_sources(tmp_path):
    # rank processes run unsynchronized: cross-rank order must come from the records' ts=, not arrival or call time
    p = demo("--out", str(tmp_path), "--faults", "ZERO_race,HASH_flip", "--mode", "shared", "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    rep = json.loads(p.stdout)
    assert rep["sources_agree"] and rep["false_positives"] == []
    assert {"C5-fence", "ZERO@reload", "HASH"} <= {f["rule"] for f in rep["findings"]}
