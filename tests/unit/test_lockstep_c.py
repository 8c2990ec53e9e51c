"""The C twin of C1's per-epoch state (``_speedups/lockstep.c``) against its Python twin
:class:`cptrace_otel.checks.cross_base.EpochC1`: the same findings, the same unchecked list and the same C1 state after
every stream, over the simulator's fault scenarios in every multi-rank mode, clean runs, and generated streams of
structural records (Hypothesis) in which ranks skip, add, reorder and mistype records across epochs.

Skipped when the extension was not built, unless ``CPTRACE_REQUIRE_SPEEDUPS=1`` (then missing it fails)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.checks import cross_base
from cptrace_otel.checks.crossrank import CrossRank
from cptrace_otel.model.events import Event
from cptrace_otel.sim.faults import FAULTS
from cptrace_otel.sim.workload import run_fault

_C = cross_base.lockstep_c()


@pytest.fixture(autouse=True)
def _built() -> None:
    if _C is None:
        if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
            pytest.fail("CPTRACE_REQUIRE_SPEEDUPS=1 but cptrace_otel._speedups._lockstep is missing")
        pytest.skip("the C extension _lockstep was not built")


def _findings(fs: list) -> list[dict]:
    """Every field of each finding, evidence included, as the JSON output carries them."""
    return [f.to_dict() for f in fs]


def _state(cross: CrossRank) -> dict:
    """C1's state per epoch, queues as their (tuple, record seq) items: what the rules after C1 read."""
    return {e: (st.index, st.diverged, dict(st.counts), {r: [(t, ev.seq) for t, ev in q] for r, q in st.queues.items()},
                sorted(map(repr, st.wait)))
            for e, st in cross._c1.items()}


def _both(run) -> tuple:
    """``run()`` with the C twin (the default when built), then with the Python twin."""
    c = run()
    with cross_base.python_lockstep():
        py = run()
    return c, py


def test_the_twins_are_the_ones_in_use() -> None:
    assert type(cross_base.new_epoch_c1()) is _C.EpochC1
    with cross_base.python_lockstep():
        assert type(cross_base.new_epoch_c1()) is cross_base.EpochC1
    # the same attributes, each settable as a slot is (the rules assign qs, qs_ranks, diverged, index, late)
    assert set(cross_base.EpochC1.__slots__) == {m for m in dir(_C.EpochC1) if not m.startswith("_")} - {"push"}
    s = _C.EpochC1()
    s.qs_ranks, s.diverged, s.index, s.late = [0, 1], 7, 3, []
    assert (s.qs_ranks, s.diverged, s.index, s.late, s.qs, s.wait) == ([0, 1], 7, 3, [], [], set())
    s.diverged = None
    assert s.diverged is None


_CASES = [(kind, mode) for kind, spec in FAULTS.items() for mode in spec.modes if mode != "none"]


@pytest.mark.parametrize(("kind", "mode"), _CASES, ids=[f"{k}-{m}" for k, m in _CASES])
def test_every_fault_scenario_checks_the_same_with_either_twin(kind: str, mode: str) -> None:
    for inject in (True, False):
        events = run_fault(kind, mode, ranks=3, level=2, inject=inject).emitter.events()

        def run(events: list = events) -> tuple:
            res = Analysis(None).run(list(events))
            return _findings(res.findings), [repr(u) for u in res.unchecked]

        c, py = _both(run)
        assert c == py, (kind, mode, inject)
        if kind == "C1_div" and inject:
            assert any(f["code"] == "C1" for f in c[0])   # (the scenario does reach C1)


def test_a_real_sglang_log_and_a_volume_run_check_the_same_with_either_twin() -> None:
    """The 3-rank attention-CP log of a real SGLang run (tests/fixtures/real) and a healthy simulator volume run."""
    from cptrace_otel.analyze.sources.logs import read_log_events
    from cptrace_otel.sim.volume import volume_workload

    real = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "sglang_attn_cp3.log"
    sources = [list(read_log_events([str(real)])),
               volume_workload(3, "replicated", 3, "wt", 3000, level=2).emitter.events()]
    for events in sources:
        def run(events: list = events) -> tuple:
            res = Analysis(None).run(list(events))
            return _findings(res.findings), [repr(u) for u in res.unchecked]

        c, py = _both(run)
        assert c == py


# -- generated streams ------------------------------------------------------------------------------------------

_TAGS = ("insert", "prepare", "reload", "evict", "split", "delete")
_ODD = (None, "7", 7.0, True, -1, 2**70)   # values of the wrong type (or of no int64) in a field C1 reads

records = st.tuples(
    st.sampled_from(_TAGS), st.integers(0, 6), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 3)),
    st.sampled_from(("host", "device", None, 3)), st.booleans(), st.sampled_from(_ODD))


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Event], int]:
    """2-3 ranks of one base stream of structural records, each rank perturbed (a record dropped, changed,
    duplicated, a mistyped field), over 1-2 epochs, merged in a drawn interleaving that keeps each rank's order."""
    base = draw(st.lists(records, min_size=1, max_size=14))
    n = draw(st.integers(2, 3))
    per: list[list] = []
    for _r in range(n):
        mine = list(base)
        for _ in range(draw(st.integers(0, 2))):
            if not mine:
                break
            i = draw(st.integers(0, len(mine) - 1))
            how = draw(st.sampled_from(("drop", "change", "dup", "extra")))
            if how == "drop":
                del mine[i]
            elif how == "change":
                mine[i] = draw(records)
            elif how == "dup":
                mine.insert(i, mine[i])
            else:
                mine.append(draw(records))
        per.append(mine)
    cut = draw(st.integers(0, len(base)))   # records from this position on belong to epoch 1
    evs: list[list[Event]] = []
    for r, mine in enumerate(per):
        out = []
        for seq, (tag, nid, ln, sl, tier, odd, bad) in enumerate(mine):
            f: dict = {"node_id": nid, ("pre_len" if tag == "split" else "len"): ln, "op": seq}
            if sl is not None:
                f["split_len"] = sl
            if tag == "evict":
                f["tier"] = tier
            if odd:   # one field C1 reads gets a value of another type
                f[("node_id", "len", "pre_len", "split_len", "tier")[seq % 5]] = bad
            out.append(Event(tag, r, seq, seq, 0 if seq < cut else 1, f, 1, f"r{r}", seq + 1))
        evs.append(out)
    order = draw(st.permutations([r for r, mine in enumerate(evs) for _ in mine]))
    pos = [0] * n
    merged = []
    for r in order:
        merged.append(evs[r][pos[r]])
        pos[r] += 1
    return merged, n


@settings(max_examples=300, deadline=None)
@given(streams(), st.booleans())
def test_generated_streams_leave_the_same_findings_and_state(stream: tuple[list[Event], int], expect: bool) -> None:
    events, n = stream

    def run() -> tuple:
        cross = CrossRank()
        if expect:
            cross.expect_ranks(range(n))
        mid = None
        for i, ev in enumerate(events):
            cross.feed(ev)
            if i == len(events) // 2:
                mid = _state(cross)   # (in flight too, not only after finish)
        fs = cross.finish()
        return _findings(fs), [repr(u) for u in cross.unchecked()], mid, _state(cross)

    c, py = _both(run)
    assert c == py


def test_a_mapping_that_is_no_dict_and_a_record_without_fields_behave_alike() -> None:
    def ev(fields: object, rank: int = 0) -> Event:
        return Event("split", rank, 0, 0, 0, fields, 1, "x", 1)   # type: ignore[arg-type]

    proxy = types.MappingProxyType({"node_id": 3, "pre_len": 8, "split_len": 2, "len": 99})
    for cls in (_C.EpochC1, cross_base.EpochC1):
        s = cls()
        assert s.push(ev(proxy), [0, 1], True) == 1
        assert [t for t, _e in s.queues[0]] == [("split", 3, 8, 2, None)]
    for cls in (_C.EpochC1, cross_base.EpochC1):
        with pytest.raises(AttributeError):
            cls().push(object(), [0], True)
        with pytest.raises(AttributeError):   # (a fields object without get)
            cls().push(ev(object()), [0], True)
