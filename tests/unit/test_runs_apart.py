"""One run is one run: records of several runs read together are judged run by run.

Real demo runs (rank processes writing log and OTLP files) checked together, as files and as a folder; a fault in
one of two runs; ``--run-id`` on files; many runs (the summary stays bounded, no step grows with the square of the
runs); and a Hypothesis property: checking several independent runs together gives exactly the union of checking each
alone, every finding tagged with its run.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers.demo_run import check, core, run_demo


def _lines(path: str) -> list[str]:
    with open(path) as fh:
        return [ln for ln in fh if ln.strip()]


def _with_run_id(line: str, run_id: str) -> str:
    """One OTLP JSON line with every resource's ``cptrace.run_id`` set to ``run_id``."""
    req = json.loads(line)
    for rs in req["resourceSpans"]:
        for a in rs["resource"]["attributes"]:
            if a["key"] == "cptrace.run_id":
                a["value"] = {"stringValue": run_id}
    return json.dumps(req, separators=(",", ":")) + "\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three launches of two ranks, in folders of their own: two healthy (seeds 1 and 2), one with an H1 fault."""
    base = tmp_path_factory.mktemp("runs")
    return {name: run_demo(base / where / name, ranks=2, faults=faults, seed=seed)
            for where, name, faults, seed in (("healthy", "r1", "none", 1), ("healthy", "r2", "none", 2),
                                              ("faulty", "bad", "H1_ack", 2))}


def test_two_healthy_runs_checked_together_are_clean(runs):
    r1, r2 = runs["r1"], runs["r2"]
    assert r1["run_id"] != r2["run_id"]
    for alone in (r1, r2):
        assert check(*alone["otlp"])[0] == 0
    rc, out, err = check("--json", *r1["otlp"], *r2["otlp"])
    assert rc == 0, out + err
    st_ = json.loads(out)["stats"]
    assert st_["runs"] == 2 and st_["runs_with_findings"] == {}
    assert "counted once" not in err   # records of two runs are not one record given twice
    # a folder of two launches (logs and OTLP files each), as README's `check cptrace-out/` reads it
    rc, out, err = check(os.path.dirname(r1["dir"]))
    assert rc == 0, out + err
    assert "2 runs" in out and "runs with findings: 0 of 2" in out
    # log files alone: their lines carry no run id; the same ranks in two folders are two launches
    rc, out, err = check("--json", *r1["logs"], *r2["logs"])
    assert rc == 0, out + err
    assert json.loads(out)["stats"]["runs"] == 2


def test_one_launchs_rank_logs_in_several_folders_are_one_run(tmp_path, runs):
    """Rank logs of one launch gathered from several places (each rank's file in a folder of its own, as copied
    from the hosts) are one run: no rank recurs across the folders, so the cross-rank rules see every rank together.
    The same records split into two launches would leave each rank alone, and the H1 fault's cross-rank view with it;
    the result equals that of the files in their own folder."""
    import shutil

    bad = runs["bad"]
    whole = check("--json", *bad["logs"])
    moved = []
    for i, p in enumerate(bad["logs"]):
        dst = tmp_path / f"host{i}" / os.path.basename(p)
        dst.parent.mkdir()
        shutil.copy(p, dst)
        moved.append(str(dst))
    apart = check("--json", *moved)
    assert whole[0] == apart[0] == 1, apart[1] + apart[2]
    w, a = json.loads(whole[1]), json.loads(apart[1])
    assert a["stats"]["runs"] == 1
    assert [(f["code"], f["rank"], f["message"]) for f in a["findings"]] == \
        [(f["code"], f["rank"], f["message"]) for f in w["findings"]]
    from cptrace_otel.analyze.sources.overlap import log_runs
    assert list(log_runs(moved)) == [str(tmp_path)]
    assert len(log_runs([*runs["r1"]["logs"], *runs["r2"]["logs"]])) == 2


def test_log_files_beside_trace_files_of_several_runs_count_once(tmp_path, runs):
    """One folder: a run's log files and OTLP files, and the OTLP files of another run. The logs are compared with
    each run and counted once with the run they copy; nothing is checked twice, nothing is a run of its own."""
    import shutil

    r1, bad = runs["r1"], runs["bad"]
    d = tmp_path / "mixed"
    d.mkdir()
    for p in r1["logs"] + r1["otlp"]:
        shutil.copy(p, d)
    for i, p in enumerate(bad["otlp"]):   # a run id sorted before the logs' run: not the first one compared
        (d / f"other{i}.otlp.jsonl").write_text("".join(_with_run_id(ln, "0-other") for ln in _lines(p)))
    rc, out, err = check("--json", str(d))
    assert rc == 1, err
    obj = json.loads(out)
    assert obj["stats"]["runs"] == 2 and "counted once, from the log files" in err
    assert set(obj["stats"]["runs_with_findings"]) == {"0-other"}
    assert obj["stats"]["sources"]["logs"] and len(obj["stats"]["sources"]["otlp"]) == len(bad["otlp"])
    assert core(out) == core(check("--json", *bad["otlp"])[1])


def test_a_fault_in_one_run_is_found_in_that_run_only(runs):
    ok, bad = runs["r1"], runs["bad"]
    rc, alone, _ = check("--json", *bad["otlp"])
    assert rc == 1
    rc, out, err = check("--json", *ok["otlp"], *bad["otlp"])
    assert rc == 1, err
    obj = json.loads(out)
    assert obj["findings"] and {f["run"] for f in obj["findings"]} == {bad["run_id"]}
    assert core(out) == core(alone) and core(out, keep_run=True) == core(alone, keep_run=True)
    assert obj["stats"]["runs_with_findings"] == {bad["run_id"]: len(obj["findings"])}
    # the trace id of a finding is its own run's
    assert [f["trace_id"] for f in obj["findings"]] == [f["trace_id"] for f in json.loads(alone)["findings"]]
    rc, text, _ = check(ok["dir"], bad["dir"])
    assert rc == 1
    assert f"runs with findings: 1 of 2: {bad['run_id']} (" in text
    assert f"run {bad['run_id']}: node " in text and ok["run_id"] not in text


def test_report_draws_each_run_apart(tmp_path, runs):
    """The HTML report of two runs: one part per run, named by it, with trace links made of that run's id."""
    import hashlib

    from cptrace_otel.cli import main

    ok, bad = runs["r1"], runs["bad"]
    out = str(tmp_path / "two.html")
    assert main(["report", "-o", out, ok["dir"], bad["dir"]]) == 1
    page = open(out).read()
    assert "cptrace-otel report: 2 runs" in page
    assert f"run · {ok['run_id']}" in page and f"run · {bad['run_id']}" in page
    _rc, js, _ = check("--json", bad["dir"])
    f = json.loads(js)["findings"][0]
    tid = hashlib.blake2b(f"{bad['run_id']}|{f['epoch']}|{f['node_id']}".encode(), digest_size=16).hexdigest()
    assert f["trace_id"] == tid and tid in page


def test_ingest_is_one_run_per_folder(tmp_path, runs):
    """ingest gives one run one run id: log files of two launches (their ranks recur in two folders) are refused; each
    folder ingested alone, the two outputs check clean together."""
    from cptrace_otel.cli import main

    r1, r2 = runs["r1"], runs["r2"]
    assert main(["ingest", "--file", str(tmp_path / "both.jsonl"), "--no-progress", *r1["logs"], *r2["logs"]]) == 2
    assert not (tmp_path / "both.jsonl").exists()
    outs = []
    for i, r in enumerate((r1, r2)):
        outs.append(str(tmp_path / f"ingest{i}.otlp.jsonl"))
        assert main(["ingest", "--file", outs[-1], "--no-progress", *r["logs"]]) == 0
    rc, out, err = check("--json", *outs)
    assert rc == 0, err
    assert json.loads(out)["stats"]["runs"] == 2


def test_run_id_selects_a_run_in_files(tmp_path, runs):
    ok, bad = runs["r1"], runs["bad"]
    rc, out, err = check("--json", "--run-id", ok["run_id"], *ok["otlp"], *bad["otlp"])
    assert rc == 0, err
    assert json.loads(out)["stats"]["runs"] == 1
    rc, out, _ = check("--json", "--run-id", bad["run_id"], ok["dir"], bad["dir"])
    assert rc == 1 and {f["run"] for f in json.loads(out)["findings"]} == {bad["run_id"]}
    rc, out, err = check("--run-id", "no-such-run", *ok["otlp"], *bad["otlp"])
    assert rc == 3 and out == ""
    assert "run id no-such-run matches no record" in err and ok["run_id"] in err and bad["run_id"] in err
    # log files of no known run (no trace file copies them) are checked under the given run id, and stderr says so
    import shutil

    logs = tmp_path / "logs-only"
    logs.mkdir()
    for p in ok["logs"]:   # (seed 1: a launch of seed 2 starts with the faulty run's records, the same ts)
        shutil.copy(p, logs)
    rc, out, err = check("--json", "--run-id", "named-here", str(logs), *bad["otlp"])
    assert rc == 0, err
    assert json.loads(out)["stats"]["runs"] == 1 and "matches no trace record" in err


def test_many_runs_one_line_each(tmp_path, runs):
    """100,000 lines with 100,000 run ids: each its own run, checked in one pass; the report counts them."""
    line = _lines(runs["r1"]["otlp"][0])[0]
    req = json.loads(line)
    rs = req["resourceSpans"][0]
    span = rs["scopeSpans"][0]["spans"][0]
    span["events"] = span["events"][:1]          # the config record alone
    rs["scopeSpans"] = [{"scope": rs["scopeSpans"][0]["scope"], "spans": [span]}]
    req["resourceSpans"] = [rs]
    one = json.dumps(req, separators=(",", ":"))
    marker = json.dumps(runs["r1"]["run_id"])
    assert one.count(marker) == 1
    n = 100_000
    p = tmp_path / "many.otlp.jsonl"
    with open(p, "w") as fh:
        for i in range(n):
            fh.write(one.replace(marker, f'"run-{i:06d}"') + "\n")
    rc, out, err = check(str(p))
    assert rc == 0, err
    assert f"{n} events" in out and f"{n} runs" in out and f"runs with findings: 0 of {n}" in out
    assert len(out.splitlines()) < 10 and "counted once" not in err


def test_text_lists_a_bounded_number_of_runs():
    from cptrace_otel.analyze.engine import Result, Runs
    from cptrace_otel.analyze.result_output import RUNS_SHOWN, to_text
    from cptrace_otel.checks import Finding, Unchecked

    runs = Runs()
    for i in range(RUNS_SHOWN + 30):
        f = Finding("H1", "H1b", 0, 1, 5, 7, "exact", [3], "boom")
        u = Unchecked("H4", "H4", None, 2, "level 1")
        runs.add(f"run-{i:03d}", Result([f], [u], {"events": 1, "ranks": [0], "nodes": 1, "levels": {0: 1}}))
    res = runs.result()
    assert len(res.unchecked) == 1 and res.unchecked[0].runs == RUNS_SHOWN + 30
    text = to_text(res)
    assert f"runs with findings: {RUNS_SHOWN + 30} of {RUNS_SHOWN + 30}: run-000 (1)" in text
    assert "and 30 more (see --json)" in text
    assert sum(1 for ln in text.splitlines() if ln.startswith("run run-")) == RUNS_SHOWN
    assert f"all ranks of {RUNS_SHOWN + 30} runs" in text


@pytest.fixture(scope="module")
def pool(runs):
    """Each launch's OTLP lines, per rank file."""
    return [[_lines(p) for p in r["otlp"]] for r in (runs["r1"], runs["r2"], runs["bad"])]


def _tagged(out: str) -> list[str]:
    return sorted(json.dumps(f, sort_keys=True) for f in core(out, keep_run=True))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40)), min_size=1, max_size=4),
       seed=st.integers(0, 2**16), files=st.integers(1, 3))
def test_together_is_the_union_of_each_alone(tmp_path_factory, pool, picks, seed, files):
    """Runs built from the launches (a prefix of each rank's lines, a fresh run id each), their lines shuffled into
    a few files: the findings of all together are the findings of each alone, tagged with its run."""
    d = tmp_path_factory.mktemp("mix")
    rnd = random.Random(seed)
    want: list[str] = []
    every: list[str] = []
    for i, (which, keep) in enumerate(picks):
        run_id = f"run-{i}"
        lines = [_with_run_id(ln, run_id) for rank in pool[which] for ln in rank[:keep]]
        alone = d / f"alone-{i}.otlp.jsonl"
        alone.write_text("".join(lines))
        rc, out, err = check("--json", str(alone))
        assert rc in (0, 1), err
        assert all(f["run"] == run_id for f in json.loads(out)["findings"])
        want += _tagged(out)
        every += lines
    rnd.shuffle(every)
    paths = []
    for k in range(files):
        p = d / f"mixed-{k}.otlp.jsonl"
        p.write_text("".join(every[k::files]))
        paths.append(str(p))
    rc, out, err = check("--json", *[p for p in paths if os.path.getsize(p)])
    assert rc == (1 if want else 0), err
    assert _tagged(out) == sorted(want)
    assert json.loads(out)["stats"]["runs"] == len(picks)


def test_localization_entries_name_their_run_when_runs_are_several():
    from cptrace_otel.analyze.engine import Result, Runs
    from cptrace_otel.analyze.result_output import localization_lines

    runs = Runs()
    for run in ("a", "b"):
        entry = {"verdict": "unpairable", "count": 1, "reason": "no pfp", "ranks": [0]}
        runs.add(run, Result([], [], {"events": 1, "ranks": [0], "nodes": 0, "levels": {}}, [entry]))
    res = runs.result()
    assert [e["run"] for e in res.localization] == ["a", "b"]
    lines = localization_lines(res.localization)
    assert lines[1].startswith("  run a: UNPAIRABLE") and lines[2].startswith("  run b: UNPAIRABLE")
    assert not localization_lines(res.localization[:1])[1].startswith("  run ")


def test_runs_apart_hold_with_records_sorted_on_disk(tmp_path, runs, monkeypatch):
    """The same checks with every few records sorted to disk (TraceDocs' bound on records held): two runs, logs
    beside the trace files of the run they copy (whose trace records on disk are then dropped) and of another run,
    ``--run-id``: the same output as with everything in memory."""
    import shutil

    from cptrace_otel.analyze.sources import sortedruns, tracedocs

    r1, r2, bad = runs["r1"], runs["r2"], runs["bad"]
    d = tmp_path / "mixed"
    d.mkdir()
    for p in r1["logs"] + r1["otlp"]:
        shutil.copy(p, d)
    for i, p in enumerate(bad["otlp"]):
        (d / f"other{i}.otlp.jsonl").write_text("".join(_with_run_id(ln, "0-other") for ln in _lines(p)))
    cases = [("--json", *r1["otlp"], *r2["otlp"], *bad["otlp"]), ("--json", str(d)),
             ("--json", "--run-id", bad["run_id"], *r1["otlp"], *bad["otlp"])]
    before = [check(*c) for c in cases]
    monkeypatch.setattr(tracedocs, "SPILL_AT", 7)
    monkeypatch.setattr(sortedruns, "CHUNK", 3)
    monkeypatch.setattr(sortedruns, "FAN_IN", 4)
    after = [check(*c) for c in cases]
    for (rc0, out0, _err0), (rc1, out1, err1) in zip(before, after, strict=True):
        assert rc0 == rc1, err1
        a, b = json.loads(out0), json.loads(out1)
        assert a["findings"] == b["findings"] and a["stats"]["runs"] == b["stats"]["runs"]
        assert a["stats"]["events"] == b["stats"]["events"]
    assert before[0][0] == 1 and json.loads(before[1][1])["stats"]["runs"] == 2
