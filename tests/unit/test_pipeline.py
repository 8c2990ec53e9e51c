"""The traced process's pipeline: bounded buffer, drops, rendering fuzz, flush/shutdown, worker death, fork."""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time
import typing
from pathlib import Path

import pytest

from cptrace_otel.model import config, records, semconv as sc
from cptrace_otel.model.logline import parse_line, parse_prefix, parse_value
from cptrace_otel.traced import api, drainer, pipeline, ring
from tests.helpers.otlp_receiver import read_jsonl

pytestmark = pytest.mark.usefixtures("fresh_pipeline")


def _configure(tmp_path: Path, exporter: str, **kw) -> str:
    out = str(tmp_path / "out" / "rank{rank}-{pid}.otlp.jsonl")
    api.configure(level=2, run_id="pipe", file=out, exporter=exporter, cp_rank=kw.pop("cp_rank", 0),
                  spool_dir=str(tmp_path / "spool"), **kw)
    return out


def _events(tmp_path: Path, pattern: str = "*.otlp.jsonl") -> list:
    spans = read_jsonl(sorted(glob.glob(str(tmp_path / "out" / pattern))))
    evs = [(e, sp) for sp in spans for e in sp.events]
    evs.sort(key=lambda x: x[0].attrs[sc.SEQ])
    return evs


class BadStr:
    def __str__(self) -> str:
        raise ValueError("no str for you")


class Spacey:
    def __str__(self) -> str:
        return "a b  c"


@pytest.mark.parametrize("exporter", ["thread", "process"])
def test_fuzzed_values_flush_and_render_like_upstream(tmp_path: Path, exporter: str) -> None:
    _configure(tmp_path, exporter)
    huge = "x" * (records.MAX_VALUE_CHARS + 500)
    cases = [
        dict(node_id=1, v=None),
        dict(node_id=1, v=[1, [2, [3, "a b"]], (4, 5)]),
        dict(node_id=1, v=huge),
        dict(node_id=1, v=BadStr()),
        dict(node_id=1, v=[BadStr(), 1]),
        dict(node_id=1, v=True, w=False),
        dict(node_id=1, v=1.25, w=float("inf"), x=float("nan")),
        dict(node_id=1, v=Spacey(), w="with space"),
        dict(node_id=1, v=b"by tes", w={"a": 1}),
        dict(node_id=1, v=-(1 << 70)),
        dict(node_id=1, v="(cnt=2,min=3,max=4,first=3,last=4)"),
    ]
    for f in cases:
        api.cptrace(1, "compose", **f)  # never raises
    api.cptrace(3, "fwd_hash", rid="r")  # above the level: nothing
    assert api.flush(60) is True
    evs = _events(tmp_path)
    assert len(evs) == len(cases)
    got = [e.attrs for e, _ in evs]
    assert got[0]["hicache.v"] == "None"
    assert got[1]["hicache.v"] == "[1,[2,[3,ab]],[4,5]]"
    assert got[2]["hicache.v"].startswith("x" * 1000) and got[2]["hicache.v"].endswith("...(cut:500)")
    assert got[3]["hicache.v"] == "(err:ValueError)"
    assert got[4]["hicache.v"] == "(err:ValueError)"
    assert (got[5]["hicache.v"], got[5]["hicache.w"]) == ("True", "False")
    assert got[6]["hicache.v"] == 1.25 and got[6]["hicache.w"] == "inf" and got[6]["hicache.x"] == "nan"
    assert (got[7]["hicache.v"], got[7]["hicache.w"]) == ("abc", "withspace")
    assert got[8]["hicache.v"] == "b'bytes'" and got[8]["hicache.w"] == "{'a':1}"
    assert got[9]["hicache.v"] == str(-(1 << 70))
    assert [got[10][f"hicache.v.{p}"] for p in sc.RNG_PARTS] == [2, 3, 4, 3, 4]
    assert [e.attrs[sc.SEQ] for e, _ in evs] == list(range(len(cases)))
    st = pipeline.stats()
    assert st["dropped"] == 0 and st["shipped"] == len(cases) and st["exporter"] == exporter


def test_full_buffer_drops_newest_counts_and_exports_the_count(tmp_path: Path) -> None:
    cfg = config.from_env({}, level=1, run_id="drops", file=str(tmp_path / "out" / "d.otlp.jsonl"),
                          exporter="thread", queue_size=5, cp_rank=0, spool_dir=str(tmp_path / "spool"))
    st = pipeline.Pipeline(cfg)  # drainer not started yet: nothing leaves the buffer
    submit = st.make_submit()
    for i in range(12):
        submit(1, "evict", {"node_id": i})
    assert len(st.buf) == 5 and st.dropped == 7
    assert [r[3]["node_id"] for r in st.buf] == [0, 1, 2, 3, 4]  # the oldest are kept, the newest dropped
    st.drainer.start()
    assert st.flush(30) is False   # everything kept was delivered, but 7 records were lost: flush() says so
    st.stop = True
    st.wake.set()
    st.drainer.join(5)
    assert st.channel.close(10)
    spans = read_jsonl([str(tmp_path / "out" / "d.otlp.jsonl")])
    assert sorted(e.attrs["hicache.node_id"] for sp in spans for e in sp.events) == [0, 1, 2, 3, 4]
    rank_spans = [sp for sp in spans if sp.attrs.get(sc.SPAN_KIND) == sc.SPAN_RANK]
    assert rank_spans and rank_spans[-1].attrs[sc.DROPPED] == 7


def test_submit_never_raises() -> None:
    cfg = config.from_env({}, level=1, run_id="x", exporter="thread")
    st = pipeline.Pipeline(cfg)
    st.cap = object()  # type: ignore[assignment]  # the capacity compare now raises: must not reach the caller
    submit = st.make_submit()
    submit(1, "t", {})
    assert len(st.buf) == 0
    rec = records.render_record(0, (1, "notint", 5, {"a": BadStr()}))
    assert rec[2] == 1 and rec[3] == "5" and rec[4] == (("a", "(err:ValueError)"),)


def test_log_lines_sink_round_trips(tmp_path: Path) -> None:
    log = str(tmp_path / "logs" / "cp{rank}.log")
    _configure(tmp_path, "thread", log_file=log, cp_rank=3, tp_rank=3)
    api.cptrace(1, "prepare", node_id=4, op=1, len=2, dev="(cnt=2,min=0,max=1,first=0,last=1)", chain=[1, 2],
                policy="wt")
    api.cptrace(1, "reset")
    assert api.flush(30)
    lines = open(str(tmp_path / "logs" / "cp3.log")).read().splitlines()
    assert len(lines) == 2
    p = parse_line(lines[0])
    assert p.tag == "prepare" and p.fields["node_id"] == 4 and p.fields["chain"] == [1, 2]
    assert p.fields["dev"] == parse_value("(cnt=2,min=0,max=1,first=0,last=1)")
    pre = parse_prefix(p.prefix)
    assert pre.cp_rank == 3 and pre.tp_rank == 3 and pre.wall is not None
    assert lines[0].endswith("[CPTRACE prepare] node_id=4 op=1 len=2 dev=(cnt=2,min=0,max=1,first=0,last=1) "
                             "chain=[1,2] policy=wt")
    assert lines[1].endswith("[CPTRACE reset] ")


@pytest.mark.parametrize("exporter", ["thread", "process"])
def test_stats_are_the_keys_and_types_pipelinestats_declares(tmp_path: Path, exporter: str) -> None:
    """stats() of a running pipeline, and of the last one after shutdown, has exactly the keys PipelineStats declares
    (``ring`` only with the record ring: the process exporter has it here, the thread exporter never), its ints are
    ints, and current() is the pipeline whose figures they are."""
    _configure(tmp_path, exporter)
    api.cptrace(1, "evict", node_id=1)
    api.cptrace(1, "evict", node_id=2, v=BadStr())   # a side record with the ring
    assert api.flush(30)
    p = pipeline.current()
    assert p is not None and (p.ring is not None) == (exporter == "process")
    hints = typing.get_type_hints(pipeline.PipelineStats)
    assert set(pipeline.PipelineStats.__optional_keys__) == {"ring"}
    want = set(pipeline.PipelineStats.__required_keys__) | ({"ring"} if p.ring is not None else set())
    for st in (pipeline.stats(), p.stats()):
        assert set(st) == want
        assert all(isinstance(st[k], int) for k in want if hints[k] is int)
        assert st["shipped"] == 2 and st["dropped"] == 0 and st["exporter"] == exporter
        if p.ring is not None:
            assert set(st["ring"]) == set(ring.RingStats.__required_keys__)
            assert st["ring"]["written"] == 1 and st["ring"]["side"] == 1
    assert api.shutdown(30)
    assert pipeline.current() is None
    last = pipeline.stats()
    assert set(last) == want and last["shipped"] == 2


def test_shutdown_stops_the_worker_and_a_new_record_restarts(tmp_path: Path) -> None:
    _configure(tmp_path, "process")
    api.cptrace(1, "evict", node_id=1)
    st = pipeline.current()
    assert st is not None
    deadline = time.time() + 30
    while st.channel is None and time.time() < deadline:
        time.sleep(0.01)
    proc = st.channel.proc
    assert api.shutdown(30) is True
    assert proc.poll() == 0  # the worker delivered and exited
    assert api._STATE.submit is api._submit_unstarted and pipeline.current() is None
    assert pipeline.flush(1) is True  # nothing running: nothing to wait for
    api.cptrace(1, "evict", node_id=2)
    assert (new := pipeline.current()) is not None and new is not st
    assert api.flush(30)
    assert sorted(e.attrs["hicache.node_id"] for e, _ in _events(tmp_path)) == [1, 2]


def test_dead_worker_drops_and_counts_never_blocks(tmp_path: Path, capfd: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drainer, "MAX_RESTARTS", 0)  # restarts used up: the worker stays dead
    _configure(tmp_path, "process")
    api.cptrace(1, "evict", node_id=1)
    assert api.flush(30)
    st = pipeline.current()
    os.kill(st.channel.proc.pid, signal.SIGKILL)
    st.channel.proc.wait(10)
    deadline = time.time() + 10
    while st.gone is None and time.time() < deadline:
        time.sleep(0.01)
    for i in range(1000):
        api.cptrace(1, "evict", node_id=i)
    assert api.flush(5) is False
    s = pipeline.stats()
    assert s["dropped"] >= 1000 and s["worker_gone"]
    assert "exporter process exited" in capfd.readouterr().err


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_starts_its_own_pipeline(tmp_path: Path) -> None:
    _configure(tmp_path, "process")
    api.cptrace(1, "evict", node_id=1, who="parent")
    assert api.flush(30)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            api.cptrace(1, "evict", node_id=2, who="child")
            code = 0 if api.flush(30) and pipeline.current() is not None else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    api.cptrace(1, "evict", node_id=3, who="parent")
    assert api.flush(30)
    child = _events(tmp_path, f"rank0-{pid}.otlp.jsonl")
    parent = _events(tmp_path, f"rank0-{os.getpid()}.otlp.jsonl")
    assert [e.attrs["hicache.who"] for e, _ in child] == ["child"]
    assert [e.attrs["hicache.node_id"] for e, _ in parent] == [1, 3]
    assert {sp.resource["process.pid"] for _, sp in child} == {pid}


def test_stats_and_json_serializable() -> None:
    json.dumps(pipeline.stats())


def test_deferred_fingerprints_are_resolved_off_the_caller_thread(tmp_path: Path) -> None:
    deferred = pytest.importorskip("cptrace_otel.fingerprint.deferred")

    import threading

    kernel_done = threading.Event()   # the "kernel" completes only when the test says so (or a timer, below)

    class SlowEvent:  # stands in for a CUDA event
        def query(self) -> bool:
            return kernel_done.is_set()

    class Host:
        def __init__(self, vals) -> None:
            self.vals = vals

        def tolist(self):
            return list(self.vals)

    h = deferred.Deferred("khash", deferred.Pending(SlowEvent(), Host([1234567890123])), lambda v: v[0], -1)
    r = deferred.Deferred("rng", deferred.Pending(SlowEvent(), Host([3, 1, 9, 1, 9])),
                          lambda v: f"(cnt={v[0]},min={v[1]},max={v[2]},first={v[3]},last={v[4]})", "(err:x)")
    _configure(tmp_path, "thread")
    timer = threading.Timer(10, kernel_done.set)   # a caller that waits would return only after this
    timer.start()
    try:
        api.cptrace(1, "backup", node_id=1, op=1, h=h, dev=r)
        assert not kernel_done.is_set()   # the caller returned while the "kernel" was still running
    finally:
        timer.cancel()
    kernel_done.set()
    assert api.flush(30)
    (ev, _), = _events(tmp_path)
    assert ev.attrs["hicache.h"] == 1234567890123
    assert [ev.attrs[f"hicache.dev.{p}"] for p in sc.RNG_PARTS] == [3, 1, 9, 1, 9]


@pytest.mark.parametrize("exporter", ["process", "thread"])
def test_exit_without_flush_still_delivers(tmp_path: Path, exporter: str) -> None:
    import subprocess

    code = ("import cptrace_otel as ct\n"
            "for i in range(2000):\n"
            "    ct.cptrace(1, 'evict', node_id=i % 10, i=i)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(CPTRACE_LEVEL="1", CPTRACE_RUN_ID="exit", CPTRACE_EXPORTER=exporter, CPTRACE_CP_RANK="0",
               CPTRACE_FILE=str(tmp_path / "out" / "rank{rank}-{pid}.otlp.jsonl"),
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert sorted(e.attrs["hicache.i"] for e, _ in _events(tmp_path)) == list(range(2000))


def test_a_restarted_worker_numbers_on_past_every_seq_the_dead_one_was_given(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """records shipped to a worker that died before reporting them safe may have been delivered: their
    seqs are spent, so the next worker starts after all of them (before: at the last safe one, reusing seqs)."""
    monkeypatch.setattr(drainer, "RESTART_BACKOFF_S", 0.0)
    cfg = config.from_env({"CPTRACE_LEVEL": "1", "CPTRACE_EXPORTER": "thread", "CPTRACE_CP_RANK": "0",
                           "CPTRACE_FILE": str(tmp_path / "o.jsonl"), "CPTRACE_SPOOL_DIR": str(tmp_path / "s")})
    st = pipeline.Pipeline(cfg)
    drainer.start_channel(st)
    old = st.channel
    old.seq0, old.shipped, old.safe = 1000, 500, 200   # 300 in flight when it died
    old.dead, old.why = True, "exporter thread failed: test"
    assert drainer.restart(st)
    assert st.channel is not old and st.channel.seq0 == 1500
    assert st.dropped == 300 and st.restarts == 1
    st.channel.close(5.0)


def test_a_worker_start_that_fails_once_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capfd: pytest.CaptureFixture) -> None:
    """The worker's first start raising (as an import another thread of the traced process raced does in thread
    mode) is said and tried again: every record is delivered and flush() is True (before: the run was lost)."""
    real, tries = drainer.start_channel, [0]

    def start(p: typing.Any, resume: dict | None = None) -> None:
        tries[0] += 1
        if tries[0] == 1:
            raise ImportError("cannot import name 'run_loop' from partially initialized module")
        real(p, resume)

    monkeypatch.setattr(drainer, "start_channel", start)
    monkeypatch.setattr(drainer, "START_RETRY_S", 0.01)
    _configure(tmp_path, "thread")
    for i in range(300):
        api.cptrace(1, "evict", node_id=i % 7, i=i)
    assert api.flush(30) is True
    api.shutdown(30)
    assert tries[0] == 2
    assert sorted(e.attrs["hicache.i"] for e, _ in _events(tmp_path)) == list(range(300))
    assert "exporter failed to start (ImportError" in capfd.readouterr().err


def test_a_worker_start_that_keeps_failing_is_given_up_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture) -> None:
    def start(p: typing.Any, resume: dict | None = None) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(drainer, "start_channel", start)
    monkeypatch.setattr(drainer, "START_RETRY_S", 0.01)
    _configure(tmp_path, "thread")
    for i in range(50):
        api.cptrace(1, "evict", node_id=1, i=i)
    assert api.flush(10) is False
    assert pipeline.stats()["dropped"] == 50
    api.shutdown(10)
    err = capfd.readouterr().err
    assert err.count("trying again") == drainer.START_TRIES - 1 and "records are dropped and counted" in err
