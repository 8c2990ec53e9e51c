"""``cptrace-otel ingest``: log files replayed through the same span mapping and sinks as live export."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from cptrace_otel import cli
from cptrace_otel.model import semconv as sc
from cptrace_otel.traced import api
from tests.helpers import free_port
from tests.helpers.otlp_receiver import HttpReceiver, read_jsonl

pytest.importorskip("cptrace_otel.analyze.sources.logs")


def _emit_live(tmp_path: Path) -> None:
    """Two ranks' live records, written both as OTLP JSON lines and as upstream log lines."""
    for rank in (0, 1):
        api.configure(level=2, run_id="ing", cp_rank=rank, tp_rank=rank, exporter="thread",
                      file=str(tmp_path / "live" / "rank{rank}.otlp.jsonl"),
                      log_file=str(tmp_path / "logs" / "cp{rank}.log"), spool_dir=str(tmp_path / "spool"))
        for i in range(300):
            node = i % 7
            api.cptrace(1, "prepare", node_id=node, op=i, len=4, dev=f"(cnt=4,min={i},max={i + 3},first={i},"
                        f"last={i + 3})", host="(none)", policy="wt", rank=rank, ts=1000 + i)
            api.cptrace(2, "ack", dir="d2h", node_id=node, op=i, chain=[node, 1], rank=rank, ts=1000 + i)
            if i % 50 == 0:
                api.cptrace(1, "rid_map", rid=f"req{i}", node_id=node, hit="dev", rank=rank, ts=1000 + i)
        assert api.flush(30)
        api.shutdown(10)
    api.reload_config()


def _event_view(spans) -> list:
    out = []
    for sp in spans:
        for e in sp.events:
            if e.name == sc.EVENT_VIOLATION:
                continue
            fields = [(k, v) for k, v in e.attr_list if k.startswith("hicache.")]
            out.append((sp.resource[sc.CP_RANK], e.attrs[sc.SEQ], e.attrs[sc.EPOCH], e.name, fields,
                        sp.trace_id, sp.name))
    return sorted(out, key=lambda x: (x[0], x[1]))


def test_ingest_gives_the_same_events_as_live_export(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _emit_live(tmp_path)
    live = _event_view(read_jsonl(sorted(glob.glob(str(tmp_path / "live" / "*.jsonl")))))
    out = tmp_path / "ingested.otlp.jsonl"
    logs = sorted(glob.glob(str(tmp_path / "logs" / "*.log")))
    assert cli.main(["ingest", *logs, "--file", str(out), "--run-id", "ing", "--no-progress"]) == 0
    summary = capsys.readouterr().out
    assert "ingested 1212 events" in summary and "2 rank(s)" in summary
    ingested = _event_view(read_jsonl([str(out)]))
    assert len(ingested) == len(live) == 2 * (600 + 6)
    # same ranks, seqs, epochs, tags, typed fields and node traces (span grouping may differ with timing)
    assert [x[:5] for x in ingested] == [x[:5] for x in live]
    assert [x[5] for x in ingested] == [x[5] for x in live]


def test_ingest_to_http_with_malformed_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "cp0.log"
    log.write_text(
        "[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE insert] node_id=1 parent=0 len=4 ts=100\n"
        "unrelated line\n"
        "[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE evict] node_id=1 tier=dev oops ts=200\n"
        "[2026-07-18 03:03:07 ATTN_CP0 TP0] [CPTRACE broken\n"
        "[2026-07-18 03:03:07 ATTN_CP0 TP0] [CPTRACE evict] node_id=2 tier=host ts=300\n")
    with HttpReceiver() as rx:
        rc = cli.main(["ingest", str(log), "--endpoint", rx.url, "--run-id", "r", "--no-progress"])
        assert rc == 0
        spans = [sp for sp in rx.spans()]
    out = capsys.readouterr().out
    assert "ingested 3 events" in out and "malformed" in out and f"{log}:3" in out and f"{log}:4" in out
    evs = sorted((e.attrs[sc.SEQ], e.name, e.attrs["hicache.node_id"]) for sp in spans for e in sp.events)
    assert evs == [(0, "insert", 1), (1, "evict", 1), (2, "evict", 2)]
    # wall-clock anchor from the logger prefix: 100 ns of monotonic time after 2026-07-18 03:03:06 local
    import datetime as dt

    t0 = int(dt.datetime(2026, 7, 18, 3, 3, 6).timestamp() * 1e9)
    times = sorted(e.time_ns for sp in spans for e in sp.events)
    assert times == [t0, t0 + 100, t0 + 200]
    assert {sp.resource[sc.CP_RANK] for sp in spans} == {0}


def test_ingest_unreachable_endpoint_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "cp0.log"
    log.write_text("[CPTRACE evict] node_id=1 tier=dev\n")
    url = f"http://127.0.0.1:{free_port()}/v1/traces"
    assert cli.main(["ingest", str(log), "--endpoint", url, "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert url in err and "unreachable" in err and "Traceback" not in err


def test_ingest_missing_log_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["ingest", str(tmp_path / "nope.log"), "--file", str(tmp_path / "o.jsonl"),
                     "--no-progress"]) == 3
    assert "nope.log" in capsys.readouterr().err
