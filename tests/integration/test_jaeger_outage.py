"""Backend outage: Jaeger is stopped in the middle of a stream of events and started again; after the flush every
event is in Jaeger (the exporter spooled and replayed), and the rank process reported the outage on stderr while it
lasted and its end afterwards.

Uses a private Jaeger (own ports, Badger storage on disk so the restart keeps what was stored before the stop), never
the shared instance.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from cptrace_otel.analyze.sources.jaeger import events_from_otlp
from cptrace_otel.model import spans
from tests.helpers.integration import rank_env, start_rank, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 400


def stream(nodes: int) -> list:
    """Five records per node (insert, prepare, backup, ack d2h, evict): 2,000 records over ~6 s."""
    out = []
    for n in range(1, nodes + 1):
        dev, host = f"(cnt=8,min={n * 8},max={n * 8 + 7},first={n * 8},last={n * 8 + 7})", \
            f"(cnt=8,min={n * 16},max={n * 16 + 7},first={n * 16},last={n * 16 + 7})"
        out += [
            [1, "insert", {"node_id": n, "parent": 0, "len": 8, "dev": dev}],
            [1, "prepare", {"node_id": n, "op": n, "len": 8, "dev": dev, "host": host, "policy": "wt"}],
            [1, "backup", {"op": n, "node_id": n, "dev": dev, "host": host, "io": 1, "h": 1000 + n, "nz": 512}],
            [2, "ack", {"dir": "d2h", "op": n, "node_id": n, "blen": 8, "clen": 8, "pub": [n]}],
            [1, "evict", {"tier": "dev", "node_id": n, "kind": "backuped", "dev": dev}],
        ]
    return out


def _progress(path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_outage_spools_and_replays_every_event(private_jaeger, run_id, tmp_path, protocol):
    pj = private_jaeger
    records = stream(NODES)
    total = len(records)
    progress = tmp_path / "progress"
    endpoint = pj.otlp_grpc if protocol == "grpc" else pj.otlp_http
    run = start_rank(tmp_path, "rank0", rank_env(run_id, 0, endpoint, protocol, tmp=tmp_path), records,
                     pace_s=0.06, batch=20, progress_file=str(progress), flush_timeout_s=120)

    wait_for(lambda: _progress(progress) >= total // 4, 60, "a quarter of the stream before the outage", 0.05)
    pj.stop()
    down_at = (_progress(progress), time.monotonic())
    # Keep Jaeger down while a good part of the stream is emitted, and long enough for the exporter to notice.
    wait_for(lambda: _progress(progress) >= total * 3 // 4 and time.monotonic() - down_at[1] >= 2.0, 60,
             "three quarters of the stream during the outage", 0.05)
    stderr_during = run.stderr_path.read_text()
    pj.start()
    res = run.wait(timeout_s=180)

    assert down_at[0] < total * 3 // 4 < total  # the outage really was in the middle of the stream
    # reported clearly while it lasted: the endpoint, that it is unreachable, that requests are being spooled
    assert "unreachable" in stderr_during and endpoint.split("://")[1] in stderr_during, stderr_during
    assert "spool" in stderr_during, stderr_during
    assert "reachable again" in run.stderr, run.stderr
    assert res["flushed"] is True, run.stderr

    # every event is in Jaeger: read each node's trace back (api_v3) and count its records
    emitted = Counter((f["node_id"], tag) for tag, f, *_ in res["emitted"])
    assert sum(emitted.values()) == total

    def all_events():
        got: Counter = Counter()
        seqs: set = set()
        for n in range(1, NODES + 1):
            td = pj.client.get_trace_v3(spans.node_trace_id(run_id, 0, n))
            for ev in events_from_otlp(td or {}):
                got[(ev.fields["node_id"], ev.tag)] += 1
                seqs.add(ev.seq)
        return (got, seqs) if got == emitted else None

    _got, seqs = wait_for(all_events, 60, f"all {total} events in Jaeger after the outage", 1.0)
    assert len(seqs) == total   # no event twice (replay is not duplication), none missing
