"""The SGLang surface we touch: one ``typing.Protocol`` per SGLang object the instrumentation reads, with
exactly the attributes and methods it reads (or sets: ``_cptrace_sg``, the cache's state), each naming the SGLang
0.5.20 / 0.5.23 class it stands for.

Type information only: nothing here runs inside SGLang's calls and no module imports this one at run time for more
than the names (SGLang itself is never imported here; ``torch`` only for the type checker). SGLang's classes are not
checked against these Protocols (SGLang ships no type information); they are the contract a successor reads to see
which SGLang attributes a new SGLang version must keep, and what the type checker holds our code to.

Where the two versions differ, one Protocol covers both and a member's comment says which version has it: the
shared code reads such a member only through the version's own accessors (``State``/``State23``, ``Reads``/
``Reads23``), and a member whose type differs by version is typed by what both have in common.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from torch import Tensor


class Traced(Protocol):
    """An SGLang object the instrumentation attaches a cache's state to (attribute ``_cptrace_sg``: the ``State``,
    None once detached); the wrappers of its methods find the state there."""

    _cptrace_sg: object


# -- the radix tree ---------------------------------------------------------------------------------------------
class RadixKey(Protocol):
    """``sglang.srt.mem_cache.radix_cache.RadixKey`` (0.5.20 and 0.5.23): a node's or a request's token key."""

    def __len__(self) -> int: ...

    def __getitem__(self, s: slice, /) -> RadixKey: ...

    def child_key(self, page_size: int) -> object: ...

    def match(self, other: RadixKey, page_size: int = ...) -> int: ...

    def maybe_to_bigram_view(self, is_eagle: bool) -> tuple[RadixKey, object]: ...

    def page_aligned(self, page_size: int) -> RadixKey: ...


class ComponentData(Protocol):
    """0.5.23's ``unified_cache.components.base.ComponentData``: one component's slots and locks on a node."""

    value: Tensor | None
    host_value: Tensor | None
    lock_ref: int
    host_lock_ref: int


class TreeNode(Protocol):
    """A radix tree node: 0.5.20's ``radix_cache.TreeNode`` (HiRadixCache's), 0.5.23's
    ``unified_cache.unified_tree_core.UnifiedTreeNode``."""

    id: int
    parent: TreeNode   # (None at the root only: no site reads the root's parent)
    key: RadixKey
    children: Mapping[object, TreeNode]
    write_through_pending_id: int | None
    hash_value: list[str] | None
    evicted: bool
    # 0.5.20 only (read through State.dev/host/lock/href and 0.5.20's own sites)
    value: Tensor | None
    host_value: Tensor | None
    lock_ref: int
    host_ref_counter: int
    # 0.5.23 only (read through State23's accessors), indexed by ComponentType
    component_data: Sequence[ComponentData]


class EvictComponent(Protocol):
    """0.5.23's tree component (``unified_cache.components``) an eviction step runs for."""

    component_type: int   # a ComponentType


class TreeCore(Traced, Protocol):
    """0.5.23's ``unified_cache.unified_tree_core.UnifiedTreeCore`` (the Python tree core)."""

    root_node: TreeNode
    page_size: int

    def node_by_id(self, node_id: int, /) -> TreeNode: ...

    # the boundary both cores answer (the Rust one's only way to its nodes: ._rust23)
    def root_node_handle(self) -> int: ...

    def collect_path_info(self, end_node_ids: list[int], /) -> tuple[tuple[Any, ...], ...]: ...

    def is_backuped(self, node_id: int, /) -> bool: ...

    def is_full_device_evicted(self, node_id: int, /) -> bool: ...

    def get_component_device_value(self, node_id: int, component_type: int, /) -> Tensor | None: ...

    def build_storage_backup_spec(self, node_id: int, with_hash: bool, /) -> Any: ...


# -- pools and allocators ---------------------------------------------------------------------------------------
class LayerDoneCounter(Protocol):
    """``managers.cache_controller.LayerDoneCounter`` (0.5.23's layer-wise load-back)."""

    producer_index: int
    consumer_index: int
    num_counters: int
    events: Sequence[LayerLoadingEvent]


class LayerLoadingEvent(Protocol):
    """``managers.cache_controller.LayerLoadingEvent``: ``complete(layer_index)``, set on the object per step in
    flight (an instance attribute over the method)."""

    complete: Callable[..., None]


class IndexKeyCache(Protocol):
    """The DSA indexer's key cache of a device pool (0.5.23, ``index_key_cache``)."""

    def get_local_buffer(self, layer_id: int, /) -> Tensor: ...


class KVPool(Protocol):
    """The device KV pool (``memory_pool.MHATokenToKVPool``, ``MLATokenToKVPool``, DSA's pool; 0.5.20 and 0.5.23).
    The buffers are read with ``getattr`` where a layout may lack them."""

    dtype: object
    k_buffer: Sequence[Tensor]
    v_buffer: Sequence[Tensor]
    kv_buffer: Sequence[Tensor]
    # 0.5.23's layer-wise load-back (the per-layer read sites)
    start_layer: int
    layer_transfer_counter: LayerDoneCounter | None
    index_key_cache: IndexKeyCache | None


class SwaKVPool(Protocol):
    """0.5.23's ``swa_memory_pool.SWAKVPool`` (a hybrid full + sliding-window model's device pool): the pools of its
    full-attention and its sliding-window layers."""

    full_kv_pool: KVPool
    swa_kv_pool: KVPool


class MambaPoolHost(Protocol):
    """0.5.23's ``pool_host.mamba.MambaPoolHost`` (a hybrid full + Mamba model's host state pool): the device state
    tensors it copies per slot (per layer: the temporal (SSM) state, each conv state) and the side states that ride
    along."""

    temporal_device_layers: Sequence[Tensor]
    conv_device_layers: Sequence[Sequence[Tensor]]
    slot_state_device_tensors: Sequence[Tensor]


class SidecarPool(Protocol):
    """A sidecar device pool on the KV's slots (0.5.23: the DSA indexer's, ``index_k_with_scale_buffer``)."""

    index_k_with_scale_buffer: Sequence[Tensor]
    index_page_size: int


class HostKVCache(Traced, Protocol):
    """``mem_cache.pool_host.base.HostKVCache`` and its MHA/MLA subclasses (0.5.20 and 0.5.23). ``k_buffer`` /
    ``v_buffer`` / ``kv_buffer`` as SGLang's ``init_kv_buffer`` lays them out (the audit's ``host_rows``)."""

    layout: str
    kv_buffer: Tensor
    k_buffer: Tensor
    v_buffer: Tensor

    def get_data_page(self, index: int, flat: bool = ...) -> Tensor: ...


class Allocator(Traced, Protocol):
    """The device allocator (``allocator.token.TokenToKVPoolAllocator``, ``allocator.paged.
    PagedTokenToKVPoolAllocator``; 0.5.20 and 0.5.23)."""

    def get_kvcache(self) -> KVPool: ...


class PoolName(Protocol):
    """0.5.23's ``PoolName`` (a string enum) of a pool of a host pool group, or of a pool a copy op moves."""

    value: str


class PoolEntry(Protocol):
    """0.5.23's ``pool_host.group.PoolEntry``: one pool of a host pool group."""

    host_pool: HostKVCache
    device_pool: SidecarPool


class HostPoolGroup(Protocol):
    """0.5.23's ``pool_host.group.HostPoolGroup`` (the controller's ``mem_pool_host``)."""

    anchor_entry: PoolEntry
    entry_map: Mapping[object, PoolEntry]

    def get_pool(self, name: object, /) -> HostKVCache: ...


class SidecarSpec(Protocol):
    """0.5.23's sidecar pool spec of a cache (``sidecar_pool_specs``)."""

    pool_name: object   # a PoolName
    indices_from_pool: object   # a PoolName ("kv": the KV's slots)


# -- the controller and its operations --------------------------------------------------------------------------
class PoolTransfer(Protocol):
    """0.5.23's ``PoolTransfer``: one pool's part of a copy op (``pool_transfers``), or a load-back's KV part."""

    name: object   # a PoolName
    nodes_to_load: Sequence[int] | None
    host_indices: Tensor
    device_indices: Tensor | None   # (a component's transfer: its own pool's slots)


class CacheOperation(Protocol):
    """``managers.cache_controller.CacheOperation`` (a queued device<->host copy; 0.5.20 and 0.5.23)."""

    counter: ClassVar[int]
    id: int
    node_ids: list[int]
    device_indices: Tensor
    host_indices: Tensor
    pool_transfers: Sequence[PoolTransfer] | None   # 0.5.23


class LoadAck(Protocol):
    """``managers.cache_controller.HiCacheAck``: an entry of the controller's ``ack_load_queue`` (0.5.20 and
    0.5.23)."""

    node_ids: Sequence[int]


class StorageOperation(Protocol):
    """``managers.cache_controller.StorageOperation`` (0.5.23: ``hybrid_cache.hybrid_cache_controller.
    StorageOperation``): an L3 backup (its ack)."""

    id: int
    completed_tokens: int


class PrefetchOperation(Protocol):
    """``managers.cache_controller.PrefetchOperation`` (0.5.23: ``hybrid_cache.hybrid_cache_controller.
    PrefetchOperation``): an L3 query and prefetch."""

    id: int
    request_id: str
    storage_hit_count: int
    all_hash_values: list[str] | None
    hash_value: list[str]
    host_indices: Tensor | None
    completed_tokens: int
    handle: object   # 0.5.23 (HybridCacheController's PrefetchOperation): the key of ongoing_prefetch


class CacheController(Traced, Protocol):
    """The HiCache controller: 0.5.20's ``managers.cache_controller.HiCacheController``, 0.5.23's
    ``hybrid_cache.hybrid_cache_controller.HybridCacheController`` (a ``HiCacheController``)."""

    write_policy: str
    io_backend: str
    page_size: int
    write_queue: list[CacheOperation]
    load_queue: list[CacheOperation]
    ack_load_queue: list[LoadAck]
    mem_pool_device_allocator: Allocator   # 0.5.20
    mem_pool_host: HostPoolGroup   # 0.5.23 (0.5.20's is the host pool itself: not read there)
    mem_pool_device: KVPool
    # the L3 storage tier
    storage_backend: object   # a HiCacheStorage (read with getattr: _l3_meta.folder)
    storage_backend_type: str | None
    storage_host_pool: HostKVCache
    backup_skip: bool
    prefetch_hit_queue: queue.Queue[PrefetchOperation]
    ack_backup_queue: queue.Queue[StorageOperation]
    # 0.5.23's layer-wise load-back
    layer_done_counter: LayerDoneCounter
    transfer_layer_id_max: int


# -- the cache ----------------------------------------------------------------------------------------------------
class TreeComponent(Protocol):
    """0.5.23's ``ComponentType`` (an ``IntEnum``) of a cache's ``tree_components``."""

    name: str

    def __int__(self) -> int: ...


class RadixCache(Traced, Protocol):
    """The HiCache radix cache: 0.5.20's ``mem_cache.hiradix_cache.HiRadixCache``, 0.5.23's
    ``mem_cache.unified_radix_cache.UnifiedRadixCache``."""

    page_size: int
    cache_controller: CacheController
    root_node: TreeNode   # (0.5.23's sites read the tree core's)
    attn_cp_group: object
    # pending host writes by ack id: 0.5.20 ``(lock node, backup length, publish nodes)``, 0.5.23 an
    # ``_OngoingWriteThrough`` (node_id, publish_node_ids): each version's State reads its own
    ongoing_write_through: Mapping[int, Any]
    # 0.5.20
    is_eagle: bool
    kv_cache: KVPool
    token_to_kv_pool_host: HostKVCache   # (absent without a host pool: read with getattr)
    evictable_host_leaves: set[TreeNode]
    # 0.5.23
    token_to_kv_pool_allocator: Allocator
    tree_core: TreeCore
    tree_components: Sequence[TreeComponent]
    enable_storage: bool
    buffer_pipeline: object
    linker: object
    sidecar_pool_specs: Sequence[SidecarSpec] | None
    # the L3 storage tier: the in-flight prefetches (0.5.20 by request id: ``(node, ..., op)``; 0.5.23 by handle: an
    # ``_OngoingPrefetch``) and backups (0.5.20: op id -> node; 0.5.23: op id -> ``(node id, ...)``), read by the
    # version's ``Reads``
    ongoing_prefetch: Mapping[object, Any]
    ongoing_backup: Mapping[int, Any]

    def _clamp_prefetch_result(self, op: PrefetchOperation, /) -> int: ...   # 0.5.20


# -- what a site is called with ---------------------------------------------------------------------------------
class Request(Protocol):
    """``managers.schedule_batch.Req``: the request a match or load-back is for (``params.req``)."""

    rid: str
    origin_input_ids: Sequence[int]


class CacheParams(Protocol):
    """``base_prefix_cache.MatchPrefixParams`` / ``InitLoadBackParams`` / ``InsertParams`` (0.5.20 and 0.5.23):
    the request's key and, where the scheduler passes it, the request."""

    key: RadixKey
    req: Request | None


class MatchResult(Protocol):
    """0.5.20's ``base_prefix_cache.MatchResult`` of ``HiRadixCache.match_prefix``."""

    device_indices: Tensor
    last_device_node: TreeNode
    host_hit_length: int


class MatchResult23(Protocol):
    """0.5.23's ``MatchResult`` of ``UnifiedRadixCache.match_prefix`` (nodes by id)."""

    device_prefix_len: int
    last_device_node: int
    host_hit_length: int
