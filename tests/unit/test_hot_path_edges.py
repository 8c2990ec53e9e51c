"""The gate never raises (a level given as a string or None), NaN / inf / -inf have one form (the
strings ``nan``, ``inf``, ``-inf``, live and read back from a log alike), and the traced process's buffer has a
byte bound (``CPTRACE_QUEUE_BYTES``) besides its record bound."""

from __future__ import annotations

import math
import tracemalloc

import pytest

from cptrace_otel.model import config
from cptrace_otel.model.logline import parse_line, parse_value, render_line
from cptrace_otel.model.records import compact_item, render_other, render_record
from cptrace_otel.traced import api, pipeline


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    got: list[tuple] = []
    monkeypatch.setattr(api._STATE, "submit", lambda level, tag, fields: got.append((level, tag, fields)))
    monkeypatch.setattr(api._STATE, "level", 2)
    return got


def test_gate_with_odd_levels_never_raises(captured: list[tuple]) -> None:
    api.cptrace("2", "backup", a=1)        # a numeric string: parsed
    api.cptrace(" 1 ", "backup", a=2)
    api.cptrace("3", "backup", a=3)        # parsed, above the gate: skipped
    api.cptrace(None, "backup", a=4)       # not a level: below the gate
    api.cptrace("high", "backup", a=5)
    api.cptrace(object(), "backup", a=6)
    api.cptrace(1.5, "backup", a=7)        # floats compare as numbers
    assert [(lv, f["a"]) for lv, _t, f in captured] == [(2, 1), (1, 2), (1.5, 7)]
    assert api.trace_enabled("2") and not api.trace_enabled("3") and not api.trace_enabled(None)
    assert not api.trace_enabled("x")
    api.fwd_hash(None, 0, "s", None, level=None)  # type: ignore[arg-type]


def test_gate_property(captured: list[tuple]) -> None:
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.given(level=st.one_of(st.none(), st.text(), st.integers(), st.floats(), st.binary(), st.booleans(),
                               st.lists(st.integers())))
    @hyp.settings(max_examples=300, deadline=None)
    def check(level: object) -> None:
        api.cptrace(level, "backup", x=1)
        api.trace_enabled(level)  # type: ignore[arg-type]

    check()


@pytest.mark.parametrize("v,text", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_non_finite_floats_have_one_form(v: float, text: str) -> None:
    assert render_other(v, None, None) == text
    rec = render_record(0, (1, 1, "backup", {"x": v}))
    assert rec[4] == (("x", text),)
    # compact_item keeps floats for the worker, which renders them the same way
    assert render_record(0, compact_item((1, 1, "backup", {"x": v})))[4] == (("x", text),)
    # a log line carrying the text reads back as the same string (check's reading matches the live one)
    line = render_line("backup", {"x": v})
    assert line.endswith("x=" + text)
    assert parse_line(line).fields["x"] == text
    assert parse_value(text) == text


def test_finite_floats_unchanged() -> None:
    for v in (0.0, -1.5, 1e300, -2.5e-10):
        assert render_other(v, None, None) == v
        assert parse_value(repr(v)) == v


def test_byte_bound_caps_a_stalled_buffer() -> None:
    """30,000 records of 20 KB with nothing draining: the buffer stops near CPTRACE_QUEUE_BYTES (+ the first
    UNMEASURED records), the rest is dropped and counted."""
    cfg = config.from_env({"CPTRACE_QUEUE_BYTES": str(8 << 20)}, level=1, run_id="x", exporter="thread")
    assert cfg.queue_bytes == 8 << 20
    st = pipeline.Pipeline(cfg)  # drainer not started: a stalled exporter
    submit = st.make_submit()
    tracemalloc.start()
    for i in range(30_000):
        submit(1, "backup", {"node_id": i, "blob": "x" * 20_000 + str(i)})
    cur, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = len(st.buf)
    assert held + st.dropped == 30_000
    assert st.dropped_bytes == st.dropped > 0
    limit = (8 << 20) // 20_000 + pipeline.UNMEASURED + 2 * (pipeline.SAMPLE_MASK + 1)
    assert held <= limit, (held, limit)
    assert cur < (8 << 20) + pipeline.UNMEASURED * 21_000 + (4 << 20)
    assert st.stats()["dropped_queue_bytes"] == st.dropped


def test_byte_estimate_shrinks_as_the_drainer_pops() -> None:
    cfg = config.from_env({}, level=1, run_id="x", exporter="thread", queue_bytes=1 << 30)
    st = pipeline.Pipeline(cfg)
    submit = st.make_submit()
    for _i in range(5000):
        submit(1, "backup", {"blob": "y" * 1000})
    before = st.qbytes
    assert before > 0
    for _ in range(4500):
        st.buf.popleft()
    st.popped()
    assert st.measured == 500 and 0 < st.qbytes < before // 4
    while st.buf:
        st.buf.popleft()
    st.popped()
    assert st.qbytes == 0 and st.measured == 0


def test_default_queue_bytes() -> None:
    assert config.from_env({}).queue_bytes == 64 << 20
    assert config.from_env({"CPTRACE_QUEUE_BYTES": "junk"}).queue_bytes == 64 << 20
