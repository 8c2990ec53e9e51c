"""The sites: one ``wrapt`` wrapper per SGLang method (:data:`SITES`).

Every wrapper calls the wrapped method exactly as it was called and returns what it returns; the recording around
it runs under :func:`safe` (an error costs that record, never SGLang's call). Below the trace level a wrapper costs
one attribute lookup and one int compare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..api import cptrace, rng, trace_level
from ._audit import enroll
from ._l3_sites import L3_SITES
from ._reqlink import note_node, request_fields
from ._state import HIRADIX, Load, State, aligned_key, arg, safe, state_of, tree_path

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import (
        Allocator,
        CacheController,
        CacheParams,
        HostKVCache,
        LoadAck,
        MatchResult,
        RadixCache,
        TreeNode,
    )

CONTROLLER = "sglang.srt.managers.cache_controller"
TOKEN_ALLOC = "sglang.srt.mem_cache.allocator.token"
PAGED_ALLOC = "sglang.srt.mem_cache.allocator.paged"
HOST_POOL = "sglang.srt.mem_cache.pool_host.base"


# -- wrappers -----------------------------------------------------------------------------------------------------
def _cache_init(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    safe(setattr, instance, "_cptrace_sg", None)   # built after instrument(): no warning while __init__ runs
    out = wrapped(*args, **kwargs)
    safe(_attach, instance)
    return out


def _attach(cache: RadixCache) -> None:
    st = State(cache)
    cache._cptrace_sg = st
    cc = cache.cache_controller
    cc._cptrace_sg = st
    cc.mem_pool_device_allocator._cptrace_sg = st
    if getattr(cache, "token_to_kv_pool_host", None) is not None:
        cache.token_to_kv_pool_host._cptrace_sg = st
    if trace_level() >= 1:
        st.config()
    enroll(st)


def reset_site(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        safe(lambda: cptrace(1, "reset", reason="flush"))
        st.clear()
    return wrapped(*args, **kwargs)


def _match_prefix(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    res = wrapped(*args, **kwargs)
    st = state_of(instance)
    if st is not None:
        safe(_rid_map_match, instance, arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_match(cache: RadixCache, params: CacheParams, res: MatchResult) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None or res.host_hit_length > 0:
        return   # no request, or the decision is init_load_back's
    dlen = len(res.device_indices)
    node_id, hit = res.last_device_node.id, ("dev" if dlen else "miss")
    rid_map(req, rid, node_id, hit, len(params.key), dlen=dlen, hlen=0)


def _init_load_back(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    st.loaded = None
    res = wrapped(*args, **kwargs)
    safe(_rid_map_load, st, arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_load(st: State, params: CacheParams, res: tuple[Tensor, TreeNode]) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None:
        return
    values, node = res
    loaded = getattr(st, "loaded", None)
    hlen = len(values) if loaded is not None else 0
    hit = "host" if loaded is not None else ("dev" if node is not st.cache.root_node else "miss")
    plen = len(getattr(req, "origin_input_ids", ()) or ())
    rid_map(req, rid, node.id, hit, plen, hlen=hlen)


def rid_map(req: object, rid: object, node_id: int, hit: str, plen: int, **lens: int) -> None:
    """The ``rid_map`` record of request ``rid`` on ``node_id`` (fields ``dlen``/``hlen`` as the site knows them,
    then ``plen``; SGLang's request span where it traces ``req``), and the node noted back on that span. Both
    versions' match and load-back sites write it here."""
    cptrace(1, "rid_map", rid=str(rid), node_id=node_id, hit=hit, **lens, plen=plen, **request_fields(req))
    note_node(req, node_id, hit)


def _split_node(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    child = arg(args, kwargs, 1, "child")
    split_len = arg(args, kwargs, 2, "split_len")
    pre = safe(lambda: (len(child.key), child.parent.id, child.write_through_pending_id, child.lock_ref))
    new = wrapped(*args, **kwargs)
    if pre is not None:
        safe(lambda: on_split(st, child, new, int(split_len), pre))
    return new


def on_split(st: State, child: TreeNode, new: TreeNode, split_len: int, pre: tuple) -> None:
    pre_len, parent_id, pend, lock = pre
    cptrace(1, "split", node_id=child.id, new_id=new.id, parent=parent_id, pre_len=pre_len, split_len=split_len,
            dev_p=rng(st.dev(new)), dev_c=rng(st.dev(child)), host_p=rng(st.host(new)), host_c=rng(st.host(child)),
            pend=(pend if pend is not None else -1), lock=lock)
    split_loads(st, child, new)
    if st.insert_ctx is not None:
        st.insert_ctx["split_new"][new] = st.dev(new) is None
    if child.id in st.rest:   # the prefix keeps its part of the audited host copy
        st.rest[new.id] = new


def split_loads(st: State, child: TreeNode, new: TreeNode) -> None:
    """A split of ``child`` (``new`` its prefix) while a load of it is in flight: the load now covers both."""
    for q in st.loads.values():
        for ld in q:
            for i, n in enumerate(ld.chain):
                if n.id == child.id:
                    ld.chain.insert(i, new)
                    break


def _insert(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None or st.insert_ctx is not None:
        return wrapped(*args, **kwargs)
    params = arg(args, kwargs, 0, "params")
    ctx = safe(_insert_ctx, instance, st, params)
    st.insert_ctx = ctx
    try:
        res = wrapped(*args, **kwargs)
        safe(st.announce_inserted)
    finally:
        st.insert_ctx = None
    return res


def _insert_ctx(cache: RadixCache, st: State, params: CacheParams) -> dict:
    key = aligned_key(cache, params)
    from sglang.srt.mem_cache.radix_cache import TreeNode

    return {"key": key, "counter": TreeNode.counter, "split_new": {}, "done": set(),
            "evicted": {n.id for n in tree_path(cache, key, st.page_size) if n.value is None}}


def _write_backup(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    safe(st.announce_inserted)   # a backup inside insert: its node's insert record goes first
    st.writing.append(arg(args, kwargs, 0, "node"))
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.writing.pop()


def _start_writing(wrapped: Callable[..., Any], instance: CacheController, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        safe(_prepare_queued, st, instance)
    return wrapped(*args, **kwargs)


def _prepare_queued(st: State, controller: CacheController) -> None:
    if controller.write_queue:
        ops = list(controller.write_queue)
        merged = ops[0].id if len(ops) == 1 else type(ops[0]).counter   # merge_ops takes the next op id
        st.prepare_backup(ops, merged)


def _finish_write_ack(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        safe(st.ack_d2h, arg(args, kwargs, 0, "ack_id"))
    return wrapped(*args, **kwargs)


def _load_back(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    node = arg(args, kwargs, 0, "node")
    chain = safe(_evicted_chain, node) or []
    res = wrapped(*args, **kwargs)
    if res is not None:
        safe(_on_reload, st, node, chain, res)
    return res


def _evicted_chain(node: TreeNode) -> list[TreeNode]:
    chain: list[TreeNode] = []
    while node.evicted:
        chain.insert(0, node)
        node = node.parent
    return chain


def _on_reload(st: State, last: TreeNode, chain: list[TreeNode], dev: Tensor) -> None:
    import torch

    op = st.cache.cache_controller.load_queue[-1]
    # (type: ignore: a node load_back reloads has its host copy; the checker cannot know it is not None)
    host = torch.cat([n.host_value for n in chain]) if chain else None  # type: ignore[misc]
    cptrace(1, "reload", node_id=last.id, chain=[n.id for n in chain], op=op.id, host=rng(host), dev=rng(dev),
            **st.xs("hostx", host), **st.xs("devx", dev))
    st.loads.setdefault(last.id, []).append(Load(op.id, list(chain)))
    st.loaded = last


def loading_check_site(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    before = safe(lambda: list(instance.cache_controller.ack_load_queue))
    res = wrapped(*args, **kwargs)
    if before is not None:
        safe(_acks_h2d, st, instance, before)
    return res


def _acks_h2d(st: State, cache: RadixCache, before: list[LoadAck]) -> None:
    n_done = len(before) - len(cache.cache_controller.ack_load_queue)
    for ack in before[:max(n_done, 0)]:
        safe(st.ack_h2d, list(ack.node_ids))


def _evict_backuped(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    node = arg(args, kwargs, 0, "node")
    safe(lambda: st.evict("dev", node, "backuped", node.value))
    st.in_evict_backuped += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.in_evict_backuped -= 1


def _detach_backuped(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None and not st.in_evict_backuped:
        # write_back staging: detached now, its device pages freed by the flush's evict_device (after the acks)
        safe(_stage, st, arg(args, kwargs, 0, "node"))
    return wrapped(*args, **kwargs)


def _stage(st: State, node: TreeNode) -> None:
    v = node.value
    if v is not None:
        st.staged[id(v)] = (v, node, node.lock_ref, node.host_ref_counter)


def _evict_device(wrapped: Callable[..., Any], instance: CacheController, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        t = arg(args, kwargs, 0, "device_indices")
        staged = st.staged.pop(id(t), None)
        if staged is not None and staged[0] is t:
            _, node, lock, href = staged
            safe(_evict_staged, st, node, t, lock, href)
    return wrapped(*args, **kwargs)


def _evict_staged(st: State, node: TreeNode, t: Tensor, lock: int, href: int) -> None:
    cptrace(1, "evict", tier="dev", node_id=node.id, kind="backuped", dev=rng(t), lock=lock, href=href,
            **st.xs("devx", t))
    st.expect_free[id(t)] = (t, node.id)


def _evict_regular(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        node = arg(args, kwargs, 0, "node")
        safe(lambda: st.evict("dev", node, "regular", node.value))
    return wrapped(*args, **kwargs)


def _drop_subtree(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        safe(_on_drop, st, arg(args, kwargs, 0, "root"))
    return wrapped(*args, **kwargs)


def _on_drop(st: State, root: TreeNode) -> None:
    nodes, stack = [], [root]
    while stack:
        n = stack.pop()
        nodes.append(n)
        stack.extend(n.children.values())
    if any(n.host_ref_counter > 0 for n in nodes):
        return   # SGLang drops nothing then
    for n in nodes:
        if n.host_value is not None:
            st.evict("host", n, "drop", n.host_value)
        if n.value is not None:
            st.evict("dev", n, "drop", n.value)


def _evict_host_tree(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    """``HiRadixCache.evict_host``: which node each ``cache_controller.evict_host(x.host_value)`` evicts is found in
    an index built once per call (host value -> node, over the leaves SGLang itself lists and heapifies here), and
    each evicted node's parent joins it (SGLang pushes the parent once it became a leaf): O(1) per evicted node."""
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    outer = st.host_owner
    st.host_owner = safe(lambda: {id(n.host_value): n for n in list(instance.evictable_host_leaves)}) or {}
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.host_owner = outer


def _controller_evict_host(wrapped: Callable[..., Any], instance: CacheController, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None and st.host_owner is not None:
        safe(_on_evict_host, st, arg(args, kwargs, 0, "host_indices"))
    return wrapped(*args, **kwargs)


def _on_evict_host(st: State, t: Tensor) -> None:
    owner = st.host_owner
    node = owner.pop(id(t), None) if owner is not None else None
    if node is None or node.host_value is not t:
        return
    st.evict("host", node, "host", t)
    parent = node.parent
    if owner is not None and parent is not None and parent.host_value is not None:
        owner[id(parent.host_value)] = parent


def dev_free(wrapped: Callable[..., Any], instance: Allocator, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None and not st.in_free:
        safe(free_nonempty, st, "dev", arg(args, kwargs, 0, "free_index"))
    return wrapped(*args, **kwargs)


def free_nonempty(st: State, pool: str, t: Tensor | None) -> None:
    if t is not None and t.numel() > 0:
        st.free(pool, t)


def host_free(wrapped: Callable[..., Any], instance: HostKVCache, args: tuple, kwargs: dict) -> Any:
    st = state_of(instance)
    if st is not None:
        safe(free_nonempty, st, "host", arg(args, kwargs, 0, "indices"))
    return wrapped(*args, **kwargs)


# (module, "Class.method", wrapper): every site, for HiRadixCache builds (sglang 0.5.20).
SITES: list[tuple[str, str, Any]] = [
    (HIRADIX, "HiRadixCache.__init__", _cache_init),
    (HIRADIX, "HiRadixCache.reset", reset_site),
    (HIRADIX, "HiRadixCache.match_prefix", _match_prefix),
    (HIRADIX, "HiRadixCache.init_load_back", _init_load_back),
    (HIRADIX, "HiRadixCache.insert", _insert),
    (HIRADIX, "HiRadixCache._split_node", _split_node),
    (HIRADIX, "HiRadixCache.write_backup", _write_backup),
    (HIRADIX, "HiRadixCache._finish_write_through_ack", _finish_write_ack),
    (HIRADIX, "HiRadixCache.load_back", _load_back),
    (HIRADIX, "HiRadixCache.loading_check", loading_check_site),
    (HIRADIX, "HiRadixCache._evict_backuped", _evict_backuped),
    (HIRADIX, "HiRadixCache._detach_backuped", _detach_backuped),
    (HIRADIX, "HiRadixCache._evict_regular", _evict_regular),
    (HIRADIX, "HiRadixCache._drop_subtree_no_host", _drop_subtree),
    (HIRADIX, "HiRadixCache.evict_host", _evict_host_tree),
    (CONTROLLER, "HiCacheController.start_writing", _start_writing),
    (CONTROLLER, "HiCacheController.evict_device", _evict_device),
    (CONTROLLER, "HiCacheController.evict_host", _controller_evict_host),
    (TOKEN_ALLOC, "TokenToKVPoolAllocator.free", dev_free),
    (PAGED_ALLOC, "PagedTokenToKVPoolAllocator.free", dev_free),
    (HOST_POOL, "HostKVCache.free", host_free),
]
SITES += L3_SITES   # the storage tier's sites (_l3_sites)
