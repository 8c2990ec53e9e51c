"""The record ring (``CPTRACE_RING=1``; ``_speedups/ring.c``, ``traced/ring.py``, ``export/ringread.py``) against the
deque path: the same records give the same compact items, Records and byte-identical OTLP (decoded with
opentelemetry-proto), whatever the value shapes (Hypothesis); order is kept across side records; a full ring drops
and counts; wrap-around, restarts (side ids already given to a dead worker) and a malformed ring; the ring is the
default with the exporter process; one reader at a time (a reader token, and a restarted worker's predecessor killed
first); consumed pages given back; the side deque bounded by bytes as well as by count."""

from __future__ import annotations

import collections
import math
import mmap
import os
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from cptrace_otel.export import worker
from cptrace_otel.export.otlp_proto import encode_requests
from cptrace_otel.export.ringread import RingIntake
from cptrace_otel.model import config
from cptrace_otel.model.logline import Rng
from cptrace_otel.model.records import compact_item, render_record
from cptrace_otel.traced.ring import HEADER, Ring

_hot = pytest.importorskip("cptrace_otel._speedups._hot")


class Odd:
    """A value of no common shape (side path), rendered by its str."""

    def __str__(self) -> str:
        return "odd value"


def _ring(nbytes: int = 1 << 16) -> tuple[Ring, collections.deque]:
    r = Ring(nbytes)
    side: collections.deque = collections.deque()
    r.submit(side, 1 << 20, 1 << 40)
    return r, side


def _both_paths(records: list[tuple[int, str, dict]], nbytes: int = 1 << 20) -> tuple[list, list]:
    """The compact items of ``records`` through the ring (its reader, the side items rendered as the drainer does)
    and through the deque path (compact_item of the same record with the ring's timestamp)."""
    r, side = _ring(nbytes)
    try:
        for level, tag, fields in records:
            _hot.ring_put(level, tag, fields)
        rd = RingIntake(r.info())
        side_items = [compact_item(it) for it in side]
        side_ts = [it[0] for it in side]
        rd.add_side(side_items)
        got = rd.take(final=True)
        assert r.counters()[2] == 0, "nothing dropped"
        assert len(got) == len(records)
        # each record's timestamp is taken once (ring or side item): the deque path gets the same one
        ref = [compact_item((it[0], level, tag, fields))
               for (level, tag, fields), it in zip(records, got, strict=False)]
        assert [it[0] for it in got if any(it is s for s in side_items)] == side_ts
        return got, ref
    finally:
        r.detach()


def _otlp(items: list) -> list[bytes]:
    cfg = config.from_env({}, level=3, run_id="ring", cp_rank=0, checks=True)
    ex = worker.Exporter(dict(config=cfg, resource=cfg.resource(), instance="i", file=None, log_file=None,
                              spool_dir=""))
    ex.add_items(items, 0)
    ex.builder.close_all("flush")
    spans = ex.builder.take()
    return list(encode_requests([(ex.resource, spans)]))


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _assert_items_equal(got: list, ref: list) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g[:3] == r[:3] and type(g[1]) is type(r[1])
        assert list(g[3]) == list(r[3]), "same keys, same order"
        for k in g[3]:
            assert _same(g[3][k], r[3][k]), (k, g[3][k], r[3][k])


MIXED = [
    (1, "prepare", {"node_id": 3, "op": 1, "dev": "(cnt=3,min=1,max=5,first=1,last=5)", "n": 7}),
    (2, "backup", {"node_id": 3, "op": 1, "host": [4, 5, 6], "ok": True, "f": 1.25, "s": "a b"}),
    (1, "config", {"cp_rank": 0, "cp_size": 2, "level": 2}),            # side: the drainer reads the rank there
    (1, "ack", {"node_id": 3, "dir": "d2h", "obj": Odd()}),               # side: an arbitrary object
    (1, "evict", {"node_id": 4, "big": 1 << 70, "neg": -(1 << 63)}),      # side: beyond int64 / int64 min kept
    (2, "insert", {"node_id": 5, "t": (1, -2), "no": False, "nan": float("nan"), "inf": float("-inf")}),
    (1, "reset", {}),
    (3, "h\u00e9", {"k\u00e9": "v\u00e9 x", "e": "", "l": [], "nested": [1, [2]], "bl": [True]}),
    (1, "rid_map", {"node_id": 6, "long": "x" * 70000}),                  # side: over the record size bound
    (2, "prepare", {"node_id": 7, "rng": Rng(2, 0, 1, 0, 1), "none": None}),   # side: an Rng, None
]


def test_ring_and_deque_paths_give_the_same_items_records_and_otlp_bytes() -> None:
    got, ref = _both_paths(MIXED)
    _assert_items_equal(got, ref)
    # the log sink's Records (repr: NaN is not equal to itself)
    assert [repr(render_record(i, g)) for i, g in enumerate(got)] == [repr(render_record(i, r)) for i, r in
                                                                      enumerate(ref)]
    a, b = _otlp(got), _otlp(ref)
    assert a and a == b, "byte-identical OTLP requests"
    reqs = [trace_service_pb2.ExportTraceServiceRequest.FromString(x) for x in a]
    names = [ev.name for req in reqs for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans
             for ev in sp.events]
    assert len(names) == len(MIXED) and set(names) >= {"prepare", "backup", "ack", "evict", "insert"}


_scalar = st.one_of(
    st.integers(min_value=-(1 << 64), max_value=1 << 64), st.text(max_size=40),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.lists(st.integers(min_value=-(1 << 63) - 2, max_value=(1 << 63) + 1), max_size=70),
    st.tuples(st.integers(), st.integers()), st.lists(st.booleans(), max_size=3),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
    st.builds(Odd))
_record = st.tuples(
    st.integers(min_value=0, max_value=3),
    st.sampled_from(["prepare", "backup", "ack", "evict", "insert", "reset", "config", "rid_map", "t\u00e9"]),
    st.dictionaries(st.sampled_from(["node_id", "op", "dir", "dev", "host", "rank", "k\u00e9", "x"]), _scalar,
                    max_size=6))


@settings(max_examples=120, deadline=None)
@given(st.lists(_record, min_size=1, max_size=12))
def test_any_value_shapes_give_the_same_items_as_the_deque_path(records: list) -> None:
    got, ref = _both_paths(records)
    _assert_items_equal(got, ref)


@settings(max_examples=25, deadline=None)
@given(st.lists(_record, min_size=1, max_size=8))
def test_any_value_shapes_give_byte_identical_otlp(records: list) -> None:
    got, ref = _both_paths(records)
    assert _otlp(got) == _otlp(ref)


def test_wrap_around_and_a_full_ring_drops_and_counts() -> None:
    r, _side = _ring(4096)
    rd = RingIntake(r.info())
    out: list = []
    n = 0
    for round_ in range(40):   # records of varying sizes, read in between: positions wrap many times
        for _ in range(round_ % 7 + 1):
            _hot.ring_put(1, "t", {"i": n, "s": "y" * (n % 97)})
            n += 1
        out += rd.take()
    assert [it[3]["i"] for it in out] == list(range(n))
    w, rpos, dropped, _, written, consumed, cap = r.counters()
    assert w == rpos and w > 3 * cap and dropped == 0 and written == consumed == n
    for i in range(1000):      # nobody reads: the ring fills, the rest is dropped and counted
        _hot.ring_put(1, "t", {"i": i})
    w, rpos, dropped, _, written, consumed, cap = r.counters()
    assert dropped > 0 and written - consumed + dropped == 1000 and w - rpos <= cap
    assert len(rd.take()) == 1000 - dropped
    r.detach()


def test_side_records_keep_their_place_and_a_restart_skips_what_a_dead_worker_had() -> None:
    r, side = _ring()
    for i in range(6):
        _hot.ring_put(1, "t", {"i": i, "o": Odd() if i % 2 else 0})
    items = [compact_item(it) for it in side]
    assert len(items) == 3 and r.counters()[3] == 3
    rd = RingIntake(r.info())
    rd.add_side(items[:1])
    assert [it[3]["i"] for it in rd.take()] == [0, 1, 2]   # waits at the placeholder of side item 1
    assert rd.take() == []
    # the worker dies holding side item 1 (the traced process counts it lost); its replacement is told side_next=2
    rd2 = RingIntake(r.info(), side_next=2)
    rd2.add_side([None])                                    # side item 2: given up by the traced process
    assert [it[3]["i"] for it in rd2.take()] == [4]
    assert rd2.skipped == 1
    r.detach()


def test_a_placeholder_never_filled_is_skipped_at_end_of_input_only() -> None:
    r, _side = _ring()
    _hot.ring_put(1, "t", {"o": Odd()})
    _hot.ring_put(1, "t", {"i": 1})
    rd = RingIntake(r.info())
    assert rd.take() == []
    assert [it[3] for it in rd.take(final=True)] == [{"i": 1}]
    r.detach()


def test_a_malformed_ring_raises_and_skips_to_the_write_position() -> None:
    r, _side = _ring()
    _hot.ring_put(1, "t", {"i": 1})
    r.mm[HEADER:HEADER + 4] = (12345).to_bytes(4, "little")   # a record size that is not a multiple of 8
    rd = RingIntake(r.info())
    with pytest.raises(ValueError, match="bad record size"):
        rd.take()
    w, rpos = r.counters()[:2]
    assert w == rpos
    _hot.ring_put(1, "t", {"i": 2})
    assert [it[3] for it in rd.take()] == [{"i": 2}]
    r.detach()


def test_the_gate_writes_the_ring_only_while_its_put_is_the_submit_function() -> None:
    from cptrace_otel.traced import api

    r, _side = _ring()
    st = api._STATE
    saved = st.submit, st.level, st.drop
    try:
        st.level, st.drop = 2, None
        st.submit = _hot.ring_put
        api.cptrace(1, "t", a=1, b="x")
        api.cptrace(3, "t", a=2)                        # below the level: nothing
        st.drop = _hot.IdSet([7])
        api.cptrace(1, "t", node_id=7)                  # sampled out
        api.cptrace(1, "t", node_id=8)                  # through the dict path into ring_put
        st.drop = None
        seen: list = []
        st.submit = lambda *a: seen.append(a)
        api.cptrace(1, "t", a=3)                        # another submit function: the ring is not written
        rd = RingIntake(r.info())
        assert [it[3] for it in rd.take()] == [{"a": 1, "b": "x"}, {"node_id": 8}]
        assert seen == [(1, "t", {"a": 3})]
    finally:
        st.submit, st.level, st.drop = saved
        r.detach()


def test_a_forked_child_never_writes_the_parents_ring() -> None:
    r, _side = _ring()
    pid = os.fork()
    if pid == 0:   # child: forgets the ring, a put is a no-op
        try:
            r.close_in_child()
            _hot.ring_put(1, "child", {"i": 1})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    _hot.ring_put(1, "parent", {"i": 2})
    assert [it[2] for it in RingIntake(r.info()).take()] == ["parent"]
    r.detach()


def test_the_ring_is_a_memfd_the_worker_maps_by_descriptor() -> None:
    r, _ = _ring()
    assert os.readlink(f"/proc/self/fd/{r.fd}").startswith("/memfd:cptrace-ring")
    m = mmap.mmap(r.fd, r.size)
    assert m.size() == r.size and r.cap == 1 << 16
    m.close()
    r.detach()


_CHILD = r"""
import json, sys
import cptrace_otel as ct
from cptrace_otel.traced import pipeline

class Odd:
    def __str__(self): return "odd value"

for i in range(3000):
    ct.cptrace(1, "alloc", i=i, op="d2h", v=(Odd() if i % 7 == 0 else [i, 1]), ok=bool(i % 2))
ok = ct.flush(30)
stats = pipeline.stats()
ct.shutdown(30)
import os
def link(f):
    try:
        return os.readlink(f"/proc/self/fd/{f}")
    except OSError:   # the directory's own descriptor, closed by now
        return ""
fds = [link(f) for f in os.listdir("/proc/self/fd")]
print(json.dumps({"ok": ok, "stats": stats, "after": pipeline.stats(),
                  "rings_open": sum("cptrace-ring" in f for f in fds)}))
"""


def test_a_traced_process_with_the_ring_delivers_every_record_in_order(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    env = dict(os.environ, CPTRACE_RING="1", CPTRACE_LEVEL="1", CPTRACE_CP_RANK="0", CPTRACE_RUN_ID="ringe2e",
               CPTRACE_EXPORTER="process", CPTRACE_FILE=str(tmp_path / "o.jsonl"),
               CPTRACE_LOG_FILE=str(tmp_path / "log.txt"), CPTRACE_SPOOL_DIR=str(tmp_path / "spool"))
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    ring = out["stats"]["ring"]
    assert out["ok"] and out["stats"]["dropped"] == 0
    assert ring["written"] == 3000 - 429 and ring["side"] == 429 and ring["taken"] == ring["written"]
    assert out["after"]["ring"] == ring and out["rings_open"] == 0   # shutdown released the memfd
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert [int(ln.split(" i=")[1].split()[0]) for ln in lines] == list(range(3000))
    assert "v=oddvalue" in lines[0] and "v=[1,1]" in lines[1] and "ok=True" in lines[1]


_STUCK_CHILD = r"""
import json, os, threading, time
import cptrace_otel as ct
from cptrace_otel.traced import pipeline

class Slow:
    def __init__(self, forever): self.forever = forever
    def __str__(self):
        if self.forever:
            threading.Event().wait()
        time.sleep(3)
        return "slow"

MODE = os.environ["CHILD_MODE"]
ct.cptrace(1, "evict", node_id=0, i=0)
st = pipeline.current()
ct.cptrace(1, "evict", node_id=1, i=1, v=Slow(MODE == "exit"))
for i in range(2, 5000):
    ct.cptrace(1, "evict", node_id=i % 500, i=i)
while not st.rendering:   # the drainer is on the slow value
    time.sleep(0.01)
print("WORKER", st.channel.proc.pid, flush=True)
if MODE == "shutdown":
    ok = ct.shutdown(0.5)
    print(json.dumps({"ok": ok, "stats": pipeline.stats()}), flush=True)
"""


@pytest.mark.parametrize("mode", ["shutdown", "exit"])
def test_with_the_ring_a_stuck_side_record_costs_only_itself_at_shutdown_and_exit(tmp_path: Any, mode: str) -> None:
    """The ring's form of test_failure_modes' ``shutdown(0.5)`` behind a slow value and test_exit_paths' exit with a
    stuck render: the records after the stuck one are in the ring, not queued behind it, so the worker delivers them
    (it reads the ring to its end after the traced process closed its input); only the stuck record is counted."""
    import json
    import subprocess
    import sys
    import time

    env = dict(os.environ, CPTRACE_RING="1", CPTRACE_LEVEL="1", CPTRACE_CP_RANK="0", CPTRACE_RUN_ID="stuck",
               CPTRACE_EXPORTER="process", CPTRACE_LOG_FILE=str(tmp_path / "log.txt"), CHILD_MODE=mode,
               CPTRACE_FILE=str(tmp_path / "o.jsonl"), CPTRACE_SPOOL_DIR=str(tmp_path / "spool"))
    p = subprocess.run([sys.executable, "-c", _STUCK_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    worker_pid = int(lines[0].split()[1])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # the worker delivers after the traced process ended: wait for it to exit
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    got = [int(ln.split(" i=")[1].split()[0]) for ln in (tmp_path / "log.txt").read_text().splitlines()]
    assert got == [0] + list(range(2, 5000))
    assert "drainer was still rendering a value; that record is dropped" in p.stderr
    if mode == "shutdown":
        out = json.loads(lines[1])
        assert out["ok"] is False and out["stats"]["dropped"] == 1


def test_a_side_record_into_the_empty_side_deque_wakes_the_drainer() -> None:
    from cptrace_otel.traced.lifecycle import Flag

    r = Ring(1 << 16)
    side: collections.deque = collections.deque()
    calls: list[int] = []
    r.submit(side, 1 << 20, 1 << 40, lambda: calls.append(len(side)))
    try:
        _hot.ring_put(1, "t", {"i": 1})            # a ring record: nobody is woken
        assert calls == []
        _hot.ring_put(1, "t", {"o": Odd()})        # lands in the empty deque: woken, after the append
        _hot.ring_put(1, "t", {"o": Odd()})        # the deque was not empty: the drainer has been woken already
        assert calls == [1]
        side.clear()
        _hot.ring_put(1, "config", {"cp_rank": 0})  # (the config record takes the side path too)
        assert calls == [1, 1]
        flag = Flag()                               # the drainer's real wake-up: a lock's release, set twice
        r.submit(side, 1 << 20, 1 << 40, flag.raw_set)
        side.clear()
        _hot.ring_put(1, "t", {"o": Odd()})
        side.clear()
        _hot.ring_put(1, "t", {"o": Odd()})        # already set: its RuntimeError is swallowed
        assert flag.wait(0) and len(side) == 1 and r.counters()[2] == 0
    finally:
        r.detach()


def test_the_ring_is_the_default_with_the_exporter_process_and_0_keeps_the_buffer() -> None:
    from cptrace_otel.traced import ring as ring_mod

    assert config.from_env({}).ring is True
    assert config.from_env({"CPTRACE_RING": "0"}).ring is False
    made = ring_mod.create(config.from_env({}))
    assert made is not None   # (CPTRACE_REQUIRE_SPEEDUPS: the C part is built)
    made.close()
    assert ring_mod.create(config.from_env({"CPTRACE_RING": "0"})) is None
    assert ring_mod.create(config.from_env({"CPTRACE_EXPORTER": "thread"})) is None


def test_a_reader_that_was_replaced_reads_nothing_more() -> None:
    r, _ = _ring()
    _hot.ring_put(1, "t", {"i": 0})
    old = RingIntake(r.info())
    assert [it[3] for it in old.take()] == [{"i": 0}]
    new = RingIntake(r.info(), side_next=0)   # a replacement worker claims the ring
    for i in range(1, 50):
        _hot.ring_put(1, "t", {"i": i})
    assert old.take() == [] and old.superseded   # the one that lingers takes nothing from under it
    assert [it[3]["i"] for it in new.take()] == list(range(1, 50))
    r.detach()


def test_consumed_pages_are_given_back_once_the_ring_has_wrapped() -> None:
    """The memfd's allocated blocks (what is resident, in both processes) after the ring wrapped three times while
    a reader kept up: about the span held back before a punch plus what is unread, not the whole ring."""
    r, _ = _ring(4 << 20)
    rd = RingIntake(r.info())
    assert rd.punch == 512 << 10
    n = 0
    blob = "z" * 900
    while r.counters()[0] < 3 * r.cap:
        for _ in range(200):
            _hot.ring_put(1, "t", {"i": n, "s": blob})
            n += 1
        assert [it[3]["i"] for it in rd.take()][-1] == n - 1
    w, rpos, dropped, _, written, consumed, _cap = r.counters()
    assert dropped == 0 and written == consumed == n and w == rpos
    resident = os.fstat(r.fd).st_blocks * 512
    assert resident <= rd.punch + 4 * 4096, resident   # (without giving pages back: the whole 4 MiB)
    for i in range(300):   # the producer writes on into punched pages: they come back as zero pages, records intact
        _hot.ring_put(1, "t", {"i": n + i, "s": blob})
    assert [it[3]["i"] for it in rd.take()] == list(range(n, n + 300))
    r.detach()


def test_a_burst_after_laps_has_the_whole_ring() -> None:
    """After the ring has wrapped (a reader that kept up for two laps, pages given back), a burst the reader falls
    behind on gets the whole ring's room: ~3.7 MiB of records into a 4 MiB ring, nothing dropped, all read back in
    order. (A producer that went back to the ring's start early, behind a PAD to the end, to stay on mapped pages,
    left such a burst only the bytes before the PAD: it dropped most of it.)"""
    r, _ = _ring(4 << 20)
    rd = RingIntake(r.info())
    blob = "z" * 900
    n = 0
    while r.counters()[0] < 2 * r.cap + r.cap // 3:   # two laps and a third, read as they come
        for _ in range(200):
            _hot.ring_put(1, "t", {"i": n, "s": blob})
            n += 1
        assert [it[3]["i"] for it in rd.take()] == list(range(n - 200, n))
    n0 = n
    while (n - n0) * 940 < (4 << 20) - (300 << 10):   # the burst: ~3.7 MiB unread
        _hot.ring_put(1, "t", {"i": n, "s": blob})
        n += 1
    assert r.dropped() == 0, r.dropped()
    got: list[int] = []
    while len(got) < n - n0:
        items = rd.take()
        assert items, len(got)
        got += [it[3]["i"] for it in items]
    assert got == list(range(n0, n))
    r.detach()


def test_the_side_deque_is_bounded_by_bytes_too() -> None:
    """Records too large for the ring (a str value over 64 KiB) take the side path; while the drainer does not
    take them they stop at the byte bound (counted as dropped), not at the count bound; once taken there is room."""
    r = Ring(1 << 20)
    side: collections.deque = collections.deque()
    r.submit(side, 1 << 20, 1 << 20)   # count bound 1M records, byte bound 1 MiB
    big = "b" * 100_000
    for i in range(100):
        _hot.ring_put(1, "t", {"i": i, "s": big})
    kept = len(side)
    assert 5 <= kept <= 10 and r.dropped() == 100 - kept
    assert [it[3]["i"] for it in side] == list(range(kept))
    side.clear()   # the drainer took them
    for i in range(3):
        _hot.ring_put(1, "t", {"i": 100 + i, "s": big})
    assert len(side) == 3 and r.dropped() == 100 - kept
    r.detach()


_RESTART_CHILD = r"""
import json, os, time
import cptrace_otel as ct
from cptrace_otel.traced import pipeline

for i in range(500):
    ct.cptrace(1, "evict", node_id=i, i=i)
assert ct.flush(30)
st = pipeline.current()
old = st.channel
st.on_worker_gone("the ack pipe broke (test)", old)   # as the ack reader does; the worker itself still runs
for i in range(500, 3000):
    ct.cptrace(1, "evict", node_id=i, i=i)
ok = ct.flush(30)
print(json.dumps({"ok": ok, "old_rc": old.proc.poll(), "new": st.channel is not old, "stats": pipeline.stats()}),
      flush=True)
"""


def test_a_restart_while_the_old_worker_still_runs_leaves_one_reader(tmp_path: Any) -> None:
    """The channel declares a worker gone when its ack pipe breaks, which can happen while the worker still runs.
    The restart kills and reaps it before the replacement starts, so the old one cannot go on reading the ring:
    every record is delivered once, in order."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, CPTRACE_LEVEL="1", CPTRACE_CP_RANK="0", CPTRACE_RUN_ID="restart",
               CPTRACE_EXPORTER="process", CPTRACE_LOG_FILE=str(tmp_path / "log.txt"),
               CPTRACE_FILE=str(tmp_path / "o.jsonl"), CPTRACE_SPOOL_DIR=str(tmp_path / "spool"))
    env.pop("CPTRACE_RING", None)   # the default
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    p = subprocess.run([sys.executable, "-c", _RESTART_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["new"] and out["old_rc"] is not None, out   # the old worker was reaped before the new one started
    assert out["stats"]["restarts"] == 1 and "ring" in out["stats"]
    got = [int(ln.split(" i=")[1].split()[0]) for ln in (tmp_path / "log.txt").read_text().splitlines()]
    assert got == list(range(3000)) and out["ok"] and out["stats"]["dropped"] == 0


def test_ring_clock_stamps_ring_and_side_records_and_none_gives_the_real_clock_back() -> None:
    import time

    ticks = iter(range(10**18, 10**18 + 100))
    r, side = _ring()
    rd = RingIntake(r.info())
    try:
        _hot.ring_clock(lambda: next(ticks))
        _hot.ring_put(1, "prepare", {"node_id": 1, "op": 1})
        _hot.ring_put(1, "ack", {"node_id": 1, "obj": Odd()})           # side path: stamped by the same clock
        _hot.ring_clock(lambda: 1 / 0)                                    # a failing clock: the real one, no error
        _hot.ring_put(1, "evict", {"node_id": 1})
        _hot.ring_clock(None)
        before = time.time_ns()
        _hot.ring_put(1, "evict", {"node_id": 2})
        with pytest.raises(TypeError):
            _hot.ring_clock(5)
        rd.add_side([compact_item(it) for it in side])
        got = rd.take(final=True)
    finally:
        _hot.ring_clock(None)
        r.detach()
    assert [it[0] for it in got[:2]] == [10**18, 10**18 + 1]
    assert got[2][0] >= before - 10**9 and got[3][0] >= before
