"""The sorted runs on disk behind TraceDocs (``analyze/sources/sortedruns.py``): runs read back as written, runs
merged as they accumulate give the stream of one stable sort of everything, and the seq bits say "clash" exactly when
two records share a seq (or one they cannot hold came)."""

from __future__ import annotations

import heapq

from hypothesis import given, settings, strategies as st

from cptrace_otel.analyze.sources import sortedruns
from cptrace_otel.analyze.sources.sortedruns import RunFile, SeqBits
from cptrace_otel.model.events import Event


def rec(epoch: int, seq: int, ts: int, i: int) -> tuple:
    ev = Event("ack", 0, seq, ts, epoch, {"i": i}, 1, f"src{i % 3}", 0)
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
