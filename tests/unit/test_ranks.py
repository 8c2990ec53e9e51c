"""Ranks and run ids without help (cptrace_otel.traced.ranks), rank-unknown naming, check on unknown-rank streams,
and deterministic lineage sampling (cptrace_otel.model.sampling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from cptrace_otel.model import config, sampling
from cptrace_otel.traced import ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_emitter(tmp_path, env_extra, body):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPTRACE_")}
    env.update({"PYTHONPATH": ROOT, "CPTRACE_LEVEL": "1", "CPTRACE_RUN_ID": "r1",
                "CPTRACE_FILE": str(tmp_path / "out" / "rank-{rank}-{pid}.otlp.jsonl")})
    env.update(env_extra)
    code = "import cptrace_otel as ct\n" + body + "\nassert ct.flush(20)\n"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def _resources(path):
    out = []
    for line in open(path):
        for rs in json.loads(line)["resourceSpans"]:
            out.append({a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]})
    return out


def test_config_record_labels_the_records_before_it(tmp_path):
    # the insert comes first: the drainer holds it until the config record names the rank
    p = _run_emitter(tmp_path, {}, "ct.cptrace(1, 'insert', node_id=5, parent=0, len=1, dev='(0)')\n"
                                   "ct.cptrace(1, 'config', cp_size=2, cp_rank=1, mode='replicated', page_size=1,"
                                   " policy='wt')")
    assert p.returncode == 0, p.stderr
    files = os.listdir(tmp_path / "out")
    assert len(files) == 1 and files[0].startswith("rank-1-")
    res = _resources(tmp_path / "out" / files[0])
    assert {int(r["sglang.cp.rank"]) for r in res} == {1}
    assert {r["cptrace.rank.source"] for r in res} == {"config-record"}


def test_unknown_rank_in_a_run_of_several_warns_and_names_no_rank(tmp_path):
    p = _run_emitter(tmp_path, {"WORLD_SIZE": "4", "CPTRACE_RANK_WAIT_S": "0.2"},
                     "ct.cptrace(1, 'insert', node_id=5, parent=0, len=1, dev='(0)')")
    assert p.returncode == 0, p.stderr
    files = os.listdir(tmp_path / "out")
    assert len(files) == 1 and files[0].startswith("rank-unknown-"), files
    assert p.stderr.count("WARNING") == 1 and "CP rank is unknown" in p.stderr


def test_env_rank_is_the_last_resort(tmp_path):
    p = _run_emitter(tmp_path, {"RANK": "2", "WORLD_SIZE": "4"},
                     "ct.cptrace(1, 'insert', node_id=5, parent=0, len=1, dev='(0)')")
    assert p.returncode == 0, p.stderr
    assert os.listdir(tmp_path / "out")[0].startswith("rank-2-")


def test_order_of_trust(monkeypatch):
    # a fake SGLang runtime context wins over torch.distributed and the environment
    rc = types.ModuleType("sglang.srt.runtime_context")
    par = types.SimpleNamespace(attn_cp_rank=3, attn_tp_rank=1, attn_dp_rank=0, attn_cp_size=8)
    rc.get_parallel = lambda: par
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)
    assert ranks.discover({"RANK": "0", "WORLD_SIZE": "2"}) == ranks.Ranks(3, 1, 0, 8, "sglang")
    par.attn_cp_rank = property(lambda s: 1 / 0)   # not a plain int: unpublished
    rc.get_parallel = lambda: (_ for _ in ()).throw(ValueError("not published"))
    assert ranks.discover({"RANK": "0", "WORLD_SIZE": "2"}) == ranks.Ranks(0, -1, -1, 2, "env")
    assert ranks.discover({}) is None
    # the config record is trusted over discovery, the caller over both
    cfg = config.from_env({})
    hold = ranks.RankHold(cfg, 10.0)
    hold.add([(0, 1, "config", {"cp_rank": 5, "cp_size": 8})])
    assert hold.due() and hold.resolve().cp_rank == 5
    assert ranks.RankHold(config.from_env({"CPTRACE_CP_RANK": "7"})).known


def test_file_names_never_read_like_a_rank_when_unknown():
    cfg = config.from_env({})
    assert cfg.cp_rank == -1
    name = cfg.expand(config.DEFAULT_FILE)
    assert "rank-unknown-" in name and "rank-1" not in name
    assert config.from_env({"CPTRACE_CP_RANK": "1"}).expand(config.DEFAULT_FILE).split("/")[-1].startswith("rank-1-")


def test_run_ids():
    assert config.derive_run_id({"TORCHELASTIC_RUN_ID": "none"}).startswith("auto-")   # torchrun's placeholder
    assert config.derive_run_id({"TORCHELASTIC_RUN_ID": "abc"}) == "te-abc"
    assert config.derive_run_id({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"}) == "te-abc-r2"
    cfg = config.from_env({})
    assert ranks.agreed_run_id(cfg, {}) == cfg.run_id    # no torch.distributed: the per-host rule stands


def test_sampling_is_deterministic_and_keeps_lineages():
    kept = [n for n in range(10_000) if sampling.keep_node("run", n, 0.25)]
    assert 2000 < len(kept) < 3000
    assert kept == [n for n in range(10_000) if sampling.keep_node("run", n, 0.25)]
    assert kept != [n for n in range(10_000) if sampling.keep_node("other", n, 0.25)]
    got = []
    sub = sampling.make_submit(lambda lv, tag, f: got.append((tag, f.get("node_id"))), "run", 0.25)
    out_node = next(n for n in range(100) if not sampling.keep_node("run", n, 0.25))
    in_node = next(n for n in range(100) if sampling.keep_node("run", n, 0.25))
    child_of_out = next(n for n in range(1000, 2000) if sampling.keep_node("run", n, 0.25))
    child_of_in = next(n for n in range(1000, 2000) if not sampling.keep_node("run", n, 0.25))
    sub(1, "config", {"cp_rank": 0})
    sub(1, "insert", {"node_id": out_node})
    sub(1, "insert", {"node_id": in_node})
    sub(1, "split", {"node_id": out_node, "new_id": child_of_out})
    sub(1, "split", {"node_id": in_node, "new_id": child_of_in})
    sub(1, "prepare", {"node_id": child_of_out})   # inherits "out" although its own hash says keep
    sub(1, "prepare", {"node_id": child_of_in})    # inherits "in"
    sub(2, "free", {"node_id": -1})
    sub(1, "reset", {})
    assert got == [("config", None), ("insert", in_node), ("split", in_node), ("prepare", child_of_in),
                   ("free", -1), ("reset", None)]


def test_sampled_stream_resource_and_check_knows(tmp_path):
    # two ranks at CPTRACE_SAMPLE=0.5 emit the same nodes: both keep the same ones, the resource says so
    body = ("import sys\nr = int(sys.argv[1]) if len(sys.argv) > 1 else 0\n")
    for r in (0, 1):
        code = ("ct.cptrace(1, 'config', cp_size=2, cp_rank=%d, mode='replicated', page_size=1, policy='wt')\n"
                "for n in range(1, 60):\n"
                "    ct.cptrace(1, 'insert', node_id=n, parent=0, len=1, dev='(cnt=1,min=%%d,max=%%d,first=%%d,last=%%d)' %% (n, n, n, n))\n" % r)  # noqa: E501 - the child's source line
        p = _run_emitter(tmp_path, {"CPTRACE_SAMPLE": "0.5"}, body + code)
        assert p.returncode == 0, p.stderr
    files = sorted(os.listdir(tmp_path / "out"))
    assert [f[:7] for f in files] == ["rank-0-", "rank-1-"]
    nodes = []
    for f in files:
        res = _resources(tmp_path / "out" / f)
        assert {r["cptrace.sample"] for r in res} == {0.5}
        seen = set()
        for line in open(tmp_path / "out" / f):
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        for a in sp["attributes"]:
                            if a["key"] == "hicache.node_id":
                                seen.add(int(a["value"]["intValue"]))
        nodes.append(seen)
    assert nodes[0] == nodes[1] == {n for n in range(1, 60) if sampling.keep_node("r1", n, 0.5)}
    from cptrace_otel.cli import main
    assert main(["check", str(tmp_path / "out")]) == 0


def _node_ids(path) -> list[int]:
    """The hicache.node_id of every span and span event in an OTLP JSON lines file, in file order."""
    out = []
    for line in open(path):
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for item in [sp] + sp.get("events", []):
                        for a in item.get("attributes", []):
                            if a["key"] == "hicache.node_id":
                                out.append(int(a["value"]["intValue"]))
    return out


@pytest.mark.parametrize("ring", ["0", "1"])
def test_a_sampled_out_nodes_records_never_reach_the_exporter(tmp_path, ring):
    """Each node gets several records: the first is decided by the sampler, the later ones of a node decided out are
    dropped by the gate (``cptrace``'s C gate probing the sampler's ``IdSet``, or the Python definition), and a
    split hands its decision to the new node; on both record paths (the buffer and the ring) exactly the kept
    lineages reach the exporter, each record of them."""
    body = (
        "from cptrace_otel.traced import api\n"
        "from cptrace_otel.model.sampling import keep_node\n"
        "ct.cptrace(1, 'config', cp_size=1, cp_rank=0, mode='none', page_size=1, policy='wt')\n"
        "dev = '(cnt=1,min=1,max=1,first=1,last=1)'\n"
        "for n in range(1, 60):\n"
        "    for _ in range(3):\n"
        "        ct.cptrace(1, 'insert', node_id=n, parent=0, len=1, dev=dev)\n"
        "out = [n for n in range(1, 60) if not keep_node('r1', n, 0.5)]\n"
        "kept = [n for n in range(1, 60) if keep_node('r1', n, 0.5)]\n"
        "ct.cptrace(1, 'split', node_id=out[0], new_id=1000, parent=0, pre_len=1, split_len=1)\n"
        "ct.cptrace(1, 'split', node_id=kept[0], new_id=1001, parent=0, pre_len=1, split_len=1)\n"
        "for n in (1000, 1001):\n"
        "    for _ in range(3):\n"
        "        ct.cptrace(1, 'insert', node_id=n, parent=0, len=1, dev=dev)\n"
        "assert sorted(api._STATE.drop) == sorted(out + [1000]), sorted(api._STATE.drop)\n"
        "assert api._hot is None or type(api._STATE.drop) is api._hot.IdSet\n")
    p = _run_emitter(tmp_path, {"CPTRACE_SAMPLE": "0.5", "CPTRACE_RING": ring, "CPTRACE_CP_RANK": "0"}, body)
    assert p.returncode == 0, p.stderr
    files = os.listdir(tmp_path / "out")
    assert len(files) == 1, files
    kept = [n for n in range(1, 60) if sampling.keep_node("r1", n, 0.5)]
    out = [n for n in range(1, 60) if not sampling.keep_node("r1", n, 0.5)]
    assert kept and out
    ids = _node_ids(tmp_path / "out" / files[0])
    assert set(ids) == set(kept) | {1001}
    for n in kept + [1001]:
        assert ids.count(n) >= 3, (n, ids.count(n))   # all three of its inserts (the split adds its own)


def test_check_says_unknown_rank_streams(tmp_path, capsys):
    for env in ({"CPTRACE_CP_RANK": "0"}, {"CPTRACE_RANK_WAIT_S": "0.1"}):
        p = _run_emitter(tmp_path, env, "ct.cptrace(1, 'insert', node_id=5, parent=0, len=1, dev='(0)')")
        assert p.returncode == 0, p.stderr
    from cptrace_otel.cli import main
    assert main(["check", str(tmp_path / "out")]) == 4
    assert "1 streams with an unknown rank: cross-rank rules not run" in capsys.readouterr().err


def test_rank_published_after_the_first_records_labels_them(tmp_path):
    # SGLang publishes its parallel state only after the first records were emitted: they still get its rank
    body = ("import sys, time, types\n"
            "ct.cptrace(1, 'insert', node_id=5, parent=0, len=1, dev='(0)')\n"
            "time.sleep(0.3)\n"
            "rc = types.ModuleType('sglang.srt.runtime_context')\n"
            "rc.get_parallel = lambda: types.SimpleNamespace(attn_cp_rank=3, attn_tp_rank=0, attn_dp_rank=0,"
            " attn_cp_size=4)\n"
            "sys.modules['sglang.srt.runtime_context'] = rc\n"
            "ct.cptrace(1, 'insert', node_id=6, parent=0, len=1, dev='(0)')\n")
    p = _run_emitter(tmp_path, {"CPTRACE_RANK_WAIT_S": "30"}, body)
    assert p.returncode == 0, p.stderr
    files = os.listdir(tmp_path / "out")
    assert len(files) == 1 and files[0].startswith("rank-3-"), files
    res = _resources(tmp_path / "out" / files[0])
    assert {r["cptrace.rank.source"] for r in res} == {"sglang"}
    assert {int(r["sglang.cp.rank"]) for r in res} == {3}


def test_cross_rank_rules_do_not_call_a_sampled_out_node_missing():
    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.model.events import Event

    out_node = next(n for n in range(1, 100) if not sampling.keep_node("r", n, 0.5))
    rng = "(cnt=4,min=0,max=3,first=0,last=3)"
    from cptrace_otel.model.logline import parse_value

    def stream():
        seq = {0: 0, 1: 0}

        def ev(rank, tag, **f):
            seq[rank] += 1
            return Event(tag, rank, seq[rank], seq[rank], 0, f, 1, "t", 0)
        for r in (0, 1):
            yield ev(r, "config", cp_size=2, cp_rank=r, mode="replicated", page_size=1, policy="wt")
        # the node is on rank 0 only (rank 1 sampled it out)
        yield ev(0, "insert", node_id=out_node, parent=0, len=4, dev=parse_value(rng), kind="new")
        yield ev(0, "prepare", node_id=out_node, op=1, len=4, dev=parse_value(rng), host=parse_value(rng),
                 policy="wt")
        yield ev(0, "backup", op=1, node_id=out_node, dev=parse_value(rng), host=parse_value(rng), io=1)

    plain = Analysis(1).run(list(stream()))   # unsampled: rank 1 lacks the node (C1 says its stream ends early)
    assert {(f.code, f.rank) for f in plain.findings} == {("C1", 1)}, plain.findings
    sampled = Analysis(1, sampled={1: ("r", 0.5)}).run(list(stream()))
    assert sampled.findings == [], sampled.findings
