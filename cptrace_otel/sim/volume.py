"""Long simulated runs (the volume negative controls and the check benchmark): a seeded random run until every rank
has logged a number of records, and a summary of what the checker found in it and which situations it held.

:func:`volume_workload` drives the simulator with every situation of the short random streams at volume (page
reuse under a small device pool, host eviction, merged writes, resets) plus those that realistic runs have and the
short streams lack: followers that run ahead of the IO rank in time (so a follower evicts a node and stores the next
owner's KV into its pages before the IO rank logs its own eviction), rounds whose acks each rank logs in its own
interleaving of the two directions, and prompts cut inside an earlier prompt (splits of reloaded nodes).

:class:`Coverage` counts those situations in the records as the checker reads them, so a clean result can be told
apart from a run that never met them; :func:`check_volume` runs one such run end to end (log files, the log reader,
the checker) and returns a plain summary (picklable: the tests run several in worker processes).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..checks.ranges import parse_runs
from ..model.events import Event
from .core import Simulation
from .tracer import TICK_NS
from .workload import P, random_stream

CHUNK = 64          # requests between two looks at the record counts
RESET_EVERY = 4     # chunks per epoch


def volume_workload(seed: int, mode: str, ranks: int, policy: str, records: int, level: int = 3,
                    exact: bool = True, real: bool = False) -> Simulation:
    """A seeded random run, until every rank has logged at least ``records`` records (chunks of :data:`CHUNK`
    requests, a reset after every :data:`RESET_EVERY` chunks: epochs of a few thousand records per rank).
    Followers stamp their records half a tick ahead of the IO rank (``lag_ns``), every rank interleaves a round's
    acks its own way (``mixed_acks``), and a quarter of the requests cut an earlier prompt (``cut``).

    Mode dcp stripes tokens over the ranks (``pos % ranks``) and needs whole widened pages (docs/domain.md §5): its
    pages hold at least one token per rank (``page_size`` = max(4, ranks)), so that every rank holds rows of every
    page.

    ``real``: what real SGLang runs do and the short streams' defaults do not: SGLang's allocators
    (scattered slots after frees), a third of the cuts made while the repeat's load is in flight (splits of nodes
    whose load is pending)."""
    rng = np.random.default_rng([seed, 0])
    ps = max(P, ranks) if mode == "dcp" else P
    sim = Simulation(mode, ranks, policy, level, (), None, page_size=ps, layers=2, width=4,
                     dev_pages=int(rng.integers(10, 17)), host_pages=int(rng.integers(14, 25)),
                     d_w=int(rng.integers(1, 4)), d_l=int(rng.integers(1, 4)), lb_threshold=2 * ps, exact=exact,
                     lag_ns=TICK_NS // 2, mixed_acks=True, alloc="sglang" if real else "lifo")
    lines = sim.emitter.lines   # type: ignore[attr-defined]
    chunk = 0
    while min(len(x) for x in lines) < records:
        chunk += 1
        random_stream(sim, np.random.default_rng([seed, chunk]), CHUNK, resets=False, cut=0.25,
                      inflight=0.35 if real else 0.0)
        if chunk % RESET_EVERY == 0:
            sim.reset()
    sim.finish()
    return sim


def _slots(f: dict, key: str, xkey: str) -> set[int]:
    runs = parse_runs(f.get(xkey))
    if runs is None:
        v = f.get(key)
        if v is None or not hasattr(v, "min"):
            return set()
        runs = ((v.min, v.max),)
    out: set[int] = set()
    for a, b in runs:
        out.update(range(a, b + 1))
    return out


class Coverage:
    """Counts, over the records of a run read in the checker's order, the situations the volume controls are for:

    * ``next_owner_stores``: a follower's store into pages the IO rank still holds for a node it backed up (the
      follower already gave them up: it runs ahead in time), the pattern a store fence over the IO rank's window
      misreads;
    * ``mixed_rounds``: ack rounds (``round=``) that two ranks log in different direction orders;
    * ``reload_splits``: splits of a node reloaded since its last device eviction (rank 0);
    * ``dev_frees`` and ``host_evicts``: page reuse and host pressure;
    * what real SGLang runs have (rank 0): ``inflight_splits`` (splits of a node whose load has no h2d ack yet),
      ``scattered`` (device ranges of inserts, prepares and reloads that are not one block), ``merged_loads`` (h2d
      ack records whose op is not their reload's: a merged load op), ``wb_staged`` (write_back evictions of a node
      whose backup was prepared in the same eviction, logged after its d2h ack).
    """

    def __init__(self, io_rank: int = 0) -> None:
        self.io_rank = io_rank
        self.next_owner_stores = 0
        self.reload_splits = 0
        self.dev_frees = 0
        self.host_evicts = 0
        self._held: dict[int, int | None] = {}           # slot -> node the IO rank backed up and still holds
        self._reloaded: set[tuple[int, int | None]] = set()  # (epoch, node) of rank 0
        self._rounds: dict[tuple, dict[int, list]] = {}  # (epoch, round) -> rank -> direction sequence
        self.records = 0
        self.inflight_splits = self.scattered = self.merged_loads = self.wb_staged = 0
        # (epoch, node) of rank 0 -> op of its pending reload
        self._loading: dict[tuple[int, int | None], int | None] = {}
        self._wb_prep: dict[tuple[int, int | None], bool] = {}   # (epoch, node) of rank 0 -> its wb prepare was acked

    def watch(self, events: Iterable[Event]) -> _Watched:
        """``events`` unchanged (and their source's rank hint), counted on the way."""
        return _Watched(self, events)

    def _each(self, events: Iterable[Event]) -> Iterator[Event]:
        for ev in events:
            self.records += 1
            tag = ev.tag
            if tag in ("store", "backup", "evict", "free", "ack", "reload", "split", "reset"):
                self._see(ev)
            if ev.rank == 0 and tag in ("insert", "prepare", "reload", "ack", "split", "evict"):
                self._see_real(ev)
            yield ev

    def _see(self, ev: Event) -> None:
        tag, f, r = ev.tag, ev.fields, ev.rank
        io = r == self.io_rank
        if tag == "store":
            if not io and self._held and not self._held.keys().isdisjoint(_slots(f, "dev", "devx")):
                self.next_owner_stores += 1
        elif tag == "backup" and io:
            for s in _slots(f, "dev", "devx"):
                self._held[s] = f.get("node_id")
        elif tag == "evict":
            if f.get("tier") == "host":
                self.host_evicts += r == 0
            else:
                if io:
                    for s in _slots(f, "dev", "devx"):
                        self._held.pop(s, None)
                if r == 0:
                    self._reloaded.discard((ev.epoch, f.get("node_id")))
        elif tag == "free" and f.get("pool") == "dev":
            self.dev_frees += r == 0
            if io:
                for s in _slots(f, "idx", "idx_x"):
                    self._held.pop(s, None)
        elif tag == "ack":
            rk = f.get("round")
            if rk is not None:
                seq = self._rounds.setdefault((ev.epoch, rk), {}).setdefault(r, [])
                d = f.get("dir")
                if not seq or seq[-1] != d:
                    seq.append(d)
        elif tag == "reload" and r == 0:
            for c in f.get("chain") or ():
                self._reloaded.add((ev.epoch, c))
        elif tag == "split" and r == 0:
            self.reload_splits += (ev.epoch, f.get("node_id")) in self._reloaded
        elif tag == "reset" and io:
            self._held.clear()

    def _see_real(self, ev: Event) -> None:
        tag, f = ev.tag, ev.fields
        key = (ev.epoch, f.get("node_id"))
        if tag in ("insert", "prepare", "reload"):
            d: Any = f.get("dev")   # a range summary (min, max, cnt) when the record has one
            if hasattr(d, "min") and d.cnt != d.max - d.min + 1:
                self.scattered += 1
            if tag == "reload":
                for c in f.get("chain") or ():
                    self._loading[(ev.epoch, c)] = f.get("op")
            elif tag == "prepare" and f.get("policy") == "wb":
                self._wb_prep[key] = False
        elif tag == "ack":
            if f.get("dir") == "h2d":
                op = self._loading.pop(key, None)
                if op is not None and op != f.get("op"):
                    self.merged_loads += 1
            elif key in self._wb_prep:
                self._wb_prep[key] = True
        elif tag == "split":
            if key in self._loading:
                self.inflight_splits += 1
                self._loading[(ev.epoch, f.get("new_id"))] = self._loading[key]
        elif tag == "evict" and f.get("tier") == "dev":
            self.wb_staged += self._wb_prep.pop(key, False)

    @property
    def mixed_rounds(self) -> int:
        return sum(1 for per in self._rounds.values() if len({tuple(s) for s in per.values()}) > 1)


class _Watched:
    def __init__(self, cov: Coverage, events: Iterable[Event]) -> None:
        self.ranks = getattr(events, "ranks", None)
        self._it = cov._each(events)

    def __iter__(self) -> Iterator[Event]:
        return self._it


def check_volume(seed: int, mode: str, ranks: int, policy: str, records: int, level: int = 3,
                 exact: bool = True, real: bool = False) -> dict[str, Any]:
    """One volume run, written as per-rank log files and checked through the log reader (as ``cptrace-otel check``
    reads them); returns the records per rank, the findings (as text), the level-unchecked rules, the oracle's
    entries (none: no fault is armed) and the :class:`Coverage` counts."""
    from ..analyze.engine import Analysis
    from ..analyze.sources.logs import read_log_events

    sim = volume_workload(seed, mode, ranks, policy, records, level, exact, real)
    cov = Coverage(sim.io_rank)
    with tempfile.TemporaryDirectory(prefix="cptrace-volume-") as d:
        paths = sim.emitter.write(d)   # type: ignore[attr-defined]
        per_rank = [len(x) for x in sim.emitter.lines]   # type: ignore[attr-defined]
        del sim.emitter.lines[:]   # type: ignore[attr-defined]  # (the files hold them now)
        res = Analysis(None).run(cov.watch(read_log_events(paths)))
        sizes = sum(os.path.getsize(p) for p in paths)
    return {
        "mode": mode, "policy": policy, "ranks": ranks, "records_per_rank": min(per_rank),
        "records": cov.records, "bytes": sizes,
        "findings": [f"{f.code} {f.rule} r{f.rank} n{f.node_id} op{f.op}: {f.message}" for f in res.findings],
        "unchecked": sorted({u.rule for u in res.unchecked if u.kind == "level"}),
        "undecidable": {u.rule: u.count for u in res.unchecked if u.kind == "undecidable"},
        "skipped": {u.rule: u.count for u in res.unchecked if u.kind == "skip"},
        "oracle": list(sim.oracle.entries),
        "next_owner_stores": cov.next_owner_stores, "mixed_rounds": cov.mixed_rounds,
        "reload_splits": cov.reload_splits, "dev_frees": cov.dev_frees, "host_evicts": cov.host_evicts,
        "inflight_splits": cov.inflight_splits, "scattered": cov.scattered, "merged_loads": cov.merged_loads,
        "wb_staged": cov.wb_staged,
    }
