"""What a ``cptrace-otel serve`` replica reports for a trace split between two replicas (the resolver's list changed
mid-run: the first spans of a trace went to one replica, the rest to another), beside the whole trace.

The records: faulted 4-rank simulator runs (sharded CP, several seeds), their OTLP requests decoded into spans in
the order the exporter sent them. Each trace is cut after ``k`` of its spans (fixed fractions, and random ``k`` per
trace, seeded): the head is checked alone (what the first replica does when the trace goes idle there) and the tail
alone (the second replica), each by :class:`~cptrace_otel.analyze.serve_state.ServeState` as a replica does. A
finding of a head or a tail that the whole trace does not give (same trace, code, rule, rank, node, epoch and last
evidence record) is *false*; one of the whole that neither part gives is *missed*.

    python bench/serve_moved_traces.py              # seeds 1-3
    python bench/serve_moved_traces.py --seeds 1,2,3,4,5
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAULTS = "HASH_flip,ZERO_nostore,H1_ack,H4_nolock,C3_writer"


def _findings(spans: list) -> set[tuple]:
    from cptrace_otel.analyze.serve_state import ServeState

    got: set[tuple] = set()
    st = ServeState(lambda tr, found: got.update(
        (tr.trace_id, f.code, f.rule, f.rank, f.node_id, f.epoch, f.evidence[-1] if f.evidence else None)
        for f in found), idle_s=3600)
    st.add(spans, now=0.0)
    st.finish_all()
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--random-cuts", type=int, default=5, help="random cuts per run (default 5)")
    args = ap.parse_args(argv)
    from cptrace_otel.analyze.otlp_intake import decode
    from tests.helpers.otlp_receiver import parse_json_line

    tmp = Path(tempfile.mkdtemp(prefix="serve-moved-"))
    total = defaultdict(int)
    for seed in args.seeds.split(","):
        out = tmp / f"seed{seed}"
        subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--mode", "sharded",
                        "--seed", seed, "--faults", FAULTS, "--out", str(out), "--json"], cwd=ROOT,
                       capture_output=True, timeout=300)
        spans = [sp for f in sorted(out.glob("*.otlp.jsonl")) for ln in f.read_text().splitlines() if ln.strip()
                 for sp in decode(parse_json_line(ln).SerializeToString()).spans]
        by: dict[str, list] = defaultdict(list)
        for sp in spans:
            by[sp.trace_id].append(sp)
        whole = _findings(spans)
        print(f"seed {seed}: {len(spans)} spans, {len(by)} traces, {len(whole)} findings on whole traces")
        cuts: list[float | str] = [0.25, 0.5, 0.75] + [f"random{i}" for i in range(args.random_cuts)]
        for cut in cuts:
            rnd = random.Random(f"{seed}|{cut}")
            heads, tails = [], []
            for sps in by.values():
                k = rnd.randrange(len(sps) + 1) if isinstance(cut, str) else int(len(sps) * cut)
                heads += sps[:k]
                tails += sps[k:]
            h, t = _findings(heads), _findings(tails)
            fh, ft, missed = h - whole, t - whole, whole - h - t
            for name, n in (("cuts", 1), ("head_false", len(fh)), ("tail_false", len(ft)), ("missed", len(missed)),
                            ("cuts_head_false", bool(fh)), ("cuts_tail_false", bool(ft))):
                total[name] += n
            rules = sorted({x[2] for x in fh | ft})
            print(f"  cut {cut}: head {len(h)} findings ({len(fh)} false), tail {len(t)} ({len(ft)} false), "
                  f"{len(missed)} missed{'; false ones: ' + ', '.join(rules) if rules else ''}")
    print(f"all: {total['cuts']} cuts; false findings in heads {total['head_false']} "
          f"({total['cuts_head_false']} cuts), in tails {total['tail_false']} ({total['cuts_tail_false']} cuts); "
          f"missed {total['missed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
