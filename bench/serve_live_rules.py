"""What a ``serve --live`` replica reports against an idle-only one, on the same spans, rule by rule.

For every (mode, faults) run of the simulator (``cptrace-otel demo``, 4 ranks by default), the run's OTLP requests
are decoded by the replica's own intake and given, 50 spans at a time, to two ``ServeState`` objects: one live
(``serve --live``: reorder window 64 records, 5 s of the bench's clock) and one idle-only (the default). Per rule it
prints the findings each reported (the same finding: trace, rule, rank, epoch, node, op, evidence, message) and how
many of the live ones were reported before the trace was finalised (``live early``): the others waited for the
end of the stream (H4-open) or, for the cross-rank C3-C5, for a rank of the CP group that never sent records past
the deciding one. Exit status 1 when the two differ on any run.

    python bench/serve_live_rules.py [--ranks 4] [--modes replicated,sharded,shared] [--faults "none;C1_div;..."]

CPU only; a few seconds per run.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serve_trace_rules import FAULTS, _requests, demo_runs  # noqa: E402


def _spans(out: Path) -> list:
    """The run's spans as the replica's intake decodes them, in the order the exporters sent them."""
    from cptrace_otel.analyze.otlp_intake import decode

    return [s for req in _requests(out, stamped=True) for s in decode(req.SerializeToString()).spans]


def _replica(spans: list, live: bool) -> tuple[list[tuple], list[tuple]]:
    """Every finding reported, and those reported before any trace was finalised."""
    from cptrace_otel.analyze.serve_state import ServeState

    got: list[tuple] = []

    def report(tr, found) -> None:
        got.extend((tr.trace_id, f.rule, f.rank, f.epoch, f.node_id, f.op, tuple(f.evidence), f.message)
                   for f in found)

    st = ServeState(report, idle_s=3600, live=live, window=64, window_s=5.0)
    for i in range(0, len(spans), 50):
        st.add(spans[i:i + 50], now=float(i))
    st.sweep(now=float(len(spans)) + 10.0)   # every reorder window's time is up; no trace idle yet
    early = list(got)
    st.finish_all()
    return got, early


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--modes", default="replicated,sharded,shared")
    ap.add_argument("--faults", default=FAULTS, help="runs separated by ';', faults of one run by ','")
    a = ap.parse_args()
    tot: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for mode, faults, out in demo_runs(Path(tmp), a.ranks, a.modes, a.faults):
            if out is None:
                return 2
            spans = _spans(out)
            idle, _ = _replica(spans, live=False)
            live, early = _replica(spans, live=True)
            same = collections.Counter(idle) == collections.Counter(live)
            differ += not same
            for rule in {f[1] for f in idle + live}:
                t = tot[rule]
                t["idle"] += sum(f[1] == rule for f in idle)
                t["live"] += sum(f[1] == rule for f in live)
                t["early"] += sum(f[1] == rule for f in early)
            print(f"  {mode:10s} {faults:34s} idle-only {len(idle):3d}, live {len(live):3d} "
                  f"({len(early)} before the finalisation): {'same' if same else 'DIFFER'}", flush=True)
    print(f"\n{a.ranks} ranks, modes {a.modes}: findings reported, by rule")
    print(f"{'rule':12s} {'idle-only':>9s} {'live':>6s} {'live early':>10s}")
    for rule, t in sorted(tot.items()):
        print(f"{rule:12s} {t['idle']:9d} {t['live']:6d} {t['early']:10d}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
