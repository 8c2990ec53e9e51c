"""SGLang's kv-canary violation lines as CANARY findings: the line grammar (cptrace_otel.model.canary), both log
readers, the owner of the slot (checks/rules_canary), ``check``, ``ingest`` (the finding on the owning node's span)
and the OTLP round trip the watcher reads.

The lines below are in the exact format of SGLang 0.5.23's ``ViolationReporter`` (``_format_violation``: the first
line is the frozen ``kv_canary violation:`` summary, then a human-readable block), with SGLang's logger prefix
``[%(asctime)s <ranks>] `` as its server log prints it, and its raise mode (``RuntimeError: <the same text>``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from cptrace_otel import cli
from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.analyze.sources import detect, logs
from cptrace_otel.analyze.sources.logs import LogStats, read_log_events
from cptrace_otel.model import canary
from tests.helpers.checks_util import R, check_lines
from tests.helpers.otlp_receiver import read_jsonl


def sglang_violation(slot: int, position: int = 42, tag: str = "HEAD_K_FULL",
                     reason: str = "verify_chain_hash+verify_real_kv_hash", prefix: str = "") -> list[str]:
    """The lines SGLang 0.5.23 logs for one verify-path violation (log mode), behind ``prefix``."""
    return [
        f"{prefix}kv_canary violation: launch_tag={tag} fail_reason={reason} slot_idx={slot} position={position} "
        "stored_token=111 expected_token=0 stored_chain_hash=0x1111111111111111 expected_aux=0x2222222222222222",
        f"KV cache canary violation detected (kernel_kind={tag}, slot_idx={slot}, position={position})",
        f"canary_kind:       per_forward_{tag.lower()}",
        f"  fail_reasons: {reason.replace('+', ' ')}",
        f"  stored:   token_id=111   position={position} prev_hash=0x1111111111111111",
        "  expected: prev_hash=0x2222222222222222",
        "  total_violations=1 ring_overflow=False step_when_pumped=7",
    ]


P0 = "[2026-05-12 10:00:01 ATTN_CP0 TP0] "


def test_the_line_grammar_reads_every_shape_sglang_prints():
    line = sglang_violation(17, prefix=P0)[0]
    prefix, f = canary.parse_canary_line(line)
    assert prefix == P0
    assert f == {"launch_tag": "HEAD_K_FULL", "fail_reason": "verify_chain_hash+verify_real_kv_hash", "slot_idx": 17,
                 "position": 42, "stored_token": 111, "expected_token": 0,
                 "stored_chain_hash": "0x1111111111111111", "expected_aux": "0x2222222222222222"}
    assert canary.render_canary_line(f) == line[len(P0):]
    # a write-path violation, an unknown kernel kind, the raise mode's exception text
    w = ("kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=write_token slot_idx=17 position=42 "
         "stored_token=999 expected_token=888 stored_chain_hash=0xdeadbeefcafebabe expected_aux=0x000000000000002b")
    assert canary.parse_canary_line(w)[1]["fail_reason"] == "write_token"
    u = canary.parse_canary_line(w.replace("HEAD_K_FULL", "unknown(9999)"))[1]
    assert u["launch_tag"] == "unknown(9999)" and not canary.full_pool(u["launch_tag"])
    assert canary.parse_canary_line("RuntimeError: " + w)[0] == "RuntimeError: "
    # not a violation line: the human-readable block, a summary without its slot, text that merely mentions it
    for other in sglang_violation(17)[1:] + ["kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=x position=1",
                                             "kv_canary violation: launch_tag=A fail_reason=b slot_idx=x position=1",
                                             "grep 'kv_canary violation:' server.log"]:
        assert canary.parse_canary_line(other) is None, other
    assert canary.full_pool("TAIL_V_FULL") and not canary.full_pool("SWEEP_K_SWA")


def _log(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> str:
    p = tmp_path / name
    p.write_text("".join(x + "\n" for x in lines))
    return str(p)


def _events(paths: list[str], c_reader: bool) -> tuple[list, LogStats]:
    st = LogStats()
    if c_reader and logs.c_reader() is None:
        if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
            pytest.fail("the C log reader was not built")
        pytest.skip("the C log reader was not built")
    with contextlib.nullcontext() if c_reader else logs.python_reader():
        return list(read_log_events(paths, stats=st)), st


def _mixed_log(n: int) -> list[str]:
    """A server log: trace lines, unrelated SGLang lines, violations (one of them in a non-ASCII line), over several
    of the readers' chunks."""
    out = []
    for i in range(n):
        out.append(f"{P0}[CPTRACE insert] node_id={i + 1} parent=0 len=4 dev={R(4 * i, 4 * i + 3)} ts={1000 + i}")
        out.append(f"{P0}Prefill batch. #new-seq: 1, #new-token: 4, #cached-token: 0")
        if i % 97 == 5:
            out.extend(sglang_violation(4 * i + 1, prefix=P0))
    out.extend(sglang_violation(3, prefix="[2026-05-12 10:00:09 ATTN_CP0 TP0 \u00e9] "))
    return out


@pytest.mark.parametrize("c_reader", [False, True])
def test_both_readers_make_one_record_per_violation(tmp_path, c_reader):
    path = _log(tmp_path, _mixed_log(1300))
    evs, st = _events([path], c_reader)
    can = [e for e in evs if e.tag == canary.TAG]
    assert [e.fields["slot_idx"] for e in can] == [4 * i + 1 for i in range(1300) if i % 97 == 5] + [3]
    assert st.malformed == 0 and len(evs) == 1300 + len(can)
    for e in can:   # ts of the record before it in the file; rank from the prefix; seq in line order
        prev = next(x for x in reversed(evs[:evs.index(e)]) if x.tag != canary.TAG)
        assert e.ts == prev.ts and e.rank == 0 and e.seq == prev.seq + 1 and e.level == 1


def test_the_c_reader_gives_the_python_readers_events(tmp_path):
    path = _log(tmp_path, _mixed_log(700))
    py, _ = _events([path], False)
    c, _ = _events([path], True)
    assert [(e.tag, e.rank, e.seq, e.ts, e.epoch, e.fields, e.line_no) for e in c] == \
        [(e.tag, e.rank, e.seq, e.ts, e.epoch, e.fields, e.line_no) for e in py]


@pytest.mark.parametrize("c_reader", [False, True])
def test_a_violation_line_that_does_not_parse_is_reported_not_dropped(tmp_path, c_reader):
    path = _log(tmp_path, [f"{P0}[CPTRACE insert] node_id=1 parent=0 len=4 dev={R(0, 3)} ts=5",
                           f"{P0}kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=chain_hash slot_idx=? "
                           "position=1"])
    evs, st = _events([path], c_reader)
    assert [e.tag for e in evs] == ["insert"] and st.malformed == 1
    assert st.examples[0].line_no == 2 and "kv_canary" in st.examples[0].reason


def test_a_log_holding_only_violations_is_a_log(tmp_path):
    path = _log(tmp_path, ["[2026-05-12 10:00:00 TP0] server started"] * 3 + sglang_violation(9, prefix=P0))
    assert detect.sniff(path).kind == "log"


# -- the owner of the slot --------------------------------------------------------------------------------------------

def _canary_findings(tmp_path, trace: list[str], slot: int, **kw) -> list:
    res = check_lines(tmp_path, trace + sglang_violation(slot, **kw))
    return [f for f in res.findings if f.code == "CANARY"], res


def test_exact_sets_decide_the_owner(tmp_path):
    trace = [f"[CPTRACE insert] node_id=1 parent=0 len=4 dev={R(16, 19)} rank=0 ts=1",
             "[CPTRACE insert] node_id=2 parent=1 len=3 dev=(cnt=3,min=20,max=40,first=20,last=40) devx=20:30:40 "
             "rank=0 ts=2"]
    (f,), _ = _canary_findings(tmp_path, trace, 17)
    assert (f.node_id, f.severity, f.certainty, f.evidence, f.line_no) == (1, "ERROR", "exact", [0, 2], 3)
    assert "node 1's device slots" in f.message and "slot_idx=17" in f.message
    (f,), _ = _canary_findings(tmp_path, trace, 30)
    assert f.node_id == 2
    (f,), _res = _canary_findings(tmp_path, trace, 25)   # between node 2's exact slots: no node holds it
    assert f.node_id is None and f.severity == "ERROR" and "no node of the trace holds the slot" in f.message


def test_a_summary_that_cannot_decide_says_so(tmp_path):
    trace = ["[CPTRACE insert] node_id=1 parent=0 len=3 dev=(cnt=3,min=20,max=40,first=20,last=40) rank=0 ts=1"]
    (f,), res = _canary_findings(tmp_path, trace, 25)
    assert f.node_id is None and "owner undecidable" in f.message and "node(s) 1" in f.message
    (u,) = [u for u in res.unchecked if u.rule == "CANARY-owner(undecidable)"]
    assert (u.kind, u.count, u.examples) == ("skip", 1, [1])


def test_the_slot_follows_the_lifecycle(tmp_path):
    """The owner at the violation: the latest holder (revive, split halves, eviction, reload to new slots)."""
    life = [f"[CPTRACE insert] node_id=1 parent=0 len=8 dev={R(0, 7)} rank=0 ts=1",
            f"[CPTRACE split] node_id=1 new_id=2 parent=0 pre_len=8 split_len=4 dev_p={R(0, 3)} dev_c={R(4, 7)} "
            "host_p=(none) host_c=(none) rank=0 ts=2"]
    assert _canary_findings(tmp_path, life, 2)[0][0].node_id == 2     # the prefix went to the new id
    assert _canary_findings(tmp_path, life, 6)[0][0].node_id == 1     # the old id kept the suffix
    ev = life + [f"[CPTRACE evict] tier=dev node_id=2 kind=backuped dev={R(0, 3)} rank=0 ts=3"]
    assert _canary_findings(tmp_path, ev, 2)[0][0].node_id is None    # evicted: no longer its slot
    rel = ev + [f"[CPTRACE reload] node_id=2 chain=[2] op=5 host={R(100, 103)} dev={R(50, 53)} rank=0 ts=4"]
    assert _canary_findings(tmp_path, rel, 51)[0] == []   # reloaded: CANARY-skipped(reloaded), below
    ev2 = rel + [f"[CPTRACE evict] tier=dev node_id=2 kind=backuped dev={R(50, 53)} rank=0 ts=5",
                 f"[CPTRACE insert] node_id=2 parent=0 len=4 dev={R(60, 63)} kind=revive rank=0 ts=6"]
    (f,), _ = _canary_findings(tmp_path, ev2, 61)   # revived from a request's own slots: stamped by its forward
    assert f.node_id == 2 and "insert kind=revive" in f.message
    # a stale record: node 3 took slots 0..3 later (no free record at level 1): the latest assignment holds them
    stale = life + [f"[CPTRACE insert] node_id=3 parent=0 len=4 dev={R(0, 3)} rank=0 ts=3"]
    assert _canary_findings(tmp_path, stale, 1)[0][0].node_id == 3


def test_a_slot_a_load_back_filled_is_skipped_not_reported(tmp_path):
    """SGLang's canary stamps do not follow a HiCache load-back (tests/sglang_real/test_canary_real.py): a violation
    on a slot the holder got by its reload (or its h2d ack), or by a split of such a node, is counted as
    ``CANARY-skipped(reloaded)``, never a finding; the node's other slots and other nodes are judged as before."""
    trace = [f"[CPTRACE insert] node_id=1 parent=0 len=8 dev={R(0, 7)} rank=0 ts=1",
             f"[CPTRACE insert] node_id=3 parent=0 len=4 dev={R(20, 23)} rank=0 ts=2",
             f"[CPTRACE evict] tier=dev node_id=1 kind=backuped dev={R(0, 7)} rank=0 ts=3",
             f"[CPTRACE reload] node_id=1 chain=[1] op=5 host={R(100, 107)} dev={R(40, 47)} rank=0 ts=4",
             "[CPTRACE ack] dir=h2d op=5 node_id=1 rank=0 ts=5",
             f"[CPTRACE split] node_id=1 new_id=2 parent=0 pre_len=8 split_len=4 dev_p={R(40, 43)} dev_c={R(44, 47)} "
             "host_p=(none) host_c=(none) rank=0 ts=6"]
    for slot in (41, 45):   # the split's prefix (new id 2) and suffix (id 1): both from the load-back
        found, res = _canary_findings(tmp_path, trace, slot)
        assert found == [], found
        (u,) = [u for u in res.unchecked if u.rule == "CANARY-skipped(reloaded)"]
        assert (u.code, u.count, u.examples) == ("CANARY", 1, [2 if slot == 41 else 1])
    (f,), _ = _canary_findings(tmp_path, trace, 21)   # node 3 was never reloaded
    assert f.node_id == 3


def test_a_sliding_window_slot_is_not_attributed(tmp_path):
    trace = [f"[CPTRACE insert] node_id=1 parent=0 len=4 dev={R(16, 19)} rank=0 ts=1"]
    (f,), _ = _canary_findings(tmp_path, trace, 17, tag="HEAD_K_SWA")
    assert f.node_id is None and "sliding-window" in f.message


# -- commands ---------------------------------------------------------------------------------------------------------

def _server_log(tmp_path: Path) -> str:
    """Two CP ranks' trace lines and violations interleaved in one server log, as SGLang prints them."""
    lines = []
    for r in (0, 1):
        p = f"[2026-05-12 10:00:0{r} ATTN_CP{r} TP{r}] "
        lines.append(f"{p}[CPTRACE insert] node_id=1 parent=0 len=4 dev={R(16 + 8 * r, 19 + 8 * r)} ts={10 + r}")
        lines.append(f"{p}[CPTRACE insert] node_id=2 parent=1 len=4 dev={R(40, 43)} ts={20 + r}")
    lines += sglang_violation(25, prefix="[2026-05-12 10:00:03 ATTN_CP1 TP1] ")   # rank 1's node 1
    lines += sglang_violation(999, prefix="[2026-05-12 10:00:04 ATTN_CP0 TP0] ")  # nobody's
    return _log(tmp_path, lines, "server.log")


def test_check_reports_violations_on_the_right_node_and_rank(tmp_path, capsys):
    path = _server_log(tmp_path)
    assert cli.main(["check", "--json", path]) == 1
    doc = json.loads(capsys.readouterr().out)
    got = sorted((f["rank"], f["node_id"], f["code"]) for f in doc["findings"])
    assert got == [(0, None, "CANARY"), (1, 1, "CANARY")]


def test_ingest_stamps_the_violation_on_the_owning_nodes_span_and_check_reads_it_back(tmp_path, capsys):
    path = _server_log(tmp_path)
    out = tmp_path / "out.jsonl"
    assert cli.main(["ingest", "--no-progress", "--file", str(out), "--run-id", "canary", path]) == 0
    spans = read_jsonl([str(out)])
    hit = [sp for sp in spans if sp.attrs.get("cptrace.violation") == "CANARY"]
    assert sorted(sp.name for sp in hit) == ["rank 0 · process", "rank 1 · node"]
    lane = next(sp for sp in hit if sp.name == "rank 1 · node")
    assert lane.attrs["hicache.node_id"] == 1 and lane.attrs["cptrace.violation.CANARY"] is True
    assert lane.status_code == 2 and "node 1's device slots" in lane.status_message   # (2: ERROR)
    ev = next(e for e in lane.events if e.name == canary.TAG)
    assert ev.attrs["hicache.slot_idx"] == 25 and ev.attrs["hicache.launch_tag"] == "HEAD_K_FULL"
    # what the watcher and `check` read back from the trace files: the same findings
    capsys.readouterr()
    assert cli.main(["check", "--json", str(out)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert sorted((f["rank"], f["node_id"], f["code"]) for f in doc["findings"]) == [(0, None, "CANARY"),
                                                                                      (1, 1, "CANARY")]


def test_watch_finds_the_violations_in_the_backends_traces(tmp_path):
    """What ``watch`` reads: the ingested spans as Jaeger returns them (api_v2 JSON), in pieces: the same findings,
    and the node's is already stamped by the exporter's check (so the watcher does not write it twice)."""
    from cptrace_otel.analyze.finding_sinks import already_stamped
    from cptrace_otel.analyze.incremental import RunWatch
    from tests.helpers.jaeger_fixtures import read_requests, v2_traces

    out = tmp_path / "out.jsonl"
    assert cli.main(["ingest", "--no-progress", "--file", str(out), "--run-id", "canary", _server_log(tmp_path)]) == 0
    traces = v2_traces(read_requests([str(out)]))
    w = RunWatch("canary")
    got = []
    for tr in reversed(traces):
        w.add_trace(tr)
        got += w.step()
    got += w.finish()
    assert sorted((f.rank, f.node_id, f.code) for f in got) == [(0, None, "CANARY"), (1, 1, "CANARY")]
    assert all(already_stamped(w, f) for f in got)


def test_no_violation_no_finding(tmp_path):
    path = _log(tmp_path, [f"{P0}[CPTRACE insert] node_id=1 parent=0 len=4 dev={R(0, 3)} ts=1",
                           f"{P0}kv_canary: enabled mode=log sweep_interval=0"])
    res = Analysis().run(read_log_events([path]))
    assert res.findings == []


def test_the_live_hook_turns_sglangs_warning_into_a_finding_on_the_node(tmp_path):
    """SGLang's reporter logs through its module logger; with the hook installed (as CPTRACE_SGLANG's shim does) the
    violation becomes a kv_canary record of the live trace, checked online and stamped on the node's lane."""
    import logging

    from cptrace_otel.traced import api, canary_hook

    out = tmp_path / "live.otlp.jsonl"
    api.configure(level=1, run_id="live-canary", cp_rank=0, exporter="thread", file=str(out),
                  spool_dir=str(tmp_path / "spool"))
    h = canary_hook.install()
    try:
        assert canary_hook.install() is h   # idempotent
        api.cptrace(1, "insert", node_id=4, parent=0, len=4, dev=R(8, 11), kind="new", rank=0)
        msg = "\n".join(sglang_violation(9, position=1))   # the WARNING SGLang's ViolationReporter logs
        logging.getLogger(canary_hook.REPORTER_LOGGER).warning(msg)
        logging.getLogger(canary_hook.REPORTER_LOGGER).warning("kv_canary: 0 violations this step")
        assert api.flush(30)
    finally:
        canary_hook.uninstall()
        api.shutdown(10)
        api.reload_config()
    assert not [x for x in logging.getLogger(canary_hook.REPORTER_LOGGER).handlers
                if isinstance(x, canary_hook.CanaryHandler)]
    spans = read_jsonl([str(out)])
    (lane,) = [sp for sp in spans if sp.attrs.get("cptrace.violation") == "CANARY"]
    assert lane.name == "rank 0 · node" and lane.attrs["hicache.node_id"] == 4
    assert [e.name for e in lane.events][:2] == ["insert", canary.TAG]
    assert sum(e.name == canary.TAG for sp in spans for e in sp.events) == 1
