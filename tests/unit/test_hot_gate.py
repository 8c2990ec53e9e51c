"""The C gate of ``cptrace`` (``_speedups/hot.c``) decides every call as the Python definition
(``api._cptrace_py``) does: the same records reach ``submit``, with the same fields in the same order, for any level,
gate, tag, node id and drop set (a ``set`` or the ``_hot.IdSet`` the sampler fills); it reads api's gate state
(``api._STATE``) on every call (setting an attribute is seen at once); and it never raises where the definition does
not. ``IdSet`` itself has a set's membership after any sequence of adds, discards and clears
(tests/unit/test_idset.py).

Skipped when the extension was not built (no compiler), unless ``CPTRACE_REQUIRE_SPEEDUPS=1`` (``.ci/run``), which
turns a missing build into a failure."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cptrace_otel.traced import api

if api._hot is None:
    if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1" and os.environ.get("CPTRACE_PY_GATE") != "1":
        pytest.fail("cptrace_otel._speedups._hot was not built (CPTRACE_REQUIRE_SPEEDUPS=1)", pytrace=False)
    pytest.skip("cptrace_otel._speedups._hot not built", allow_module_level=True)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    got: list[tuple] = []
    monkeypatch.setattr(api._STATE, "submit", lambda level, tag, fields: got.append((level, tag, list(fields.items()))))
    monkeypatch.setattr(api._STATE, "level", 2)
    monkeypatch.setattr(api._STATE, "drop", None)
    return got


def _unannotated(fn):
    """``fn``'s signature without annotations: what a C function's ``__text_signature__`` can state."""
    import inspect

    sig = inspect.signature(fn)
    return sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
                       return_annotation=inspect.Signature.empty)


def test_the_call_sites_get_the_c_gate() -> None:
    import inspect

    import cptrace_otel

    assert api.cptrace is api._hot.cptrace and cptrace_otel.cptrace is api.cptrace
    assert inspect.signature(api.cptrace) == _unannotated(api._cptrace_py)


@pytest.mark.parametrize("kind", [set, api._hot.IdSet])
def test_gate_drop_and_split(captured: list[tuple], monkeypatch: pytest.MonkeyPatch, kind: type) -> None:
    api.cptrace(2, "backup", node_id=1, a=1)
    api.cptrace(3, "backup", node_id=1, a=2)                # above the gate
    monkeypatch.setattr(api._STATE, "drop", kind([5, "n7"]))
    api.cptrace(1, "evict", a=3, node_id=5)                 # sampled out
    api.cptrace(1, "split", node_id=5, new_id=9, a=4)      # a split goes on: its new node inherits the decision
    api.cptrace(1, "evict", node_id="n7", a=5)             # any hashable id
    api.cptrace(1, "evict", node_id=[5], a=6)              # unhashable: not decided out, never raises
    api.cptrace(1, "evict", a=7)                            # no node: kept
    api.cptrace(1, "config", level=3, tag="x", a=8)        # fields named level and tag
    assert [f for _lv, _t, f in captured] == [
        [("node_id", 1), ("a", 1)], [("node_id", 5), ("new_id", 9), ("a", 4)], [("node_id", [5]), ("a", 6)],
        [("a", 7)], [("level", 3), ("tag", "x"), ("a", 8)]]


def test_setting_the_state_is_seen_at_once(captured: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    api.cptrace(2, "a")
    monkeypatch.setattr(api._STATE, "level", 1)
    api.cptrace(2, "b")
    other: list = []
    monkeypatch.setattr(api._STATE, "submit", lambda *a: other.append(a[1]))
    api.cptrace(1, "c", node_id=3)
    monkeypatch.setattr(api._STATE, "drop", api._hot.IdSet([3]))
    api.cptrace(1, "d", node_id=3)
    api._STATE.drop.discard(3)
    api.cptrace(1, "e", node_id=3)
    assert [t for _lv, t, _f in captured] == ["a"] and other == ["c", "e"]


@pytest.mark.parametrize("kind", [set, api._hot.IdSet])
def test_a_node_id_whose_hash_replaces_the_drop_set(captured: list[tuple], monkeypatch: pytest.MonkeyPatch,
                                                    kind: type) -> None:
    # Python code run by the set lookup replaces api._STATE.drop (dropping the last reference to the old set): no
    # crash, and the decision is the old set's
    class Sly:
        def __hash__(self) -> int:
            api._STATE.drop = kind()
            return 5

        def __eq__(self, other: object) -> bool:
            return other == 5

    monkeypatch.setattr(api._STATE, "drop", kind([5]))
    api.cptrace(1, "evict", node_id=Sly())
    api.cptrace(1, "evict", node_id=Sly())   # the new, empty set: kept
    assert len(captured) == 1


def test_a_failing_submit_is_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(level, tag, fields):
        raise RuntimeError("submit failed")

    monkeypatch.setattr(api._STATE, "submit", boom)
    monkeypatch.setattr(api._STATE, "level", 1)
    assert api.cptrace(1, "evict", node_id=1) is None


def test_a_missing_submit_is_swallowed_without_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # the gate finds no submit function and sets no error: the call is dropped, and the exit path that lets a signal
    # handler's SystemExit through must not turn "no error" into a SystemError
    monkeypatch.delattr(api._STATE, "submit")
    monkeypatch.setattr(api._STATE, "level", 1)
    assert api.cptrace(1, "evict", node_id=1) is None


@pytest.mark.parametrize("exc", [SystemExit(7), KeyboardInterrupt()])
def test_a_signal_handlers_exit_raised_inside_submit_propagates(monkeypatch: pytest.MonkeyPatch,
                                                                exc: BaseException) -> None:
    """What an application's signal handler raises while submit runs (its SIGTERM handler's sys.exit, Ctrl-C) is not
    tracing's to swallow: the C gate and the Python definition both let it through (the real case, with signals:
    tests/e2e/test_exit_paths.py)."""
    def interrupted(level, tag, fields):
        raise exc

    monkeypatch.setattr(api._STATE, "submit", interrupted)
    monkeypatch.setattr(api._STATE, "level", 1)
    for fn in (api.cptrace, api._cptrace_py):
        with pytest.raises(type(exc)):
            fn(1, "evict", node_id=1)


_LEVELS = st.one_of(st.integers(-3, 5), st.integers(), st.booleans(), st.floats(), st.none(),
                    st.sampled_from(["2", " 1 ", "x", b"1"]))
_VALUES = st.one_of(st.integers(-2, 9), st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=400, deadline=None)
@given(calls=st.lists(st.tuples(_LEVELS, st.sampled_from(["evict", "split", "backup", 7]),
                                st.dictionaries(st.sampled_from(["node_id", "new_id", "a", "level", "tag"]), _VALUES,
                                                max_size=4)), max_size=8),
       gate=st.one_of(st.integers(-1, 4), st.just(1 << 70)),
       drop=st.one_of(st.none(), st.sets(st.one_of(st.integers(-2, 9), st.text(max_size=2), st.none(), st.just(True),
                                                   st.just(2.0), st.integers(min_value=1 << 63)), max_size=4)),
       idset=st.booleans())
def test_same_decisions_as_the_python_definition(calls: list, gate: int, drop: set | None, idset: bool) -> None:
    state = api._STATE
    saved = state.submit, state.level, state.drop
    try:
        state.level = gate
        state.drop = api._hot.IdSet(drop) if idset and drop is not None else drop
        got: dict[str, list] = {"c": [], "py": []}
        for side, fn in (("c", api._hot.cptrace), ("py", api._cptrace_py)):
            state.submit = lambda level, tag, fields, out=got[side]: out.append((level, tag, list(fields.items())))
            for level, tag, fields in calls:
                assert fn(level, tag, **fields) is None
        assert got["c"] == got["py"]
    finally:
        state.submit, state.level, state.drop = saved


def test_trace_enabled_is_the_c_one_with_the_same_signature() -> None:
    import inspect

    import cptrace_otel

    assert api.trace_enabled is api._hot.trace_enabled and cptrace_otel.trace_enabled is api.trace_enabled
    assert inspect.signature(api.trace_enabled) == _unannotated(api._trace_enabled_py)


def _outcome(fn, *args, **kwargs) -> tuple:
    try:
        r = fn(*args, **kwargs)
    except Exception as e:   # the same error type and text on both sides
        return ("raised", type(e), str(e))
    return ("returned", type(r), r)


@settings(max_examples=400, deadline=None)
@given(level=st.one_of(_LEVELS, st.just(1 << 63), st.just(-(1 << 63))),
       gate=st.one_of(st.integers(-1, 4), st.integers(), st.just(1 << 70), st.none(), st.floats(allow_nan=False)),
       how=st.sampled_from(["positional", "keyword", "default", "two"]))
def test_trace_enabled_decides_as_the_python_definition(level: object, gate: object, how: str) -> None:
    saved = api._STATE.level
    try:
        api._STATE.level = gate
        args, kwargs = {"positional": ((level,), {}), "keyword": ((), {"level": level}), "default": ((), {}),
                        "two": ((level, level), {})}[how]
        assert _outcome(api._hot.trace_enabled, *args, **kwargs) == _outcome(api._trace_enabled_py, *args, **kwargs)
    finally:
        api._STATE.level = saved


def test_wrong_arity_raises_like_python() -> None:
    for args in [(), (1,), (1, "a", 3)]:
        with pytest.raises(TypeError) as c_err:
            api._hot.cptrace(*args)
        with pytest.raises(TypeError) as py_err:
            api._cptrace_py(*args)
        assert str(c_err.value) == str(py_err.value)


def test_python_gate_switch() -> None:
    code = "from cptrace_otel.traced import api; assert api._hot is None and api.cptrace is api._cptrace_py"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "CPTRACE_PY_GATE": "1"})
