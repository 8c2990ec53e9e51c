"""The sites of sglang 0.5.23 (``UnifiedRadixCache`` + ``HybridCacheController`` over the Python ``UnifiedTreeCore``):
:data:`SITES23`. The records, their fields and their grammar are 0.5.20's (:mod:`._sites`, :class:`._state.State`);
only where 0.5.23 does a thing differs, and :class:`State23` reads 0.5.23's nodes.

Where each record is made in 0.5.23 (the README's "Use it with SGLang" lists them):

* the tree lives in the tree core: ``insert`` (new) at ``UnifiedTreeCore._add_new_node``, (revive) at
  ``_unevict_node_on_insert``, ``split`` at ``UnifiedTreeCore._split_node`` (its pending write follows through the
  ``UpdatePendingBackupOnNodeSplit`` action, recorded by ``ack d2h``'s ``pub``);
* ``prepare`` + ``backup`` when a node's backup is queued (``UnifiedRadixCache._track_write_through_node``, right
  after ``HybridCacheController.write`` allocated the host slots): 0.5.23 queues a node's copy (``flush=False``) and
  submits the merged copy later (``start_writing``); the device KV hashed then is what the copy reads, as the node
  is pinned (write-through) or flushed before its device pages go (write-back). ``op`` is the queued op's id,
  the same in the node's ``ack dir=d2h``;
* ``evict``: every eviction of the tree core goes through ``_evict_component_and_detach_lru`` (full-attention
  component only): ``tier=dev`` when the node's device value is handed to the frees (kind ``backuped`` when a host
  copy stays, ``regular`` when the node goes, ``drop`` under ``drop_subtree_no_host``), ``tier=host`` when its host
  value is (kind ``host``, or ``drop``). Write-back demotes a node only after ``writing_check(write_back=True)``
  consumed its acks, so its ``evict tier=dev`` follows them without any staging. A write-back *host duplicate*
  reclaimed under host pressure (``_release_full_host_duplicate``: the node keeps its device copy) is no eviction:
  it is one ``free pool=host why=dup`` of that node;
* ``reload`` at ``UnifiedTreeCore.commit_load_back`` (the chain is the transfer's ``nodes_to_load``), ``ack h2d``
  per chain node at ``loading_check`` (as 0.5.20);
* ``free pool=dev`` at the allocator's ``free_segment`` / ``free`` (0.5.23 frees tree values and an insert's
  duplicate slots with ``free_segment``), ``free pool=host`` at ``HostKVCache.free``.
* ``ld_start``, ``ld_layer``, ``ld_read`` (level 2, the layer-wise load-back and the reads of its layers) at
  ``HiCacheController.start_loading`` and the per-layer sites it hooks while a step is in flight
  (:mod:`._layerwise23`); a step ends at its ``ack h2d``.

Not covered (:func:`untraceable`: such a cache gets one warning and no record, never partial records): a tree core
neither Python nor Rust (0.5.23's default, ``RustUnifiedTreeCore``, is traced at its Python boundary, :mod:`._rust23`,
whose doc lists what it cannot trace; ``CPTRACE_SGLANG_TREE_CORE=python`` is the option that switches to the Python
core where ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` is unset), trees with
other components than the full-attention KV with the sliding-window one or the Mamba one (C128, FULL + SWA + Mamba:
hybrid models; FULL + SWA, :mod:`._swa23`, and FULL + Mamba, :mod:`._mamba23`, are traced on either core, but
not with L3 storage), an L3 storage
backend other than ``file`` and ``seaweedfs`` (the L3 sites, :mod:`._l3_sites23`, are verified against those
backends' flows, :data:`._l3_sites23.L3_BACKENDS`; a
cache that gets another backend attached at run time stops being traced then, with a warning), the buffer-only host
mode and the external cache linker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..api import cptrace, rng, trace_level
from ._audit import enroll
from ._l3_sites23 import L3_BACKENDS, L3_SITES23
from ._layerwise23 import LAYERWISE_SITES23, drop_counter, end as end_layerwise
from ._mamba23 import MAMBA, MAMBA_SITES23, MambaBook, mamba_host_pool
from ._shard import stripe_fp
from ._sites import (
    HOST_POOL,
    PAGED_ALLOC,
    TOKEN_ALLOC,
    dev_free,
    free_nonempty,
    host_free,
    loading_check_site,
    on_split,
    reset_site,
    rid_map,
)
from ._state import (
    Load,
    Recorder,
    State,
    arg,
    is_rust_core,
    kv_rows,
    rust_boundary_armed,
    safe,
    state_of,
    warn_once,
)
from ._swa23 import SWA, SWA_SITES23, SwaBook, full_pool

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import (
        Allocator,
        CacheParams,
        EvictComponent,
        HostKVCache,
        KVPool,
        MatchResult23,
        PoolTransfer,
        RadixCache,
        SidecarPool,
        Traced,
        TreeCore,
        TreeNode,
    )

URC = "sglang.srt.mem_cache.unified_radix_cache"
UTC = "sglang.srt.mem_cache.unified_cache.unified_tree_core"
BASE_ALLOC = "sglang.srt.mem_cache.allocator.base"
SWA_ALLOC = "sglang.srt.mem_cache.allocator.swa"
FULL = 0   # ComponentType.FULL (an IntEnum, 0 in 0.5.23)


class State23(State):
    """:class:`State` over 0.5.23's nodes: the full-attention component's data, node ids resolved by the tree core."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__(cache)
        self.write_len: dict[int, tuple[int, int]] = {}   # ack id (node id) -> (op id, backup length)
        self.side = sidecars(cache)
        group = cache.cache_controller.mem_pool_host
        self.side_host = {name: group.get_pool(pool_name) for name, pool_name in sidecar_names(cache)}
        self.sharded = getattr(self.kv_pool(), "placement", None) is not None   # (KV sharding: a stripe per rank)
        # a hybrid full + sliding-window tree: its SWA component's round trips (._swa23)
        self.swa = SwaBook(cache) if SWA in [int(c) for c in cache.tree_components] else None
        # a hybrid full + Mamba tree: its Mamba component's round trips (._mamba23)
        self.mamba = MambaBook(cache) if MAMBA in [int(c) for c in cache.tree_components] else None

    @staticmethod
    def dev(n: TreeNode) -> Tensor | None:
        return n.component_data[FULL].value

    @staticmethod
    def host(n: TreeNode) -> Tensor | None:
        return n.component_data[FULL].host_value

    @staticmethod
    def lock(n: TreeNode) -> int:
        return int(n.component_data[FULL].lock_ref)

    @staticmethod
    def href(n: TreeNode) -> int:
        return int(n.component_data[FULL].host_lock_ref)

    def kv_pool(self) -> KVPool:
        """The full-attention KV pool (of a hybrid tree's ``SWAKVPool`` or ``HybridLinearKVPool``, its
        full-attention layers' pool)."""
        return full_pool(self.cache.token_to_kv_pool_allocator.get_kvcache())

    def node(self, nid: int) -> TreeNode:
        return self.cache.tree_core.node_by_id(nid)

    def host_pool(self) -> HostKVCache:
        return self.cache.cache_controller.mem_pool_host.anchor_entry.host_pool

    def fp(self, idx: Tensor | None) -> dict[str, Any]:
        """:meth:`State.fp`; under KV sharding the fingerprint of this rank's stripe (:mod:`._shard`)."""
        if self.sharded and idx is not None and len(idx):
            out = stripe_fp(self.kv_pool(), idx, self.page_size, kv_rows)
            if out is not None:
                return out
        return super().fp(idx)

    def clear(self) -> None:
        super().clear()
        self.write_len.clear()
        self.evict_kind = None
        drop_counter(self.cache.cache_controller.layer_done_counter)   # a reset aborts the load-backs in flight
        for book in (self.swa, self.mamba):
            if book is not None:
                book.clear()

    def ack_h2d(self, ack_node_ids: list) -> None:
        super().ack_h2d(ack_node_ids)
        for book in (self.swa, self.mamba):
            if book is not None:
                book.ack_h2d(self, ack_node_ids)
        end_layerwise(ack_node_ids)   # the load-back step is done: its reads are no longer recorded

    def parent_pbk(self, node_id: int) -> tuple[int, int]:
        """The parent's id of node ``node_id`` (-1: none) and whether the parent's KV is backed up (the root is)."""
        parent = self.node(node_id).parent
        root = self.cache.tree_core.root_node
        return (parent.id if parent is not None else -1,
                int(parent is root or (parent is not None and self.host(parent) is not None)))

    def key_len(self, node_id: int) -> int:
        """How many tokens node ``node_id`` holds now."""
        return len(self.node(node_id).key)

    # -- records that differ from 0.5.20 --------------------------------------------------------------------------
    def prepare23(self, node_id: int) -> None:
        from ._state import POLICY

        cc = self.cache.cache_controller
        op = cc.write_queue[-1]
        parent, pbk = self.parent_pbk(node_id)
        dev, host = op.device_indices, op.host_indices
        cptrace(1, "prepare", node_id=node_id, op=op.id, len=len(dev), dev=rng(dev), host=rng(host),
                policy=POLICY.get(cc.write_policy, "?"), parent=parent, pbk=pbk,
                **self.xs("hostx", host), **self.xs("devx", dev))
        cptrace(1, "backup", op=op.id, node_id=node_id, dev=rng(dev), host=rng(host), io=1, **self.fp(dev),
                **self.moved(op), **self.xs("devx", dev), **self.xs("hostx", host))
        self.write_len[node_id] = (op.id, len(dev))

    def ack_d2h23(self, ack_id: int) -> None:
        pending = self.cache.ongoing_write_through.get(ack_id)
        if pending is None:
            return
        op, blen = self.write_len.pop(ack_id, (-1, -1))
        cptrace(2, "ack", dir="d2h", op=op, node_id=ack_id, blen=int(blen), clen=self.key_len(pending.node_id),
                pub=[int(x) for x in pending.publish_node_ids])
        self.at_rest([self.node(x) for x in pending.publish_node_ids])

    def reload23(self, node_id: int, device_indices: Tensor, kv_xfer: PoolTransfer) -> None:
        cc = self.cache.cache_controller
        op = cc.load_queue[-1]
        chain = [self.node(nid) for nid in (kv_xfer.nodes_to_load or ())]
        host = kv_xfer.host_indices
        last = self.node(node_id)
        self.loaded = last
        if not chain:   # a hybrid tree's load of other components only (._swa23, ._mamba23): no full-attention KV moves
            return
        cptrace(1, "reload", node_id=last.id, chain=[n.id for n in chain], op=op.id, host=rng(host),
                dev=rng(device_indices), **self.moved(op), **self.xs("hostx", host), **self.xs("devx", device_indices))
        self.loads.setdefault(last.id, []).append(Load(op.id, chain))


# the State of a cache whose tree core is another class than the Python one, by that class's name (._rust23 adds
# the Rust core's): a module that needs State23 cannot be imported from here
STATE_FOR_CORE: dict[str, type[State23]] = {}


def sidecar_names(cache: RadixCache) -> list[tuple[str, object]]:
    """The cache's sidecar pools whose slots are the KV's (``sidecar_pool_specs`` with ``indices_from_pool=KV``:
    the DSA/NSA indexer of DeepSeek-V3.2 and GLM-5.x) that its host pool group holds, as ``(name, PoolName)``;
    their pages travel in the same copy ops as the node's KV (``HybridCacheController.write``/``load``
    ``extra_pools``) and to L3 under their own keys."""
    entries = getattr(cache.cache_controller.mem_pool_host, "entry_map", {})
    return [(str(getattr(spec.pool_name, "value", spec.pool_name)), spec.pool_name)
            for spec in getattr(cache, "sidecar_pool_specs", None) or ()
            if getattr(spec.indices_from_pool, "value", None) == "kv" and spec.pool_name in entries]


def sidecars(cache: RadixCache) -> list[tuple[str, SidecarPool]]:
    """:func:`sidecar_names` as ``(name, device pool)``."""
    entries = cache.cache_controller.mem_pool_host.entry_map
    return [(name, entries[pn].device_pool) for name, pn in sidecar_names(cache)]


def _st(obj: object) -> State23 | None:
    st = state_of(obj)
    return st if isinstance(st, State23) else None


# -- wrappers -----------------------------------------------------------------------------------------------------
def _init_hicache(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    safe(setattr, instance, "_cptrace_sg", None)   # HiCache set up after instrument(): no warning meanwhile
    out = wrapped(*args, **kwargs)
    safe(_attach, instance)
    return out


def untraceable(cache: RadixCache) -> str | None:
    """Why this 0.5.23 cache is left untraced (None when it is traced). Its records would be partial, and partial
    records give false findings: a tree core neither Python nor Rust fires none of the tree sites (the Rust one is
    traced at its boundary, :mod:`._rust23`, where its sites are wrapped); other component sets (C128, SWA with
    Mamba) free and load through other allocators and pools; an L3 storage backend, the buffer-only host mode and
    the external cache linker move KV on paths these sites do not see. A hybrid tree of FULL and SWA
    (:mod:`._swa23`) or of FULL and Mamba (:mod:`._mamba23`) is traced on either core, without L3 storage: its
    SWA pages and Mamba states go to storage by their own trailing-page keys, which no record follows.
    What the Rust core's boundary cannot trace names the option that traces it (:data:`ON_PYTHON`)."""
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    if cache.cache_controller is None:
        return "no HiCache controller"
    if is_rust_core(cache) and not rust_boundary_armed():
        return f"its Rust tree core's boundary is not armed ({ON_PYTHON})"
    if not isinstance(cache.tree_core, UnifiedTreeCore) and not is_rust_core(cache):
        return (f"its tree core is {type(cache.tree_core).__name__}, neither the Python UnifiedTreeCore nor the "
                f"Rust one (set SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python, or {ON_PYTHON})")
    if [int(c) for c in cache.tree_components] not in ([FULL], [FULL, SWA], [FULL, MAMBA]):
        return (f"its tree has components {[c.name for c in cache.tree_components]}: only FULL alone, FULL with "
                "SWA and FULL with MAMBA are traced")
    if SWA in [int(c) for c in cache.tree_components]:
        pool = cache.token_to_kv_pool_allocator.get_kvcache()
        if getattr(pool, "full_kv_pool", None) is None or getattr(pool, "swa_kv_pool", None) is None:
            return (f"it is a hybrid SWA tree over a {type(pool).__name__}, not an SWAKVPool (its full and SWA "
                    "pools are not where the fingerprints read them)")
        if cache.enable_storage:
            return "it is a hybrid SWA tree with an L3 storage backend (the SWA pages' L3 round trip is not recorded)"
    if MAMBA in [int(c) for c in cache.tree_components]:
        if mamba_host_pool(cache) is None:
            return "it is a hybrid Mamba tree without a MambaPoolHost in its host pool group"
        if cache.enable_storage:
            return ("it is a hybrid Mamba tree with an L3 storage backend (the Mamba states' L3 round trip is not "
                    "recorded)")
    backend = getattr(cache.cache_controller, "storage_backend_type", None)
    if cache.enable_storage and backend not in L3_BACKENDS:
        return (f"it has the L3 storage backend {backend!r} (the L3 sites are verified with "
                f"{', '.join(L3_BACKENDS)} only)")
    if cache.buffer_pipeline is not None or cache.linker is not None:
        return "it runs the buffer-only host mode or an external cache linker"
    return None


ON_PYTHON = ("CPTRACE_SGLANG_TREE_CORE=python traces it on the Python tree core where "
             "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND is unset")


def _traced_objects(cache: RadixCache) -> tuple[Traced, ...]:
    """The objects whose wrapped methods find the cache's state (attribute ``_cptrace_sg``)."""
    cc = cache.cache_controller
    return (cache, cache.tree_core, cc, cache.token_to_kv_pool_allocator, cc.mem_pool_host.anchor_entry.host_pool)


def _attach(cache: RadixCache) -> None:
    why = untraceable(cache)
    if why is not None:
        warn_once("untraceable:" + why, f"cptrace-otel: this sglang UnifiedRadixCache is not traced: {why}")
        return
    st = STATE_FOR_CORE.get(type(cache.tree_core).__name__, State23)(cache)
    for obj in _traced_objects(cache):
        obj._cptrace_sg = st
    if Recorder.audit_mbps > 0 and is_rust_core(cache):
        warn_once("rust-audit", "cptrace-otel: the audit of host copies at rest (CPTRACE_AUDIT_MBPS) does not run "
                  f"over the Rust tree core; its other records are written ({ON_PYTHON})")
    if trace_level() >= 1:
        st.config()
    enroll(st)


def detach(cache: RadixCache, why: str) -> None:
    """Stop tracing ``cache`` from now on (one warning): it became untraceable at run time (a storage backend
    attached that the sites do not cover). Its records so far stay; none follow."""
    warn_once("untraceable:" + why, f"cptrace-otel: this sglang UnifiedRadixCache is no longer traced: {why}")
    for obj in _traced_objects(cache):
        if getattr(obj, "_cptrace_sg", None) is not None:
            obj._cptrace_sg = None


def _attach_storage_backend(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    """A backend attached at run time: a traced cache whose new backend is not one of :data:`L3_BACKENDS` is no
    longer traced from here on (one warning), as such a cache is refused at ``init_hicache``."""
    res = wrapped(*args, **kwargs)
    safe(_after_attach, instance)
    return res


def _after_attach(cache: RadixCache) -> None:
    if getattr(cache, "_cptrace_sg", None) is None:
        return   # not traced
    why = untraceable(cache)
    if why is not None:
        detach(cache, why)


def _match_prefix(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    res = wrapped(*args, **kwargs)
    st = _st(instance)
    if st is not None:
        safe(_rid_map_match, arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_match(params: CacheParams, res: MatchResult23) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None or res.host_hit_length > 0:
        return   # no request, or the decision is init_load_back's
    dlen = int(res.device_prefix_len)
    node_id, hit = int(res.last_device_node), ("dev" if dlen else "miss")
    rid_map(req, rid, node_id, hit, len(params.key), dlen=dlen, hlen=0)


def _init_load_back(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    st.loaded = None
    res = wrapped(*args, **kwargs)
    safe(_rid_map_load, st, arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_load(st: State23, params: CacheParams, res: tuple[int, int] | None) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None or res is None:
        return
    n, node_id = res
    root = st.cache.tree_core.root_node_handle()
    hit = "host" if st.loaded is not None and n else ("dev" if node_id != root else "miss")
    plen = len(getattr(req, "origin_input_ids", ()) or ())
    rid_map(req, rid, int(node_id), hit, plen, hlen=int(n))


def _add_new_node(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    new = wrapped(*args, **kwargs)
    st = _st(instance)
    if st is not None:
        safe(st.node_record, new, "new")
    return new


def _unevict(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    out = wrapped(*args, **kwargs)
    st = _st(instance)
    if st is not None:
        safe(st.node_record, arg(args, kwargs, 0, "node"), "revive")
    return out


def _split_node(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    child = arg(args, kwargs, 1, "child")
    split_len = arg(args, kwargs, 2, "split_len")
    pre = safe(lambda: (len(child.key), child.parent.id, child.write_through_pending_id, st.lock(child)))
    out = wrapped(*args, **kwargs)
    if pre is not None:
        safe(lambda: on_split(st, child, out[0], int(split_len), pre))
    return out


def _track_write(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        safe(st.prepare23, arg(args, kwargs, 0, "node_id"))
    return wrapped(*args, **kwargs)


def _finish_write_ack(wrapped: Callable[..., Any], instance: RadixCache, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        safe(st.ack_d2h23, arg(args, kwargs, 0, "ack_id"))
    return wrapped(*args, **kwargs)


def commit_load_back_site(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    """``reload`` at the tree core's ``commit_load_back(node_id, device_indices, kv_xfer, ...)`` (either core's)."""
    st = _st(instance)
    if st is not None:
        safe(st.reload23, arg(args, kwargs, 0, "node_id"), arg(args, kwargs, 1, "device_indices"),
             arg(args, kwargs, 2, "kv_xfer"))
    return wrapped(*args, **kwargs)


def _evict_component(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    """``_evict_component_and_detach_lru(node, comp, device_frees, host_frees, cache_actions, target, tracker)``."""
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    node = arg(args, kwargs, 0, "node")
    pre = safe(_pre_evict, st, node, arg(args, kwargs, 1, "comp"), arg(args, kwargs, 2, "device_frees"))
    out = wrapped(*args, **kwargs)
    if pre is not None:
        safe(_on_evict, st, node, pre)
    return out


def _pre_evict(st: State23, node: TreeNode, comp: EvictComponent,
               dfrees: Mapping[int, list[Tensor]]) -> tuple | None:
    """The FULL component's eviction of ``node``, before the call: its device and host values, the frees list the
    call appends to and that list's length. The call's own frees are those past it: O(1) per evicted node, never a
    scan of everything the running eviction freed before (that was quadratic in the nodes one eviction takes)."""
    if int(getattr(comp, "component_type", -1)) != FULL:
        return None
    lst = dfrees.get(FULL)
    return st.dev(node), st.host(node), dfrees, (len(lst) if lst is not None else 0)


def _on_evict(st: State23, node: TreeNode, pre: tuple) -> None:
    dev, host, dfrees, n_before = pre
    kind = st.evict_kind
    if dev is not None and any(t is dev for t in dfrees.get(FULL, ())[n_before:]):
        st.evict("dev", node, kind or ("backuped" if st.host(node) is not None else "regular"), dev)
    if host is not None and st.host(node) is None:
        if kind == "dup":   # a host duplicate reclaimed: the node keeps its device copy
            st.expect_free[id(host)] = (host, node.id, "dup")
        else:
            st.evict("host", node, kind or "host", host)


def _kind(kind: str) -> Any:
    def wrapper(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
        st = _st(instance)
        if st is None:
            return wrapped(*args, **kwargs)
        prev, st.evict_kind = st.evict_kind, kind
        try:
            return wrapped(*args, **kwargs)
        finally:
            st.evict_kind = prev
    return wrapper


def _dev_free_segment(wrapped: Callable[..., Any], instance: Allocator, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    if not st.in_free:
        safe(free_nonempty, st, "dev", arg(args, kwargs, 0, "free_index"))
    st.in_free += 1   # the base class's free_segment frees through free(): one record
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.in_free -= 1


# (module, "Class.method", wrapper): every site, for UnifiedRadixCache builds (sglang 0.5.23).
SITES23: list[tuple[str, str, Any]] = [
    (URC, "UnifiedRadixCache.init_hicache", _init_hicache),
    (URC, "UnifiedRadixCache.reset", reset_site),
    (URC, "UnifiedRadixCache.match_prefix", _match_prefix),
    (URC, "UnifiedRadixCache.init_load_back", _init_load_back),
    (URC, "UnifiedRadixCache._track_write_through_node", _track_write),
    (URC, "UnifiedRadixCache._finish_write_through_ack", _finish_write_ack),
    (URC, "UnifiedRadixCache.loading_check", loading_check_site),
    (UTC, "UnifiedTreeCore._add_new_node", _add_new_node),
    (UTC, "UnifiedTreeCore._unevict_node_on_insert", _unevict),
    (UTC, "UnifiedTreeCore._split_node", _split_node),
    (UTC, "UnifiedTreeCore.commit_load_back", commit_load_back_site),
    (UTC, "UnifiedTreeCore._evict_component_and_detach_lru", _evict_component),
    (UTC, "UnifiedTreeCore.drop_subtree_no_host", _kind("drop")),
    (UTC, "UnifiedTreeCore._release_full_host_duplicate", _kind("dup")),
    (BASE_ALLOC, "BaseTokenToKVPoolAllocator.free_segment", _dev_free_segment),
    (PAGED_ALLOC, "PagedTokenToKVPoolAllocator.free_segment", _dev_free_segment),
    (TOKEN_ALLOC, "TokenToKVPoolAllocator.free", dev_free),
    (PAGED_ALLOC, "PagedTokenToKVPoolAllocator.free", dev_free),
    # a hybrid SWA tree's allocator: its free/free_segment release full slots with their SWA peers, free_full*
    # the full slots alone (the free pool=dev records); its SWA-only frees (free_swa*) are the SWA pool's
    (SWA_ALLOC, "SWATokenToKVPoolAllocator.free", _dev_free_segment),
    (SWA_ALLOC, "SWATokenToKVPoolAllocator.free_full", _dev_free_segment),
    (SWA_ALLOC, "SWATokenToKVPoolAllocator.free_segment", _dev_free_segment),
    (SWA_ALLOC, "SWATokenToKVPoolAllocator.free_full_segment", _dev_free_segment),
    (HOST_POOL, "HostKVCache.free", host_free),
    *L3_SITES23,
    (URC, "UnifiedRadixCache.attach_storage_backend", _attach_storage_backend),
    *LAYERWISE_SITES23,
    *SWA_SITES23,
    *MAMBA_SITES23,
]
