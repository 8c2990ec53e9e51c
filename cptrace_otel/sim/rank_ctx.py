"""What the parts of one simulated rank share with the group, passed to each part instead of the rank or the
simulation: the group's :class:`Settings`, and :class:`RankCtx`, this rank's view of the group's mutable state
(the clock, the ranks' op counters, the epoch's first divergence).

A leaf module: it imports no other part of the simulator, so every part can import it.
"""

from __future__ import annotations

import dataclasses

from .tracer import Clock


@dataclasses.dataclass
class Settings:
    """The simulation's parameters (:class:`~cptrace_otel.sim.core.Simulation` reads and writes them here, as
    ``sim.d_w`` ...): one object for the whole run, held by every rank's parts, so a change takes effect at once;
    the pool sizes at the next reset, when the pools are made (a demo segment sets them, then resets)."""

    mode: str
    ranks: int
    policy: str
    level: int
    page_size: int
    layers: int
    width: int
    dev_pages: int
    host_pages: int
    d_w: int
    d_l: int
    lb_threshold: int
    exact: bool
    io_rank: int
    # the writes of one scheduler step (a request's backups, a write_back eviction's victims, a re-backup pass)
    # start as one merged op, as SGLang's merge_ops; off: each write is its own op at once
    merge: bool
    # how far ahead of the IO rank the other ranks stamp their records (below one tick, so every rank's store
    # still precedes the IO rank's copy and every ack follows it)
    lag_ns: int
    mixed_acks: bool   # each rank logs a round's d2h and h2d acks in its own interleaving (see Simulation)
    # what real SGLang does: alloc "sglang": the device allocator's sorted free pages and the host
    # pool's appended frees (scattered slots after frees; "lifo": prompt reuse, for the scripted races);
    # split_loading: match/insert split nodes whose load is in flight; ack_chain: one h2d ack record per chain
    # node (False: the last node's only, as SGLang's HiCacheAck names it)
    alloc: str
    split_loading: bool
    ack_chain: bool


class Epoch:
    """The epoch's cross-rank divergence: ``diverged_at`` is the structural index of its first divergence of the
    trees (None while they are in step); a reset starts a new epoch."""

    def __init__(self) -> None:
        self.diverged_at: int | None = None

    def judged(self, index: int) -> bool:
        """Whether the cross-rank rules C3-C5 judge a record at structural ``index`` of this epoch: node ids (and
        in mode shared the pages) line up across ranks only up to the first divergence of the trees, so the
        checker judges only records at or before it (docs/domain.md §5, pitfall). ``index``: the rank's structural
        records before the record (the rank's :attr:`Recorder.n_struct <cptrace_otel.sim.emit.Recorder.n_struct>`
        when it is emitted)."""
        return self.diverged_at is None or index <= self.diverged_at


@dataclasses.dataclass
class RankCtx:
    """Rank ``r``'s view of the group: the settings, the shared clock, every rank's op counter (``next_op``, one
    list for the group: a rank's counter runs in lockstep with its peers') and the epoch."""

    cfg: Settings
    r: int
    clock: Clock
    next_op: list[int]
    epoch: Epoch

    def new_op_id(self) -> int:
        """The next id from this rank's op counter."""
        oid = self.next_op[self.r]
        self.next_op[self.r] += 1
        return oid
