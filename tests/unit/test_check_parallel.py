"""``check -j N``: worker processes give the output of one process, byte for byte (text, ``--json``, stderr's
warnings, exit code), on simulator runs with findings of every code family, malformed lines, errors; a worker that
dies is an error, never a pass. The workers are real processes (spawn) reading real files."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cptrace_otel.analyze import parallel
from cptrace_otel.cli import parse_args
from cptrace_otel.commands import check as check_cmd
from cptrace_otel.sim.faults import FAULTS
from cptrace_otel.sim.workload import random_workload, run_fault


def _check(paths: list[str], jobs: int, *flags: str) -> tuple[int, str, str]:
    args = parse_args(["check", "-j", str(jobs), "--no-progress", *flags, *paths])
    out, err = io.StringIO(), io.StringIO()
    rc = check_cmd.run(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def _same(paths: list[str], *flags: str, jobs: tuple[int, ...] = (2, 3)) -> tuple[int, str, str]:
    one = _check(paths, 1, *flags)
    for j in jobs:
        assert _check(paths, j, *flags) == one, f"-j {j} differs from -j 1"
    return one


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs check_logs did in workers (so a test cannot pass by falling back to one process)."""
    done: list[int] = []
    real = parallel.check_logs

    def spy(paths, jobs, *a):
        res = real(paths, jobs, *a)
        if res is not None:
            done.append(jobs)
        return res

    monkeypatch.setattr(parallel, "check_logs", spy)
    return done


# one scenario per fault kind, in a multi-rank mode where it applies (C3_writer: sharded only)
_MATRIX = [(k, "sharded" if "sharded" in f.modes and k == "C3_writer" else
            next(m for m in ("replicated", "shared", "sharded") if m in f.modes)) for k, f in FAULTS.items()]


@pytest.mark.parametrize("kind,mode", _MATRIX)
def test_fault_runs_byte_identical(tmp_path, monkeypatch, kind, mode):
    spy = _spy(monkeypatch)
    sim = run_fault(kind, mode, ranks=3)
    paths = sim.emitter.write(str(tmp_path))
    rc, out, _err = _same(paths)
    assert rc == 1 and "no findings" not in out, out   # every fault is found ...
    _same(paths, "--json", jobs=(3,))
    assert spy and all(j > 1 for j in spy)             # ... by workers, not by a fallback


def test_every_code_family_found_by_workers(tmp_path, monkeypatch):
    """The matrix above covers the per-rank and the cross-rank families: their codes, as -j 2 reports them."""
    import json

    codes = set()
    for kind, mode in _MATRIX:
        d = tmp_path / kind
        paths = run_fault(kind, mode, ranks=3).emitter.write(str(d))
        _rc, out, _ = _check(paths, 2, "--json")
        codes |= {f["code"] for f in json.loads(out)["findings"]}
    assert {"H1", "H2", "H3", "H4", "ZERO", "HASH", "C1", "C2", "C3"} <= codes, codes


@pytest.mark.parametrize("seed,mode", [(0, "replicated"), (1, "shared"), (2, "sharded"), (3, "dcp")])
def test_random_multirank_runs_byte_identical(tmp_path, seed, mode):
    sim = random_workload(seed, mode, 3, "wt", requests=40)
    paths = sim.emitter.write(str(tmp_path))
    _same(paths)
    _same(paths, "--json", jobs=(2,))


def test_c_rule_findings_and_malformed_lines(tmp_path, monkeypatch):
    """A divergent CP run (C1, C3) with malformed lines in two files: the same findings and the same warnings
    (file:line, in the order one process reports them)."""
    spy = _spy(monkeypatch)
    paths = run_fault("C1_div", "replicated", ranks=3).emitter.write(str(tmp_path))
    for p, at in ((paths[0], 3), (paths[2], 7)):
        with open(p) as fh:
            lines = fh.readlines()
        lines.insert(at, "[CPTRACE evict node_id=4 ts=oops\n")
        with open(p, "w") as fh:
            fh.writelines(lines)
    rc, out, err = _same(paths)
    assert rc == 1 and "C1" in out
    assert f"{paths[0]}:4: malformed line" in err and f"{paths[2]}:8: malformed line" in err
    assert err.index(f"{paths[0]}:4:") < err.index(f"{paths[2]}:8:")
    assert spy


def test_many_malformed_lines_capped_the_same(tmp_path):
    """More than 20 malformed lines: the same first 20 warnings, the same count."""
    paths = run_fault("H1_ack", "replicated", ranks=2).emitter.write(str(tmp_path))
    with open(paths[1], "a") as fh:
        fh.write("".join(f"[CPTRACE insert node_id={i}\n" for i in range(30)))
    _same(paths, jobs=(2,))
    _same(paths, "--json", jobs=(2,))


def test_empty_input_is_an_error(tmp_path):
    a, b = tmp_path / "rank0.log", tmp_path / "rank1.log"
    a.write_text("")
    b.write_text("")
    rc, _out, err = _same([str(a), str(b)], jobs=(2,))
    assert rc == 3 and err


def test_unreadable_rank_file_is_an_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    paths = run_fault("H1_ack", "replicated", ranks=2).emitter.write(str(tmp_path))
    os.chmod(paths[1], 0)
    rc, _out, err = _same(paths, jobs=(2,))
    assert rc == 3 and paths[1] in err


def test_rank_file_that_cannot_be_opened_is_the_readers_error(tmp_path):
    """A rank file gone between the listing and the read: the same error as the one-process reader's."""
    from cptrace_otel.analyze.sources.logs import LogReadError, LogStats, read_log_events

    paths = run_fault("H1_ack", "replicated", ranks=3).emitter.write(str(tmp_path))
    os.remove(paths[1])
    with pytest.raises(LogReadError) as one:
        read_log_events(paths)
    with pytest.raises(LogReadError) as par:
        parallel.check_logs(paths, 2, None, None, "", lambda m: None, LogStats(), None)
    assert str(par.value) == str(one.value) and paths[1] in str(par.value)


def test_file_of_several_ranks_falls_back_to_one_process(tmp_path, monkeypatch):
    """A file holding two ranks (the reader renumbers them in merge order): checked in one process, same output."""
    spy = _spy(monkeypatch)
    sim = run_fault("C2_round", "replicated", ranks=3)
    paths = sim.emitter.write(str(tmp_path))
    with open(paths[0], "a") as fh, open(paths[1]) as src:
        fh.write(src.read())   # rank 1 also in rank0.log, after rank 0's lines
    _same(paths, jobs=(2,))
    assert spy == []


def test_ranks_that_differ_in_mode_fall_back_to_one_process(tmp_path, monkeypatch):
    """A worker sends a rank's free and store records as counts once the rank's config names a mode other than
    shared (only the store fence of mode shared reads them). Here the group's mode is shared (rank 1's config
    comes first) while rank 0's says replicated, and only rank 0 logs the store the fence finds: the run is checked
    in one process, with the same output (the workers' result would lack what rank 0's records give)."""
    spy = _spy(monkeypatch)
    sim = run_fault("ZERO_race", "shared", ranks=2)
    paths = sim.emitter.write(str(tmp_path))
    with open(paths[0]) as fh:
        r0 = fh.read()
    with open(paths[0], "w") as fh:
        fh.write(r0.replace("mode=shared", "mode=replicated", 1))
    with open(paths[1]) as fh:
        r1 = fh.read().replace("ts=1000000002", "ts=1", 1)   # (rank 1's config, and its file, first in the merge)
    assert "mode=shared" in r1.splitlines()[0] and "ts=1\n" in r1.splitlines(True)[0]
    with open(paths[1], "w") as fh:
        fh.write("".join(line for line in r1.splitlines(True) if "CPTRACE store" not in line))
    rc, out, _err = _same(paths, jobs=(2,))
    assert rc == 1 and "C5-fence" in out
    assert spy == []


def test_worker_that_dies_is_an_error_never_a_pass(tmp_path, monkeypatch):
    """A worker killed mid-run (it cannot have finished: its pipe is full until the parent reads): exit 3 with a
    message naming its files, no report on stdout."""
    sim = random_workload(5, "replicated", 2, "wt", requests=400)
    paths = sim.emitter.write(str(tmp_path))
    real = parallel._Pool.get
    monkeypatch.setattr(parallel, "PIPE_BYTES", 4096)

    def get(self, w):
        if self.procs[w].poll() is None:
            self.procs[w].kill()
            self.procs[w].wait()
        return real(self, w)

    monkeypatch.setattr(parallel._Pool, "get", get)
    rc, out, err = _check(paths, 2)
    assert rc == 3 and out == ""
    assert "check worker (reading " in err and "without a result" in err


def test_worker_exception_is_reported_with_its_message(tmp_path):
    """An exception inside a worker (here: L3 state from an earlier run it cannot take) ends the run with its
    message."""
    from types import SimpleNamespace

    from cptrace_otel.analyze.sources.logs import LogStats

    paths = run_fault("H1_ack", "replicated", ranks=2).emitter.write(str(tmp_path))
    broken = SimpleNamespace(keys=SimpleNamespace(cap=4, items=lambda: [1, 2], __len__=None))
    broken.keys = _Keys()
    with pytest.raises(parallel.WorkerFailed, match="failed: TypeError"):
        parallel.check_logs(paths, 2, None, broken, "", lambda m: None, LogStats(), None)


class _Keys(dict):
    cap = 4

    def items(self):   # not (key, value) pairs
        return [1, 2]

    def __len__(self) -> int:
        return 2


def test_jobs_default_and_single_file():
    ns = parse_args(["check", "a", "b"])
    assert ns.jobs is None
    assert parallel.jobs_for(ns, [__file__, __file__]) == 1   # by default a small run stays in one process
    assert parallel.idle_jobs(2, 0.3) == 2 and parallel.idle_jobs(2, 0.6) == 1   # the CPUs the load leaves idle
    assert parallel.idle_jobs(2, 7.5) == 1 and parallel.idle_jobs(16, 3.0) == 13 and parallel.idle_jobs(4, None) == 4
    assert parallel.default_jobs() == len(os.sched_getaffinity(0))
    auto = parse_args(["check", "-j", "0", "a", "b"])
    assert parallel.jobs_for(auto, [__file__, __file__]) == 1   # -j 0: the CPUs, but a small run stays in one
    one = parse_args(["check", "-j", "4", "a"])
    assert parallel.jobs_for(one, ["a"]) == 1            # one file: nothing to split
    assert parallel.jobs_for(one, ["-", "b"]) == 1       # standard input: one process
    two = parse_args(["check", "-j", "4", "a", "b"])
    assert parallel.jobs_for(two, ["a", "b"]) == 2       # at most one worker per file
    rc = check_cmd.run(parse_args(["check", "-j", "-1", "a"]), io.StringIO(), io.StringIO())
    assert rc == 2


def test_jobs_default_follows_the_idle_cpus(monkeypatch):
    """Without -j, a run past MIN_BYTES gets the CPUs the load average leaves idle: all on an idle machine, one
    process on a busy one (where -j 2 was measured slower than -j 1), and -j 0 every CPU whatever the load."""
    ns, auto = parse_args(["check", "a", "b"]), parse_args(["check", "-j", "0", "a", "b"])
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "default_jobs", lambda: 4)
    files = [__file__, __file__, __file__]
    monkeypatch.setattr(parallel, "load_average", lambda: 0.2)
    assert parallel.jobs_for(ns, files) == 3   # 4 idle CPUs, one worker per file
    monkeypatch.setattr(parallel, "load_average", lambda: 2.7)
    assert parallel.jobs_for(ns, files) == 1
    assert parallel.jobs_for(auto, files) == 3
    monkeypatch.setattr(parallel, "load_average", lambda: None)
    assert parallel.jobs_for(ns, files) == 3


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["replicated", "shared", "sharded", "dcp"]),
       ranks=st.integers(2, 4), level=st.integers(1, 3), lag=st.integers(0, 3000), cut=st.sampled_from([0.0, 0.3]),
       faults=st.lists(st.sampled_from(sorted(FAULTS)), max_size=2), chop=st.integers(0, 40))
def test_generated_streams_split_across_ranks(tmp_path_factory, seed, mode, ranks, level, lag, cut, faults, chop):
    """Generated record streams (random workloads, random faults and levels, rank lag, a rank's log cut short
    mid-line): -j 1 and -j 2 print the same."""
    from cptrace_otel.sim.faults import FaultPlan

    plans = [FaultPlan(k, rank=seed % ranks, nth=1) for k in faults if mode in FAULTS[k].modes]
    try:
        sim = random_workload(seed, mode, ranks, "wt", level=level, faults=plans, requests=16, lag_ns=lag, cut=cut)
    except ValueError:
        return   # a fault the simulator cannot place in this workload
    d = tmp_path_factory.mktemp("gen")
    paths = sim.emitter.write(str(d))
    if chop:
        with open(paths[-1], "rb+") as fh:
            size = fh.seek(0, 2)
            fh.truncate(max(0, size - chop))
    _same(paths, jobs=(2,))


def _cross_both_ways(events: list) -> tuple[list, list]:
    """CrossRank fed every record, and fed only what a check -j worker sends (crossrank.sent_tags of the mode of the
    record's rank's first config naming one), the rest as skip() runs. Findings and unchecked of each."""
    from cptrace_otel.checks.crossrank import READS, CrossRank, sent_tags
    from cptrace_otel.model.events import Event

    assert all(isinstance(e, Event) for e in events)
    a, b = CrossRank(), CrossRank()
    for e in events:
        a.feed(e)
    modes: dict[int, str] = {}

    def sent(e: Event) -> bool:
        if e.tag == "config" and e.rank not in modes and isinstance(e.fields.get("mode"), str):
            modes[e.rank] = e.fields["mode"]
        return e.tag in sent_tags(modes.get(e.rank))

    run: list = []
    for e in events + [None]:
        if e is not None and not sent(e) and (not run or run[0].rank == e.rank):
            run.append(e)
            continue
        if run:
            b.skip(run[0].rank, len(run), max(x.level for x in run))
            run = []
        if e is not None:
            if sent(e):
                b.feed(e)
            else:
                run.append(e)
    assert b.mode != "shared" or not any(e.tag in READS and e.tag not in sent_tags(modes.get(e.rank))
                                        for e in events)   # (the parent's condition for replaying such skips)
    got = []
    for c in (a, b):
        got.append(([f.to_dict() for f in c.finish()], [repr(u) for u in c.unchecked()], c.level, c.disabled))
    return got[0], got[1]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["replicated", "shared", "sharded"]),
       faults=st.lists(st.sampled_from(["C2_round", "C1_div", "H1_ack", "C3_writer"]), max_size=2),
       noise=st.lists(st.tuples(st.integers(0, 10_000),
                                st.sampled_from(["compose", "rid_map", "fwd_hash", "free", "store"]),
                                st.integers(1, 3)), max_size=60), merge=st.booleans(),
       keyless=st.booleans())
def test_skip_is_feed_of_records_no_cross_rule_reads(seed, mode, faults, noise, merge, keyless):
    """Generated streams with records no cross-rank rule reads dropped in anywhere (between the acks of a round
    too, with and without round=), and free and store records, which only mode shared's fence reads: the
    cross-rank rules give the same findings, unchecked list and level with those records skipped."""
    from cptrace_otel.sim.faults import FaultPlan

    plans = [FaultPlan(k, rank=1, nth=1) for k in faults if mode in FAULTS[k].modes]
    try:
        sim = random_workload(seed, mode, 2, "wt", level=2, faults=plans, requests=12, merge=merge)
    except ValueError:
        return
    events = sim.emitter.events()
    from cptrace_otel.model.events import Event

    if keyless:   # acks without round= (upstream's shape): a round ends at the rank's next record of any tag
        for e in events:
            if e.tag == "ack":
                e.fields.pop("round", None)

    for pos, tag, lv in sorted(noise, reverse=True):
        at = pos % (len(events) + 1)
        near = events[min(at, len(events) - 1)]
        events.insert(at, Event(tag, near.rank, near.seq, near.ts, near.epoch, {"node_id": 1}, lv, "x", 0))
    full, skipped = _cross_both_ways(events)
    assert skipped == full


def test_skip_counts_towards_the_single_rank_switch_off():
    from cptrace_otel.checks.crossrank import CrossRank
    from cptrace_otel.model.events import Event

    one = [Event("compose", 0, i, i, 0, {}, 1, "x", 0) for i in range(CrossRank.SINGLE_RANK_AFTER + 5)]
    one.append(Event("insert", 0, len(one), len(one), 0, {"node_id": 3}, 1, "x", 0))
    full, skipped = _cross_both_ways(one)
    assert full[3] is True and skipped == full


def test_an_earlier_runs_l3_backups_reach_the_workers_of_a_later_run(tmp_path, monkeypatch):
    """Two runs of two rank files each (two folders): the first run's L3 backups, absorbed from its workers, judge
    the second run's fetch in the second run's workers (FOREIGN), as in one process."""
    from tests.helpers.checks_util import R

    spy = _spy(monkeypatch)
    keys = "[a1f0_m_0_1,b2e1_m_0_1]"
    cfg = ("[CPTRACE config] cp_size=2 cp_rank={r} page_size=4 level=2 layout=layer_first model=org/m "
           "kv_dtype={dt} rank={r} ts=0")
    backup = [cfg.format(dt="float32", r="{r}"),
              f"[CPTRACE l3_backup] node_id=1 op=3 keys={keys} hp=[701,702] host={R(64, 71)} io=1 rank={{r}} ts=5",
              "[CPTRACE l3_ack] dir=backup op=3 node_id=1 done=2 rank={r} ts=6"]
    fetch = [cfg.format(dt="bfloat16", r="{r}"),
             f"[CPTRACE l3_prefetch] op=9 rid=req7 node_id=0 keys={keys} host={R(32, 39)} rank={{r}} ts=2",
             f"[CPTRACE l3_ack] dir=prefetch op=9 node_id=0 done=2 keys={keys} hp=[701,702] rank={{r}} ts=3",
             f"[CPTRACE l3_hit] node_id=5 op=9 keys={keys} host={R(32, 39)} rank={{r}} ts=4"]
    paths = []
    for folder, lines in (("a", backup), ("b", fetch)):
        (tmp_path / folder).mkdir()
        for r in (0, 1):
            p = tmp_path / folder / f"rank-{r}.log"
            p.write_text("".join(x.format(r=r) + "\n" for x in lines))
            paths.append(str(p))
    rc, out, _err = _same(paths, jobs=(2,))
    assert rc == 1 and "FOREIGN" in out and "kv_dtype float32" in out, out
    assert spy == [2, 2]   # both runs by workers


def test_gzip_rank_files_and_a_cut_off_stream(tmp_path, monkeypatch):
    """gzip-compressed rank files, one of them cut off mid-stream (reported where it broke): the same output."""
    import gzip

    spy = _spy(monkeypatch)
    paths = run_fault("C2_round", "replicated", ranks=3).emitter.write(str(tmp_path))
    gz = []
    for p in paths:
        with open(p, "rb") as fh:
            data = gzip.compress(fh.read())
        with open(p + ".gz", "wb") as fh:
            fh.write(data[:len(data) * 2 // 3] if p == paths[1] else data)
        os.remove(p)
        gz.append(p + ".gz")
    rc, _out, err = _same(gz, jobs=(2,))
    assert rc == 1
    assert "ends early" in err and spy


def test_workers_import_the_parents_package_whatever_the_working_directory(tmp_path, monkeypatch):
    """``check -j`` started in a folder that holds another ``cptrace_otel`` (a checkout, a broken copy): the workers
    run the parent's package, not that one."""
    spy = _spy(monkeypatch)
    paths = run_fault("H1_ack", "replicated", ranks=2).emitter.write(str(tmp_path / "logs"))
    decoy = tmp_path / "cwd" / "cptrace_otel"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy package in the working directory')\n")
    monkeypatch.chdir(decoy.parent)
    rc, out, _err = _same(paths, jobs=(2,))
    assert rc == 1 and "H1" in out
    assert spy == [2]
