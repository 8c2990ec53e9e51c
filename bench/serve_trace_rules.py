"""Which rules one ``serve`` replica can decide: each node trace of simulator runs checked alone against ``check``.

For every (mode, faults) run of the simulator (``cptrace-otel demo``): ``check --json`` over the run's log files is
the reference; then every trace of the run's OTLP requests is checked alone (``serve_trace.check_trace``: what a
replica runs on a trace once idle, before it keeps only the rules it reports), once as the exporter sends them
(each rank's config record stamped on the resource) and once with the stamp taken off (what a replica saw before
it). Per rule it prints the findings of ``check`` and, for each variant, how many of them the traces found, missed,
and how many they gave that ``check`` does not (findings compared by rule, rank, node, epoch and last evidence).

    python bench/serve_trace_rules.py [--ranks 4] [--modes replicated,sharded,shared] [--faults "none;C1_div;..."]
        [--bump 3]

No simulator fault breaks C4 (a node's dev/host page counts equal on all ranks), so with ``--bump N`` each run
without faults is also measured changed as a rank that logs other page counts would send it: rank 1's first N
prepare/reload ``dev.cnt``/``host.cnt`` plus one, in its OTLP requests; the reference is then ``check`` over the
changed OTLP files (the log files are not changed).

A fault that does not apply to a mode (C3_writer outside sharded) is skipped. CPU only; about 10 s per run here.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAULTS = "none;C1_div;C2_round;C3_writer;ZERO_race;H4_nolock,HASH_flip;H1_ack,H2_release,HASH_flip@1"
ONLY = {"C3_writer": ("sharded",)}   # faults the simulator injects in some modes only


def _key(rule: str, rank: int, node: object, epoch: int, ev: list) -> tuple:
    return (rule, rank, node, epoch, str(ev[-1]) if ev else None)


def _requests(out: Path, stamped: bool, bump: int = 0) -> list:
    from google.protobuf.json_format import Parse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from cptrace_otel.model import semconv as sc

    stamp = (sc.CONFIG_SEQ, sc.CONFIG_EPOCH, sc.CONFIG_LEVEL)
    reqs = []
    for f in sorted(out.glob("*.otlp.jsonl")):
        for ln in f.read_text().splitlines():
            if not ln.strip():
                continue
            req = Parse(ln, ExportTraceServiceRequest())
            for rs in req.resource_spans:
                if bump <= 0 or not any(kv.key == sc.CP_RANK and kv.value.int_value == 1
                                        for kv in rs.resource.attributes):
                    continue
                for ev in (e for ss in rs.scope_spans for sp in ss.spans for e in sp.events):
                    for kv in ev.attributes:
                        if bump > 0 and ev.name in ("prepare", "reload") and kv.key in ("hicache.dev.cnt",
                                                                                        "hicache.host.cnt"):
                            kv.value.int_value += 1
                            bump -= 1
            if not stamped:
                for rs in req.resource_spans:
                    keep = [kv for kv in rs.resource.attributes
                            if not kv.key.startswith(sc.CONFIG_PREFIX) and kv.key not in stamp]
                    del rs.resource.attributes[:]
                    rs.resource.attributes.extend(keep)
            reqs.append(req)
    return reqs


def per_trace(out: Path, stamped: bool, bump: int = 0) -> set:
    """Every finding of every trace of the run in ``out``, each trace checked alone."""
    from cptrace_otel.analyze.otlp_intake import from_request
    from cptrace_otel.analyze.serve_state import ServeState
    from cptrace_otel.analyze.serve_trace import check_trace

    st = ServeState(lambda tr, found: None, idle_s=3600, max_nodes=10 ** 9)
    for req in _requests(out, stamped, bump):
        st.add(from_request(req).spans, now=0.0)
    return {_key(f.rule, f.rank, f.node_id, f.epoch, f.evidence) for tr in st.traces.values()
            for f in check_trace(tr).findings}


def demo_runs(tmp: Path, ranks: int, modes: str, faults_list: str) -> Iterator[tuple[str, str, Path | None]]:
    """(mode, faults, output folder) of each simulator run of ``modes`` x ``faults_list`` (``;``-separated) that
    applies; the folder None (said on stderr) when a demo failed: the caller stops."""
    for mode in modes.split(","):
        for faults in faults_list.split(";"):
            if mode not in ONLY.get(faults, (mode,)):
                continue
            out = tmp / f"{mode}-{faults}"
            d = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", str(ranks), "--mode",
                                mode, "--faults", faults, "--out", str(out), "--json"],
                               capture_output=True, text=True, cwd=ROOT)
            if d.returncode not in (0, 1):
                print(f"demo {mode} {faults} failed: {d.stderr[-500:]}", file=sys.stderr)
                yield mode, faults, None
                return
            yield mode, faults, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--modes", default="replicated,sharded,shared")
    ap.add_argument("--faults", default=FAULTS, help="runs separated by ';', faults of one run by ','")
    ap.add_argument("--bump", type=int, default=3, help="page counts changed on rank 1 of each run without faults")
    a = ap.parse_args()
    tot: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory() as tmp:
        for mode, faults, out in demo_runs(Path(tmp), a.ranks, a.modes, a.faults):
            if out is None:
                return 2
            c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                                *sorted(str(p) for p in out.glob("rank*.log"))], capture_output=True, text=True,
                               cwd=ROOT)
            want = {_key(f["rule"], f["rank"], f["node_id"], f["epoch"], f["evidence"])
                    for f in json.loads(c.stdout)["findings"]}
            got = {True: per_trace(out, True), False: per_trace(out, False)}
            if faults == "none" and a.bump > 0:
                from google.protobuf.json_format import MessageToJson

                changed = Path(tmp) / f"{mode}-bumped"
                changed.mkdir()
                (changed / "run.otlp.jsonl").write_text("".join(
                    MessageToJson(r, indent=None) + "\n" for r in _requests(out, True, a.bump)))
                c = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json",
                                    str(changed / "run.otlp.jsonl")], capture_output=True, text=True, cwd=ROOT)
                want |= {_key(f["rule"], f["rank"], f["node_id"], f["epoch"], f["evidence"])
                         for f in json.loads(c.stdout)["findings"] if f["rule"] == "C4"}
                for v in (True, False):
                    got[v] |= {f for f in per_trace(changed, v) if f[0] == "C4"}
            for rule in sorted({f[0] for f in want | got[True] | got[False]}):
                w = {f for f in want if f[0] == rule}
                t = tot[rule]
                t["check"] += len(w)
                for v, g in got.items():
                    g = {f for f in g if f[0] == rule}
                    tag = "stamp" if v else "bare"
                    t[f"{tag} found"] += len(w & g)
                    t[f"{tag} missed"] += len(w - g)
                    t[f"{tag} extra"] += len(g - w)
                if w != {f for f in got[True] if f[0] == rule}:
                    print(f"  {mode:10s} {faults:28s} {rule}: check {len(w)}, traces with the stamp "
                          f"{len({f for f in got[True] if f[0] == rule})}", flush=True)
    print(f"\n{a.ranks} ranks, modes {a.modes}; each trace checked alone, with / without the config stamp")
    print(f"{'rule':12s} {'check':>6s} | {'found':>6s} {'missed':>6s} {'extra':>6s} | {'found':>6s} {'missed':>6s} "
          f"{'extra':>6s}")
    for rule, t in sorted(tot.items()):
        print(f"{rule:12s} {t['check']:6d} | {t['stamp found']:6d} {t['stamp missed']:6d} {t['stamp extra']:6d} | "
              f"{t['bare found']:6d} {t['bare missed']:6d} {t['bare extra']:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
