"""The exporter worker (export/worker.py): compact items in, spans out to the sinks; flush, close, stats; the
message loop (run_loop); the sinks built by export/stack.py, network path included (a fake transport)."""

from __future__ import annotations

import itertools
import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from cptrace_otel.export import stack, worker
from cptrace_otel.export.protocol import ACK, FLUSH, INIT, ITEMS, PROGRESS
from cptrace_otel.export.sinks import Outcome, SendResult
from cptrace_otel.model import config, config_stamp, semconv as sc

S = 1_000_000_000
T0 = time.time_ns()  # spans open now, so that a tick's expiry (now - span_timeout_s) leaves them open


@pytest.fixture(autouse=True, params=["c", "python"])
def intake(request: pytest.FixtureRequest) -> str:
    """Every test with both intakes: the C one (when it was built) and the Python one."""
    if request.param == "python":
        request.getfixturevalue("python_worker_intake")
    elif worker.c_intake() is None:
        if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
            pytest.fail("the C intake (_logc) was not built (CPTRACE_REQUIRE_SPEEDUPS=1)")
        pytest.skip("the C intake (_logc) was not built")
    return request.param


class MemorySink:
    """A span sink that keeps what it gets."""

    waits = False
    what = "memory sink"

    def __init__(self) -> None:
        self.groups: list[tuple[dict[str, Any], list[Any]]] = []
        self.flushes = 0
        self.closed = False

    def export(self, groups) -> None:
        self.groups.extend((res, list(spans)) for res, spans in groups)

    def flush(self, timeout_s: float) -> bool:
        self.flushes += 1
        return True

    def close(self, timeout_s: float) -> bool:
        self.closed = True
        return True

    def stats(self) -> dict[str, Any]:
        return {"mem_spans": len(self.spans)}

    @property
    def spans(self) -> list[Any]:
        return [sp for _, spans in self.groups for sp in spans]


def _cfg(**kw: Any) -> config.Config:
    kw.setdefault("checks", False)
    kw.setdefault("span_timeout_s", 3600.0)
    return config.from_env({}, level=2, run_id="w/run", cp_rank=0, **kw)


def _info(cfg: config.Config, **kw: Any) -> dict[str, Any]:
    info = dict(config=cfg, resource={sc.SERVICE_NAME: "t", sc.CP_RANK: cfg.cp_rank}, instance="i", file=None,
                log_file=None, spool_dir="")
    info.update(kw)
    return info


@pytest.fixture
def mem(monkeypatch: pytest.MonkeyPatch) -> tuple[MemorySink, list[dict[str, Any]]]:
    """The worker's sinks replaced by one in-memory span sink (in the OTLP-file slot); the open_sinks calls."""
    sink = MemorySink()
    calls: list[dict[str, Any]] = []

    def fake_open_sinks(cfg: Any, **kw: Any) -> list[Any]:
        calls.append(kw)
        return [sink]

    monkeypatch.setattr(worker, "open_sinks", fake_open_sinks)
    return sink, calls


def _items(t0: int = T0) -> list[tuple]:
    return [
        (t0, 1, "config", {"level": 2, "policy": "wt"}),
        (t0 + 1, 1, "prepare", {"node_id": 1, "op": 7, "len": 4, "dev": "(cnt=4,min=0,max=3,first=0,last=3)"}),
        (t0 + 2, 1, "backup", {"node_id": 1, "op": 7, "host": "(cnt=4,min=8,max=11,first=8,last=11)"}),
        (t0 + 3, 2, "ack", {"dir": "d2h", "node_id": 1, "op": 7, "chain": "[1,2]"}),
        (t0 + 4, 1, "evict", {"node_id": 2, "tier": "dev", "note": "a b"}),
    ]


def test_items_in_spans_out_with_seq_epoch_and_typed_fields(mem) -> None:
    sink, calls = mem
    ex = worker.Exporter(_info(_cfg(), spool_dir="/sp"))
    spool = os.path.join("/sp", f"w_run-{os.getpid()}")  # the run id made path-safe, one folder per process
    assert calls == [dict(endpoint=None, protocol="http/protobuf", spool_dir=spool, file=None, log_file=None,
                          adopt_orphans=True, on_error=ex._sink_error)]
    ex.add_items(_items(), 0)
    assert ex.records == 5 and ex.next_seq == 5
    assert sink.spans == []  # nothing is exported before a tick, a flush or EXPORT_MIN_SPANS finished spans
    assert ex.flush(5.0) is True
    by_name = {sp.kind: sp for sp in sink.spans}
    assert sorted(by_name) == [sc.SPAN_D2H, sc.SPAN_NODE, sc.SPAN_RANK]
    d2h = by_name[sc.SPAN_D2H]
    assert [name for _, name, _ in d2h.events] == ["prepare", "backup", "ack"]
    assert d2h.attrs[sc.STAGE_CLOSED] == "tag" and d2h.attrs[sc.NODE_ID] == 1
    assert d2h.events[0][2]["hicache.dev.cnt"] == 4 and d2h.events[2][2]["hicache.chain"] == "[1,2]"
    assert [a[sc.SEQ] for _, _, a in d2h.events] == [1, 2, 3]
    assert d2h.events[2][2][sc.LEVEL] == 2
    node = by_name[sc.SPAN_NODE]
    assert node.attrs[sc.STAGE_CLOSED] == "flush" and node.events[0][2]["hicache.note"] == "ab"
    rank = by_name[sc.SPAN_RANK]
    assert [name for _, name, _ in rank.events] == ["config"] and rank.attrs[sc.DROPPED] == 0
    assert all(a[sc.EPOCH] == 0 for sp in sink.spans for _, _, a in sp.events)
    # the resource: the process's, plus its config record's stamp (read back whole by serve's intake)
    res = sink.groups[0][0]
    assert {k: v for k, v in res.items() if not k.startswith("cptrace.config")} == {sc.SERVICE_NAME: "t", sc.CP_RANK: 0}
    cfg = config_stamp.record(res, 0)
    assert cfg is not None and (cfg.seq, cfg.fields) == (0, {"level": 2, "policy": "wt"})
    st = ex.stats()
    # spans: the d2h span, its lane (node 1), node 2's lane, the rank span
    assert st == {"records": 5, "events": 5, "spans": 4, "findings": 0, "dropped_upstream": 0, "errors": [],
                  "mem_spans": 4}
    assert ex.close(5.0) is True and sink.closed


def test_seq_runs_on_across_batches_and_the_drop_count_is_stamped(mem) -> None:
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg()))
    ex.add_items(_items(), 0)
    ex.add_items([(T0 + 10, 1, "reset", {}), (T0 + 11, 1, "insert", {"node_id": 1, "len": 4})], 7)
    assert ex.next_seq == 7 and ex.dropped_upstream == 7
    assert ex.flush(5.0, dropped=9) is True
    seqs = sorted(a[sc.SEQ] for sp in sink.spans for _, _, a in sp.events)
    assert seqs == list(range(7))
    insert = [a for sp in sink.spans for _, name, a in sp.events if name == "insert"]
    assert insert[0][sc.EPOCH] == 1  # after a reset
    rank_spans = [sp for sp in sink.spans if sp.kind == sc.SPAN_RANK]
    assert rank_spans[-1].attrs[sc.DROPPED] == 9
    assert ex.stats()["dropped_upstream"] == 9


def test_a_rank_span_opened_for_the_drop_count_starts_on_the_records_clock(mem) -> None:
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg()))
    far = 4_000_000_000 * S   # a replayed or test clock far from the exporter's own
    ex.add_items([(far + 5, 1, "insert", {"node_id": 1, "len": 4}), (far + 9, 1, "evict", {"node_id": 1})], 0)
    assert ex.flush(5.0, dropped=3) is True
    rank = [sp for sp in sink.spans if sp.kind == sc.SPAN_RANK]
    assert len(rank) == 1 and rank[0].attrs[sc.DROPPED] == 3 and rank[0].start == far + 9


def test_fields_rank_chooses_the_rank_and_unusual_items_are_completed(mem) -> None:
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg()))
    ex.add_items([(T0, 1, "evict", {"node_id": 3, "rank": 5}), (T0 + 1, "2", 7, {"node_id": 3, "v": 1.5}),
                  (T0 + 2, 1, "evict", {"node_id": 3, "rank": -1})], 0)
    assert ex.flush(5.0)
    evs = sorted(((sp.rank, name, a[sc.LEVEL]) for sp in sink.spans for _, name, a in sp.events), key=str)
    # tag 7 -> "7", level "2" -> 2; a negative rank field falls back to the process's rank
    assert evs == [(0, "7", 2), (0, "evict", 1), (5, "evict", 1)]


def test_export_min_spans_and_tick_export_finished_spans(mem, monkeypatch: pytest.MonkeyPatch) -> None:
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg(span_timeout_s=1.0)))
    monkeypatch.setattr(worker, "EXPORT_MIN_SPANS", 1)
    # prepare .. ack: the d2h span finishes, and goes out with its lane when the lane closes (here: a record more
    # than span_timeout_s later; the lane and rank spans of that record stay open)
    t0 = T0 - 10 * S
    ex.add_items(_items(t0)[1:4] + [(t0 + 2 * S, 1, "evict", {"node_id": 9})], 0)
    assert [sp.kind for sp in sink.spans] == [sc.SPAN_NODE, sc.SPAN_D2H]
    monkeypatch.setattr(worker, "EXPORT_MIN_SPANS", 10**9)
    monkeypatch.setattr(worker, "EXPORT_EVERY_S", 0.0)
    monkeypatch.setattr(worker, "FILE_FLUSH_EVERY_S", 0.0)
    ex.add_items([(t0 + 5 * S, 1, "prepare", {"node_id": 4, "op": 1}),
                  (t0 + 5 * S + 1, 2, "ack", {"dir": "d2h", "node_id": 4, "op": 1})], 0)
    assert len(sink.spans) == 2  # node 9's lane finished, not exported before a tick
    ex._last_items -= 2.0  # the stream has been idle for longer than span_timeout_s: the tick expires by wall clock
    ex.tick()
    assert len(sink.spans) == 5 and sink.flushes == 1  # exported, and the file sinks flushed


def test_log_sink_gets_the_records_and_the_same_events(tmp_path: Path, mem) -> None:
    sink, _ = mem
    plain = worker.Exporter(_info(_cfg()))
    plain.add_items(_items(), 0)
    plain.flush(5.0)
    want = [(sp.name, [(t, n, dict(a)) for t, n, a in sp.events]) for sp in sink.spans]
    sink.groups.clear()

    from cptrace_otel.export.file_sinks import LogLinesSink

    ex = worker.Exporter(_info(_cfg()))
    ex.sinks.append(LogLinesSink(str(tmp_path / "cp0.log"), 0, 0))
    ex.add_items(_items(), 0)
    assert ex.flush(5.0)
    got = [(sp.name, [(t, n, dict(a)) for t, n, a in sp.events]) for sp in sink.spans]
    assert got == want
    lines = (tmp_path / "cp0.log").read_text().splitlines()
    assert len(lines) == 5 and lines[4].endswith("[CPTRACE evict] node_id=2 tier=dev note=ab")
    assert ex.stats()["log_lines"] == 5
    assert ex.close(1.0)


def test_unrenderable_items_with_a_log_sink_are_reported_once(tmp_path: Path, mem, capsys) -> None:
    from cptrace_otel.export.file_sinks import LogLinesSink

    ex = worker.Exporter(_info(_cfg()))
    ex.sinks.append(LogLinesSink(str(tmp_path / "cp0.log"), 0, 0))
    ex.add_items([(T0, 1, "evict", {"node_id": 1}), ("bad",), (T0 + 2, 1, "evict", {"node_id": 2})], 0)
    assert ex.records == 2 and ex.next_seq == 3
    assert len(ex.errors) == 1 and "dropped an unrenderable record" in ex.errors[0]
    assert "dropped an unrenderable record" in capsys.readouterr().err
    assert ex.flush(1.0) is False  # an error was reported
    assert len((tmp_path / "cp0.log").read_text().splitlines()) == 2


class RecordSink(MemorySink):
    """A sink with the per-record hook: it keeps the Records of every batch as well."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple] = []

    def write(self, records: list[tuple]) -> None:
        self.records.extend(records)


class BrokenSink(MemorySink):
    what = "broken sink"

    def export(self, groups) -> None:
        raise OSError("disk gone")


def test_sinks_are_one_list_behind_one_protocol(mem, capsys) -> None:
    """Any object with export/flush/close/stats (+ the optional ``write`` hook) is a sink: each gets the spans, a
    sink with ``write`` the Records too, and a sink that fails is reported once and left out while the rest go on."""
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg()))
    rec, broken = RecordSink(), BrokenSink()
    ex.sinks += [rec, broken]
    ex.add_items(_items(), 0)
    assert ex.flush(5.0) is False   # the broken sink's error was reported
    assert [sp.name for sp in rec.spans] == [sp.name for sp in sink.spans] and len(sink.spans) > 0
    assert [(r[0], r[3]) for r in rec.records] == [(i, it[2]) for i, it in enumerate(_items())]
    assert broken not in ex.sinks and rec in ex.sinks and sink in ex.sinks
    failed = [e for e in ex.errors if "broken sink write failed" in e]
    assert failed == ["broken sink write failed: OSError('disk gone')"]
    assert "broken sink write failed" in capsys.readouterr().err


def test_a_sink_that_cannot_be_opened_is_reported_and_flush_says_false(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = _cfg()
    ex = worker.Exporter(_info(cfg, file=str(blocker / "x.otlp.jsonl"), log_file=str(tmp_path / "ok.log")))
    assert [type(s).__name__ for s in ex.sinks] == ["LogLinesSink"]
    assert len(ex.errors) == 1 and ex.errors[0].startswith(f"cannot open the OTLP file {blocker / 'x.otlp.jsonl'}: ")
    assert "cptrace_otel: cannot open the OTLP file" in capsys.readouterr().err
    ex.add_items(_items(), 0)
    assert ex.flush(1.0) is False
    assert ex.stats()["errors"] == ex.errors and ex.stats()["log_lines"] == 5
    ex.close(1.0)


def test_file_sinks_write_otlp_json_lines(tmp_path: Path) -> None:
    from tests.helpers.otlp_receiver import read_jsonl

    out = tmp_path / "o" / "r.otlp.jsonl"
    ex = worker.Exporter(_info(_cfg(), file=str(out)))
    ex.add_items(_items(), 0)
    assert ex.flush(1.0)
    assert ex.stats()["file"] == str(out) and ex.stats()["file_lines"] == 1
    assert ex.close(1.0)
    spans = read_jsonl([str(out)])
    assert sorted(e.attrs[sc.SEQ] for sp in spans for e in sp.events) == [0, 1, 2, 3, 4]


_SENT = SendResult(Outcome.OK)


class FakeTransport:
    url = "http://fake:4318/v1/traces"

    def __init__(self, answer: Any = _SENT) -> None:
        self.bodies: list[bytes] = []
        self.answer = answer
        self.closed = False

    def send(self, body: bytes) -> Any:
        self.bodies.append(body)
        return self.answer

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("answer", [SendResult(Outcome.OK), ("ok", "")])
def test_network_sink_sends_encoded_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer) -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    tr = FakeTransport(answer)
    opened: list[tuple] = []

    def fake_transport(endpoint: str, protocol: str, cfg: Any) -> FakeTransport:
        opened.append((endpoint, protocol))
        return tr

    monkeypatch.setattr(stack, "open_transport", fake_transport)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://fake:4318/"}
    cfg = config.from_env(env, level=2, run_id="net", cp_rank=0, checks=False)
    ex = worker.Exporter(_info(cfg, spool_dir=str(tmp_path / "spool")))
    assert opened == [("http://fake:4318/v1/traces", "http/protobuf")]
    ex.add_items(_items(), 0)
    assert ex.flush(10.0) is True
    st = ex.stats()
    assert st["url"] == tr.url and st["sent_requests"] == len(tr.bodies) >= 1 and st["backend_down"] is False
    names = []
    for body in tr.bodies:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        names += [sp.name for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    assert sorted(names) == sorted(sc.span_name(0, k) for k in [sc.SPAN_D2H, sc.SPAN_NODE, sc.SPAN_NODE, sc.SPAN_RANK])
    assert ex.close(5.0) is True and tr.closed


def test_network_sink_that_cannot_be_set_up_is_reported(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def boom(endpoint: str, protocol: str, cfg: Any) -> Any:
        raise ValueError("no transport")

    monkeypatch.setattr(stack, "open_transport", boom)
    cfg = config.from_env({}, level=2, run_id="net", cp_rank=0, endpoint="http://x:1/v1/traces", protocol="grpc")
    ex = worker.Exporter(_info(cfg))
    assert ex.sinks == []
    assert ex.errors == ["cannot set up the OTLP grpc sink for http://x:1/v1/traces: ValueError('no transport')"]
    assert ex.flush(1.0) is False


def _loop(msgs: list[Any]) -> tuple[int, list[tuple]]:
    q: queue.Queue = queue.Queue()
    for m in msgs:
        q.put(m)
    acks: list[tuple] = []
    rc = worker.run_loop(lambda t: q.get(timeout=t), acks.append)
    return rc, acks


def test_run_loop_init_items_flush_eof(mem) -> None:
    sink, _ = mem
    cfg = _cfg()
    rc, acks = _loop([(INIT, _info(cfg)), (ITEMS, _items(), 3), (FLUSH, 11, 4, 5.0), (ITEMS, _items(T0 + 100), 4),
                      None])
    assert rc == 0
    assert len(acks) == 1
    kind, fid, ok, stats = acks[0]
    assert (kind, fid, ok) == (ACK, 11, True)
    assert stats["records"] == 5 and stats["dropped_upstream"] == 4 and stats["mem_spans"] == 4
    assert sink.closed  # end of input closes the sinks
    assert sorted(a[sc.SEQ] for sp in sink.spans for _, _, a in sp.events) == list(range(10))


def test_run_loop_flush_before_init_bad_batches_and_unknown_messages(mem, capsys) -> None:
    _sink, _ = mem
    # a flush before init, a batch that is not a list, a message kind the worker does not know (ignored)
    rc, acks = _loop([(FLUSH, 1, 0, 1.0), (INIT, _info(_cfg())), (ITEMS, None, 0), ("rec", [], 0),
                      (ITEMS, _items(), 0), (FLUSH, 2, 0, 1.0), None])
    assert rc == 0
    assert acks[0] == (ACK, 1, False, {})
    assert acks[1][:3] == (ACK, 2, True) and acks[1][3]["records"] == 5
    assert "cptrace_otel: exporter error on 'items'" in capsys.readouterr().err


def test_run_loop_without_init_and_a_failing_close(mem, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _loop([None]) == (0, [])
    sink, _ = mem
    monkeypatch.setattr(sink, "close", lambda timeout_s: False)
    rc, _ = _loop([(INIT, _info(_cfg())), None])
    assert rc == 1


def test_online_checks_stamp_findings(mem) -> None:
    pytest.importorskip("cptrace_otel.checks")
    sink, _ = mem
    ex = worker.Exporter(_info(_cfg(checks=True)))
    # an ack for a node that was never prepared: the stats count the findings the spans carry
    ex.add_items(_items() + [(T0 + 9, 2, "ack", {"dir": "d2h", "node_id": 9, "op": 3})], 0)
    assert ex.flush(1.0)
    assert ex.stats()["findings"] == ex.builder.findings == sum(len(sp.findings) for sp in sink.spans)


def test_run_loop_sends_progress_only_when_it_changed(mem, monkeypatch: pytest.MonkeyPatch) -> None:
    # an idle worker does not wake the traced process's ack reader with the same PROGRESS over and over
    monkeypatch.setattr(worker, "PROGRESS_EVERY_S", 0.0)   # every round may report
    q: queue.Queue = queue.Queue()
    idle = [(INIT, _info(_cfg()))] + [queue.Empty] * 5 + [(ITEMS, _items(), 0)] + [queue.Empty] * 5 + [None]
    for m in idle:
        q.put(m)

    def get(t: float) -> Any:
        m = q.get_nowait()
        if m is queue.Empty:
            raise queue.Empty
        return m

    progress: list[tuple] = []
    assert worker.run_loop(get, lambda m: None, progress.append) == 0
    assert all(m[0] == PROGRESS for m in progress)
    # each report differs from the one before it (at most one per change: after INIT, after the batch, at the end)
    assert all(a != b for a, b in itertools.pairwise(progress))
    assert 2 <= len(progress) <= 4


def test_an_idle_ring_is_polled_less_often_and_a_record_resets_the_poll(mem) -> None:
    import collections

    _hot = pytest.importorskip("cptrace_otel._speedups._hot")
    from cptrace_otel.traced.ring import Ring

    r = Ring(1 << 16)
    r.submit(collections.deque(), 1 << 20, 1 << 40)
    script: list[Any] = [(INIT, _info(_cfg(), ring=r.info()))] + [queue.Empty] * 6 + ["put", queue.Empty, None]
    timeouts: list[float] = []

    def get(t: float) -> Any:
        timeouts.append(t)
        m = script.pop(0)
        if m == "put":   # a record lands in the ring while the worker waits
            _hot.ring_put(1, "evict", {"node_id": 2})
            raise queue.Empty
        if m is queue.Empty:
            raise queue.Empty
        return m

    try:
        assert worker.run_loop(get, lambda m: None) == 0
    finally:
        r.close()
    p, most = worker.RING_POLL_S, worker.RING_POLL_MAX_S
    idle = timeouts[1:7]   # after INIT, six rounds that find nothing
    assert idle[0] == p and all(b == min(2 * a, most) for a, b in itertools.pairwise(idle)) and idle[-1] == most
    assert timeouts[8] == p   # the round that found the record resets the poll
    sink, _ = mem
    assert [a.get("hicache.node_id") for sp in sink.spans for _, _, a in sp.events] == [2]


def _failing_starts(monkeypatch: pytest.MonkeyPatch, fails: int) -> list[int]:
    """``worker.Exporter`` raising for its first ``fails`` constructions (as an import another thread of the traced
    process raced does in thread mode), then the real one; returns the running count of tries."""
    real, tries = worker.Exporter, [0]

    def exporter(info: dict) -> Any:
        tries[0] += 1
        if tries[0] <= fails:
            raise ImportError("cannot import name 'sizer' from partially initialized module")
        return real(info)

    monkeypatch.setattr(worker, "Exporter", exporter)
    monkeypatch.setattr(worker, "INIT_RETRY_S", 0.0)
    return tries


def test_run_loop_a_failed_start_holds_the_records_and_tries_again(mem, monkeypatch, capsys) -> None:
    """A start that fails once loses nothing: the records wait and the next message starts the exporter."""
    sink, _ = mem
    tries = _failing_starts(monkeypatch, 1)
    rc, acks = _loop([(INIT, _info(_cfg())), (ITEMS, _items(), 0), (FLUSH, 7, 0, 5.0), None])
    assert rc == 0 and tries[0] == 2
    assert acks[0][:3] == (ACK, 7, True) and acks[0][3]["records"] == 5
    assert sorted(a[sc.SEQ] for sp in sink.spans for _, _, a in sp.events) == list(range(5))
    assert "exporter could not start (ImportError" in capsys.readouterr().err


def test_run_loop_a_start_that_keeps_failing_gives_up_once(mem, monkeypatch, capsys) -> None:
    """A start that fails every time is tried INIT_TRIES times, then its records are given up, said once; every
    flush meanwhile answers False (the traced process counts the records lost)."""
    sink, _ = mem
    tries = _failing_starts(monkeypatch, 10**6)
    msgs: list[Any] = [(INIT, _info(_cfg()))]
    msgs += [(ITEMS, _items(T0 + i), 0) for i in range(worker.INIT_TRIES + 2)]
    rc, acks = _loop([*msgs, (FLUSH, 9, 0, 1.0), None])
    assert rc == 0 and tries[0] == worker.INIT_TRIES
    assert acks == [(ACK, 9, False, {})]
    assert sink.spans == []
    assert capsys.readouterr().err.count(f"tried {worker.INIT_TRIES} times; the records it was given are lost") == 1
