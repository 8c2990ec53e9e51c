"""One rank process of ``cptrace-otel demo``: ``python -m cptrace_otel.sim.rank_main --rank R ...``.

It runs the whole deterministic simulation (every rank, in lockstep, same seed) and emits only its own rank's
records, through the public API (``cptrace_otel.cptrace``), so the real pipeline runs: the gate, the drainer, the
exporter process, the per-rank online checks, the sinks named by the environment the demo sets (``CPTRACE_FILE``,
``CPTRACE_LOG_FILE``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` ...). It flushes before exiting.

Exit status: 0 when every record was delivered, 4 when the flush timed out, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tracer import Emitter

FLUSH_TIMEOUT_S = 60.0


def build(mode: str, ranks: int, policy: str, level: int, seed: int, faults: str, emitter: Emitter,
          background: int = 16) -> Any:
    """The demo run: a seeded random stream (no fault armed), then one scripted segment per requested fault with
    only that fault armed (each segment a new epoch), then, with no fault at all, every legal near-miss segment.
    Deterministic in its arguments, so every rank process and the parent's oracle run see the same run."""
    import numpy as np

    from .core import Simulation
    from .faults import parse_faults
    from .workload import NEAR_MISSES, SCENARIO_NAME_OF_FAULT, P, random_stream, run_segment

    plans = parse_faults(faults, 1 if mode == "none" else ranks)
    # divergence faults desynchronize the ranks for good: run them last
    plans.sort(key=lambda p: p.kind == "C1_div")
    for p in plans:
        p.active = False
    sim = Simulation(mode, ranks, policy, level, plans, emitter, page_size=P, layers=2, width=4, dev_pages=12,
                     host_pages=20, d_w=2, d_l=2, lb_threshold=2 * P)
    random_stream(sim, np.random.default_rng(seed), background, resets=False)
    if plans:
        for p in plans:
            p.active = True
            run_segment(sim, SCENARIO_NAME_OF_FAULT[p.kind])
            p.active = False
    else:
        seen = set()
        for name, pol in NEAR_MISSES.values():
            if pol == policy and name not in seen:
                seen.add(name)
                run_segment(sim, name)
    sim.finish(max_steps=8)
    return sim


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cptrace_otel.sim.rank_main")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--level", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--faults", default="none")
    a = p.parse_args(argv)
    import cptrace_otel

    from .tracer import ApiEmitter

    emitter = ApiEmitter(a.rank, a.level)
    build(a.mode, a.ranks, a.policy, a.level, a.seed, a.faults, emitter)
    ok = cptrace_otel.flush(FLUSH_TIMEOUT_S)
    cptrace_otel.shutdown(10.0)
    return 0 if ok else 4


if __name__ == "__main__":
    sys.exit(main())
