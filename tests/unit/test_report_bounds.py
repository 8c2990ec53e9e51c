"""``report --node`` in memory bounded by the run's structure: the node drawn from one pass over the records equals
the node drawn from the records held (the summarised run's node panels, its twin); the streaming histogram against
the exact density; the bars a lane keeps past its bound; and the peak RSS of a real ``report --node`` process flat
as one node's records grow (OTLP JSON lines and upstream log alike)."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings, strategies as st
from test_bad_input import run_rss  # (pytest puts this folder on sys.path)
from test_big_inputs import big  # noqa: F401  (the fixture)

from cptrace_otel.analyze import report_bars, report_model
from cptrace_otel.analyze.report_bars import Bar, Hist, Kept, density
from cptrace_otel.analyze.report_model import Builder, Records
from cptrace_otel.commands.check import analyze_sources
from tests.helpers.demo_run import run_demo


class _Args:
    run_id = None
    progress = False
    no_progress = True


def _groups(paths: list[str]):
    _res, run_id, groups = analyze_sources(_Args(), paths, None, io.StringIO(), keep=True)[:3]
    assert len(groups) == 1
    result, again = groups[0]
    return run_id, list(again), result.findings


def _view(model, rows: list, node: int) -> list:
    """The node's panels of ``model``: lanes (records, the marks' rows, bars, density), span, findings, note."""
    out = []
    for p in model.panels:
        if p.node != node:
            continue
        lanes = [(ln.rank, ln.records, [tuple(rows[i]) for i in ln.marks],
                  [(b.kind, b.start, b.end, b.op, sorted(b.nodes), b.seqs) for b in ln.bars], ln.density, ln.no_acks)
                 for ln in p.lanes]
        out.append((p.title, p.epoch, p.t0, p.t1, lanes, sorted(model.findings[i].finding.code for i in p.findings),
                    p.note))
    return sorted(out, key=lambda v: v[1])


def test_a_node_drawn_in_one_pass_equals_the_node_drawn_from_the_held_records(tmp_path):
    """Every node of a faulty 4-rank demo run (OTLP files): ``report --node N``'s panels (one pass, nothing held)
    are those of the run's summarised report, which draws its top nodes from the records it holds."""
    d = run_demo(tmp_path / "demo")
    run_id, events, findings = _groups(d["otlp"])
    assert findings, "the faulty run gives no finding to draw"
    held_rec = Records()
    held = Builder(held_rec, run_id, full_limit=0, top=10**6).build(events, findings, "run")
    nodes = sorted({p.node for p in held.panels if p.node is not None})
    assert len(nodes) > 10
    compared = with_findings = 0
    for node in nodes:
        streamed_rec = Records()
        streamed = Builder(streamed_rec, run_id).build(iter(events), findings, "node", node=node)
        one, other = _view(streamed, streamed_rec.rows, node), _view(held, held_rec.rows, node)
        assert one == other, node
        compared += 1
        with_findings += any(v[5] for v in one)
    assert compared == len(nodes) and with_findings, (compared, with_findings)


def test_a_node_past_the_bounds_draws_densities_and_the_first_and_last_bars(big, tmp_path, monkeypatch):  # noqa: F811
    """With the bounds made small: the node's records go to the histogram (their count kept), each lane keeps its
    first and last bars and the panel says how many it did not draw (one node reloaded over and over)."""
    log = tmp_path / "one.log"
    big.one_node_log(str(log), 400)
    run_id, events, findings = _groups([str(log)])
    monkeypatch.setattr(report_model, "NODE_MARKS", 3)
    monkeypatch.setattr(report_model, "NODE_BARS", 4)
    monkeypatch.setattr(report_model, "SETTLE_EVERY", 2)
    held = Builder(Records(), run_id, full_limit=0, top=10**6).build(events, findings, "run")
    node = 1
    streamed = Builder(Records(), run_id).build(iter(events), findings, "node", node=node)
    cut = 0
    for p in streamed.panels:
        whole = next(h for h in held.panels if h.node == node and h.epoch == p.epoch)
        for ln, hl in zip(p.lanes, whole.lanes, strict=True):
            assert ln.records == hl.records
            assert sum(c for _b, c in ln.density or ()) == ln.records
            for holds in (False, True):   # at most 4 stage bars and 4 holds, the first two and the last two
                kept = [(b.kind, b.start, b.seqs) for b in ln.bars if (b.kind in ("dev", "host")) == holds]
                drawn = [(b.kind, b.start, b.seqs) for b in hl.bars if (b.kind in ("dev", "host")) == holds]
                assert kept == (drawn if len(drawn) <= 4 else drawn[:2] + drawn[-2:]), (holds, kept, drawn)
        over = any(sum((b.kind in ("dev", "host")) == holds for b in hl.bars) > 4
                   for hl in whole.lanes for holds in (False, True))
        assert over == ("bars not drawn" in p.note), p.note
        cut += over
    assert cut, "no lane past the bound"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1, max_size=300),
       st.integers(min_value=0, max_value=10**6))
def test_the_streaming_histogram_counts_every_time_within_one_fine_bucket(times, spread):
    h = Hist()
    for t in times:
        h.add(t)
    t0, t1 = min(times) - spread, max(times) + spread
    got = h.density(t0, t1)
    assert sum(c for _b, c in got) == len(times)
    if max(times) - min(times) < report_bars.FINE:   # exact while the times span fewer than FINE ns
        assert got == density(times, t0, t1)
    else:   # each time counted in its bucket or one beside it
        exact = dict(density(times, t0, t1))
        for b, _c in got:
            assert any(k in exact for k in (b - 1, b, b + 1)), (b, exact)


def test_kept_bars_are_the_first_and_the_last():
    k = Kept(5)
    bars = [Bar("h2d", i, i + 1) for i in range(12)]
    for b in bars:
        k.add(b)
    assert [b.start for b in k.bars()] == [0, 1, 9, 10, 11] and k.dropped == 7


@pytest.mark.parametrize("kind", ["otlp", "log"])
def test_report_node_peak_rss_is_flat_in_the_number_of_the_nodes_records(big, tmp_path, kind):  # noqa: F811
    rss = {}
    for n in (30_000, 120_000):
        log, otlp = tmp_path / f"{n}.log", tmp_path / f"{n}.jsonl"
        big.one_node_log(str(log), n)
        src = log
        if kind == "otlp":
            big.write_otlp(str(log), str(otlp), 1000)
            src = otlp
        out = tmp_path / f"{n}.html"
        rc, err, rss[n] = run_rss("report", "--no-progress", "--node", "1", "-o", str(out), str(src), timeout=600)
        assert rc == 0, err
        assert out.stat().st_size < 4 << 20, "the page of one node grows with its records"
    # 90,000 more records held would be ~130 MiB more (about 1.5 KiB each)
    assert rss[120_000] <= rss[30_000] + 24, rss
