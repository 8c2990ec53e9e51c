"""Drive real SGLang 0.5.23 HiCache over a hybrid full + Mamba tree (Qwen3-Next, Qwen3.5 GDN, Kimi-Linear, Nemotron-H
style): ``UnifiedRadixCache`` with the FULL and MAMBA components (what ``registry.create_unified_radix_cache`` builds
for a model with linear-attention layers) over a ``HybridLinearKVPool`` (the full-attention layers' MHA pool) and a
``HybridReqToTokenPool`` whose ``MambaPool`` holds one conv + SSM state per slot; ``init_hicache`` picks SGLang's own
strategy (``_MambaStrategy``), which adds a ``MambaPoolHost`` beside the KV anchor in the host pool group. The Python
tree core, or with ``boundary`` (``--boundary``) the one SGLang selects, its Rust one (:class:`BoundaryMambaDriver`);
page size 1 and no extra buffer (what ``MambaComponent`` asserts then); the
page-first direct host layout (the only layouts ``MambaPoolHost`` takes; runtime.py gives its copies their CPU answer).

The scheduler steps are ``driver.Driver23``'s plus what the scheduler does with a request's Mamba state: the match
copies (copy-on-write) a device-resident state into the request's own slot, a load-back of a host-only state copies
it into the node's new slot and the request's, a request without a state gets a fresh slot; the forward checks the
state it starts from (the state after the matched prefix: the match ends where a node holds one) and writes the
state after its whole prompt, which the request's insert donates to the tree as the new leaf's state (the
request's slot is freed instead where the tree already has one). The state of a prefix is a function of its tokens
(every Mamba layer's SSM and conv state), so what comes back from the host can be compared with what must be
there; the host audit also checks the Mamba host copy of every complete backup.

Faults (:data:`MAMBA_FAULTS`): ``mamba_flip`` flips one byte of the host copy of the first load-back's Mamba state
before the copy reads it (the state of a round trip corrupted on the host; the full KV stays right).
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Any

from tests.sglang_real import driver, rust_driver

FULL_LAYERS, MAMBA_LAYERS = [1, 3], [0, 2]
MAMBA_SLOTS = 40   # device state slots: fewer than the leaves the stream caches, so states are evicted and reloaded
CHUNK = 64         # the Mamba cache chunk (FLA's; a dummy model has no HF config to read it from)
MAMBA_FAULTS = ("mamba_flip",)


def conversation_stream(seed: int, n: int, page_size: int, chats: int = 8) -> list[list[int]]:
    """Seeded multi-turn prompts: each continues one of a few conversations (its previous prompt plus a new turn)
    or starts it over from its system prompt, so prompts end where earlier ones did (the only prefixes whose Mamba
    state the tree keeps: the state after a cached prompt's last token)."""
    import random

    r = random.Random(seed)
    systems = [[r.randrange(1, 5000) for _ in range(r.choice((8, 12, 16)))] for _ in range(chats)]
    last = [list(s) for s in systems]
    out = []
    for _ in range(n):
        c = r.randrange(chats)
        if len(last[c]) > 96 or r.random() < 0.15:
            last[c] = list(systems[c])
        last[c] = last[c] + [r.randrange(1, 5000) for _ in range(r.randrange(4, 16))]
        out.append(list(last[c]))
    return out


class _MambaKv:
    """0.5.23's ``req.kv`` as a Mamba hybrid's match, load-back and insert read and write it."""

    def __init__(self) -> None:
        self.mamba_pool_idx: Any = None
        self.mamba_cow_src_index: Any = None
        self.mamba_needs_clear = False
        self.mamba_last_track_seqlen = None
        self.mamba_prev_track_seqlen = None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


def build_mamba(policy: str, page_size: int, dev_tokens: int, host_ratio: float, cp_group: Any,
                tp_group: Any) -> tuple[Any, Any, Any]:
    """``driver.build23`` with the FULL and MAMBA components: a ``HybridReqToTokenPool`` (Mamba2 state shapes, SSM
    state float32, conv bfloat16) and the ``HybridLinearKVPool`` over its ``MambaPool``. Returns the full-attention
    layers' pool as the KV pool (the one the driver's KV checks read)."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    box: dict = {}

    def make_kv(dev_tokens: int, page_size: int) -> Any:
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("float32"):
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2,
                                            head_dim=16, state_size=4, conv_kernel=4)
            params = Mamba2CacheParams(shape=shape, layers=MAMBA_LAYERS)
        box["req_pool"] = HybridReqToTokenPool(
            size=64, mamba_size=MAMBA_SLOTS, mamba_spec_state_size=64, max_context_len=256, device="cpu",
            enable_memory_saver=False, cache_params=params, mamba_layer_ids=MAMBA_LAYERS,
            enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3)
        return HybridLinearKVPool(size=dev_tokens, dtype=torch.float32, page_size=page_size, head_num=driver.HEADS,
                                  head_dim=driver.DIM, full_attention_layer_ids=FULL_LAYERS, device="cpu",
                                  enable_memory_saver=False, mamba_pool=box["req_pool"].mamba_pool)

    def params_hook(params: Any) -> None:
        from sglang.srt.runtime_context import get_server_args

        get_server_args()._mamba_cache_chunk_size = CHUNK
        params.tree_components = (ComponentType.FULL, ComponentType.MAMBA)
        params.req_to_token_pool = box["req_pool"]

    cache, kv, alloc = driver.build23(policy, page_size, dev_tokens, host_ratio, cp_group, tp_group, make_kv=make_kv,
                                      server_args={"hicache_mem_layout": "page_first_direct"},
                                      params_hook=params_hook)
    return cache, kv.full_kv_pool, alloc


# -- the state of a prefix -------------------------------------------------------------------------------------
def _device_parts(cache: Any) -> list[Any]:
    """The Mamba pool's state tensors, ``[layers, slots, ...]`` each: the SSM (temporal) state, then each conv."""
    st = cache.req_to_token_pool.mamba_pool.mamba_cache
    return [st.temporal, *st.conv]


def _host_parts(hp: Any) -> list[Any]:
    """The ``MambaPoolHost``'s page-first buffers as ``[layers, slots, ...]`` views, in :func:`_device_parts`'s
    order."""
    return [b.select(2, 0).transpose(0, 1) for b in (hp.temporal_buffer, *hp.conv_buffer)]


def expected_state(cache: Any, tokens: list[int]) -> list[Any]:
    """The state after ``tokens``, per part of :func:`_device_parts` (``[layers, ...]``): another function of the
    prefix per layer and part."""
    import torch

    h = driver._prefix_hashes(tokens)[-1] if tokens else 0
    out = []
    for part_no, part in enumerate(_device_parts(cache)):
        shape = (part.shape[0], *part.shape[2:])
        n = math.prod(shape)
        v = ((h * 31 + part_no * 7 + torch.arange(n, dtype=torch.int64) * 3) % 9973 + 1).to(torch.float32) / 97.0
        out.append(v.view(shape).to(part.dtype))
    return out


def _same(parts: list[Any], slot: int, want: list[Any]) -> bool:
    return all(bool((p[:, slot] == w).all()) for p, w in zip(parts, want, strict=True))


class MambaDriver(driver.Driver23):
    """:class:`driver.Driver23` over a full + Mamba tree: the requests' states copied, checked, written and donated
    (see the module)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.stats.update({"mamba_checked": 0, "mamba_loaded": 0, "mamba_host_checked": 0})
        self.fault_hits: list[dict] = []   # what the injected fault did (install_fault)
        self.slots = self.cache.req_to_token_pool.mamba_allocator

    def own_state(self, req: driver.Req) -> bool:
        """A fresh state slot for ``req`` where it holds none (evicting Mamba states for it); False: no room."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if req.kv.holds_mamba:
            return True
        got = self.slots.alloc(1)
        if got is None:
            self.cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
            got = self.slots.alloc(1)
        if got is None:
            return False
        req.kv.mamba_pool_idx = got[0]
        return True

    def drop_state(self, req: driver.Req) -> None:
        if req.kv.holds_mamba:
            self.slots.free(req.kv.mamba_pool_idx.unsqueeze(0))
        req.kv = _MambaKv()

    def match(self, req: driver.Req) -> None:
        """:meth:`driver.Driver23.match` with the request's Mamba state: copied on write from a device-resident one
        (the match's ``cow_mamba``), loaded with a host-only one (``mamba_host_hit_length``)."""
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        req.kv = _MambaKv()
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(req.tokens), req=req, cow_mamba=True))
        req.mamba_host_hit_length = m.mamba_host_hit_length
        plen, last = m.device_prefix_len, m.last_device_node
        req.last_node = last
        if m.host_hit_length > 0 or m.mamba_host_hit_length > 0:
            held = req.kv.holds_mamba
            n, last = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                          host_hit_length=m.host_hit_length, req=req))
            if n or last == m.best_match_node:
                self.stats["loads"] += 1
                plen += n
                if req.kv.holds_mamba and not held:
                    self.stats["mamba_loaded"] += 1
        # the state the request starts from is the one of the node the match ended at, when it got one
        req.state_len = plen if req.kv.holds_mamba and last == m.best_match_node else None
        req.prefix_idx = c.path_device_indices(last)[:plen] if plen else torch.empty((0,), dtype=torch.int64)
        req.last_node = last
        req.lock = c.inc_lock_ref(last).to_dec_params()

    def forward(self, req: driver.Req, new: Any) -> None:
        super().forward(req, new)
        self.forward_state(req)

    def forward_state(self, req: driver.Req) -> None:
        """The Mamba layers' forward: the deferred copy-on-write of a matched device state (the scheduler's
        ``mamba_cow_src_index``), the check of the state it starts from, the state after the whole prompt written."""
        pool = self.cache.req_to_token_pool.mamba_pool
        dst = req.kv.mamba_pool_idx.view(1)
        if req.kv.mamba_cow_src_index is not None:
            pool.copy_from(req.kv.mamba_cow_src_index.view(1), dst)
            req.kv.mamba_cow_src_index = None
        slot = int(dst[0])
        if req.state_len:
            self.stats["mamba_checked"] += 1
            if not _same(_device_parts(self.cache), slot, expected_state(self.cache, req.tokens[:req.state_len])):
                nodes = [nid for nid, _, e in self._nodes_of(req.tokens, req.state_len) if e == req.state_len]
                self.corruption.append({"step": self.copies.step, "where": "device-mamba", "rid": req.rid,
                                        "nodes": nodes})
        for part, want in zip(_device_parts(self.cache), expected_state(self.cache, req.tokens), strict=True):
            part[:, slot] = want

    def finish(self, req: driver.Req) -> Any:
        """The request's insert, its state donated (the id of the insert's last device node)."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        res = c.insert(InsertParams(key=RadixKey(req.tokens), value=req.all_idx, prev_prefix_len=len(req.prefix_idx),
                                    mamba_value=req.kv.mamba_pool_idx.unsqueeze(-1).clone()))
        if res.mamba_exist:   # cache_finished_req: the tree has this state already, the request's slot goes
            self._drop_state(req)
        c.dec_lock_ref(req.last_node, req.lock)
        return res.last_device_node

    def host_ok(self, hp: Any, hv: Any, tokens: list[int], start: int) -> bool:
        """:meth:`driver.Driver.host_ok` over the page-first KV host pool (``[page, layer, 1, heads, dim]``)."""
        import torch

        got = torch.cat([hp.k_buffer[hv, :, 0], hp.v_buffer[hv, :, 0]], dim=1)
        return bool((got == driver.expected_rows(tokens)[start:]).all())

    def audit_host(self) -> None:
        """Every complete host copy: its full KV (``driver.Driver23``'s audit) and its Mamba host state, where the
        node has one, equal the expected ones."""
        super().audit_host()
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        c = self.cache
        parts = _host_parts(mamba_host_pool(c))
        pending = self.pending_ids()
        for child, _, toks in self.walk():
            hv = child.component_data[ComponentType.MAMBA].host_value
            if hv is not None and child.id not in pending:
                self.stats["mamba_host_checked"] += 1
                if not _same(parts, int(hv[0]), expected_state(c, toks)):
                    self.corruption.append({"step": self.copies.step, "where": "host-mamba", "nodes": [child.id]})


def mamba_host_pool(cache: Any) -> Any:
    """The ``MambaPoolHost`` of the cache's host pool group."""
    from sglang.srt.mem_cache.hicache_storage import PoolName

    return cache.cache_controller.mem_pool_host.get_pool(PoolName.MAMBA)


def install_fault(cache: Any, hits: list[dict], kind: str | None) -> None:
    """``mamba_flip``: at the first load-back with a Mamba transfer, one byte of the SSM state of its host slot
    flipped before the copy reads it (:func:`driver.at_first_load`)."""
    if kind != "mamba_flip":
        return

    def corrupt(t: Any) -> int:
        slot = int(t.host_indices[0])
        mamba_host_pool(cache).temporal_buffer[slot].view(-1)[0] += 1.0
        return slot

    driver.at_first_load(cache, hits, kind, "mamba", corrupt)


class BoundaryMambaDriver(MambaDriver, rust_driver.BoundaryDriver23):
    """:class:`MambaDriver` over the tree core SGLang selects, its Rust one included: the tree read through the
    core's interface (rust_driver.py). Its host audit checks the full KV host copies only (it reads no node's Mamba
    host slot through that interface); the state a load brings back is still checked where the forward starts from
    it (:meth:`MambaDriver.forward_state`)."""

    def finish(self, req: driver.Req) -> None:
        self.known[super().finish(req)] = req.tokens   # (rust_driver.py's audit walks the paths of known nodes)

    def audit_host(self) -> None:
        rust_driver.BoundaryDriver23.audit_host(self)


def run(out: str, fault: str | None = None, boundary: bool = False, **kw: Any) -> dict:
    """One run of ``driver.run`` over the hybrid tree (``fault``: one of :data:`MAMBA_FAULTS`); ``boundary``: over
    the tree core SGLang selects (the Rust one, in a process with its torch: ``runtime.sglang_env(..., rust=True)``),
    with :class:`BoundaryMambaDriver` and ``array('q')`` prompts."""
    kw.setdefault("dev_tokens", 320)
    kw.setdefault("requests", 80)
    stream = (lambda *a: [array("q", t) for t in conversation_stream(*a)]) if boundary else conversation_stream
    with rust_driver.core_selected_by_sglang(boundary):
        return driver.run_hybrid(out, build_mamba, BoundaryMambaDriver if boundary else MambaDriver, install_fault,
                                 fault, "mamba_fault_hits", stream=stream, **kw)


if __name__ == "__main__":
    sys.exit(driver.hybrid_main(__doc__, MAMBA_FAULTS, run))
