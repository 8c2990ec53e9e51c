"""The exporter worker's fast paths give exactly what the general paths give: its intake of compact items
(``Exporter.add_items``, the C intake and the Python one, ``Exporter._item_event`` per item) against the reference
path (``render_record``, each string value parsed by ``logline.parse_value``, every record stepped through its rank's
``EpochTracker``), leaving the items it was given unchanged; and the canonical-range parser against
``logline.parse_value``."""

from __future__ import annotations

import copy
import os
import random

import pytest

from cptrace_otel.checks.epochs import EpochTracker
from cptrace_otel.export import worker
from cptrace_otel.model import config
from cptrace_otel.model.events import Event
from cptrace_otel.model.logline import parse_value
from cptrace_otel.model.records import render_record


def _exporter() -> worker.Exporter:
    cfg = config.from_env({}, level=2, run_id="fast", cp_rank=0, checks=True)
    return worker.Exporter(dict(config=cfg, resource=cfg.resource(), instance="i", file=None, log_file=None,
                                spool_dir=""))


def _items(rng: random.Random, n: int) -> list[tuple]:
    vals = ["(cnt=3,min=1,max=5,first=1,last=5)", "(cnt=2,min=-0,max=1,first=0,last=1)", "a b", "x" * 70000,
            "[1,[2,3]]", "(none)", "007", "nan", 1.5, float("inf"), -3, 1 << 70, "wt", "h\u00e9 llo", "h\u00e9llo",
            "a\tb", "[1,2,3]", "[]", "-0", "1e5", True, None]
    out = []
    for i in range(n):
        node = rng.randrange(0, 40)
        tag = rng.choice(["prepare", "backup", "ack", "evict", "insert", "reset", "config", "rid_map"])
        f = {"node_id": node, "op": rng.randrange(0, 5)}
        for j in range(rng.randrange(0, 5)):
            f[rng.choice(["dev", "host", "io", f"k{j}", "rank"])] = rng.choice(vals + [rng.randrange(-5, 1 << 40)])
        if tag == "ack":
            f["dir"] = rng.choice(["d2h", "h2d"])
        out.append((10**18 + i * 1000, rng.choice([1, 2]), tag, f))
    return out


def _reference_add(ex: worker.Exporter, trackers: dict[int, EpochTracker], records: list[tuple]) -> None:
    """The reference path: finished Records ``(seq, ts, level, tag, ((k, v), ...))``, each string value parsed as a
    log line's value is, each record's epoch from its rank's tracker, straight into the span builder."""
    for seq, ts, level, tag, fields in records:
        f = {k: (parse_value(v) if type(v) is str else v) for k, v in fields}
        r = f.get("rank")
        rank = r if type(r) is int and r >= 0 else ex.rank
        tr = trackers.setdefault(rank, EpochTracker())
        ex.builder.add(Event(tag, rank, seq, ts, tr.step(tag, f), f, level, "live", 0))
    if ex.builder.finished_spans >= worker.EXPORT_MIN_SPANS:   # where add_items exports (and so takes) spans
        ex.export()


def _dump(ex: worker.Exporter) -> list:
    ex.builder.close_all()
    return [(sp.trace_id, sp.span_id, sp.name, sp.start, sp.end, dict(sp.attrs),
             [(ts, name, dict(a.items())) for ts, name, a in sp.events]) for sp in ex.builder.take()]


@pytest.mark.parametrize("intake", ["c", "python"])
def test_add_items_fast_path_equals_render_record_path(intake: str, request: pytest.FixtureRequest) -> None:
    """Both intakes (the C one when it was built, and the Python one) against the general path."""
    if intake == "python":
        request.getfixturevalue("python_worker_intake")
    elif worker.c_intake() is None:
        if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
            pytest.fail("the C intake (_speedups._intake) was not built (CPTRACE_REQUIRE_SPEEDUPS=1)")
        pytest.skip("the C intake (_speedups._intake) was not built")
    rng = random.Random(5)
    items = _items(rng, 3000)
    fast, ref = _exporter(), _exporter()
    trackers: dict[int, EpochTracker] = {}
    for j in range(0, len(items), 500):
        batch = copy.deepcopy(items[j:j + 500])
        seq = fast.next_seq
        fast.add_items(batch, 0)
        assert repr(batch) == repr(items[j:j + 500])   # the intake leaves its input as it came
        _reference_add(ref, trackers, [render_record(seq + i, it) for i, it in enumerate(batch)])
    assert fast.records == len(items)
    got, want = _dump(fast), _dump(ref)
    assert len(got) > 100
    assert got == want
    assert fast.builder.findings == ref.builder.findings


def test_fast_range_parse_equals_parse_value() -> None:
    rng = random.Random(9)
    cases = ["(cnt=64,min=100,max=163,first=100,last=163)", "(cnt=0,min=0,max=0,first=0,last=0)",
             "(cnt=1,min=-0,max=0,first=0,last=0)", "(cnt=01,min=1,max=1,first=1,last=1)",
             "(cnt=1,min=\u0661,max=1,first=1,last=1)", "(cnt=1,min=1.5,max=1,first=1,last=1)",
             "(cnt=1,min=1,max=1,first=1,last=1)\n", "(cnt=1,min=1,max=1,first=1,last=1)x",
             f"(cnt=2,min={-(1 << 80)},max={1 << 90},first=-5,last=7)", "(cnt=-3,min=-1,max=-2,first=-3,last=-4)"]
    for _ in range(2000):
        parts = [rng.choice([str(rng.randrange(-10**6, 10**6)), str(rng.randrange(1 << 70)), "0", "-0", "007",
                             "1e3", "x"]) for _ in range(5)]
        cases.append("(cnt={},min={},max={},first={},last={})".format(*parts))
    for s in cases:
        worker._parsed.clear()
        got, want = worker._value(s), parse_value(s)
        assert got == want and type(got) is type(want), s
        if isinstance(want, tuple):
            assert [type(x) for x in got] == [type(x) for x in want], s


@pytest.mark.parametrize("intake", ["c", "python"])
def test_bad_items_are_dropped_and_reported_the_rest_kept(intake: str, request: pytest.FixtureRequest,
                                                          capsys: pytest.CaptureFixture) -> None:
    if intake == "python" or worker.c_intake() is None:
        request.getfixturevalue("python_worker_intake")
    ex = _exporter()
    good = (10**18, 1, "insert", {"node_id": 1, "len": 64, "kind": "new"})
    ex.add_items([good, ("not", "an item"), (10**18 + 1, 1, "evict", {"node_id": 1, "tier": "dev"})], 0)
    assert ex.records == 2 and ex.next_seq == 3
    assert "dropped an unrenderable record" in capsys.readouterr().err
    seqs = [a.seq for sp in _dump_spans(ex) for _, _, a in sp.events]
    assert sorted(seqs) == [0, 2]


def _dump_spans(ex: worker.Exporter) -> list:
    ex.builder.close_all()
    return ex.builder.take()
