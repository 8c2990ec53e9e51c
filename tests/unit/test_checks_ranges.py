"""Slot-set algebra of the checks: exact runs, dense blocks, interval-only overlaps, concatenation, slicing."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cptrace_otel.checks.ranges import EXACT, INTERVAL, concat, overlap, parse_runs, slice_slots, slots_of
from cptrace_otel.model.logline import Rng


def test_parse_runs():
    assert parse_runs("1-3:7-7:9") == ((1, 3), (7, 7), (9, 9))
    assert parse_runs(5) == ((5, 5),)
    for bad in ("", "3-1", "-3", "a-b", None, 1.5):
        assert parse_runs(bad) is None


def test_slots_of_sentinels_and_dense_blocks():
    assert slots_of("(none)") is None and slots_of("(err:x)") is None and slots_of("junk") is None
    e = slots_of("(0)")
    assert e.cnt == 0 and overlap(e, slots_of(Rng(4, 0, 3, 0, 3))) is None
    d = slots_of(Rng(4, 10, 13, 10, 13))
    assert d.runs == ((10, 13),) and not d.ordered      # membership known, order not
    s = slots_of(Rng(2, 10, 20, 10, 20))
    assert s.runs is None
    x = slots_of(Rng(2, 10, 20, 10, 20), "10:20")
    assert x.runs == ((10, 10), (20, 20)) and x.ordered


def test_overlap_certainty():
    dense = slots_of(Rng(4, 10, 13, 10, 13))
    sparse = slots_of(Rng(2, 5, 30, 5, 30))
    assert overlap(dense, slots_of(Rng(2, 13, 14, 13, 14))) == EXACT
    assert overlap(dense, slots_of(Rng(2, 14, 15, 14, 15))) is None
    assert overlap(dense, sparse) == INTERVAL                       # hulls intersect, sets unknown
    assert overlap(dense, slots_of(Rng(2, 5, 30, 5, 30), "5:30")) is None   # exact: they do not
    assert overlap(sparse, slots_of(Rng(2, 5, 30, 5, 30))) == EXACT      # equal summaries count as sure
    assert overlap(slots_of(Rng(3, 1, 9, 1, 9), "1:5:9"), slots_of(Rng(2, 4, 5, 4, 5))) == EXACT


def test_overlap_proofs_from_summaries_alone():
    """What rng summaries prove (slots of one tensor are distinct): a shared member (min, max, first, last) is an
    overlap; so is having more slots in the hulls' intersection than it holds (pigeonhole); anything else with
    intersecting hulls is undecidable, whatever the sets really are."""
    a = slots_of(Rng(3, 10, 50, 30, 10))                  # members 10, 30, 50 known
    assert overlap(a, slots_of(Rng(2, 20, 30, 30, 20))) == EXACT          # 30 is in both
    assert overlap(a, slots_of(Rng(2, 11, 49, 11, 49))) == INTERVAL       # hull inside, no known member shared
    assert overlap(slots_of(Rng(10, 0, 9, 0, 9)), slots_of(Rng(2, 5, 14, 5, 14))) == EXACT  # dense: 5 is in it
    assert overlap(slots_of(Rng(8, 0, 9, 0, 9)), slots_of(Rng(2, 5, 14, 5, 14))) == INTERVAL  # 8 of 10: maybe not
    # pigeonhole: 7 of [0,9] and 7 of [3,12] share [3,9] (7 slots): at least 4 + 4 of them lie there
    assert overlap(slots_of(Rng(7, 0, 9, 1, 8)), slots_of(Rng(7, 3, 12, 4, 11))) == EXACT
    # one slot fewer on each side: 3 + 3 <= 7, they may be disjoint
    assert overlap(slots_of(Rng(6, 0, 9, 1, 8)), slots_of(Rng(6, 3, 12, 4, 11))) == INTERVAL
    # the two sets behind that last pair, disjoint, to show the answer could not be EXACT
    x = {0, 1, 2, 8, 9, 7}
    y = {3, 4, 5, 6, 12, 11}
    assert not x & y and (len(x), min(x), max(x)) == (6, 0, 9) and (len(y), min(y), max(y)) == (6, 3, 12)


def test_concat_and_slice():
    a = slots_of(Rng(2, 7, 8, 7, 8), "7-8")
    b = slots_of(Rng(2, 1, 2, 1, 2), "1-2")
    c = concat([a, b])
    assert c.summary() == (4, 1, 8, 7, 2) and c.runs == ((7, 8), (1, 2)) and c.ordered
    assert slice_slots(c, 1, 2).summary() == (2, 1, 8, 8, 1)
    assert slice_slots(slots_of(Rng(4, 1, 4, 1, 4)), 0, 2) is None  # dense but unordered: no slicing
    assert concat([a, None]) is None


_RUN = st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1]))
_RUNS = st.lists(_RUN, min_size=1, max_size=6).map(tuple)


def _members(runs: tuple) -> set[int]:
    return {x for lo, hi in runs for x in range(lo, hi + 1)}


@settings(max_examples=500, deadline=None)
@given(_RUNS, _RUNS)
def test_exact_overlap_is_set_intersection(a: tuple, b: tuple) -> None:
    """Two exact sets overlap (EXACT) exactly when they share a slot, whichever side has one run (the unsorted fast
    path the H4 scan takes) or both have several (the sorted merge), overlapping or unsorted runs included."""
    sa = slots_of(None, ":".join(f"{lo}-{hi}" for lo, hi in a))
    sb = slots_of(None, ":".join(f"{lo}-{hi}" for lo, hi in b))
    assert sa is not None and sb is not None
    expect = EXACT if _members(a) & _members(b) else None
    assert overlap(sa, sb) == expect
    assert overlap(sb, sa) == expect
