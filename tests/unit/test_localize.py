"""fwd_hash localization (docs/domain.md §4, level 3, advisory): pairing, first divergence, noise, unpairable records,
its place in ``Analysis``/``check`` (never a finding, never an exit code), and simulator runs.
"""

from __future__ import annotations

import io
import json

import pytest

from cptrace_otel.analyze.engine import Analysis
from cptrace_otel.analyze.localize import Localizer
from cptrace_otel.commands import check as check_cmd
from cptrace_otel.model.events import Event
from cptrace_otel.sim.workload import analyze, run_fault

PFP, PLEN = 1234567, 12
STAGES = ("attn_kv", "attn_out")


class Stream:
    """Hand-written fwd_hash records, per rank in seq order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.seq: dict[int, int] = {}

    def rec(self, rank: int, **fields) -> None:
        seq = self.seq[rank] = self.seq.get(rank, 0) + 1
        self.events.append(Event("fwd_hash", rank, seq, seq, 0, fields, level=3))

    def forward(self, rank: int, rid: str, src: str, hashes: dict | None = None, *, layers: int = 6,
                pfp=PFP, plen=PLEN, nreq=1, rows=PLEN, cprank=-1, stages=STAGES) -> None:
        """One forward: a record per (layer, stage); ``hashes`` overrides h for some (layer, stage)."""
        hashes = hashes or {}
        for layer in range(layers):
            for st in stages:
                f = dict(rid=rid, nreq=nreq, layer=layer, stage=st, h=hashes.get((layer, st), 1000 + 10 * layer +
                                                                                  STAGES.index(st)),
                         nz=rows, rows=rows, cprank=cprank, pfp=pfp, src=src, plen=plen)
                if pfp is None:
                    del f["pfp"]
                if src is None:
                    del f["src"]
                self.rec(rank, **f)

    def report(self) -> list[dict]:
        loc = Localizer()
        for ev in self.events:
            loc.feed(ev)
        return loc.report()


def by_verdict(entries: list[dict], verdict: str) -> list[dict]:
    return [e for e in entries if e["verdict"] == verdict]


def test_identical_forwards_match():
    s = Stream()
    s.forward(0, "r1", "miss")
    s.forward(0, "r2", "host")
    [e] = s.report()
    assert e["verdict"] == "match" and e["ranks"] == [0]
    assert (e["pfp"], e["plen"], e["base_rid"], e["reload_rid"]) == (PFP, PLEN, "r1", "r2")
    assert e["layer"] is None and e["reason"] is None


def test_first_divergent_layer_after_matching_layers():
    s = Stream()
    s.forward(0, "r1", "dev")
    # layers 0-2 match (both stages), layer 3 matches on attn_kv and differs on attn_out, later layers differ too
    s.forward(0, "r2", "host", {(3, "attn_out"): 7, (4, "attn_kv"): 8, (5, "attn_out"): 9})
    [e] = s.report()
    assert e["verdict"] == "diverged"
    assert (e["layer"], e["stage"]) == (3, "attn_out")
    assert (e["base_rid"], e["reload_rid"], e["ranks"]) == ("r1", "r2", [0])


def test_batched_forward_is_noisy_not_diverged():
    s = Stream()
    s.forward(0, "r1", "miss")
    s.forward(0, "r2", "host", {(1, "attn_kv"): 5}, nreq=2)
    [e] = s.report()
    assert e["verdict"] == "noisy" and e["layer"] is None
    assert "nreq=2" in e["reason"] and "layer 1 stage attn_kv" in e["reason"]
    # a batched baseline makes every pairing against it noisy, matching hashes included
    s = Stream()
    s.forward(0, "r1", "miss", nreq=3)
    s.forward(0, "r2", "host")
    [e] = s.report()
    assert e["verdict"] == "noisy" and "baseline" in e["reason"] and "nreq=3" in e["reason"]


def test_other_noise_rows_and_disagreeing_baselines():
    s = Stream()
    s.forward(0, "r1", "miss", rows=12)
    s.forward(0, "r2", "host", {(0, "attn_kv"): 1}, rows=4)     # extended a different number of tokens
    [e] = s.report()
    assert e["verdict"] == "noisy" and "rows differ" in e["reason"]
    s = Stream()
    s.forward(0, "r1", "miss")
    s.forward(0, "r2", "dev", {(2, "attn_kv"): 1})              # a second baseline that disagrees with the first
    s.forward(0, "r3", "host")
    [e] = s.report()
    assert e["verdict"] == "noisy" and "not deterministic" in e["reason"] and "r2" in e["reason"]


def test_records_without_proposed_fields_are_unpairable_never_passed():
    s = Stream()
    s.forward(0, "r1", "miss", pfp=None, layers=2)
    s.forward(0, "r2", "host", pfp=None, layers=2)
    s.forward(1, "r1", None, layers=1)
    s.rec(1, rid="r9", nreq=1, layer=0, stage="attn_kv", h=5, nz=1, rows=1, cprank=-1, pfp=PFP, src="l3", plen=1)
    entries = s.report()
    assert [e["verdict"] for e in entries] == ["unpairable", "unpairable"]
    assert [(e["ranks"], e["count"]) for e in entries] == [([0], 8), ([1], 3)]
    assert not by_verdict(entries, "match")


def test_reload_without_baseline_is_unpaired():
    s = Stream()
    s.forward(0, "r1", "host")
    s.forward(0, "r2", "dev")     # after the reload: reads reloaded KV, so never a baseline for r1
    [e] = s.report()
    assert e["verdict"] == "unpaired" and e["reload_rid"] == "r1" and e["base_rid"] is None


def test_device_hit_after_a_bad_reload_does_not_hide_the_next_divergence():
    s = Stream()
    s.forward(0, "r1", "miss")
    s.forward(0, "r2", "host", {(1, "attn_kv"): 1})
    s.forward(0, "r3", "dev", {(1, "attn_kv"): 1})   # reads the corrupted reloaded KV: not a determinism witness
    s.forward(0, "r4", "host", {(1, "attn_kv"): 1})
    entries = s.report()
    assert [(e["verdict"], e["reload_rid"], e["layer"]) for e in entries] == [
        ("diverged", "r2", 1), ("diverged", "r4", 1)]


def test_several_prompts_and_ranks_merge_ranks_that_agree():
    s = Stream()
    q = 999
    for rank in (0, 1):
        s.forward(rank, "a1", "miss")
        s.forward(rank, "b1", "miss", pfp=q, plen=8, rows=8)
    for rank in (0, 1):
        s.forward(rank, "b2", "host", pfp=q, plen=8, rows=8)
        s.forward(rank, "a2", "host", {(2, "attn_kv"): 1} if rank == 1 else None)
    # a shared-layout forward keyed by its cprank, not the record's rank
    s.forward(0, "c1", "miss", pfp=55, cprank=3, layers=2)
    s.forward(0, "c2", "host", {(1, "attn_kv"): 2}, pfp=55, cprank=3, layers=2)
    entries = s.report()
    div = by_verdict(entries, "diverged")
    assert [(e["pfp"], e["ranks"], e["layer"], e["stage"]) for e in div] == [
        (PFP, [1], 2, "attn_kv"), (55, [3], 1, "attn_kv")]
    assert entries[:2] == div     # the telling entries first
    match = {(e["pfp"], e["reload_rid"], tuple(e["ranks"])) for e in by_verdict(entries, "match")}
    assert match == {(q, "b2", (0, 1)), (PFP, "a2", (0,))}


def test_chunked_forward_and_interleaved_ranks_stay_apart():
    s = Stream()
    s.forward(0, "r1", "miss", layers=3)
    s.forward(1, "r1", "miss", layers=3)
    # rank 0's reload and rank 1's reload interleave record by record; rank 1 diverges at layer 1
    a, b = Stream(), Stream()
    a.forward(0, "r2", "host", layers=3)
    b.forward(1, "r2", "host", {(1, "attn_out"): 3}, layers=3)
    for x, y in zip(a.events, b.events, strict=False):
        s.rec(0, **x.fields)
        s.rec(1, **y.fields)
    # the same rid again from layer 0: a second forward (chunked prefill), compared on its own
    s.forward(0, "r2", "host", {(0, "attn_kv"): 4}, layers=3)
    entries = s.report()
    got = sorted((e["verdict"], e["ranks"], e["layer"]) for e in entries)
    assert got == [("diverged", [0], 0), ("diverged", [1], 1), ("match", [0], None)]


def test_memory_stays_bounded_and_overflow_is_counted():
    loc = Localizer(max_prompts=4, max_entries=3)
    s = Stream()
    for i in range(10):
        s.forward(0, f"b{i}", "miss", pfp=i, layers=2)
        s.forward(0, f"h{i}", "host", pfp=i, layers=2)
    for ev in s.events:
        loc.feed(ev)
        forwards, prompts = loc.held
        assert forwards <= 1 and prompts <= 4
    entries = loc.report()
    assert len(by_verdict(entries, "match")) == 4        # 3 closed + the one still open
    [t] = by_verdict(entries, "truncated")
    assert t["count"] == 6 and "6 oldest prompts" in t["reason"]


def test_other_tags_are_ignored_and_nothing_to_say_is_empty():
    loc = Localizer()
    loc.feed(Event("backup", 0, 1, 1, 0, {"node_id": 1, "h": 5}))
    assert loc.report() == [] and loc.records == 0


def test_analysis_routes_fwd_hash_without_findings():
    s = Stream()
    s.forward(0, "r1", "miss")
    s.forward(0, "r2", "host", {(0, "attn_kv"): 1})   # the divergence sits on the rank's very first record pair
    an = Analysis()
    res = an.run(iter(s.events))
    assert res.findings == [] and res.stats["events"] == len(s.events)
    assert an.localizer.records == len(s.events)      # the first record too (it takes the engine's slow path)
    assert [(e["verdict"], e["layer"], e["stage"]) for e in res.localization] == [("diverged", 0, "attn_kv")]


def _check(paths, as_json):
    class Args:
        pass
    a = Args()
    a.paths, a.json, a.level, a.jaeger_url, a.run_id = paths, as_json, None, None, None
    out, err = io.StringIO(), io.StringIO()
    return check_cmd.run(a, out, err), out.getvalue()


def test_clean_simulator_run_reports_no_divergence(tmp_path):
    sim = run_fault("HASH_flip", "replicated", ranks=2, level=3, inject=False)
    res = analyze(sim)
    assert res.findings == []
    assert res.localization and {e["verdict"] for e in res.localization} == {"match"}
    assert {r for e in res.localization for r in e["ranks"]} == {0, 1}
    # through `check`: exit code 0, a localization key, and a short advisory section in the text
    paths = sim.emitter.write(str(tmp_path))
    rc, out = _check(paths, True)
    # (`check` names each entry's run: the run its files are, here the folder's log run)
    assert rc == 0 and [{k: v for k, v in e.items() if k != "run"} for e in json.loads(out)["localization"]] \
        == res.localization
    rc, out = _check(paths, False)
    assert rc == 0 and "fwd_hash localization (advisory" in out and "match their baseline" in out


def test_no_fwd_hash_records_no_section(tmp_path):
    sim = run_fault("HASH_flip", "none", level=2, inject=False)
    rc, out = _check(sim.emitter.write(str(tmp_path)), False)
    assert rc == 0 and "localization" not in out


@pytest.mark.parametrize("mode", ["none", "replicated", "sharded", "dcp", "layersplit", "shared"])
def test_flipped_byte_in_a_host_reload_diverges_at_the_flipped_layer(mode):
    """End to end through the simulator: the forward after a reload reads the device KV the load wrote, so one
    flipped byte (HASH_flip: layer index 0 of the copy) shows as a divergence at that rank's first layer; the same
    run without the fault only matches."""
    sim = run_fault("HASH_flip", mode, level=3)
    res = analyze(sim)
    [(_, rank, _node, _op)] = sim.oracle.injected
    assert "HASH" in res.codes
    div = by_verdict(res.localization, "diverged")
    assert div, res.localization
    for e in div:
        assert e["stage"] == "attn_kv"
        assert e["layer"] == int(sim.ranks_[rank].layer_ids[0])
    # the flipped rank's forward diverges; in mode shared every rank reads that page through the shared view, in
    # mode sharded every rank's forward assembles the prefix from the pages' owners (SGLang's allgather)
    assert {r for e in div for r in e["ranks"]} == ({0, 1} if mode in ("shared", "sharded") else {rank})
    clean = analyze(run_fault("HASH_flip", mode, level=3, inject=False))
    assert clean.findings == [] and not by_verdict(clean.localization, "diverged")
