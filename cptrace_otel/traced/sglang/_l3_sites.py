"""The L3 storage sites of stock SGLang 0.5.20's HiCache (``HiRadixCache`` + ``HiCacheController`` with a storage
backend, e.g. ``--hicache-storage-backend file``): the records of :mod:`cptrace_otel.model.l3`.

Where each record is written (every site runs on the scheduler thread; SGLang's storage threads are never wrapped):

* ``l3_backup``: ``HiCacheController.write_storage`` called by ``HiRadixCache.write_backup_storage`` (after a d2h
  ack, the node's host pages go to storage). ``keys`` are the backend's object keys of the operation's
  ``hash_value`` (the ``file`` backend's ``_get_suffixed_key``: the hash plus its rank suffix), ``hp`` one
  fingerprint per page of the data page the backend is handed (``get_data_page``: the bytes storage holds),
  ``op`` the ``StorageOperation`` id ``write_storage`` returns, ``io=0`` where the controller skips the write
  (``backup_skip``).
* ``l3_ack dir=backup``: ``HiRadixCache._drain_storage_control_queues_impl`` popped the op from
  ``ongoing_backup`` (its ack from ``ack_backup_queue``; the node's host protection is released there); ``done``
  the pages the backup thread completed.
* ``l3_query`` and ``l3_prefetch``: the same drain took the op from ``prefetch_hit_queue`` (the storage query's
  TP/CP-min hit count); ``l3_prefetch`` when it also allocated the host pages and handed the op to the I/O thread
  (not when the prefetch was revoked). ``node_id`` is the matched node the pages extend (``last_host_node``).
* ``l3_ack dir=prefetch``: ``HiRadixCache._handle_prefetch_result`` (from the drain's completed ack, or from
  ``check_prefetch_progress`` terminating it), before the pages enter the tree: ``done`` the usable pages
  (``_clamp_prefetch_result``), ``keys``/``hp`` of those pages as the host pool holds them now.
* ``l3_hit``: ``HiRadixCache._insert_helper_host`` under that call created the node that holds the fetched pages
  past the part the tree already had (which SGLang frees right after).

The records of one drain call are written when it returns (its inner steps are closures), in the drain's order:
queries and prefetches first, then backup acks; the prefetch acks inside it are written at their own call.
"""

from __future__ import annotations

from typing import Any

from ..api import cptrace, khash, rng
from ._state import arg, safe, state_of

CONTROLLER = "sglang.srt.managers.cache_controller"
HIRADIX = "sglang.srt.mem_cache.hiradix_cache"


class L3State:
    """The L3 side of one cache's :class:`~._state.State` (attribute ``l3``)."""

    __slots__ = ("backup_node", "prefetch_op")

    def __init__(self) -> None:
        self.backup_node: Any = None   # during write_backup_storage: its node
        self.prefetch_op: Any = None   # during _handle_prefetch_result: its operation


def _l3(st: Any) -> L3State:
    s = getattr(st, "l3", None)
    if s is None:
        s = st.l3 = L3State()
    return s


def _keys(cc: Any, hashes: Any) -> list[str]:
    """The backend's object keys of page hashes (the hash itself for a backend without a suffix)."""
    suffixed = getattr(cc.storage_backend, "_get_suffixed_key", None)
    hs = list(hashes or ())
    return [str(suffixed(h)) for h in hs] if suffixed is not None else [str(h) for h in hs]


def _page_fps(cc: Any, host_indices: Any, pages: int) -> list[int]:
    """One fingerprint per page of the host pool: of the data page the storage backend reads or fills
    (``get_data_page``), see :func:`page_fp`."""
    pool = cc.storage_host_pool
    ps = int(cc.page_size)
    return [page_fp(pool.get_data_page(int(host_indices[i * ps]), flat=False)) for i in range(pages)]


def page_fp(page: Any) -> int:
    """``khash`` of a contiguous page; of a strided one (a page of a ``layer_first`` host pool is one block per layer
    and K/V), ``khash`` of its blocks' ``khash`` values in order: equal bytes give equal values and a changed byte
    changes its block's value, without the copy that flattening a strided page makes (10x the hash's own time)."""
    if page.is_contiguous():
        return int(khash(page))
    import itertools

    import torch

    lead = 1
    while lead < page.dim() and not page[(0,) * lead].is_contiguous():
        lead += 1
    blocks = [int(khash(page[ix])) for ix in itertools.product(*(range(n) for n in page.shape[:lead]))]
    return int(khash(torch.tensor(blocks, dtype=torch.int64)))


def _queue_items(q: Any) -> list:
    if q is None:
        return []
    with q.mutex:   # the storage threads append while we look
        return list(q.queue)


# -- backup -------------------------------------------------------------------------------------------------------
def _write_backup_storage(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    l3 = _l3(st)
    l3.backup_node = arg(args, kwargs, 0, "node")
    try:
        return wrapped(*args, **kwargs)
    finally:
        l3.backup_node = None


def _write_storage(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    node = getattr(getattr(st, "l3", None), "backup_node", None)
    if st is None or node is None:
        return wrapped(*args, **kwargs)
    host = arg(args, kwargs, 0, "host_indices")
    hashes = list(arg(args, kwargs, 2, "hash_value") or ())
    # before the call: the backup thread reads these pages as soon as the op is queued (it never writes them)
    pre = safe(lambda: (_keys(instance, hashes), _page_fps(instance, host, len(hashes))))
    op = wrapped(*args, **kwargs)
    if pre is not None:
        keys, hp = pre
        safe(lambda: cptrace(1, "l3_backup", node_id=node.id, op=int(op), keys=keys, hp=hp, host=rng(host),
                             io=(0 if getattr(instance, "backup_skip", False) else 1), **st.xs("hostx", host)))
    return op


# -- the scheduler's drain of the storage queues ------------------------------------------------------------------
def _drain(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    pre = safe(_drain_pre, instance, arg(args, kwargs, 0, "n_storage_hit"))
    res = wrapped(*args, **kwargs)
    if pre is not None:
        safe(_drain_post, st, instance, pre)
    return res


def _drain_pre(cache: Any, n_hit: Any) -> tuple:
    cc = cache.cache_controller
    hits = _queue_items(cc.prefetch_hit_queue)
    if n_hit is not None:
        hits = hits[:int(n_hit)]
    # the query's own view, before the drain truncates hash_value to what it allocates
    queried = [(op, int(op.storage_hit_count), list(op.all_hash_values or op.hash_value or ())) for op in hits]
    acks = {op.id: op for op in _queue_items(cc.ack_backup_queue)}
    return queried, dict(cache.ongoing_backup), acks


def _drain_post(st: Any, cache: Any, pre: tuple) -> None:
    queried, backups, acks = pre
    cc = cache.cache_controller
    ps = int(cache.page_size)
    for op, hit, hashes in queried:
        rid = str(op.request_id)
        cptrace(1, "l3_query", op=op.id, rid=rid, keys=_keys(cc, hashes), hit=hit // ps)
        info = cache.ongoing_prefetch.get(op.request_id)
        if op.host_indices is None or info is None or info[2] is not op:
            continue   # revoked (too few hits, no host memory, aborted): nothing is read
        host = op.host_indices
        cptrace(1, "l3_prefetch", op=op.id, rid=rid, node_id=info[0].id, keys=_keys(cc, op.hash_value),
                host=rng(host), **st.xs("hostx", host))
    for op_id, node in backups.items():
        if op_id in cache.ongoing_backup:
            continue
        op = acks.get(op_id)
        done = {"done": int(op.completed_tokens) // ps} if op is not None else {}
        cptrace(2, "l3_ack", dir="backup", op=op_id, node_id=node.id, **done)


# -- prefetch completion and the storage hit ----------------------------------------------------------------------
def _prefetch_result(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    op = arg(args, kwargs, 0, "operation")
    safe(_prefetch_ack, instance, op)
    l3 = _l3(st)
    l3.prefetch_op = op
    try:
        return wrapped(*args, **kwargs)
    finally:
        l3.prefetch_op = None


def _prefetch_ack(cache: Any, op: Any) -> None:
    info = cache.ongoing_prefetch.get(op.request_id)
    if info is None:
        return
    cc = cache.cache_controller
    pages = int(cache._clamp_prefetch_result(op)) // int(cache.page_size)
    cptrace(2, "l3_ack", dir="prefetch", op=op.id, node_id=info[0].id, done=pages,
            keys=_keys(cc, list(op.hash_value)[:pages]), hp=_page_fps(cc, op.host_indices, pages))


def _insert_helper_host(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    op = getattr(getattr(st, "l3", None), "prefetch_op", None)
    if st is None or op is None:
        return wrapped(*args, **kwargs)
    node, key = arg(args, kwargs, 0, "node"), arg(args, kwargs, 1, "key")
    matched = wrapped(*args, **kwargs)
    safe(_on_hit, st, instance, op, node, key, matched)
    return matched


def _on_hit(st: Any, cache: Any, op: Any, start: Any, key: Any, matched: int) -> None:
    if matched >= len(key):
        return   # the tree already held every fetched page: no node takes them
    ps = int(cache.page_size)
    node = start
    while len(key) > 0:   # the path _insert_helper_host walked; it ends at the node it created
        child = node.children.get(key.child_key(ps))
        if child is None:
            return
        m = child.key.match(key, page_size=ps)
        if m == 0:
            return
        node, key = child, key[m:]
        if m < len(child.key):
            break
    if node.value is not None or node.host_value is None:
        return
    host = node.host_value
    cptrace(1, "l3_hit", node_id=node.id, parent=node.parent.id, op=op.id, keys=_keys(cache.cache_controller,
            node.hash_value), host=rng(host), **st.xs("hostx", host))


# (module, "Class.method", wrapper): the L3 sites, for HiRadixCache builds (sglang 0.5.20), registered with SITES.
L3_SITES: list[tuple[str, str, Any]] = [
    (HIRADIX, "HiRadixCache.write_backup_storage", _write_backup_storage),
    (CONTROLLER, "HiCacheController.write_storage", _write_storage),
    (HIRADIX, "HiRadixCache._drain_storage_control_queues_impl", _drain),
    (HIRADIX, "HiRadixCache._handle_prefetch_result", _prefetch_result),
    (HIRADIX, "HiRadixCache._insert_helper_host", _insert_helper_host),
]
