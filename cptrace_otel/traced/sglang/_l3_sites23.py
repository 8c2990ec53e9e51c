"""The L3 storage sites of stock SGLang 0.5.23's HiCache (``UnifiedRadixCache`` + ``HybridCacheController`` with a
storage backend, full-attention KV only): :data:`L3_SITES23`, registered with :data:`._sites23.SITES23`. The records
and their code are 0.5.20's (:mod:`._l3_sites`); :class:`Reads23` reads 0.5.23's storage state.

Where each record is written in 0.5.23 (every site on the scheduler thread; the storage threads are never wrapped):

* ``l3_backup``: ``HybridCacheController.write_storage`` called by ``UnifiedRadixCache.write_backup_storage(node_id)``
  (from ``_finish_write_through_ack``, once per node the host write published: after a split, each fragment).
  ``keys``/``hp`` as in 0.5.20 (the ``file`` backend's suffixed keys, one fingerprint per page of the anchor host
  pool's data page), ``io=0`` under ``backup_skip``.
* ``l3_query``, ``l3_prefetch``, ``l3_ack dir=backup``: ``UnifiedRadixCache._drain_storage_control_queues_impl``, as
  in 0.5.20. 0.5.23's ``ongoing_prefetch`` is keyed by the request handle and holds the anchor's node id
  (``_OngoingPrefetch``), its ``ongoing_backup`` ``(node id, lock release)``.
* ``l3_ack dir=prefetch``: ``UnifiedRadixCache._handle_prefetch_result``; ``done`` the completed pages (a
  full-attention tree has no sidecar pool to clamp them by).
* ``l3_hit``: ``UnifiedTreeCore.insert_host`` under that call, once per node that now holds fetched host slots:
  the node it creates past the tree's path and, under write-through, every node on the path whose host copy had
  been evicted (a host tombstone) and is refilled with the fetched pages (0.5.20 has no refill).

The backends whose flow these records were checked against (:data:`L3_BACKENDS`; another one leaves the cache
untraced): ``file`` (``HiCacheFile``: flat pages through ``batch_get``/``batch_set``, one file per page) and
``seaweedfs`` (``SeaweedFSStore``: one S3 object per page, through the zero-copy ``batch_get_v1``/``batch_set_v1``
into the host pool's own buffers; ``batch_exists`` the leading run of present objects; a read counts the leading run
of pages that came back, and only those are ``done``). The records are the same; ``keys`` are each backend's object
names (``_get_suffixed_key``, ``_object_key``), which carry the rank scope. Only ``file`` keeps the metadata
beside its objects (``wfp``/``wid``, :mod:`._l3_meta`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._l3_sites import (
    Reads,
    drain_site,
    hit_record,
    prefetch_insert_site,
    prefetch_result_site,
    tree_path,
    write_backup_storage_site,
    write_storage_site,
)
from ._state import State, arg

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import PrefetchOperation, RadixCache, TreeCore

URC = "sglang.srt.mem_cache.unified_radix_cache"
UTC = "sglang.srt.mem_cache.unified_cache.unified_tree_core"
HCC = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller"
L3_BACKENDS = ("file", "seaweedfs")   # the storage backends whose flow the real tests run (untraceable, _sites23)


class Reads23(Reads):
    """0.5.23's storage state for the shared L3 wrappers."""

    @staticmethod
    def node_id(st: State, node: Any) -> int:
        return int(node)   # write_backup_storage(node_id)

    @staticmethod
    def prefetch(cache: RadixCache, op: PrefetchOperation) -> tuple[int, Tensor | None] | None:
        info = cache.ongoing_prefetch.get(op.handle)
        if info is None or info.operation is not op:
            return None
        return int(info.anchor_node_id), info.host_indices

    @staticmethod
    def backup_node_id(entry: Any) -> int:
        return int(entry[0])

    @staticmethod
    def usable_pages(cache: RadixCache, op: PrefetchOperation) -> int:
        return int(op.completed_tokens) // int(cache.page_size)


def insert_host_call(args: tuple, kwargs: dict) -> tuple:
    """``insert_host(node_id, key, host_value, hash_value)``: its start, key and the fetched host slots."""
    host = arg(args, kwargs, 2, "host_value")
    return arg(args, kwargs, 0, "node_id"), arg(args, kwargs, 1, "key"), {int(x) for x in host.tolist()}


def _on_hits(st: State, tree: TreeCore, op: PrefetchOperation, pre: tuple, _res: object) -> None:
    """Walk the path ``insert_host`` took (read-only, after it): every node whose host slots are fetched ones took
    pages of this prefetch. Fetched slots were free when the drain allocated them, so no node held them before
    (a split's new parent keeps slots of the node it split, never fetched ones)."""
    start, key, fetched = pre
    for child, _end in tree_path(tree.node_by_id(start), key, int(tree.page_size)):
        host = st.host(child)
        if host is not None and len(host) and int(host[0]) in fetched:
            hit_record(st, st.cache, op, child, child.hash_value)


# (module, "Class.method", wrapper): the L3 sites of 0.5.23, part of SITES23.
L3_SITES23: list[tuple[str, str, Any]] = [
    (URC, "UnifiedRadixCache.write_backup_storage", write_backup_storage_site),
    (HCC, "HybridCacheController.write_storage", write_storage_site(Reads23)),
    (URC, "UnifiedRadixCache._drain_storage_control_queues_impl", drain_site(Reads23)),
    (URC, "UnifiedRadixCache._handle_prefetch_result", prefetch_result_site(Reads23)),
    (UTC, "UnifiedTreeCore.insert_host", prefetch_insert_site(insert_host_call, _on_hits)),
]
