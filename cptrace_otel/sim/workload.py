"""Workloads for the simulator: seeded random request streams (negative controls), one scripted scenario per fault
of docs/domain.md §7.2 (each makes its eligible site and its consequence happen), and the legal near-misses of §7.3.2.

Every function drives a :class:`~cptrace_otel.sim.core.Simulation` and returns it; the records are in its emitter,
the ground truth in ``sim.oracle``. :func:`analyze` runs the checker (per-rank rules and cross-rank rules) over the
records of a :class:`~cptrace_otel.sim.tracer.LogEmitter`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .core import Simulation
from .faults import FAULTS, FaultPlan
from .tracer import Emitter

P = 4  # page size of every workload here


class Tokens:
    """Fresh token ids, so scenario prompts never collide by accident."""

    def __init__(self, start: int = 1000) -> None:
        self.n = start

    def __call__(self, pages: int) -> list[int]:
        out = list(range(self.n, self.n + pages * P))
        self.n += pages * P
        return out


def random_workload(seed: int, mode: str = "none", ranks: int = 2, policy: str = "wt", level: int = 3,
                    emitter: Emitter | None = None, faults: Iterable[FaultPlan] = (), requests: int = 24,
                    exact: bool = True, merge: bool = True, lag_ns: int = 0, mixed_acks: bool = False,
                    cut: float = 0.0, alloc: str = "lifo", inflight: float = 0.0,
                    ack_chain: bool = True) -> Simulation:
    """A seeded random stream: shared prefixes force splits, a small device pool forces eviction and reloads, a
    small host pool forces host eviction, copy delays ``d_w``/``d_l`` of 1-3 rounds, now and then a reset.
    ``merge``: the writes of one round start as one merged op (the simulator's default); False: one op each.
    ``lag_ns``, ``mixed_acks``: see :class:`~cptrace_otel.sim.core.Simulation`; ``cut``: see :func:`random_stream`
    (all three off by default, so a seed's stream is what it always was). What real SGLang runs do:
    ``alloc="sglang"`` (scattered slots after frees), ``inflight`` (the share of cuts made while the load is still
    in flight), ``ack_chain`` (False: h2d ack records for each load's last node only); see :class:`Simulation`."""
    rng = np.random.default_rng(seed)
    sim = Simulation(mode, ranks, policy, level, faults, emitter, page_size=P, layers=2, width=4,
                     dev_pages=int(rng.integers(10, 17)), host_pages=int(rng.integers(14, 25)),
                     d_w=int(rng.integers(1, 4)), d_l=int(rng.integers(1, 4)), lb_threshold=2 * P, exact=exact,
                     merge=merge, lag_ns=lag_ns, mixed_acks=mixed_acks, alloc=alloc, ack_chain=ack_chain)
    random_stream(sim, rng, requests, cut=cut, inflight=inflight)
    sim.finish()
    return sim


def random_stream(sim: Simulation, rng: np.random.Generator, requests: int, resets: bool = True,
                  cut: float = 0.0, inflight: float = 0.0) -> None:
    """Drive ``sim`` with ``requests`` random requests (repeats, shared prefixes with new suffixes, fresh prompts),
    0-2 rounds apart, random durations. ``cut``: the share of requests that repeat an earlier prompt of two pages
    or more (a host hit reloads it when it was evicted), wait for any load, then take a page-aligned part of it
    (cut inside it) and a new suffix, which splits its node, the reloaded one included (0: none, and the stream
    draws exactly what it did before the option existed). ``inflight``: the share of those cuts made after a
    device eviction pass, in the same batch as the repeat and another earlier prompt, while their loads are in
    flight (SGLang's match_prefix/insert split a node whose load is pending; two loads of one batch merge into one
    op). Prompts are whole pages of ``sim.page_size`` tokens."""
    ps = sim.page_size
    vocab = 200
    prefixes = [rng.integers(0, vocab, ps * int(k)).tolist() for k in rng.integers(1, 4, size=4)]
    history: list[list[int]] = []
    for _ in range(requests):
        if cut and history and rng.random() < cut:
            src = history[int(rng.integers(len(history)))]
            if len(src) >= 2 * ps:
                now = bool(inflight) and rng.random() < inflight
                if now:
                    sim.evict_all()   # memory pressure: the repeat is a host hit and reloads
                sim.request(src)
                if now:
                    # the same batch: another earlier prompt (a second load merges with the first) and the cut
                    sim.request(history[int(rng.integers(len(history)))])
                else:
                    for _ in range(sim.d_l + 1):   # the load lands before the cut
                        sim.step()
                k = _cut_point(sim, src, rng)
                toks = src[:k] + rng.integers(0, vocab, ps * int(rng.integers(1, 3))).tolist()
                history.append(toks)
                sim.request(toks, dur=int(rng.integers(0, 3)))
                for _ in range(int(rng.integers(0, 3))):
                    sim.step()
                continue
        u = rng.random()
        if u < 0.35 and history:
            toks = history[int(rng.integers(len(history)))]
        elif u < 0.8:
            pre = prefixes[int(rng.integers(len(prefixes)))]
            k = int(rng.integers(1, len(pre) // ps + 1)) * ps
            toks = pre[:k] + rng.integers(0, vocab, ps * int(rng.integers(0, 3))).tolist()
        else:
            toks = rng.integers(0, vocab, ps * int(rng.integers(1, 4))).tolist()
        history.append(toks)
        sim.request(toks, dur=int(rng.integers(0, 3)))
        for _ in range(int(rng.integers(0, 3))):
            sim.step()
        if resets and rng.random() < 0.04:
            sim.reset()


def _cut_point(sim: Simulation, src: list[int], rng: np.random.Generator) -> int:
    """A page-aligned cut inside ``src``: inside the deepest node of two pages or more on rank 0's path of
    ``src`` (the leaf that eviction, and so a reload, is likeliest to have touched), else anywhere inside it."""
    ps = sim.page_size
    tree = sim.ranks_[0].tree
    toks = np.asarray(src, dtype=np.int64)
    node, pos, best = tree.root, 0, None
    while pos < toks.size:
        child = node.children.get(tree.edge(toks[pos:]))
        if child is None or child.key.size > toks.size - pos or not np.array_equal(child.key,
                                                                                    toks[pos:pos + child.key.size]):
            break
        if child.key.size >= 2 * ps:
            best = (pos, child.key.size)
        pos += child.key.size
        node = child
    if best is None:
        return int(rng.integers(1, len(src) // ps)) * ps
    start, n = best
    return start + int(rng.integers(1, n // ps)) * ps


# -- scripted scenarios ---------------------------------------------------------------------------------------------

def _sim(mode: str, ranks: int, policy: str, level: int, faults: Iterable[FaultPlan], emitter: Emitter | None,
         **kw: object) -> Simulation:
    opts: dict[str, Any] = dict(page_size=P, layers=2, width=4, dev_pages=8, host_pages=16, d_w=1, d_l=1,
                                lb_threshold=2 * P)
    opts.update(kw)
    return Simulation(mode, ranks, policy, level, faults, emitter, **opts)


def _steps(sim: Simulation, n: int) -> None:
    for _ in range(n):
        sim.step()


def _split_pending(sim: Simulation, t: Tokens) -> None:
    """A node is split while its device->host write is pending; the ack must publish both fragments (H1_ack)."""
    a = t(4)
    sim.request(a)
    sim.step()
    sim.request(a[:2 * P] + t(2))      # splits a's node at 8 tokens while its write is in flight
    _steps(sim, 3)


def _split_reload(sim: Simulation, t: Tokens) -> None:
    """A backuped node is split, everything is evicted, then the whole prompt reloads both fragments (H1_swap,
    H2_stale); then a reload of the split-created node alone, which must use ``host_p``."""
    a = t(4)
    sim.request(a)
    sim.step()
    sim.request(a[:2 * P] + t(2))
    _steps(sim, 2)
    sim.evict_all()
    sim.request(a)                      # host hit on [prefix, suffix]: one reload of the chain
    _steps(sim, 2)
    sim.evict_all()
    sim.request(a[:2 * P])              # host hit on the split-created prefix alone
    _steps(sim, 2)


def _rebackup_reload(sim: Simulation, t: Tokens) -> None:
    """A backuped node is re-backed up to a fresh host range (the old range is released at the ack but nothing
    allocates host pages afterwards, so its pages keep the node's bytes), evicted, then reloaded: the reload must
    use the new range (H2_stale_clean reads the old one: right bytes, wrong range)."""
    a = t(3)
    sim.request(a)
    _steps(sim, 2)
    sim.rebackup_all()
    _steps(sim, 2)
    sim.evict_all()
    sim.request(a)                      # host hit on a alone: no new node, so no host allocation during the load
    _steps(sim, 2)


def _split_twice(sim: Simulation, t: Tokens) -> None:
    """Nodes split more than once while their device->host write is pending: the old id keeps the suffix at two
    splits, and the prefix one of them made is split again, so the node's lineage spans four fragments, each split
    in another fragment's records, and the ack publishes all four; everything is evicted and the whole prompt
    reloads the four as one chain; then the first three reload under a new suffix."""
    a = t(6)
    sim.request(a)
    sim.step()
    sim.request(a[:2 * P] + t(1))      # splits a's node at 8 tokens (a new id takes the prefix)
    sim.request(a[:4 * P] + t(1))      # splits what a's id kept at 8 more (another new id takes the middle)
    sim.request(a[:P] + t(1))          # splits the first prefix at 4 (a third new id takes its first page)
    _steps(sim, 3)
    sim.evict_all()
    sim.request(a)                      # host hit on the four fragments: one reload of the chain
    _steps(sim, 2)
    sim.evict_all()
    sim.request(a[:4 * P] + t(2))       # host hit on the first three, a new leaf below
    _steps(sim, 2)


def _reload_reuse(sim: Simulation, t: Tokens) -> None:
    """A reload, and new backups that allocate host pages while it is in flight (freed pages come first, so
    H2_release turns into a reuse of the loading pages); then host eviction right after the h2d ack."""
    a = t(4)
    sim.request(a)
    sim.step()
    sim.evict_all()
    sim.request(a + t(1))               # reload a; the new leaf's backup allocates host pages during the load
    sim.request(t(2))                   # a new node under the root: its backup allocates host pages too
    _steps(sim, 3)
    sim.evict_all()
    sim.evict_host_all()


def _reload_split(sim: Simulation, t: Tokens) -> None:
    """A backuped node is evicted and reloaded into new device pages, then split by a request that shares its
    prefix: the fragments take slices of the reloaded pages (H1_stale_dev slices the pre-eviction ones)."""
    a = t(4)
    sim.request(a)
    _steps(sim, 2)
    sim.evict_all()
    sim.request(t(4))                   # a fresh prompt takes the pages a just freed (they are reused first)
    sim.request(a)                      # host hit: a reloads into other pages
    _steps(sim, 2)
    sim.request(a[:2 * P] + t(2))       # splits a's node at 8 tokens
    _steps(sim, 2)


def _split_while_loading(sim: Simulation, t: Tokens) -> None:
    """What real SGLang does within one batch: two evicted prompts reload in the same round (one merged load op,
    whose ack carries its own id), and a third request cuts inside the first one's node while its load is still
    in flight (``match_prefix`` splits a node whose load is pending): the split is applied to the load, each
    fragment gets its ack record and compares its slice of the backup."""
    a, b = t(4), t(3)
    sim.request(a)
    sim.request(b)
    _steps(sim, 3)
    sim.evict_all()
    sim.request(a)                      # reload a's node
    sim.request(b)                      # reload b's, same round: one merged load op
    sim.request(a[:2 * P] + t(2))       # splits a's node (new id: its first 2 pages) while the load is in flight
    _steps(sim, 3)
    sim.evict_all()
    sim.request(a)                      # the fragments reload as one chain
    _steps(sim, 2)


def _two_writes_one_round(sim: Simulation, t: Tokens) -> None:
    """Two writes issued in one round as separate ops (no merge) while their requests run: both acks are ready in
    the same round on every rank, and the MIN over the group pops them together (C2_round pops one fewer on one
    rank, the other a round later)."""
    sim.request(t(2), dur=3)
    sim.request(t(2), dur=3)
    _steps(sim, 4)
    sim.request(t(2))
    _steps(sim, 2)


def _compose_reload(sim: Simulation, t: Tokens) -> None:
    """The attention's derived view of a node is filled, the node is evicted and reloaded, then read again: the
    view must be refilled after the reload (H3_noinval serves the stale one)."""
    a = t(3)
    sim.request(a)
    sim.request(a)
    sim.step()
    sim.evict_all()
    sim.request(a)
    _steps(sim, 2)
    sim.request(a)
    sim.step()


def _recycle(sim: Simulation, t: Tokens) -> None:
    """Pressure right after a backup is issued: the next request needs every device page. Correct code holds the
    node (write_through lock, write_back flush); H4 faults free the pages while the copy is in flight. Then the node
    is reloaded."""
    a, u = t(4), t(4)
    sim.request(a)
    sim.request(u)                      # needs all 4 pages: evicts a (if it can), stores into them
    _steps(sim, 3)
    sim.evict_all()
    sim.request(a)                      # reload a
    _steps(sim, 2)


def _store_reload(sim: Simulation, t: Tokens) -> None:
    """Store, backup, evict, reload of one node (ZERO_nostore, ZERO_race, HASH_flip); then a free right after the
    ack (eviction) and a second reload. The node has 3 pages; in mode sharded a page on every rank (up to the
    device pool), so a one-rank content fault has a site on rows the faulted rank holds."""
    a = t(max(3, min(sim.ranks, sim.ranks_[0].dev.n_pages)) if sim.mode == "sharded" else 3)
    sim.request(a)
    _steps(sim, 3)
    sim.evict_all()
    sim.request(a)
    _steps(sim, 2)
    sim.evict_all()
    sim.request(a)
    _steps(sim, 2)


def _backup_only(sim: Simulation, t: Tokens) -> None:
    """A few backups and nothing else (C1_div, C3_writer): the divergence stays the last write."""
    a = t(2)
    sim.request(a)
    _steps(sim, 2)
    sim.request(a + t(2))
    _steps(sim, 3)


# name -> (simulation sizes/delays, body)
SCENARIOS: dict[str, tuple[dict[str, Any], Callable[[Simulation, Tokens], None]]] = {
    "split_pending": ({"d_w": 2}, _split_pending),
    "split_reload": ({}, _split_reload),
    "split_twice": ({"d_w": 2, "dev_pages": 16}, _split_twice),
    "reload_split": ({}, _reload_split),
    "two_writes_one_round": ({"merge": False}, _two_writes_one_round),
    "split_while_loading": ({"dev_pages": 16, "d_l": 2}, _split_while_loading),
    "rebackup_reload": ({}, _rebackup_reload),
    "reload_reuse": ({"d_w": 1, "d_l": 2}, _reload_reuse),
    "compose_reload": ({}, _compose_reload),
    "recycle": ({"dev_pages": 4, "d_w": 2}, _recycle),
    "store_reload": ({}, _store_reload),
    "backup_only": ({}, _backup_only),
}
_FINISH_STEPS = {"backup_only": 4}   # a diverged group never acks its odd write: do not spin on it


def run_scenario(name: str, sim_args: dict, faults: Iterable[FaultPlan] = ()) -> Simulation:
    """Scenario ``name`` in a fresh simulation (``sim_args``: mode, ranks, policy, level, emitter)."""
    params, body = SCENARIOS[name]
    sim = _sim(**sim_args, faults=faults, **params)
    body(sim, Tokens())
    sim.finish(max_steps=_FINISH_STEPS.get(name, 64))
    return sim


def run_segment(sim: Simulation, name: str) -> None:
    """Scenario ``name`` as a new epoch of a running simulation (a reset, then the scenario's pool sizes and copy
    delays), for long runs such as the demo that string several scenarios together."""
    params, body = SCENARIOS[name]
    sim.drain()
    base = dict(dev_pages=8, host_pages=16, d_w=1, d_l=1, merge=True)
    base.update(params)
    for k, v in base.items():
        setattr(sim, k, v)
    sim.reset()
    body(sim, Tokens())
    sim.drain(_FINISH_STEPS.get(name, 64))


# fault -> the scripted scenario that reaches its eligible site and its consequence
SCENARIO_NAME_OF_FAULT = {
    "H1_ack": "split_pending", "H1_swap": "split_reload", "H2_release": "reload_reuse", "H2_stale": "split_reload",
    "H2_stale_clean": "rebackup_reload", "H3_noinval": "compose_reload", "H4_nolock": "recycle",
    "H4_wb_noflush": "recycle",
    "ZERO_nostore": "store_reload", "ZERO_race": "store_reload", "HASH_flip": "store_reload",
    "C1_div": "backup_only", "C3_writer": "backup_only",
    "H1_stale_dev": "reload_split", "C2_round": "two_writes_one_round",
}

# Legal near-misses (docs/domain.md §7.3.2): scripted sequences that must stay silent without any fault -> (scenario,
# policy).
NEAR_MISSES: dict[str, tuple[str, str]] = {
    "free right after the ack": ("store_reload", "wt"),
    "host eviction right after the h2d ack": ("reload_reuse", "wt"),
    "split with correct fragment publication": ("split_pending", "wt"),
    "nodes split more than once while their write is pending, then reloaded": ("split_twice", "wt"),
    "compose refill after a reload": ("compose_reload", "wt"),
    "write_back flush before the free": ("recycle", "wb"),
    "reload of a split-created node using host_p": ("split_reload", "wt"),
    "reload after a re-backup using the new host range": ("rebackup_reload", "wt"),
    "write_through lock holds the node under pressure": ("recycle", "wt"),
    "write_back: split, evict, reload": ("split_reload", "wb"),
    "write_back: store, evict, reload": ("store_reload", "wb"),
    "split of a reloaded node from its reloaded slots": ("reload_split", "wt"),
    "two writes acked in one round on every rank": ("two_writes_one_round", "wt"),
    "split of a node whose load is in flight, loads merged": ("split_while_loading", "wt"),
    "write_back: split of a node whose load is in flight": ("split_while_loading", "wb"),
}


def run_fault(kind: str, mode: str = "none", ranks: int = 2, level: int = 3, emitter: Emitter | None = None,
              rank: int | None = None, nth: int = 1, inject: bool = True) -> Simulation:
    """The scripted scenario of fault ``kind`` in ``mode`` (its policy from the fault table); ``inject=False`` runs
    the same scenario clean. ``rank`` targets one rank (scope ``rank``); default: the fault's own scope (rank 1 for
    one-rank faults in multi-rank modes, so rank 0 is not always the odd one)."""
    spec = FAULTS[kind]
    if mode == "none":
        ranks = 1
    if rank is None:
        rank = 1 if (spec.scope == "rank" and ranks > 1) else 0
    faults = [FaultPlan(kind, rank=rank, nth=nth)] if inject else []
    args = dict(mode=mode, ranks=ranks, policy=spec.policy, level=level, emitter=emitter)
    return run_scenario(SCENARIO_NAME_OF_FAULT[kind], args, faults)


def analyze(sim: Simulation, level: int | None = None):
    """Check a simulation's records (its :class:`LogEmitter`) with the project's checker; returns its ``Result``."""
    from ..analyze.engine import Analysis

    return Analysis(level).run(sim.emitter.events())  # type: ignore[attr-defined]


def expected_set(sim: Simulation, level: int, result=None) -> set[tuple]:
    """The oracle's ``(code, rank, node_id, op)`` observable at ``level``. Expectations of a rule that the checker
    declares it cannot run (an ``Unchecked`` entry naming that rule, e.g. ``C5-fence``) are left out: an unchecked
    rule is reported as such, never passed silently, and the tests assert that entry separately."""
    skipped = set()
    if result is not None:
        skipped = {u.rule for u in result.unchecked if u.rank is None or u.kind == "skip"}
    return {(e.code, e.rank, e.node_id, e.op) for e in sim.oracle.expected(level) if e.rule not in skipped}


def found_set(result) -> set[tuple]:
    """The checker's findings as ``(code, rank, node_id, op)``; an op of -1 (a ``pend=-1`` field) counts as none."""
    return {(f.code, f.rank, f.node_id, f.op if f.op is None or f.op >= 0 else None) for f in result.findings}
