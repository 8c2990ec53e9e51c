"""Fault-injecting HiCache simulator (numpy only): a mini HiRadix cache per CP rank with device/host pools, splits,
backup/evict/reload, asynchronous copies that read their source when they complete, CP modes, write policies, and
every fault of docs/domain.md §7.2 injectable by name, with an oracle of what each must make the checker
find. Used by the tests and by ``cptrace-otel demo``.

    from cptrace_otel.sim import Simulation, FaultPlan, LogEmitter
    sim = Simulation("replicated", ranks=2, policy="wt", level=2, faults=[FaultPlan("HASH_flip", rank=1)])
    sim.request(tokens); sim.step(); ...; sim.finish()
    sim.emitter.lines[rank]      # upstream log lines;  sim.oracle.expected(level)  # the ground truth
"""

from .core import Simulation
from .faults import FAULTS, FaultPlan, Oracle, parse_faults
from .tracer import ApiEmitter, LogEmitter

__all__ = ["FAULTS", "ApiEmitter", "FaultPlan", "LogEmitter", "Oracle", "Simulation", "parse_faults"]
