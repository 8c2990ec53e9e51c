"""``_hot.IdSet`` (``_speedups/idset.c``), the set of node ids sampled out that the C gate of ``cptrace`` probes: its
membership is a Python set's after any sequence of adds, discards and clears, for any elements (ints in and beyond
int64, INT64_MIN, bools, floats equal to ints, strs, None, objects with their own equality), through the C gate and
through ``in`` alike; Python code run by an element's ``__hash__``/``__eq__``/``__del__`` that mutates the same set
leaves it right; a cycle through it is collected.

Skipped when the extension was not built (no compiler), unless ``CPTRACE_REQUIRE_SPEEDUPS=1``."""

from __future__ import annotations

import gc
import os
import random
import weakref

import pytest

from cptrace_otel.traced import api

if api._hot is None:
    if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1" and os.environ.get("CPTRACE_PY_GATE") != "1":
        pytest.fail("cptrace_otel._speedups._hot was not built (CPTRACE_REQUIRE_SPEEDUPS=1)", pytrace=False)
    pytest.skip("cptrace_otel._speedups._hot not built", allow_module_level=True)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

IdSet = api._hot.IdSet
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


class Eq5:
    """Equal to 5 (and hashes like it) without being an int: the set's generic compare decides."""

    def __hash__(self) -> int:
        return 5

    def __eq__(self, other: object) -> bool:
        return other == 5


def _gate_says(s: IdSet, key: object) -> bool:
    """Whether the C gate drops a record of node ``key`` with drop set ``s`` (its own probe of ``s``)."""
    seen: list = []
    state = api._STATE
    saved = state.submit, state.level, state.drop
    try:
        state.submit, state.level, state.drop = (lambda *a: seen.append(a)), 1, s
        api._hot.cptrace(1, "evict", node_id=key)
    finally:
        state.submit, state.level, state.drop = saved
    return not seen


_ELEMS = st.one_of(
    st.integers(-3, 40), st.integers(I64_MIN, I64_MAX), st.sampled_from([I64_MIN, I64_MAX, 1 << 30, -(1 << 30)]),
    st.integers(min_value=1 << 63, max_value=1 << 70), st.booleans(), st.sampled_from([2.0, 5.0, 0.5, -1.0]),
    st.text(max_size=2), st.none(), st.builds(Eq5))
_OPS = st.lists(st.tuples(st.sampled_from(["add", "discard", "clear", "in"]), _ELEMS), max_size=40)


@settings(max_examples=500, deadline=None)
@given(ops=_OPS, init=st.lists(_ELEMS, max_size=6))
def test_membership_is_a_sets(ops: list, init: list) -> None:
    model, s = set(init), IdSet(init)
    probes = [0, 1, 2, 5, -1, I64_MIN, I64_MAX, 1 << 63, True, 2.0, "a", None]
    for op, x in ops:
        if op == "add":
            model.add(x)
            s.add(x)
        elif op == "discard":
            model.discard(x)
            s.discard(x)
        elif op == "clear":
            model.clear()
            s.clear()
        assert len(s) == len(model)
        for key in [x] + probes:
            assert (key in s) == (key in model), (key, model)
            assert _gate_says(s, key) == (key in model), (key, model)
    assert sorted(map(repr, s)) == sorted(map(repr, model))


@pytest.mark.parametrize("spread", ["sequential", "random"])
def test_many_ids_grow_and_shrink_the_table(spread: str) -> None:
    # sequential ids (SGLang's) spread evenly; random ones collide, so removals shift runs of the probe sequence
    rnd = random.Random(7)
    ids = list(range(0, 300_000, 3)) if spread == "sequential" else [rnd.randrange(-(1 << 40), 1 << 40)
                                                                      for _ in range(100_000)]
    s, model = IdSet(), set()
    for n in ids:
        s.add(n)
        model.add(n)
    for n in ids[::3] + [rnd.randrange(-(1 << 40), 1 << 40) for _ in range(1000)]:
        s.discard(n)
        model.discard(n)
    assert len(s) == len(model)
    assert all((n in s) == (n in model) for n in ids)
    assert all((n in s) == (n in model) for n in range(-5, 3005))
    assert all(_gate_says(s, n) == (n in model) for n in ids[:3000])
    s.clear()
    assert len(s) == 0 and ids[1] not in s and not _gate_says(s, ids[1])


def test_removals_keep_every_colliding_id_reachable() -> None:
    # small tables, many ids per first slot: a removal must move the ids after it in its probe run that may move
    rnd = random.Random(11)
    for _ in range(300):
        ids = list({rnd.randrange(0, 1 << 20) for _ in range(rnd.randrange(5, 300))})
        s, model = IdSet(ids), set(ids)
        for n in ids[::3]:
            s.discard(n)
            model.discard(n)
        assert [n in s for n in ids] == [n in model for n in ids]


def test_unhashable_keys_raise_like_a_set() -> None:
    s = IdSet([1])
    with pytest.raises(TypeError):
        [1] in s  # noqa: B015 - the test is that the comparison raises
    with pytest.raises(TypeError):
        s.add([1])
    with pytest.raises(TypeError):
        s.discard({})
    assert list(s) == [1] and repr(s) == "IdSet([1])" and repr(IdSet()) == "IdSet()"
    with pytest.raises(TypeError):
        IdSet(5)
    assert not _gate_says(s, [1])   # the gate: an unhashable node id is not decided out, and nothing raises


def test_elements_whose_python_code_mutates_the_same_set() -> None:
    s = IdSet()

    class AddsOnHash:
        def __hash__(self) -> int:
            s.add(7)          # the outer add is still running
            return 11

    s.add(AddsOnHash())
    assert 7 in s and _gate_says(s, 7) and len(s) == 2

    class DiscardsOnDel:
        def __del__(self) -> None:
            s.discard(7)

    s.add(DiscardsOnDel())
    s.discard(next(x for x in s if isinstance(x, DiscardsOnDel)))   # its __del__ runs inside this discard
    assert 7 not in s and not _gate_says(s, 7)

    class AddsOnDel:
        def __del__(self) -> None:
            s.add(9)

    s.add(AddsOnDel())
    s.clear()                                     # its __del__ runs while the set is being cleared
    assert list(s) == [9] and _gate_says(s, 9)

    class EqDiscards:
        def __hash__(self) -> int:
            return 9

        def __eq__(self, other: object) -> bool:
            s.discard(3)
            return other == 9

    s.add(3)
    assert EqDiscards() in s and 3 not in s and not _gate_says(s, 3) and _gate_says(s, 9)


def test_a_cycle_through_an_idset_is_collected() -> None:
    class Node:
        pass

    s = IdSet()
    n = Node()
    n.ids = s   # type: ignore[attr-defined]
    s.add(n)
    gone = weakref.ref(n)
    del s, n
    gc.collect()
    assert gone() is None


def test_the_sampler_gets_an_idset_and_the_gate_reads_it(tmp_path) -> None:
    from cptrace_otel.model import sampling

    out_node = next(n for n in range(1000) if not sampling.keep_node("idset-run", n, 0.1))
    api.configure(level=1, run_id="idset-run", sample=0.1, file=str(tmp_path / "o-{pid}.otlp.jsonl"),
                  exporter="thread")
    try:
        api.cptrace(1, "insert", node_id=out_node)   # starts the pipeline; the sampler decides the node out
        assert type(api._STATE.drop) is IdSet and out_node in api._STATE.drop
        assert _gate_says(api._STATE.drop, out_node)
    finally:
        api.shutdown(30)
        api.reload_config()
    assert api._STATE.drop is None
