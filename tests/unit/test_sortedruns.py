"""The sorted runs on disk behind TraceDocs (``analyze/sources/sortedruns.py``): runs read back as written, runs
merged as they accumulate give the stream of one stable sort of everything, and the seq bits say "clash" exactly when
two records share a seq (or one they cannot hold came)."""

from __future__ import annotations

import heapq

from hypothesis import given, settings, strategies as st

from cptrace_otel.analyze.sources import sortedruns
from cptrace_otel.analyze.sources.sortedruns import RunFile, SeqBits
from cptrace_otel.model.events import Event


def rec(epoch: int, seq: int, ts: int, i: int, pickled: bool = False) -> tuple:
    """A record; ``pickled``: one whose fields sortedruns.c does not pack (a dict with an int key), so its chunk is
    pickled and its run "mixed"."""
    fields: dict = {"i": i, "odd": {1: 2}} if pickled else {"i": i}
    ev = Event("ack", 0, seq, ts, epoch, fields, 1, f"src{i % 3}", 0)
    return ev.epoch, ev.seq, ev.ts, ev


keys = st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(keys, max_size=12), max_size=40), st.integers(2, 4), st.integers(1, 5))
def test_runs_merged_as_they_come_give_one_stable_sort(spills, fan_in, chunk):
    old = sortedruns.FAN_IN, sortedruns.CHUNK
    sortedruns.FAN_IN, sortedruns.CHUNK = fan_in, chunk
    try:
        f, runs, everything, i = RunFile(), [], [], 0
        for spill in spills:
            lst = []
            for e, q, t in spill:
                lst.append(rec(e, q, t, i))
                i += 1
            everything += lst
            lst.sort(key=lambda t: t[:3])
            runs.append(f.write(lst))
            f.compact(runs)
            levels = [f.level(r) for r in runs]
            assert levels == sorted(levels, reverse=True)   # oldest (longest) runs first
            assert all(levels.count(lv) < fan_in for lv in set(levels))
        got = [t[3] for t in heapq.merge(*(f.read(o, n) for o, n in runs), key=lambda t: t[:3])]
        want = [t[3] for t in sorted(everything, key=lambda t: t[:3])]   # (sorted is stable)
        assert got == want
    finally:
        sortedruns.FAN_IN, sortedruns.CHUNK = old


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.tuples(keys, st.booleans()), max_size=4)), max_size=40))
def test_runs_of_several_keys_in_one_file_each_read_back_as_one_stable_sort(spills):
    """Several keys' runs share one file, as TraceDocs' ranks do, some of them empty (a run of no record starts where
    the next run written does) and some holding pickled chunks: merging one key's runs never reads or marks
    another's."""
    old = sortedruns.FAN_IN, sortedruns.CHUNK
    sortedruns.FAN_IN, sortedruns.CHUNK = 2, 1
    try:
        f = RunFile()
        runs: dict[int, list] = {0: [], 1: [], 2: []}
        everything: dict[int, list] = {0: [], 1: [], 2: []}
        for i, (key, spill) in enumerate(spills):
            lst = sorted((rec(e, q, t, i, pickled) for (e, q, t), pickled in spill), key=lambda t: t[:3])
            everything[key] += lst
            runs[key].append(f.write(lst))
            f.compact(runs[key])
        for key, rs in runs.items():
            got = [t[3] for t in heapq.merge(*(f.read(o, n) for o, n in rs), key=lambda t: t[:3])]
            assert got == [t[3] for t in sorted(everything[key], key=lambda t: t[:3])]
    finally:
        sortedruns.FAN_IN, sortedruns.CHUNK = old


def test_an_empty_run_merged_leaves_the_run_at_its_offset_as_it_was():
    """An empty run has the offset of the next run written: merging it must not take that run's marks (here its
    pickled chunk, which the packed merge cannot read) nor give it a level."""
    old = sortedruns.FAN_IN, sortedruns.CHUNK
    sortedruns.FAN_IN, sortedruns.CHUNK = 2, 1
    try:
        f = RunFile()
        a = [f.write([])]
        b = [f.write([rec(0, 1, 0, 0, pickled=True)])]
        assert a[0][0] == b[0][0]
        b.append(f.write([rec(0, 2, 0, 1)]))
        a.append(f.write([]))
        f.compact(a)
        assert f.level(b[0]) == 0 and f.level(b[1]) == 0
        f.compact(b)
        assert [t[1] for o, n in b for t in f.read(o, n)] == [1, 2]
    finally:
        sortedruns.FAN_IN, sortedruns.CHUNK = old


@given(st.lists(st.lists(st.integers(-2, 70), max_size=20), max_size=6))
def test_seq_bits_clash_exactly_when_a_seq_comes_twice_or_cannot_be_held(batches):
    bits = SeqBits()
    seen: set[int] = set()
    clash = False
    for batch in batches:
        bits.add([rec(0, q, 0, 0) for q in batch])
        for q in batch:
            clash = clash or q < 0 or q in seen
            seen.add(q)
    assert bits.clash == clash


def test_seq_bits_past_their_bound_and_of_another_type_clash():
    b = SeqBits()
    b.add([(0, sortedruns.SEQ_BITS_MAX - 1, 0, None)])
    assert not b.clash
    b.add([(0, sortedruns.SEQ_BITS_MAX, 0, None)])
    assert b.clash
    c = SeqBits()
    c.add([(0, True, 0, None)])
    assert c.clash
