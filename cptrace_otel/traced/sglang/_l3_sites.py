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

With the ``file`` backend the backup's ack also writes the metadata file beside each object it stored, and the
prefetch's ack reads those of its pages (``wfp``/``wid``): :mod:`._l3_meta`.

The drain's inner steps are closures, run in this order: storage hits, prefetch acks, backup acks, releases. Its
``l3_query``/``l3_prefetch`` records are written at its first prefetch ack (before that ack's record: a prefetch
allocated and read within one drain is acknowledged in it) or when it returns; its backup acks when it returns.

The wrappers are shared with 0.5.23 (:mod:`._l3_sites23`): a :class:`Reads` says how a version's storage state is
read; the records are the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ...model import l3 as l3m, semconv as sc
from ..api import cptrace, rng
from . import _audit, _audit_l3, _l3_meta
from ._pagefp import page_fp
from ._state import State, arg, safe, state_of

if TYPE_CHECKING:
    import queue

    from torch import Tensor

    from ._types import CacheController, PrefetchOperation, RadixCache, RadixKey, TreeCore, TreeNode

_T = TypeVar("_T")
CONTROLLER = "sglang.srt.managers.cache_controller"
HIRADIX = "sglang.srt.mem_cache.hiradix_cache"


class L3State:
    """The L3 side of one cache's :class:`~._state.State` (attribute ``l3``)."""

    __slots__ = ("backup_node", "prefetch_op", "drain", "meta", "audit")

    def __init__(self) -> None:
        self.backup_node: TreeNode | int | None = None   # during write_backup_storage: its node (0.5.23: its id)
        self.prefetch_op: PrefetchOperation | None = None   # during _handle_prefetch_result: its operation
        self.drain: tuple | None = None       # during a drain: (reads, its queues' view) until its hit records are out
        # file backend: op id -> (folder, keys, fingerprints, start ns) of a backup whose metadata its ack writes
        self.meta: OrderedDict = OrderedDict()
        self.audit: _audit_l3.L3Rest | None = None   # the audit of the stored objects, for a cache under audit


def _l3(st: State) -> L3State:
    s = getattr(st, "l3", None)
    if s is None:
        s = L3State()
        setattr(st, "l3", s)  # noqa: B010 - attached on first use, so State (_state.py) does not declare it
    return s


def _keys(cc: CacheController, hashes: Iterable[str] | None) -> list[str]:
    """The backend's object keys of page hashes: the name the page is stored under, which carries the rank scope
    (the ``file`` backend's ``_get_suffixed_key``, the hash plus its rank suffix; ``seaweedfs``'s ``_object_key``,
    ``<prefix>/<model>/<rank scope>/<hash>``); the hash itself for a backend with neither."""
    backend = cc.storage_backend
    name = getattr(backend, "_get_suffixed_key", None) or getattr(backend, "_object_key", None)
    hs = list(hashes or ())
    return [str(name(h)) for h in hs] if name is not None else [str(h) for h in hs]


def _page_fps(cc: CacheController, host_indices: Tensor, pages: int) -> list[int]:
    """One fingerprint per page of the host pool: of the data page the storage backend reads or fills
    (``get_data_page``), see :func:`page_fp`."""
    pool = cc.storage_host_pool
    ps = int(cc.page_size)
    return [page_fp(pool.get_data_page(int(host_indices[i * ps]), flat=False)) for i in range(pages)]


def _side_fps(st: State | None, cc: CacheController, host_indices: Tensor, pages: int) -> dict[str, list[int]]:
    """``shp_<pool>``: per sidecar pool of the cache (the DSA indexer), one :func:`page_fp` per page of its host pool
    at the KV's host slots (a sidecar's slots are the KV's); nothing for a cache without sidecars."""
    side_host = getattr(st, "side_host", None)
    if not side_host:
        return {}
    ps = int(cc.page_size)
    return {sc.side_field(sc.SIDE_HP, name): [page_fp(pool.get_data_page(int(host_indices[i * ps]), flat=False))
                                               for i in range(pages)] for name, pool in side_host.items()}


def _queue_items(q: queue.Queue[_T] | None) -> list[_T]:
    if q is None:
        return []
    with q.mutex:   # the storage threads append while we look
        return list(q.queue)


class Reads:
    """How the shared L3 wrappers read one SGLang version's storage state (0.5.20's :class:`Reads`; 0.5.23's
    subclass in :mod:`._l3_sites23`). The records and their grammar are the same for every version."""

    @staticmethod
    def node_id(st: State, node: Any) -> int:   # (Any: a TreeNode here, Reads23's a node id)
        """The id of the node a storage method was called with (0.5.20: the node itself)."""
        return int(node.id)

    @staticmethod
    def prefetch(cache: RadixCache, op: PrefetchOperation) -> tuple[int, Tensor | None] | None:
        """``(node id, host slots)`` of a prefetch that is still ``op``'s (its ``ongoing_prefetch`` entry), None
        when it is gone; host slots None while its pages are not allocated."""
        info = cache.ongoing_prefetch.get(op.request_id)
        if info is None or info[2] is not op:
            return None
        return int(info[0].id), op.host_indices

    @staticmethod
    def backup_node_id(entry: Any) -> int:   # (Any: a TreeNode here, Reads23's a tuple)
        """The node id of an ``ongoing_backup`` value."""
        return int(entry.id)

    @staticmethod
    def usable_pages(cache: RadixCache, op: PrefetchOperation) -> int:
        """The pages of a finished prefetch that enter the tree."""
        return int(cache._clamp_prefetch_result(op)) // int(cache.page_size)


# -- backup -------------------------------------------------------------------------------------------------------
def write_backup_storage_site(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    """``write_backup_storage(node)`` (0.5.23: ``(node_id)``): the node :func:`write_storage_site` records."""
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    l3 = _l3(st)
    l3.backup_node = arg(args, kwargs, 0, "node")
    if l3.backup_node is None:
        l3.backup_node = arg(args, kwargs, 0, "node_id")
    try:
        return wrapped(*args, **kwargs)
    finally:
        l3.backup_node = None


def write_storage_site(reads: type[Reads]) -> Any:
    """The ``write_storage`` wrapper: ``l3_backup`` of the node ``write_backup_storage`` is backing up."""
    def _write_storage(wrapped: Callable[..., Any], instance: CacheController, args: tuple, kwargs: dict) -> Any:
        st = state_of(instance)
        node = getattr(getattr(st, "l3", None), "backup_node", None)
        if st is None or node is None:
            return wrapped(*args, **kwargs)
        host = arg(args, kwargs, 0, "host_indices")
        # before the call: the backup thread reads these pages as soon as the op is queued (it never writes them)
        pre = safe(lambda: _backup_pre(reads, st, node, instance, host, arg(args, kwargs, 2, "hash_value")))
        t0 = _l3_meta.now_ns()
        op = wrapped(*args, **kwargs)
        if pre is not None:
            nid, keys, hp, side = pre
            io = 0 if getattr(instance, "backup_skip", False) else 1
            safe(lambda: cptrace(1, "l3_backup", node_id=nid, op=int(op), keys=keys, hp=hp, host=rng(host),
                                 io=io, **side, **st.xs("hostx", host)))
            if io:
                safe(_meta_pending, st, instance, int(op), keys, hp, t0)
                if _audit.enrolled(st):
                    safe(_audit_pending, st, instance, int(op), nid, arg(args, kwargs, 2, "hash_value"), keys)
        return op
    return _write_storage


# -- the scheduler's drain of the storage queues ------------------------------------------------------------------
def drain_site(reads: type[Reads]) -> Any:
    """The drain wrapper. Its steps run in this order in both versions: storage hits (queries, prefetches
    allocated), prefetch acks (``_handle_prefetch_result``), backup acks, releases. The ``l3_query``/``l3_prefetch``
    records are written after the first step: at the drain's first prefetch ack (:func:`prefetch_result_site`
    flushes them; a prefetch allocated and read within one drain is acknowledged in it) or when the drain returns;
    the backup acks when it returns."""
    def _drain(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
        st = state_of(instance)
        if st is None:
            return wrapped(*args, **kwargs)
        pre = safe(_drain_pre, instance, arg(args, kwargs, 0, "n_storage_hit"))
        l3 = _l3(st)
        l3.drain = (reads, pre) if pre is not None else None
        try:
            res = wrapped(*args, **kwargs)
        finally:
            flush_hits(st, instance)
        if pre is not None:
            safe(_backup_acks, reads, st, instance, pre)
        return res
    return _drain


def _drain_pre(cache: RadixCache, n_hit: int | None) -> tuple:
    cc = cache.cache_controller
    hits = _queue_items(cc.prefetch_hit_queue)
    if n_hit is not None:
        hits = hits[:int(n_hit)]
    # the query's own view, before the drain truncates hash_value to what it allocates
    queried = [(op, int(op.storage_hit_count), list(op.all_hash_values or op.hash_value or ())) for op in hits]
    acks = {op.id: op for op in _queue_items(cc.ack_backup_queue)}
    return queried, dict(cache.ongoing_backup), acks


def _meta_pending(st: State, cc: CacheController, op: int, keys: list[str], hp: list[int], t0: int) -> None:
    """A file backend's backup: its ack writes the metadata files (:func:`_l3_meta.write`)."""
    root = _l3_meta.folder(cc.storage_backend)
    if root is None:
        return
    pending = _l3(st).meta
    pending[op] = (root, keys, hp, t0)
    while len(pending) > _l3_meta.PENDING_KEPT:
        pending.popitem(last=False)


def _audit_pending(st: State, cc: CacheController, op: int, nid: int, hashes: Iterable[str] | None,
                   keys: list[str]) -> None:
    """A backup of a cache under audit: its objects join the L3 audit set at its ack (:mod:`._audit_l3`)."""
    l3 = _l3(st)
    if l3.audit is None:
        l3.audit = _audit_l3.L3Rest()
    _audit_l3.on_backup(l3.audit, cc, op, nid, [str(h) for h in hashes or ()], keys)


def _backup_pre(reads: type[Reads], st: State, node: TreeNode | int, controller: CacheController, host: Tensor,
                hash_value: Iterable[str] | None) -> tuple:
    hashes = list(hash_value or ())
    return (reads.node_id(st, node), _keys(controller, hashes), _page_fps(controller, host, len(hashes)),
            _side_fps(st, controller, host, len(hashes)))


def flush_hits(st: State, cache: RadixCache) -> None:
    """The pending ``l3_query``/``l3_prefetch`` records of the running drain, once."""
    l3 = _l3(st)
    pending, l3.drain = l3.drain, None
    if pending is not None:
        safe(_hit_records, pending[0], st, cache, pending[1][0])


def _hit_records(reads: type[Reads], st: State, cache: RadixCache,
                 queried: list[tuple[PrefetchOperation, int, list[str]]]) -> None:
    cc = cache.cache_controller
    ps = int(cache.page_size)
    for op, hit, hashes in queried:
        rid = str(op.request_id)
        cptrace(1, "l3_query", op=op.id, rid=rid, keys=_keys(cc, hashes), hit=hit // ps)
        cur = reads.prefetch(cache, op)
        if cur is None or cur[1] is None:
            continue   # revoked (too few hits, no host memory, aborted): nothing is read
        host = cur[1]
        cptrace(1, "l3_prefetch", op=op.id, rid=rid, node_id=cur[0], keys=_keys(cc, op.hash_value),
                host=rng(host), **st.xs("hostx", host))


def _backup_acks(reads: type[Reads], st: State, cache: RadixCache, pre: tuple) -> None:
    _, backups, acks = pre
    ps = int(cache.page_size)
    l3 = _l3(st)
    pending = l3.meta
    for op_id, entry in backups.items():
        if op_id in cache.ongoing_backup:
            continue
        op = acks.get(op_id)
        done = {"done": int(op.completed_tokens) // ps} if op is not None else {}
        cptrace(2, "l3_ack", dir="backup", op=op_id, node_id=reads.backup_node_id(entry), **done)
        if l3.audit is not None:
            safe(_audit_l3.on_ack, l3.audit, op_id, done.get("done"))
        meta = pending.pop(op_id, None)
        if meta is not None:
            root, keys, hp, t0 = meta
            n = len(keys) if op is None else int(op.completed_tokens) // ps
            safe(_l3_meta.write, root, keys[:n], hp[:n], st_identity(st), t0)


def st_identity(st: State) -> dict:
    """The cache's storage identity (:func:`_l3_meta.identity`), read once."""
    ident = getattr(st, "ident", None)
    if ident is None:
        ident = st.ident = _l3_meta.identity(st)
    return ident


# -- prefetch completion and the storage hit ----------------------------------------------------------------------
def prefetch_result_site(reads: type[Reads]) -> Any:
    """The ``_handle_prefetch_result`` wrapper: ``l3_ack dir=prefetch`` before the pages enter the tree; the
    storage hits of the call below it are that prefetch's."""
    def _prefetch_result(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
        st = state_of(instance)
        if st is None:
            return wrapped(*args, **kwargs)
        op = arg(args, kwargs, 0, "operation")
        flush_hits(st, instance)
        safe(_prefetch_ack, reads, instance, op)
        l3 = _l3(st)
        l3.prefetch_op = op
        try:
            return wrapped(*args, **kwargs)
        finally:
            l3.prefetch_op = None
    return _prefetch_result


def _prefetch_ack(reads: type[Reads], cache: RadixCache, op: PrefetchOperation) -> None:
    cur = reads.prefetch(cache, op)
    if cur is None:
        return
    cc = cache.cache_controller
    pages = reads.usable_pages(cache, op)
    keys = _keys(cc, list(op.hash_value)[:pages])
    root = _l3_meta.folder(cc.storage_backend)
    got = safe(_l3_meta.read, root, keys) if root is not None and keys else None
    wrote = {l3m.WFP: got[0], l3m.WID: got[1]} if got is not None else {}
    # (type: ignore: a prefetch that is acknowledged had its host pages allocated at its storage hit)
    cptrace(2, "l3_ack", dir="prefetch", op=op.id, node_id=cur[0], done=pages,
            keys=keys, hp=_page_fps(cc, op.host_indices, pages),  # type: ignore[arg-type]
            **_side_fps(state_of(cache), cc, op.host_indices, pages), **wrote)  # type: ignore[arg-type]


def hit_record(st: State, cache: RadixCache, op: PrefetchOperation, node: TreeNode,
               hashes: Iterable[str] | None) -> None:
    """``l3_hit``: ``node`` now holds fetched pages of ``op`` (its host slots, its page hashes)."""
    host = st.host(node)
    cptrace(1, "l3_hit", node_id=node.id, parent=node.parent.id, op=op.id, keys=_keys(cache.cache_controller,
            hashes), host=rng(host), **st.xs("hostx", host))


def prefetch_insert_site(before: Callable[[tuple, dict], tuple], after: Callable[..., None]) -> Any:
    """A wrapper of the tree method ``_handle_prefetch_result`` inserts the fetched pages with: outside that call it
    only calls through; inside, ``before(args, kwargs)`` reads the call, ``after(st, instance, op, pre, result)``
    writes the ``l3_hit`` records."""
    def wrapper(wrapped: Callable[..., Any], instance: RadixCache | TreeCore, args: tuple, kwargs: dict) -> Any:
        st = state_of(instance)
        op = getattr(getattr(st, "l3", None), "prefetch_op", None)
        if st is None or op is None:
            return wrapped(*args, **kwargs)
        pre = safe(before, args, kwargs)
        res = wrapped(*args, **kwargs)
        if pre is not None:
            safe(after, st, instance, op, pre, res)
        return res
    return wrapper


def tree_path(node: TreeNode, key: RadixKey, ps: int) -> Iterator[tuple[TreeNode, bool]]:
    """The nodes an insert walk from ``node`` along ``key`` passes (read-only, after the insert), each with True
    where the walk ends at it (the key consumed, or matched only in part); a walk that ends because no child
    matches ends on False."""
    while len(key) > 0:
        child = node.children.get(key.child_key(ps))
        if child is None:
            return
        m = child.key.match(key, page_size=ps)
        if m == 0:
            return
        node, key = child, key[m:]
        yield child, (len(key) == 0 or m < len(child.key))
        if m < len(child.key):
            return


def _on_hit(st: State, cache: RadixCache, op: PrefetchOperation, pre: tuple, matched: int) -> None:
    """``_insert_helper_host(node, key, ...)`` returned ``matched``: the node it created past it takes the pages."""
    start, key = pre
    if matched >= len(key):
        return   # the tree already held every fetched page: no node takes them
    node = None
    for child, end in tree_path(start, key, int(cache.page_size)):   # it ends at the node it created
        node = child if end else None
    if node is None or node.value is not None or node.host_value is None:
        return
    hit_record(st, cache, op, node, node.hash_value)


_insert_helper_host = prefetch_insert_site(lambda a, k: (arg(a, k, 0, "node"), arg(a, k, 1, "key")), _on_hit)


# (module, "Class.method", wrapper): the L3 sites, for HiRadixCache builds (sglang 0.5.20), registered with SITES.
L3_SITES: list[tuple[str, str, Any]] = [
    (HIRADIX, "HiRadixCache.write_backup_storage", write_backup_storage_site),
    (CONTROLLER, "HiCacheController.write_storage", write_storage_site(Reads)),
    (HIRADIX, "HiRadixCache._drain_storage_control_queues_impl", drain_site(Reads)),
    (HIRADIX, "HiRadixCache._handle_prefetch_result", prefetch_result_site(Reads)),
    (HIRADIX, "HiRadixCache._insert_helper_host", _insert_helper_host),
]
