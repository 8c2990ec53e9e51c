"""What a ``cptrace-otel serve`` replica reports for a trace split between two replicas (the resolver's list changed
mid-run: the first spans of a trace went to one replica, the rest to another), beside the whole trace.

The records: faulted 4-rank simulator runs (sharded CP, several seeds), their OTLP requests decoded into spans in
the order the exporter sent them. Each trace is cut after ``k`` of its spans (fixed fractions, and random ``k`` per
trace, seeded): the head is checked alone (what the first replica does when the trace goes idle there) and the tail
alone (the second replica), each by :class:`~cptrace_otel.analyze.serve_state.ServeState` as a replica does. A
finding of a head or a tail that the whole trace does not give (same trace, code, rule, rank, node, epoch and last
evidence record) is *false*; one of the whole that neither part gives is *missed* (a tail reported UNCHECKED
reports none of its findings). The replica reports a tail that lacks a rank's first records as UNCHECKED
(``serve_journal.ranks_without_start``); the figures count those too, and check that no whole trace is.

Each head is checked twice, side by side: alone (a replica without ``--confirm-url``) and with a span store that
holds every span of the run, as the Jaeger the collector also writes to does (``serve --confirm-url``,
:class:`~cptrace_otel.analyze.serve_confirm.StoreConfirm`; here ``StoreConfirm.holding`` answers from the decoded
spans, the lookup a real Jaeger answers is tests/integration/test_serve_confirm_jaeger.py's). With the store, the tail's
replica checks the whole trace from it and reports what the head's replica did not: the last line counts what the
two replicas report together (missed, doubled: reported by both, false), each with the store.

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


def _findings(spans: list, store=None) -> tuple[set[tuple], set[str]]:
    """The findings a replica reports on ``spans``, and the traces it reports UNCHECKED (first records not seen,
    or, with ``store``, records in the store that never came)."""
    from cptrace_otel.analyze.serve_state import ServeState

    got: set[tuple] = set()
    unchecked: set[str] = set()
    st = ServeState(lambda tr, found: got.update(
        (tr.trace_id, f.code, f.rule, f.rank, f.node_id, f.epoch, f.evidence[-1] if f.evidence else None)
        for f in found), idle_s=3600, unchecked=lambda run, trace, why, n: unchecked.add(trace),
        confirm=store)
    st.add(spans, now=0.0)
    st.finish_all()
    return got, unchecked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--random-cuts", type=int, default=5, help="random cuts per run (default 5)")
    args = ap.parse_args(argv)
    from cptrace_otel.analyze.otlp_intake import decode
    from cptrace_otel.analyze.serve_confirm import StoreConfirm
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
        whole, wu = _findings(spans)
        store = StoreConfirm.holding(spans)
        total["whole_traces"] += len(by)
        total["whole_unchecked"] += len(wu)
        print(f"seed {seed}: {len(spans)} spans, {len(by)} traces, {len(whole)} findings on whole traces, {len(wu)} "
              "reported UNCHECKED")
        cuts: list[float | str] = [0.25, 0.5, 0.75] + [f"random{i}" for i in range(args.random_cuts)]
        for cut in cuts:
            rnd = random.Random(f"{seed}|{cut}")
            heads, tails = [], []
            for sps in by.values():
                k = rnd.randrange(len(sps) + 1) if isinstance(cut, str) else int(len(sps) * cut)
                heads += sps[:k]
                tails += sps[k:]
            (h, hu), (t, tu) = _findings(heads), _findings(tails)
            hs, hsu = _findings(heads, store)
            ts, tsu = _findings(tails, store)
            both_missed, doubled, both_false = whole - hs - ts, hs & ts, (hs | ts) - whole
            for name, n in (("both_missed", len(both_missed)), ("both_doubled", len(doubled)),
                            ("both_false", len(both_false)), ("both_tail_unchecked", len(tsu)),
                            ("both_silent", len({x for x in both_missed if x[0] not in hsu | tsu}))):
                total[name] += n
            fhs, missed_s = hs - whole, whole - hs - t
            silent_s = {x for x in missed_s if x[0] not in hsu | tu}
            for name, n in (("store_head_false", len(fhs)), ("store_head_unchecked", len(hsu)),
                            ("store_missed", len(missed_s)), ("store_silent", len(silent_s)),
                            ("store_cuts_head_false", bool(fhs))):
                total[name] += n
            total["head_unchecked"] += len(hu)
            total["tail_unchecked"] += len(tu)
            total["tails"] += len({sp.trace_id for sp in tails})
            fh, ft, missed = h - whole, t - whole, whole - h - t
            silent = {x for x in missed if x[0] not in hu | tu}   # neither reported nor its trace said UNCHECKED
            for name, n in (("cuts", 1), ("head_false", len(fh)), ("tail_false", len(ft)), ("missed", len(missed)),
                            ("silent", len(silent)), ("cuts_head_false", bool(fh)), ("cuts_tail_false", bool(ft))):
                total[name] += n
            rules = sorted({x[2] for x in fh | ft})
            print(f"  cut {cut}: head {len(h)} findings ({len(fh)} false, {len(hu)} traces UNCHECKED), tail {len(t)} "
                  f"({len(ft)} false, {len(tu)} of {len({sp.trace_id for sp in tails})} traces UNCHECKED), "
                  f"{len(missed)} missed ({len(silent)} silently)"
                  f"{'; false ones: ' + ', '.join(rules) if rules else ''}")
            print(f"    with the store: head {len(hs)} findings ({len(fhs)} false, {len(hsu)} traces UNCHECKED), "
                  f"{len(missed_s)} missed ({len(silent_s)} silently)")
            print(f"    both replicas with the store: {len(both_missed)} missed, {len(doubled)} doubled, "
                  f"{len(both_false)} false; tails UNCHECKED {len(tsu)}")
            for x in sorted(silent, key=str):
                print(f"    missed silently: {x[1:]}")
    print(f"all: {total['whole_unchecked']} of {total['whole_traces']} whole traces reported UNCHECKED; "
          f"{total['cuts']} cuts: false findings in heads {total['head_false']} ({total['cuts_head_false']} cuts), "
          f"in tails {total['tail_false']} ({total['cuts_tail_false']} cuts); tails reported UNCHECKED "
          f"{total['tail_unchecked']} of {total['tails']}, heads {total['head_unchecked']}; "
          f"missed (neither part reports it) {total['missed']}, of them silently (the trace not reported UNCHECKED "
          f"either) {total['silent']}")
    print(f"heads with the span store (--confirm-url): false findings {total['store_head_false']} "
          f"({total['store_cuts_head_false']} cuts), heads reported UNCHECKED {total['store_head_unchecked']}; "
          f"missed {total['store_missed']}, of them silently {total['store_silent']}")
    print(f"both replicas with the span store (the tail's checks the whole trace from it): missed "
          f"{total['both_missed']} (silently {total['both_silent']}), doubled {total['both_doubled']}, false "
          f"{total['both_false']}; tails reported UNCHECKED {total['both_tail_unchecked']} of {total['tails']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
