"""``_speedups/sortedruns.c`` against its Python twins, as the sorted runs on disk use them
(``analyze/sources/sortedruns.py``): ``pack``/``unpack`` against pickle of the Events' values (the same records
back, every value of the same type and bits; ``None``, pickle the chunk, exactly for the values the format does not
hold; bytes it did not write refused with a ValueError; runs mixing packed and pickled chunks read back as written),
``merge`` against ``heapq.merge`` (the same records in the same order, pulled from the runs in the same order, the
same errors), and ``check``'s whole report over a real run's records sorted on disk the same with either."""

from __future__ import annotations

import heapq
import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cptrace_otel._speedups import twin_off
from cptrace_otel.analyze.sources import sortedruns, tracedocs
from cptrace_otel.analyze.sources.sortedruns import RECORD_KEY, RunFile, pickle_chunk, unpickle_chunk
from cptrace_otel.model.events import Event
from cptrace_otel.model.logline import Rng

P = sortedruns.c_runs()
pytestmark = pytest.mark.skipif(P is None, reason="the _sortedruns extension was not built (pip install -e . builds "
                                "it)")

INT64 = (-(1 << 63), (1 << 63) - 1)
# the ints where the format's varints change length (7 bits a byte, zigzag for the sign), and int64's ends
VARINT_EDGES = sorted({s * ((1 << k) + d) for k in range(0, 64, 7) for d in (-1, 0) for s in (1, -1)} | set(INT64))


def packable(v: object, depth: int = 0) -> bool:
    """The format's domain, stated in Python: what pack must take (anything else: None)."""
    if v is None or type(v) in (bool, float):
        return True
    if type(v) is int:
        return INT64[0] <= v <= INT64[1]
    if type(v) is str:
        try:
            v.encode()
        except UnicodeEncodeError:
            return False
        return True
    if depth >= 32:
        return False
    if type(v) is list:
        return all(packable(x, depth + 1) for x in v)
    if type(v) is Rng:
        return all(packable(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(type(k) is str and packable(k) and packable(x, depth + 1) for k, x in v.items())
    return False


def _values(e: Event) -> tuple:
    return (e.tag, e.rank, e.seq, e.ts, e.epoch, e.fields, e.level, e.src, e.line_no)


def same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (floats by their bits: -0.0 and NaN too)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)  # type: ignore[arg-type]
    if type(a) in (list, Rng, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)  # type: ignore[index, arg-type]
    if isinstance(a, Event):
        return same(_values(a), _values(b))
    return a == b


def twin(records: list[tuple]) -> list[tuple]:
    """What the sorted runs read back from a pickled chunk of ``records``."""
    return unpickle_chunk(pickle_chunk(records))


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.integers(-300, 300), st.sampled_from(VARINT_EDGES),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["stage", "node_id", "\ud800x", "é", ""]))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.builds(Rng, inner, inner, inner, inner, inner),
        st.tuples(inner),                                   # (not an Rng: pickled)
        st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
fields = st.dictionaries(st.sampled_from(["node_id", "len", "rng", "hash", "x", "\ud800"]) | st.text(max_size=4),
                         values, max_size=6)
ints = st.integers(-(1 << 64), 1 << 64) | st.integers(0, 1000) | st.sampled_from(VARINT_EDGES)
events = st.builds(Event, st.sampled_from(["insert", "ack", "reload"]) | st.text(max_size=5), ints, ints, ints, ints,
                   fields, ints, st.sampled_from(["a.jsonl", "b.jsonl"]), st.none() | ints)


def as_records(evs: list[Event]) -> list[tuple]:
    return [(e.epoch, e.seq, e.ts, e) for e in evs]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=8))
def test_pack_gives_the_records_pickle_gives_or_none_exactly_outside_its_domain(evs):
    recs = as_records(evs)
    data = P.pack(recs)
    if not all(packable(v) for e in evs for v in _values(e)):
        assert data is None
        return
    assert isinstance(data, bytes)
    got, want = P.unpack(data), twin(recs)
    assert len(got) == len(want) == len(recs)
    for g, w in zip(got, want, strict=True):
        assert type(g) is tuple and len(g) == 4
        assert all(same(x, y) for x, y in zip(g, w, strict=True)), (g, w)
        assert g[0] is g[3].epoch and g[1] is g[3].seq and g[2] is g[3].ts


def test_the_shapes_the_readers_build_are_packed():
    ev = Event("reload", 3, 17, 1_784_343_786_000_000_000, 2,
               {"node_id": 9, "rng": Rng(16, 0, 15, 0, 15), "frng": Rng(4, -0.5, 2.0, 1.0, math.inf),
                "hash": "ab12", "slots": [1, 2, [3]], "ok": True, "none": None, "nested": {"k": [1.5]}},
               2, "run.otlp.jsonl", None)
    data = P.pack([(2, 17, ev.ts, ev)] * 3)
    assert data is not None
    back = P.unpack(data)
    assert all(same(b[3], ev) for b in back)
    assert type(back[0][3].fields["rng"]) is Rng


def test_a_stream_of_our_records_packs_smaller_than_pickle():
    """The varints at work: a chunk shaped as the log reader's records of a lifecycle stream (small ints, range
    summaries, 64-bit hashes, times in ns, the reader's rank and ts fields) takes fewer bytes than the same chunk
    pickled (with the 4 and 8 byte numbers it had before, 2.2 times as many on bench/check_throughput.py's stream)."""
    tags = ("insert", "prepare", "backup", "ack", "evict", "free", "compose", "rid_map")
    recs = []
    for i in range(256):
        node, t = i // 8, 1_784_343_786_000_000_000 + 1000 * i
        d, h = 64 * node, 100_000 + 64 * node
        f = {"op": node, "node_id": node, "dev": Rng(64, d, d + 63, d, d + 63), "host": Rng(64, h, h + 63, h, h + 63),
             "io": 1, "h": (node * 0x9E3779B97F4A7C15) % (1 << 63), "nz": 8192, "hp": [704, 385, 295, 329],
             "dir": "d2h", "rank": 0, "ts": t}
        ev = Event(tags[i % 8], 0, i, t, 0, f, 2, "rank0.log", i + 1)
        recs.append((ev.epoch, ev.seq, ev.ts, ev))
    data = P.pack(recs)
    assert data is not None and all(same(g, w) for g, w in zip(P.unpack(data), recs, strict=True))
    assert len(data) < len(pickle_chunk(recs)), (len(data), len(pickle_chunk(recs)))


@pytest.mark.parametrize("odd", [
    pytest.param(("not", "a", "list"), id="tuple"),
    pytest.param(1 << 64, id="int beyond int64"),
    pytest.param("\udcff", id="lone surrogate"),
    pytest.param(type("Sub", (str,), {})("x"), id="str subclass"),
    pytest.param(type("Flag", (int,), {})(1), id="int subclass"),
    pytest.param({1: "int key"}, id="dict with an int key"),
    pytest.param(frozenset(), id="frozenset"),
])
def test_values_outside_the_format_leave_the_chunk_to_pickle(odd):
    ev = Event("ack", 0, 1, 2, 0, {"x": odd}, 1, "s", 0)
    assert P.pack([(0, 1, 2, ev)]) is None


def test_nesting_past_the_depth_bound_is_pickled():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    ev = Event("ack", 0, 1, 2, 0, {"x": deep}, 1, "s", 0)
    assert P.pack([(0, 1, 2, ev)]) is None


def test_not_an_event_or_not_a_record_is_pickled():
    class Other(Event):
        __slots__ = ()

    ev = Event("ack", 0, 1, 2, 0, {}, 1, "s", 0)
    assert P.pack([(0, 1, 2, Other(*_values(ev)))]) is None
    assert P.pack([(0, 1, 2, ev, "extra")]) is None
    with pytest.raises(TypeError):
        P.pack(((0, 1, 2, ev),))


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=3), st.data())
def test_bytes_pack_did_not_write_are_refused_not_read(evs, data):
    recs = [(e.epoch, e.seq, e.ts, e) for e in evs if all(packable(v) for v in _values(e))]
    packed = P.pack(recs)
    if not packed:
        return
    cut = data.draw(st.integers(0, len(packed) - 1))
    with pytest.raises(ValueError):
        P.unpack(packed[:cut])
    with pytest.raises(ValueError):
        P.unpack(packed + b"N")
    pos = data.draw(st.integers(0, len(packed) - 1))
    byte = data.draw(st.integers(0, 255))
    bad = packed[:pos] + bytes([byte]) + packed[pos + 1:]
    try:   # a changed byte may still spell records: then they are whole records, never a crash
        out = P.unpack(bad)
    except ValueError:
        return
    assert all(isinstance(t[3], Event) for t in out)


def test_a_run_mixing_packed_and_pickled_chunks_reads_back_as_written(monkeypatch):
    monkeypatch.setattr(sortedruns, "CHUNK", 3)
    pickled = []
    monkeypatch.setattr(sortedruns, "pickle_chunk", lambda recs: pickled.append(len(recs)) or pickle_chunk(recs))
    recs = []
    for i in range(20):
        v = (i,) if i % 7 == 0 else i   # a tuple value: its chunk is pickled
        ev = Event("ack", 0, i, 100 + i, 0, {"v": v, "r": Rng(1, i, i, i, i)}, 1, "s", i)
        recs.append((0, i, 100 + i, ev))
    f = RunFile()
    run = f.write(recs)
    assert pickled == [3, 3, 3]   # (records 0, 7 and 14: the rest packed)
    back = list(f.read(*run))
    assert len(back) == len(recs)
    assert all(same(a, b) for a, b in zip(back, recs, strict=True))


# keys as the runs hold them (ints, some past 64 bits, equal ones across runs) and of other types (floats, which
# compare with ints; None, which compares with nothing: a TypeError in both twins)
key_parts = st.integers(0, 3) | st.integers(-(1 << 70), 1 << 70) | st.sampled_from([0.5, 2.0, -0.0])


class Pulls:
    """An iterator over ``items`` that logs each pull in ``log`` (to hold the twins' laziness equal)."""

    def __init__(self, name: int, items: list, log: list) -> None:
        self.name, self.it, self.log = name, iter(items), log

    def __iter__(self) -> Pulls:
        return self

    def __next__(self) -> object:
        self.log.append(self.name)
        return next(self.it)


def _both(runs: list[list], take: int | None = None) -> tuple:
    """(records, pulls, error) of each twin over ``runs``, ``take`` records at most."""
    out = []
    for twin_merge in (lambda its: heapq.merge(*its, key=RECORD_KEY), P.merge):
        log: list = []
        got: list = []
        err = None
        try:
            for t in twin_merge([Pulls(i, r, log) for i, r in enumerate(runs)]):
                got.append(t)
                if take is not None and len(got) >= take:
                    break
        except TypeError as e:
            err = type(e)
        out.append((got, log, err))
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(key_parts, key_parts, key_parts), max_size=8), max_size=6),
       st.none() | st.integers(0, 20))
def test_merge_gives_heapq_merges_records_in_its_order_pulled_alike(run_keys, take):
    runs = []
    for ri, keys in enumerate(run_keys):
        recs = [(*k, f"run{ri}#{j}") for j, k in enumerate(keys)]
        runs.append(sorted(recs, key=RECORD_KEY))
    (got, log, err), (want, log_py, err_py) = _both(runs, take)
    assert err == err_py is None
    assert [id(t) for t in got] == [id(t) for t in want]   # the same objects: stable, ties in the order of the runs
    assert log == log_py


ts_values = st.integers(0, 5) | st.integers(-(1 << 70), 1 << 70) | st.booleans() | st.just("7") | st.none()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(ts_values, st.integers(0, 5)), max_size=8), max_size=5))
def test_merge_of_events_gives_merge_streams_python_order(run_specs):
    """merge(runs, "ts"): the ranks' Event streams as otlpfile.merge_streams merges them in Python (merge_key: the
    ts field when an int, not a bool; else Event.ts)."""
    from cptrace_otel.analyze.sources.otlpfile import MERGE_FIELD, merge_key

    runs = []
    for r, spec in enumerate(run_specs):
        evs = []
        for j, (f, ts) in enumerate(spec):
            fields = {} if f is None else {MERGE_FIELD: f}
            evs.append(Event("ack", r, j, ts, 0, fields, 1, "s", j))
        runs.append(sorted(evs, key=merge_key))
    want = list(heapq.merge(*runs, key=merge_key))
    got = list(P.merge(runs, MERGE_FIELD))
    assert [id(e) for e in got] == [id(e) for e in want]
    with pytest.raises(TypeError):
        list(P.merge([[(0, 1, 2)], [(0, 1, 3)]], MERGE_FIELD))   # (records, not Events)


def test_merge_raises_where_heapq_merge_does():
    (got, _log, err), (want, _log_py, err_py) = _both([[(None, 1, 2, "a")], [(0, 1, 2, "b")]])
    assert err is err_py is TypeError and got == want == []
    with pytest.raises(TypeError):
        list(P.merge([[(0, 1)]]))   # (not a record: heapq.merge would take it; the runs never hold one)

    def broken():
        yield (0, 0, 0, "x")
        raise OSError("disk gone")
    m = P.merge([broken(), [(1, 0, 0, "y")]])
    assert next(m) == (0, 0, 0, "x")
    with pytest.raises(OSError, match="disk gone"):
        next(m)


seqs = st.integers(-2, 80) | st.sampled_from([True, None, 2.0, 1 << 70, sortedruns.SEQ_BITS_MAX - 1,
                                              sortedruns.SEQ_BITS_MAX, 4000])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(seqs, max_size=15), max_size=6))
def test_mark_seqs_is_seq_bits_add(batches):
    """SeqBits.add in C (mark_seqs) and in Python (_add_py): the same clash after every batch, the same bits (grown
    alike) while none came."""
    from cptrace_otel.analyze.sources.sortedruns import SeqBits

    c, py = SeqBits(), SeqBits()
    for batch in batches:
        recs = [(0, q, 0, None) for q in batch]
        c.add(recs)
        py._add_py(recs)
        assert c.clash == py.clash
        if not py.clash:
            assert c.bits == py.bits


def _run_bytes(f: RunFile, run: tuple) -> bytes:
    """The bytes of the file from ``run`` on (the last run written)."""
    fh = f._file()
    end = fh.seek(0, 2)
    fh.seek(run[0])
    return fh.read(end - run[0])


texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=5) | st.sampled_from(["ack", "node_id", "é"])
clean_values = st.recursive(
    st.none() | st.booleans() | st.integers(*INT64) | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.builds(Rng, inner, inner, inner, inner, inner)
    | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8)
clean_fields = st.dictionaries(texts, clean_values, max_size=4) | st.just({"odd": (1,)})   # (a tuple: pickled)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 3), clean_fields),
                         max_size=9), min_size=2, max_size=5), st.integers(1, 4))
def test_merge_packed_writes_the_chunks_merge_and_pack_write(spills, chunk):
    """A merge of runs straight from their packed bytes (merge_packed) writes the same bytes as merging their
    records and packing them again (_merge_records, its twin), chunk for chunk; where a run holds a pickled chunk the
    records are merged instead, and read back the same."""
    old = sortedruns.CHUNK
    sortedruns.CHUNK = chunk
    try:
        outs = []
        for raw in (True, False):
            f, runs = RunFile(), []
            for si, spill in enumerate(spills):
                lst = [(e, q, t, Event("ack", si, q, t, e, flds, 1, f"s{si}", j))
                       for j, (e, q, t, flds) in enumerate(spill)]
                runs.append(f.write(sorted(lst, key=RECORD_KEY)))
            w = f.writer()
            in_c = raw and f._merge_packed(runs, w)
            if not in_c:
                w = f.writer()
                f._merge_records(runs, w)
            new = w.close()
            outs.append((_run_bytes(f, new), [_values(t[3]) for t in f.read(*new)], bool(f._mixed), in_c))
        (got, got_recs, mixed, in_c), (want, want_recs, _m, _c) = outs
        assert len(got_recs) == sum(map(len, spills))
        assert all(same(a, b) for a, b in zip(got_recs, want_recs, strict=True))
        if not mixed:
            assert in_c and got == want and (len(got) > 0) == (len(got_recs) > 0)
    finally:
        sortedruns.CHUNK = old


def test_merge_packed_declines_keys_that_are_not_int64_and_refuses_bytes_pack_did_not_write():
    ev = Event("ack", 0, 1, 2, 0, {}, 1, "s", 0)
    good = P.pack([(0, 1, 2, ev)])
    big = P.pack([(1 << 40, 1, 2, Event("ack", 0, 1, 2, 1 << 40, {}, 1, "s", 0))])
    assert P.merge_packed([[good], [big]], 4, lambda n, d: None) is True
    odd = P.pack([(True, 1, 2, Event("ack", 0, 1, 2, True, {}, 1, "s", 0))])   # (a bool epoch: records compare it)
    assert P.merge_packed([[good], [odd]], 4, lambda n, d: None) is False
    for bad in (good[:-1], good + b"N", b"\x01\x00\x00\x00Z"):
        with pytest.raises(ValueError):
            P.merge_packed([[bad]], 4, lambda n, d: None)


def test_check_over_a_real_runs_records_sorted_on_disk_says_the_same_with_either(tmp_path, monkeypatch):
    """A demo run (our exporter's file sink in real rank processes, faults injected) checked with its records
    sorted on disk: every record packed (none of their values left to pickle), the same report as pickled."""
    import json

    from tests.helpers.demo_run import check, run_demo

    demo = run_demo(tmp_path / "demo", ranks=2)
    monkeypatch.setattr(tracedocs, "SPILL_AT", 1)
    monkeypatch.setattr(sortedruns, "CHUNK", 16)
    answers = []
    real = P.pack

    def pack(recs):
        answers.append((len(recs), real(recs)))
        return answers[-1][1]
    monkeypatch.setattr(P, "pack", pack)
    rc, out, _err = check("--json", *demo["otlp"])
    with twin_off(vars(sortedruns), "C_RUNS"):
        rc_py, out_py, _err_py = check("--json", *demo["otlp"])
    assert sum(n for n, _d in answers) == json.loads(out)["stats"]["events"] > 100
    assert all(d is not None for _n, d in answers)
    assert (rc, json.loads(out)) == (rc_py, json.loads(out_py))
    assert rc == 1 and json.loads(out)["findings"]
