"""A ``cptrace-otel serve`` replica killed and started again: its journal (``--state-dir``) says which traces it held
(reported UNCHECKED, their later records counted, not checked), which it had checked (their later records late) and
which findings it had emitted (never emitted again). On the simulator's real OTLP bytes, in-process and as real
processes killed with SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from cptrace_otel.analyze.otlp_intake import decode
from cptrace_otel.analyze.serve_journal import Journal, JournalError, finding_id
from cptrace_otel.analyze.serve_state import PARTIAL_RULES, TRACE_RULES, ServeState
from tests.helpers import free_port
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import parse_json_line

FINDING = re.compile(r"^(?:ERROR|WARN) (\S+) (\S+) run (\S+) rank (-?\d+) (?:node (-?\d+)|\(no node\)) "
                     r"\(epoch (\d+)\) seq (\S+):")
UNCHECKED = re.compile(r"^UNCHECKED run (\S+) trace ([0-9a-f]{32}): ")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A 2-rank simulator run with a HASH and a ZERO fault: its OTLP requests (protobuf bytes) and its log files."""
    out = tmp_path_factory.mktemp("demo")
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults",
                        "HASH_flip,ZERO_nostore", "--out", str(out), "--json"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    bodies = []
    for f in sorted(out.glob("*.otlp.jsonl")):
        bodies += [parse_json_line(ln).SerializeToString() for ln in f.read_text().splitlines() if ln.strip()]
    return bodies, out


def _state(folder, got):
    j = Journal(str(folder))
    lost = j.open()
    unchecked: list = []
    st = ServeState(lambda tr, found: got.extend((tr.run_id, tr.trace_id, f) for f in found), idle_s=3600,
                    journal=j, unchecked=lambda r, t, why, n: unchecked.append(t))
    for r, t, n in lost:
        st.lost(r, t, "state lost", n)
    return st, j, unchecked


def _kill(j: Journal) -> None:
    """What SIGKILL leaves: the facts written so far, no finalisation (the descriptors simply close)."""
    os.close(j._fd)
    os.close(j._lock_fd)


def test_restart_reports_what_was_held_and_doubles_nothing(tmp_path, demo):
    spans = [sp for b in demo[0] for sp in decode(b).spans]
    plain: list = []
    st0 = ServeState(lambda tr, found: plain.extend(tr.trace_id for _ in found), idle_s=3600)
    st0.add(spans, now=0.0)
    st0.finish_all()
    # the traces with findings first, dealt in turn to the checked third, the lost third and the rest
    traces = sorted(dict.fromkeys(sp.trace_id for sp in spans), key=lambda t: t not in plain)
    first, second = set(traces[0::3]), set(traces[1::3])
    assert first & set(plain) and second & set(plain)
    got: list = []
    st, j, _ = _state(tmp_path, got)
    part1 = [sp for sp in spans if sp.trace_id in first]
    j.opened((sp.run_id, sp.trace_id, len(sp.events)) for sp in part1)
    st.add(part1, now=0.0)
    st.sweep(now=4000.0)                          # the first third: checked, its findings emitted
    part2 = [sp for sp in spans if sp.trace_id in second]
    j.opened((sp.run_id, sp.trace_id, len(sp.events)) for sp in part2)
    st.add(part2, now=4001.0)                     # the second third: held when the process dies
    before = list(got)
    _kill(j)

    st2, j2, unchecked2 = _state(tmp_path, got)
    assert sorted(unchecked2) == sorted(second)   # every trace held at the kill is reported, once
    assert st2.unchecked == {(spans[0].run_id, "state lost"): len(second)}
    assert st2.unchecked_records == sum(len(sp.events) for sp in part2)   # how many records died, said
    # the collector resends everything (retries, or a replay): nothing checked twice, the lost not checked partly
    j2.opened((sp.run_id, sp.trace_id, len(sp.events)) for sp in spans)
    st2.add(spans, now=0.0)
    st2.finish_all()
    assert st2.late == sum(len(sp.events) for sp in part1)
    assert j2.lost_records == sum(len(sp.events) for sp in part2)
    assert {t for _, t, _ in got[len(before):]} <= set(traces) - first - second
    ids = [finding_id(r, t, f) for r, t, f in got]
    assert len(ids) == len(set(ids)) and before, "no finding emitted twice; the first process emitted some"
    j2.close()

    _, j3, unchecked3 = _state(tmp_path, [])     # a clean stop then a start: nothing is reported again
    assert not unchecked3 and not j3.open_keys
    j3.close()


def test_a_finding_already_emitted_is_not_emitted_again(tmp_path, demo):
    spans = [sp for b in demo[0] for sp in decode(b).spans]
    got: list = []
    st, j, _ = _state(tmp_path, got)
    st.add(spans, now=0.0)
    st.finish_all()
    assert got
    j.close()
    # the same records checked again on a journal that forgot the traces but kept the finding ids (its bound)
    j2 = Journal(str(tmp_path))
    j2.open()
    j2.closed.clear()
    again: list = []
    st2 = ServeState(lambda tr, found: again.extend(found), idle_s=3600, journal=j2)
    st2.add(spans, now=0.0)
    st2.finish_all()
    assert not again and j2.suppressed_repeats == len(got)
    j2.close()


def test_journal_is_locked_bounded_and_survives_a_cut_line(tmp_path, monkeypatch):
    from cptrace_otel.analyze import serve_journal

    j = Journal(str(tmp_path), max_kept=50)
    j.open()
    with pytest.raises(JournalError, match="held by another process"):
        Journal(str(tmp_path)).open()
    monkeypatch.setattr(serve_journal, "MIN_COMPACT_BYTES", 2000)
    for i in range(500):
        j.opened([("run x", f"{i:032x}", 3)])
        j.finalised("run x", f"{i:032x}")
        j.tick()
    # 500 traces wrote ~40 kB of facts; the file stays under twice what is kept (64 bytes a fact) plus a fact
    assert os.path.getsize(j.path) < 2 * 64 * 50 + 200 and len(j.closed) == 50
    j.opened([("run x", "f" * 32, 2), ("run x", "f" * 32, 5)])
    _kill(j)
    with open(j.path, "a") as fh:
        fh.write("O run%20x abc")               # a line cut by a host crash: skipped, counted
    j2 = Journal(str(tmp_path))
    assert j2.open() == [("run x", "f" * 32, 7)] and j2.skipped == 1
    assert j2.state_of("run x", f"{499:032x}") == "late" and j2.state_of("run x", "f" * 32) == "lost"
    j2.close()


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in r.read().decode().splitlines()
                if ln and not ln.startswith("#")}


def _post(port: int, body: bytes) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def _serve(tmp_path, name: str, port: int, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", f"127.0.0.1:{port}",
                          "--idle", "1h", "--state-dir", str(tmp_path / "state"), *extra],
                         stdout=open(tmp_path / f"{name}.out", "w"), stderr=open(tmp_path / f"{name}.err", "w"),
                         cwd=ROOT)
    deadline = time.monotonic() + 30
    while True:
        try:
            _metrics(port)
            return p
        except OSError:
            assert p.poll() is None and time.monotonic() < deadline, (tmp_path / f"{name}.err").read_text()
            time.sleep(0.1)


def test_sigkilled_replica_restarted_reports_every_lost_trace(tmp_path, demo):
    """Real processes: half the requests, SIGKILL, a new process on the same port and folder, the rest. Every
    finding ``check`` gives (of the rules a replica reports) is printed or its trace is reported UNCHECKED; none is
    printed twice; /metrics counts the unchecked traces by run; Alertmanager (an in-test endpoint, as in
    test_serve.py) gets an UNCHECKED alert with the run id."""

    from tests.helpers.otlp_receiver import AlertSink

    am = AlertSink()
    bodies, logs = demo
    port = free_port()
    a = _serve(tmp_path, "a", port)
    half = len(bodies) // 2
    try:
        for b in bodies[:half]:
            _post(port, b)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        b_ = _serve(tmp_path, "b", port, "--alertmanager", am.url,
                    "--alert-interval", "0.5")
        held = {sp.trace_id for b in bodies[:half] for sp in decode(b).spans}
        held_records = sum(decode(b).records for b in bodies[:half])
        m = _metrics(port)
        run_id = decode(bodies[0]).spans[0].run_id
        assert m[f'cptrace_serve_unchecked_traces_total{{run_id="{run_id}",reason="state lost: held when a '
                 f'previous process of this replica died, its records were not checked"}}'] == len(held)
        assert m["cptrace_serve_unchecked_records_total"] == held_records
        for b in bodies[half:]:
            _post(port, b)
        b_.send_signal(signal.SIGTERM)
        rc = b_.wait(timeout=60)
    finally:
        am.close()
        for p in (a, locals().get("b_")):
            if p is not None and p.poll() is None:
                p.kill()
    lines = (tmp_path / "a.out").read_text().splitlines() + (tmp_path / "b.out").read_text().splitlines()
    lost = {m[2] for ln in lines if (m := UNCHECKED.match(ln))}
    assert lost == held
    found = [(m[1], m[2], int(m[4]), int(m[5]) if m[5] else None, int(m[6]), m[7])
             for ln in lines if (m := FINDING.match(ln))]
    assert len(found) == len(set(found)), "no finding printed twice"
    assert len(found) + len(lost) == len([ln for ln in lines if ln.strip()])
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(p) for p in logs.glob("rank*.log"))], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    want = [f for f in json.loads(c.stdout)["findings"] if f["rule"] in TRACE_RULES | PARTIAL_RULES]
    assert want, "the faults give findings a replica reports"
    from cptrace_otel.analyze.finding_sinks import finding_trace
    from cptrace_otel.checks import Finding

    for f in want:
        key = (f["code"], f["rule"], f["rank"], f["node_id"], f["epoch"], str(f["evidence"][-1]))
        tid = finding_trace(run_id, Finding(**{k: f[k] for k in ("code", "rule", "rank", "epoch", "node_id", "op",
                                                                  "certainty", "evidence", "message")})).hex()
        assert key in set(found) or tid in lost, f"finding {key} neither reported nor its trace reported lost"
    unchecked_alerts = [a for a in am.alerts() if a["labels"]["code"] == "UNCHECKED"]
    assert unchecked_alerts and all(a["labels"]["run_id"] == run_id for a in unchecked_alerts)
    assert f"{len(held)} findings" in unchecked_alerts[-1]["annotations"]["message"]   # one alert, the count
    assert "NOT checked" in unchecked_alerts[-1]["annotations"]["summary"]
    assert rc == (1 if found else 4)   # a run with traces lost is never a clean exit
    err = (tmp_path / "b.err").read_text()
    assert f"{len(held)} trace(s) held when the previous process died, reported UNCHECKED" in err
    assert re.search(r"[1-9]\d* later record\(s\) of them", err.strip().splitlines()[-1])


def test_a_trace_whose_first_records_went_elsewhere_is_reported_not_checked(demo):
    """The resolver moved traces mid-life: each trace's spans cut at a random point, the tails sent to a replica
    alone. A tail without a rank's first lane span is reported UNCHECKED (reason CUT) and none of its records is
    checked; the tails that are checked give no finding the whole traces do not; no whole trace is reported."""
    import random

    from cptrace_otel.analyze.serve_state import CUT, GROUP_SHORT

    spans = [sp for b in demo[0] for sp in decode(b).spans]

    def replica(part):
        got, unchecked = set(), []
        st = ServeState(lambda tr, found: got.update((tr.trace_id, f.code, f.rule, f.rank, f.node_id, f.epoch,
                                                      f.evidence[-1]) for f in found),
                        idle_s=3600, unchecked=lambda r, t, why, n: unchecked.append((t, why, n)))
        st.add(part, now=0.0)
        st.finish_all()
        return st, got, unchecked

    _, whole, none = replica(spans)
    assert whole and not none
    by: dict = {}
    for sp in spans:
        by.setdefault(sp.trace_id, []).append(sp)
    rnd = random.Random(7)
    tails = [sp for sps in by.values() for sp in sps[rnd.randrange(1, len(sps) + 1):]]
    st, got, unchecked = replica(tails)
    # a tail may also hold one rank alone: checked, its cross-rank joins named UNCHECKED (GROUP_SHORT, no record)
    assert unchecked and CUT in {why for _, why, _ in unchecked} <= {CUT, GROUP_SHORT}
    assert all(n == 0 for _, why, n in unchecked if why == GROUP_SHORT)
    cut = {t for t, why, _ in unchecked if why == CUT}
    assert st.events_checked == sum(len(sp.events) for sp in tails if sp.trace_id not in cut)
    assert sum(n for _, _, n in unchecked) == sum(len(sp.events) for sp in tails if sp.trace_id in cut)
    assert got <= whole and not {f for f in got if f[0] in cut}


def test_a_node_trace_without_a_rank_of_its_group_is_not_joined(tmp_path):
    """C3-C5 join a node's records of every rank of the CP group: a node trace a replica holds without some rank's
    spans (the resolver sent them elsewhere) is checked for the other rules, gives no C3-C5 (a head holding the
    other ranks gave a false C3; a part holding the faulted rank alone missed it silently) and is named UNCHECKED
    for them; the whole traces give C3 as ``check`` does, none named."""
    from cptrace_otel.analyze.serve_state import GROUP_SHORT, LOCKSTEP_RULES

    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", "sharded",
                        "--faults", "C3_writer", "--out", str(out), "--json"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    by_rank = [[sp for ln in f.read_text().splitlines() if ln.strip()
                for sp in decode(parse_json_line(ln).SerializeToString()).spans]
               for f in sorted(out.glob("*.otlp.jsonl"))]
    assert len(by_rank) == 4

    def replica(spans):
        got, unchecked = [], []
        st = ServeState(lambda tr, found: got.extend(f for f in found), idle_s=3600,
                        unchecked=lambda r, t, why, n: unchecked.append((t, why, n)))
        st.add(spans, now=0.0)
        st.finish_all()
        return got, unchecked

    whole, none = replica([sp for spans in by_rank for sp in spans])
    assert not none and any(f.rule == "C3" for f in whole)
    for part in ([sp for spans in by_rank[:3] for sp in spans], by_rank[3]):   # three ranks; the fourth alone
        got, unchecked = replica(part)
        assert not [f for f in got if f.rule in LOCKSTEP_RULES]
        assert unchecked and {why for _, why, _ in unchecked} == {GROUP_SHORT}
