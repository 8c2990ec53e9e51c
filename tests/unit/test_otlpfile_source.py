"""The OTLP JSON-lines reader: events written by the exporter's span model and file sink come back identical
(tag, rank, seq, epoch, typed fields), violation events are skipped, and the checks give the same findings."""

from __future__ import annotations

import json
import os

import pytest

from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.analyze.sources.logs import LogReadError, read_log_events
from cptrace_otel.analyze.sources.otlpfile import OtlpInfo, any_value, looks_like_otlp, read_otlp_events
from cptrace_otel.model import semconv as sc
from tests.helpers.checks_util import FIXTURES

spans = pytest.importorskip("cptrace_otel.model.spans")
otlp_json = pytest.importorskip("cptrace_otel.export.otlp_json")


def _write_otlp(log_paths: list[str], out: str, run_id: str = "run-1", level: int = 2, batch: int = 7) -> list:
    """Events of the log files -> SpanBuilder (with online checks) -> OTLP JSON lines, a few spans per line."""
    from cptrace_otel.checks import RankChecker
    evs = list(read_log_events(log_paths))
    builders: dict[int, spans.SpanBuilder] = {}
    with open(out, "w") as fh:
        def flush(final=False):
            groups = []
            for r, b in sorted(builders.items()):
                if final:
                    b.finish()
                done = b.take()
                if done:
                    groups.append(({sc.CP_RANK: r, sc.RUN_ID: run_id, sc.TRACE_LEVEL: level}, done))
            line = otlp_json.request_json(groups)
            if line:
                fh.write(line + "\n")
        for i, ev in enumerate(evs):
            b = builders.get(ev.rank)
            if b is None:
                b = builders[ev.rank] = spans.SpanBuilder(run_id, checker_factory=lambda r: RankChecker(r, None))
            b.add(ev)
            if i % batch == 0:
                b.close_all()
                flush()
        flush(final=True)
    return evs


def _key(e):
    return (e.tag, e.rank, e.seq, e.epoch, tuple(e.fields.items()))


@pytest.mark.parametrize("name", ["domain/h1b_bad.log", "domain/h3_bad.log", "real/sglang_attn_cp3.log",
                                  "nearmiss/reload_split_node_host_p.log"])
def test_events_round_trip_through_otlp_file(tmp_path, name):
    out = str(tmp_path / "trace.jsonl")
    evs = _write_otlp([os.path.join(FIXTURES, name)], out)
    assert looks_like_otlp(out)
    info = OtlpInfo()
    back = list(read_otlp_events([out], info))
    assert [_key(e) for e in back] == [_key(e) for e in evs]
    assert info.run_ids == {"run-1"} and set(info.levels.values()) == {2}


def test_violation_events_are_skipped_and_findings_match_the_log(tmp_path):
    paths = [os.path.join(FIXTURES, "domain", n) for n in ("h4_bad.log",)]
    out = str(tmp_path / "trace.jsonl")
    _write_otlp(paths, out)
    text = open(out).read()
    assert sc.EVENT_VIOLATION in text   # the online checker stamped the H4 finding
    from_log = Analysis().run(read_log_events(paths))
    from_otlp = Analysis().run(read_otlp_events([out]))
    def key(r):
        return sorted((f.code, f.rule, f.rank, f.epoch, f.node_id, f.op, tuple(f.evidence)) for f in r.findings)
    assert key(from_log) == key(from_otlp) != []


def test_simulator_run_gives_same_findings_from_logs_and_otlp(tmp_path):
    sim_mod = pytest.importorskip("cptrace_otel.sim.workload")
    sim = sim_mod.run_fault("H2_release", "replicated", level=2)
    logs = sim.emitter.write(str(tmp_path))
    out = str(tmp_path / "trace.jsonl")
    _write_otlp(logs, out, batch=50)
    def key(r):
        return sorted((f.code, f.rule, f.rank, f.node_id, f.op) for f in r.findings)
    a = Analysis().run(read_log_events(logs))
    b = Analysis().run(read_otlp_events([out]))
    assert key(a) == key(b) and key(a)


def test_any_value_forms_and_snake_case():
    assert any_value({"intValue": "-5"}) == -5 and any_value({"int_value": 7}) == 7
    assert any_value({"doubleValue": 1.5}) == 1.5 and any_value({"stringValue": "x"}) == "x"
    assert any_value({"boolValue": True}) is True
    assert any_value({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}) == [1, "a"]


def _snake_request():
    return {"resource_spans": [{"resource": {"attributes": [{"key": sc.CP_RANK, "value": {"int_value": 4}}]},
                                "scope_spans": [{"spans": [{"name": "hicache.node", "events": [
                                    {"name": "reset", "time_unix_nano": "5", "attributes": [
                                        {"key": sc.SEQ, "value": {"int_value": "0"}},
                                        {"key": "hicache.reason", "value": {"string_value": "flush"}}]}]}]}]}]}


def test_snake_case_file_and_malformed_lines(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(_snake_request()) + "\n{not json\n\n")
    info = OtlpInfo()
    evs = list(read_otlp_events([str(p)], info))
    assert [(e.tag, e.rank, e.seq, e.ts, e.fields) for e in evs] == [("reset", 4, 0, 5, {"reason": "flush"})]
    assert [(m[1]) for m in info.malformed] == [2]


def test_unreadable_otlp_file(tmp_path):
    with pytest.raises(LogReadError):
        read_otlp_events([str(tmp_path / "nope.jsonl")])
