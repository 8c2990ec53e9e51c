"""The sliding-window (SWA) component of sglang 0.5.23's hybrid trees (``UnifiedRadixCache`` with the FULL and SWA
components: gpt-oss, Gemma 4, Llama 4, MiMo style models): the ``swa`` records of its host round trips and the sites
that make them (:data:`SWA_SITES23`).

What a node's SWA component holds (``components/swa.py``; docs/rules.md "Sliding-window trees (SWA)" cites the
lines): its ``value`` is the node's tokens' slots in the SWA pool, its ``host_value`` their slots in the SWA host
pool. Either may be None on a live node (a tombstone: the window no longer needs those tokens, or SWA eviction took
them); the FULL KV is recorded as for a FULL-only tree (:mod:`._sites23`, the full-attention pool of the
``SWAKVPool``). A backup moves the device-only SWA values of the node and its ancestors within one window, in the
node's copy op; a load-back moves the host-only SWA values of the loaded node's last window, in the load's op.
So a round trip is per host slot, not per node: what a backup wrote into SWA host slots is what a later load of
those slots must bring back; tokens the window dropped are never loaded and never compared.

Records (level 2, tag ``swa``): ``dir=d2h`` when a backup's SWA transfer is committed (the copy queued: ``op`` is
its id, the node's ``backup`` op), ``dir=h2d`` at the ``ack dir=h2d`` of a load-back that moved SWA values (its
``op``). Both carry ``node_id`` (the backup's or load's node), ``nodes`` (the SWA nodes moved), ``hostx`` and
``devx`` (the exact SWA host and device slots, token order) and ``h``, ``nz``, ``hp`` of the SWA layers' KV at the
device slots (``hp``: one ``khash`` per ``page`` tokens, the cache's page size), read when the backup was queued
(what its copy reads: the node is pinned) and after the load completed. Rule ``SWA-hash`` (``checks.rules_swa``)
compares them per host page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..api import cptrace, trace_level
from ._state import arg, exact_runs, kv_rows, safe, state_of

if TYPE_CHECKING:
    from torch import Tensor

    from ._state import State
    from ._types import KVPool, PoolTransfer, RadixCache, SwaKVPool, TreeNode

SWA_COMP = "sglang.srt.mem_cache.unified_cache.components.swa"
SWA = 1           # ComponentType.SWA
BACKUP_HOST, LOAD_BACK = "backup_host", "load_back"   # CacheTransferPhase values


def full_pool(pool: KVPool) -> KVPool:
    """The pool of the full-attention layers: an ``SWAKVPool``'s ``full_kv_pool``, else ``pool`` itself."""
    return getattr(pool, "full_kv_pool", None) or pool


class ComponentBook:
    """What the book of a hybrid tree's component (:class:`SwaBook`, ``_mamba23.MambaBook``) does at its commit site
    (:func:`commit_site`): ``backup`` records a backup's transfers as they are committed, ``load`` remembers a
    load-back's until its ack, whose record ``acked`` writes (their data is not there before)."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.loads: dict[int, list[tuple]] = {}   # load ack id (node id) -> what each load's record needs, FIFO

    def backup(self, st: State, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        raise NotImplementedError

    def load(self, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        raise NotImplementedError

    def acked(self, st: State, node_id: int, load: tuple) -> None:
        raise NotImplementedError

    def ack_h2d(self, st: State, ack_node_ids: list) -> None:
        """The loads acked now: their records."""
        for nid in ack_node_ids:
            q = self.loads.get(nid)
            if not q:
                continue
            load = q.pop(0)
            if not q:
                del self.loads[nid]
            self.acked(st, nid, load)

    def clear(self) -> None:
        self.loads.clear()


class SwaBook(ComponentBook):
    """The SWA side of one traced hybrid cache: its device pool and the SWA loads waiting for their ack
    (``(op, nodes, host slots, device slots)``)."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__(cache)
        pool = cast("SwaKVPool", cache.token_to_kv_pool_allocator.get_kvcache())
        self.pool = pool.swa_kv_pool

    def record(self, st: State, dir: str, op: int, node_id: int, nodes: Any, host: Tensor, dev: Tensor) -> None:
        """One ``swa`` record: the SWA rows at device slots ``dev`` as they are now, copied from or to ``host``."""
        cptrace(2, "swa", dir=dir, op=op, node_id=int(node_id), nodes=[int(x) for x in (nodes or ())],
                hostx=exact_runs(host), devx=exact_runs(dev), page=st.page_size,
                **st.fp_rows(kv_rows(self.pool, dev)))

    def backup(self, st: State, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        """A backup's SWA transfer committed (the copy queued, not run: the rows hashed are the ones it reads)."""
        xfer = xfers[0]
        if xfer.host_indices is None or xfer.device_indices is None or not len(xfer.host_indices):
            return
        op = self.cache.cache_controller.write_queue[-1]
        self.record(st, "d2h", op.id, node.id, xfer.nodes_to_load, xfer.host_indices, xfer.device_indices)

    def load(self, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        """A load-back's SWA transfer committed: remembered until the load's ack (its rows are not there yet)."""
        xfer = xfers[0]
        if xfer.host_indices is None or xfer.device_indices is None or not len(xfer.host_indices):
            return
        op = self.cache.cache_controller.load_queue[-1]
        self.loads.setdefault(node.id, []).append((op.id, list(xfer.nodes_to_load or ()), xfer.host_indices,
                                                   xfer.device_indices))

    def acked(self, st: State, node_id: int, load: tuple) -> None:
        op, nodes, host, dev = load
        self.record(st, "h2d", op, node_id, nodes, host, dev)


def commit_site(book: str) -> Callable[..., Any]:
    """The wrapper of a component's ``commit_hicache_transfer(node, phase, transfers, ...)`` whose cache State keeps
    the component's :class:`ComponentBook` in attribute ``book``: a backup's or load-back's transfers committed onto
    the tree (after the controller queued their copy)."""

    def _commit_transfer(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        st = state_of(getattr(instance, "cache", None))
        b = getattr(st, book, None)
        if st is not None and b is not None:
            commit_book(st, b, arg(args, kwargs, 0, "node"), arg(args, kwargs, 1, "phase"),
                        arg(args, kwargs, 2, "transfers"))
        return out

    return _commit_transfer


def commit_book(st: State, book: ComponentBook, node: Any, phase: Any, xfers: Any) -> None:
    """``book``'s record of a backup's or load-back's transfers ``xfers`` of its component committed onto ``node``
    (phase ``phase``) after the controller queued their copy: :func:`commit_site` on the Python core, the Rust
    core's ``commit_backup`` / ``commit_load_back`` at its boundary (``._rust23``; ``node`` a node by id)."""
    if not xfers or trace_level() < 2:
        return
    ph = getattr(phase, "value", phase)
    if ph == BACKUP_HOST:
        safe(book.backup, st, node, list(xfers))
    elif ph == LOAD_BACK:
        safe(book.load, node, list(xfers))


# (module, "Class.method", wrapper): the SWA component's sites (the SWA allocator's frees are in SITES23).
SWA_SITES23: list[tuple[str, str, Any]] = [
    (SWA_COMP, "SWAComponent.commit_hicache_transfer", commit_site("swa")),
]
