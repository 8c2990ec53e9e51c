"""Big inputs in bounded memory: OTLP JSON-lines records sorted in runs on disk give the same stream as one sort in
memory, and ``check``'s peak RSS over one node's OTLP JSON stays flat as the records grow (real processes, real
files written by ``bench/big_inputs.py``'s generators)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_bad_input import run_rss  # (pytest puts this folder on sys.path)

from cptrace_otel.analyze.sources import sortedruns, tracedocs
from cptrace_otel.analyze.sources.tracedocs import TraceDocs
from cptrace_otel.model.events import Event

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture()
def big():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import big_inputs
        yield big_inputs
    finally:
        sys.path[:] = saved


def _two_rank_files(big, tmp_path: Path, n: int) -> list[str]:
    """Rank 0's records (one node) as OTLP JSON lines written in reverse line order (spans out of order), a copy of
    a third of them (the same records given twice), one record changed (a conflict) and a second rank."""
    log = tmp_path / "r0.log"
    big.one_node_log(str(log), n)
    a = tmp_path / "a.jsonl"
    big.write_otlp(str(log), str(a), 7)
    lines = a.read_text().splitlines()
    a.write_text("\n".join(reversed(lines)) + "\n")
    b = tmp_path / "b.jsonl"
    dup = lines[: len(lines) // 3]
    req = json.loads(dup[0])
    ev = req["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"][1]
    ev["attributes"].append({"key": "hicache.extra", "value": {"intValue": "5"}})
    dup[0] = json.dumps(req)
    req = json.loads(lines[-1])
    req["resourceSpans"][0]["resource"]["attributes"][0]["value"] = {"intValue": "1"}   # rank 1
    b.write_text("\n".join(dup + [json.dumps(req)]) + "\n")
    return [str(a), str(b)]


def _read(paths: list[str]):
    docs = TraceDocs()
    for p in paths:
        docs.add_otlp_lines(p)
    counts = (docs.total(), {r: docs.count(r) for r in docs.ranks()})
    docs.dedupe()
    evs = [(e.tag, e.rank, e.epoch, e.seq, e.ts, e.fields, e.src) for e in docs.events()]
    return (evs, counts, docs.total(), docs.duplicates, docs.conflicts, sorted(docs.ranks()),
            [docs.head(r, 5) for r in (0, 1)], [docs.sources_of(r) for r in (0, 1)])


@pytest.mark.parametrize("packer", ["packed", "pickled"])
def test_sorted_runs_on_disk_give_the_stream_of_one_sort(big, tmp_path, monkeypatch, packer):
    """Either way the chunks are written (sortedruns.c, or pickle: its twin), the runs give one sort's stream."""
    paths = _two_rank_files(big, tmp_path, 400)
    whole = _read(paths)
    if packer == "pickled":
        monkeypatch.setattr(sortedruns, "C_RUNS", None)
    elif sortedruns.c_runs() is None:
        pytest.skip("the _sortedruns extension was not built (pip install -e . builds it)")
    monkeypatch.setattr(tracedocs, "SPILL_AT", 9)
    monkeypatch.setattr(sortedruns, "CHUNK", 4)
    spilled = _read(paths)
    assert len(whole[0]) > 400 and whole[3] and whole[4], "the input has no duplicates or conflicts to keep"
    assert spilled == whole
    monkeypatch.setattr(sortedruns, "FAN_IN", 3)   # runs merged into longer ones as they accumulate, several levels
    merged = []
    real = sortedruns.RunFile.compact

    def counted(self, runs):
        n = len(runs)
        real(self, runs)
        merged.append(n - len(runs))
    monkeypatch.setattr(sortedruns.RunFile, "compact", counted)
    assert _read(paths) == whole
    assert sum(merged) > 20 and max(merged) >= 4, merged   # (4: a merge that made two levels at once)


def test_merged_runs_give_their_disk_blocks_back(tmp_path, monkeypatch):
    """The runs merged a level up are punched out of the temporary file (Linux's hole punching): the disk holds about
    the live run's bytes, not every level's, and what is still read is untouched (a hole takes only its own bytes,
    whatever the blocks they share with a neighbour)."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * (1 << 20))
    with open(probe, "r+b") as fh:
        if not sortedruns.punch_hole(fh, 4000, (1 << 20) - 8000):
            pytest.skip("this platform or file system cannot punch holes (merged runs keep their blocks until the "
                        "file is closed)")
        fh.seek(0)
        data = fh.read()
    assert data[:4000] == b"x" * 4000 and data[-4000:] == b"x" * 4000
    assert data[4000:-4000] == bytes(len(data) - 8000)
    assert os.stat(probe).st_blocks * 512 <= 64 << 10
    monkeypatch.setattr(sortedruns, "FAN_IN", 4)
    rf, runs, want = sortedruns.RunFile(), [], []
    for k in range(16):   # 16 runs of level 0 -> 4 of level 1 -> 1 of level 2: each record written 3 times
        recs = [(0, 16 * i + k, i, Event("backup", 0, 16 * i + k, i, 0, {"node_id": i, "h": (i * 7919) << 20,
                                                                          "dir": "d2h"}, 2, "x", i))
                for i in range(2000)]
        want += recs
        runs.append(rf.write(recs))
        rf.compact(runs)
    assert len(runs) == 1 and rf.level(runs[0]) == 2
    assert list(rf.read(*runs[0])) == sorted(want, key=sortedruns.RECORD_KEY)
    st = os.fstat(rf._fh.fileno())
    assert st.st_blocks * 512 < 0.5 * st.st_size, (st.st_blocks * 512, st.st_size)


def test_sorted_runs_without_a_record_given_twice_are_not_read_to_dedupe(big, tmp_path, monkeypatch):
    """Runs on disk whose seqs all differ hold no record twice: dedupe reads none of them (the seq bits say so), and
    the stream is still the one of one sort in memory; a file given twice makes it read them and drop the copies."""
    a = _two_rank_files(big, tmp_path, 400)[0]
    whole = _read([a])
    monkeypatch.setattr(tracedocs, "SPILL_AT", 9)
    reads = []
    real = sortedruns.RunFile.read
    monkeypatch.setattr(sortedruns.RunFile, "read", lambda self, o, n: reads.append(n) or real(self, o, n))
    docs = TraceDocs()
    docs.add_otlp_lines(a)
    docs.dedupe()
    assert reads == [] and not docs.duplicates
    assert _read([a]) == whole and reads   # (read once, for the events)
    reads.clear()
    docs = TraceDocs()
    for p in (a, a):
        docs.add_otlp_lines(p)
    docs.dedupe()
    assert reads and sum(docs.duplicates.values()) == len(whole[0])


def test_check_peak_rss_is_flat_in_the_number_of_otlp_records(big, tmp_path):
    rss = {}
    for n in (30_000, 120_000):
        log, otlp = tmp_path / f"{n}.log", tmp_path / f"{n}.jsonl"
        big.one_node_log(str(log), n)
        big.write_otlp(str(log), str(otlp), 1000)
        rc, err, rss[n] = run_rss("check", "--no-progress", str(otlp), timeout=600)
        assert rc == 0, err
    # 90,000 more records held would be ~130 MiB more (about 1.5 KiB each); sorted on disk, they cost none
    assert rss[120_000] <= rss[30_000] + 24, rss


def test_ingest_peak_rss_is_flat_however_dense_the_records_are(big, tmp_path):
    """Records 1 ns apart never reach the span timeout: without a bound on what is open, every lane and request span
    of the run stays in memory until the end (about 1 KiB per record here)."""
    rss = {}
    for n in (120_000, 480_000):   # both past the fixed bounds (open spans, records linked as evidence)
        log, out = tmp_path / f"{n}.log", tmp_path / f"{n}.jsonl"
        big.dense_log(str(log), n)
        rc, err, rss[n] = run_rss("ingest", "--no-progress", "--file", str(out), str(log), timeout=600)
        assert rc == 0, err
        assert out.stat().st_size > 0
    assert rss[480_000] <= rss[120_000] + 24, rss


def test_span_builder_closes_the_oldest_spans_at_its_bound_and_loses_no_record(monkeypatch):
    from cptrace_otel.model import spans
    from cptrace_otel.model.events import Event

    monkeypatch.setattr(spans, "MAX_OPEN", 40)
    monkeypatch.setattr(spans, "MAX_HELD", 90)
    b = spans.SpanBuilder("run", span_timeout_s=3600.0)
    out, most_open, most_held, n = [], 0, 0, 0
    for node in range(2, 200):
        for tag, f in (("insert", {"node_id": node}), ("rid_map", {"rid": f"q{node}", "node_id": node}),
                       ("reload", {"node_id": node, "op": node, "chain": [node]})):
            b.add(Event(tag, 0, n, 1_000 + n, 0, dict(f)))   # 1 ns apart: no timeout ever
            n += 1
            most_open, most_held = max(most_open, b.open_spans), max(most_held, b.held_records)
            out += b.take()
    b.finish()
    out += b.take()
    assert most_open <= 40 and most_held <= 90, (most_open, most_held)
    seqs = sorted(a.seq for sp in out for _ts, _tag, a in sp.events)
    assert seqs == list(range(n)), "a record was lost or sent twice"
    why = {sp.attrs.get("cptrace.span.closed_by") for sp in out}
    assert "bound" in why, why
