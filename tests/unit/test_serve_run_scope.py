"""A run-scope replica (``serve --scope run``: every span of a run, behind the collector's ``load_balancing/runs``
exporter) over the simulator's faulted runs: real OTLP bytes from ``cptrace-otel demo``, decoded by the replica's
intake, against ``check`` over the same run's log files.

* every rule's findings, exactly ``check``'s (C1 and C2 among them: the rules a trace-scope replica cannot decide),
  whether the requests come in the order the exporters sent them or shuffled within the reorder window;
* a record that comes behind its rank's reorder window is not checked and is counted, never passed;
* the settings a run scope cannot take are refused (the state's and the command's)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from cptrace_otel.analyze.otlp_intake import decode
from cptrace_otel.analyze.serve_confirm import StoreConfirm
from cptrace_otel.analyze.serve_state import ServeState, unchecked_rules
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import parse_json_line

RUNS = {"4-sharded": (4, "sharded", "HASH_flip,ZERO_nostore,H1_ack,H4_nolock,C3_writer,C1_div,C2_round"),
        "4-shared": (4, "shared", "H4_nolock,HASH_flip,C1_div")}


def _key(f) -> tuple:
    return (f["code"], f["rule"], f["rank"], f["epoch"], f["node_id"], tuple(f["evidence"]))


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory) -> tuple[list[bytes], set[tuple]]:
    """A faulted run's OTLP requests (protobuf, in the order the exporters sent them) and ``check``'s findings."""
    ranks, mode, faults = RUNS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", str(ranks), "--mode", mode,
                        "--seed", "1", "--faults", faults, "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert d.returncode in (0, 1), d.stderr[-2000:]
    bodies = [parse_json_line(ln).SerializeToString() for f in sorted(out.glob("*.otlp.jsonl"))
              for ln in f.read_text().splitlines() if ln.strip()]
    c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                        *sorted(str(p) for p in out.glob("rank*.log"))], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert c.returncode == 1, c.stderr[-2000:]
    return bodies, {_key(f) for f in json.loads(c.stdout)["findings"]}


def _replica(bodies: list, step_s: float, **kw) -> tuple[list[tuple], ServeState]:
    """(the findings, the state) of a run-scope replica given ``bodies`` (requests, or lists of spans) one per
    ``step_s``."""
    got: list[tuple] = []
    st = ServeState(lambda tr, found: got.extend(_key(f.to_dict()) for f in found), idle_s=3600, live=True,
                    scope="run", window=65536, **kw)
    for i, b in enumerate(bodies):
        st.add(decode(b).spans if isinstance(b, bytes) else b, now=i * step_s)
        st.sweep(now=i * step_s)
    st.finish_all()
    return got, st


def test_a_run_checked_whole_gives_every_rule_check_gives(run):
    bodies, want = run
    assert {"C1"} <= {k[1] for k in want}, "the run has no finding a trace-scope replica cannot decide"
    got, st = _replica(bodies, 0.01)
    assert len(got) == len(set(got)), "no finding reported twice"
    assert set(got) == want
    assert st.past_window == 0 and not st.suppressed and st.events_checked == sum(decode(b).records for b in bodies)
    assert unchecked_rules("run") == [] and "C1" in unchecked_rules()


def test_requests_shuffled_within_the_reorder_window_give_the_same_findings(run):
    bodies, want = run
    shuffled = bodies[:]
    random.Random(7).shuffle(shuffled)
    got, st = _replica(shuffled, 0.0)   # all within one window: the per-rank windows and the merge reorder them
    assert set(got) == want and st.past_window == 0
    spans = [sp for b in bodies for sp in decode(b).spans]
    random.Random(8).shuffle(spans)     # a rank's config record (its rank trace's span) after its node spans
    got, st = _replica([spans[i:i + 10] for i in range(0, len(spans), 10)], 0.0)
    assert sorted(got) == sorted(want) and st.past_window == 0
    # a config record that came after its stamp led the rank's records: the same record again, not fed twice
    assert st.events_checked + st.duplicates == sum(len(sp.events) for sp in spans) and st.duplicates <= 4


def test_a_record_behind_its_reorder_window_is_counted_not_checked(run):
    bodies, _ = run
    first = sorted(decode(bodies[0]).spans, key=lambda s: min(ev.seq for ev in s.events))
    k = len(first) // 2   # rank 0's earlier spans come 5 s after its later ones: behind its 2 s window
    notes: list[str] = []
    _, st = _replica([first[k:], *bodies[1:], first[:k]], 5.0, window_s=2.0, note=notes.append)
    behind = sum(len(s.events) for s in first[:k] if min(ev.seq for ev in s.events) > 0)
    assert st.past_window >= behind > 0
    assert any("behind their rank's reorder window" in n and "NOT checked" in n for n in notes)


def test_what_a_run_scope_cannot_take_is_refused(tmp_path):
    with pytest.raises(ValueError, match="live"):
        ServeState(lambda tr, f: None, scope="run")
    with pytest.raises(ValueError, match="span store"):
        ServeState(lambda tr, f: None, scope="run", live=True, confirm=StoreConfirm(lookup=lambda t: []))
    with pytest.raises(ValueError, match="scope"):
        ServeState(lambda tr, f: None, scope="node")
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0", "--scope", "run",
                        "--confirm-url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "--confirm-url" in p.stderr, p.stderr
