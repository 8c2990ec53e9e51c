"""Drive real SGLang HiCache (0.5.20: ``HiRadixCache`` + ``HiCacheController``; 0.5.23: ``UnifiedRadixCache`` +
``HybridCacheController``, :class:`Driver23`; their pools and allocators) the way the scheduler does, on CPU, with
the instrumentation on, and check the KV content itself.

One scheduler step: ``copies.tick`` (copies due now complete), ``check_hicache_events`` (writing_check /
loading_check, all-reduced over the CP group), then a batch of requests is admitted: for each, ``match_prefix``,
``init_load_back`` when the match ends on the host (match then load, request by request, as the scheduler does: a
later request's match can split a node whose load is still in flight), ``inc_lock_ref`` of its last node;
``ready_to_load_host_cache`` starts the batch's loads and the forward waits for them; the forward allocates the
new tokens' slots (``evict`` under memory pressure), checks the matched prefix's KV against the expected bytes and
stores the new tokens' KV into the device pool. A request finishes 0-2 steps later: ``insert`` (write-through
backups happen here), the duplicate slots freed (``cache_finished_req``'s ``[cache_protected_len, new_prefix)``),
``dec_lock_ref``. A reset (flush) may happen mid-run, between requests.

The KV of token ``p`` of a prompt depends on the whole prefix ``tokens[:p+1]`` (as a model's does), so what comes
back from any tier can be compared with what must be there. :func:`run` returns these observations
(``corruption``), what the injected fault did, and where the records went.

CLI (one JSON summary on stdout), from the repository root:
``python -m tests.sglang_real.driver --version 0.5.20 --out DIR [options]``;
``--world N`` runs N CP ranks (gloo, ``file://`` store) as N processes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from tests.sglang_real import runtime

LAYERS, HEADS, DIM = 2, 1, 4
# Another configuration for the next caches built (l3_driver.py's runs of another model or KV dtype): ``model_path``
# (ServerArgs') and ``kv_dtype`` (a torch dtype name, of the device KV pool, so also of its host pool); 0.5.23's
# ``tree_core`` (:func:`build23`)
POOL: dict[str, str] = {}


def _prefix_hashes(tokens: list[int]) -> list[int]:
    out, h = [], 1469598103
    for t in tokens:
        h = (h * 1000003 ^ (t + 1)) & 0xFFFFFFFF
        out.append(h)
    return out


def expected_rows(tokens: list[int]) -> Any:
    """``[len(tokens), 2*LAYERS, HEADS, DIM]`` float32: the KV of every position (K of each layer, then V)."""
    import torch

    h = torch.tensor(_prefix_hashes(tokens), dtype=torch.int64)[:, None, None, None]
    lay = torch.arange(2 * LAYERS, dtype=torch.int64)[None, :, None, None]
    d = torch.arange(HEADS * DIM, dtype=torch.int64).view(1, 1, HEADS, DIM)
    return (((h * 31 + lay * 7 + d * 3) % 9973) + 1).to(torch.float32) / 97.0


def _bufs(pool: Any) -> list:
    return list(pool.k_buffer) + list(pool.v_buffer)


def read_rows(pool: Any, idx: Any) -> Any:
    import torch

    return torch.stack([b[idx] for b in _bufs(pool)], dim=1)


def write_rows(pool: Any, idx: Any, rows: Any) -> None:
    for i, b in enumerate(_bufs(pool)):
        b[idx] = rows[:, i].to(b.dtype)   # (a pool of another KV dtype, POOL: the expected values, cast)


class _ReqKv:
    """0.5.23's ``req.kv`` as read by a full-attention load back (no Mamba state)."""

    mamba_pool_idx = None


class Req:
    """What the cache's calls read from a request (``rid``, ``origin_input_ids``)."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.rid = rid
        self.origin_input_ids = tokens
        self.tokens = tokens
        self.prefix_idx: Any = None
        self.last_node: Any = None
        self.all_idx: Any = None
        self.finish_step = 0
        # what 0.5.23's calls read besides (a plain, non-streaming full-attention request)
        self.session = None
        self.extra_key = None
        self.swa_host_hit_length = 0
        self.mamba_host_hit_length = 0
        self.lock: Any = None
        self.kv = _ReqKv()
        self.kv_rotation_base: int | None = None   # (0.5.23 KV sharding: the chain's first page owner)


def request_stream(seed: int, n: int, page_size: int, families: int = 6) -> list[list[int]]:
    """Seeded prompts sharing prefixes: a few families of system prompts, sub-prefixes, random tails (page-aligned
    lengths, as the paged allocator needs)."""
    r = random.Random(seed)
    fams = [[r.randrange(1, 5000) for _ in range(r.choice((24, 32, 40)))] for _ in range(families)]
    out = []
    for _ in range(n):
        base = list(r.choice(fams))
        if r.random() < 0.5:
            base = base[: r.randrange(8, len(base) + 1)]
        tail = [r.randrange(1, 5000) for _ in range(r.randrange(4, 24))]
        toks = base + tail
        toks = toks[: len(toks) - len(toks) % page_size] if len(toks) % page_size else toks
        out.append(toks)
    return out


def _pools(policy: str, page_size: int, dev_tokens: int, host_ratio: float, cp_group: Any,
           tp_group: Any, make_kv: Any = None, server_args: dict | None = None,
           make_alloc: Any = None) -> tuple[Any, Any, Any, Any]:
    """What both versions' caches are built from: the server args (set in SGLang's runtime context, the CPU answers
    applied; ``server_args``: more of ``ServerArgs``'s fields or other values, e.g. the CP ones), the device KV pool
    (``make_kv(dev_tokens, page_size)`` where given, else an MHA pool), its allocator (``make_alloc(dev_tokens,
    page_size, kv)`` where given, else SGLang's token or paged one) and the cache's init params.
    ``(server args, kv, alloc, params)``."""
    import torch
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(**{"model_path": POOL.get("model_path", "dummy"), "device": "cpu",
                       "enable_hierarchical_cache": True, "hicache_io_backend": "direct",
                       "hicache_mem_layout": "layer_first", "hicache_write_policy": policy, "page_size": page_size,
                       "hicache_ratio": host_ratio, **(server_args or {})})
    rc.get_context().set_server_args(sa)
    runtime.apply_cpu_answers()
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    kv_dtype = getattr(torch, POOL.get("kv_dtype", "float32"))
    kv = (make_kv(dev_tokens, page_size) if make_kv is not None else
          MHATokenToKVPool(size=dev_tokens, page_size=page_size, dtype=kv_dtype, head_num=HEADS, head_dim=DIM,
                           layer_num=LAYERS, device="cpu", enable_memory_saver=False))
    if make_alloc is not None:
        alloc = make_alloc(dev_tokens, page_size, kv)
    elif page_size == 1:
        alloc = TokenToKVPoolAllocator(dev_tokens, torch.float32, "cpu", kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(dev_tokens, page_size, torch.float32, "cpu", kv, need_sort=False)
    req_pool = ReqToTokenPool(size=64, max_context_len=256, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc,
                             page_size=page_size, tp_cache_group=tp_group, attn_cp_cache_group=cp_group)
    return sa, kv, alloc, params


def build(version: str, policy: str, page_size: int, dev_tokens: int, host_ratio: float, cp_group: Any,
          tp_group: Any) -> tuple[Any, Any, Any]:
    sa, kv, alloc, params = _pools(policy, page_size, dev_tokens, host_ratio, cp_group, tp_group)
    from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

    return HiRadixCache(params, sa), kv, alloc


def build23(policy: str, page_size: int, dev_tokens: int, host_ratio: float, cp_group: Any,
            tp_group: Any, make_kv: Any = None, server_args: dict | None = None,
            make_alloc: Any = None, params_hook: Any = None) -> tuple[Any, Any, Any]:
    """sglang 0.5.23: ``UnifiedRadixCache`` with the full-attention component only (what the scheduler builds for a
    plain MHA model, ``registry.create_unified_radix_cache``; ``make_kv``: another device pool, see :func:`_pools`),
    then ``init_hicache`` (``HybridCacheController``, its host pools chosen by SGLang's strategy for the pool);
    ``server_args``, ``make_alloc``: :func:`_pools`'s; ``params_hook(params)``: edits the init params before the
    cache is built (swa_driver.py's hybrid tree: its components and window)."""
    sa, kv, alloc, params = _pools(policy, page_size, dev_tokens, host_ratio, cp_group, tp_group, make_kv,
                                   server_args, make_alloc)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params.tree_components = (ComponentType.FULL,)
    # the core pinned per cache: the Python one unless the variable or POOL says otherwise, so every driver built
    # here (L3, SWA, DSA, layer-wise, CP, the audit) runs the Python core on purpose, whatever the torch (SGLang's
    # default, the Rust core, is taken where its extension supports the torch; the instrumentation keeps it and
    # traces it at its boundary: rust_driver.py); POOL["tree_core"] = "": SGLang's own selection, as the scheduler
    # leaves it (None: the variable, else its default)
    params.tree_core_backend = os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND",
                                              POOL.get("tree_core", "python")) or None
    if params_hook is not None:
        params_hook(params)
    cache = UnifiedRadixCache(params)
    cache.init_hicache(sa, params)
    return cache, kv, alloc


class Driver:
    def __init__(self, cache: Any, kv: Any, alloc: Any, copies: runtime.Copies, seed: int, page_size: int) -> None:
        self.cache, self.kv, self.alloc, self.copies = cache, kv, alloc, copies
        self.rng = random.Random(seed + 7)
        self.page_size = page_size
        self.corruption: list[dict] = []
        self.stats = {"steps": 0, "admitted": 0, "deferred": 0, "loads": 0, "resets": 0, "host_audits": 0}

    # -- content checks ------------------------------------------------------------------------------------------
    def _nodes_of(self, tokens: list[int], upto: int) -> list[tuple[int, int, int]]:
        """``(node id, start, end)`` of the tree nodes covering ``tokens[:upto]``."""
        out, node, pos = [], self.cache.root_node, 0
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(tokens[:upto])
        while pos < upto:
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            out.append((child.id, pos, pos + len(child.key)))
            pos += len(child.key)
            node = child
        return out

    def check_prefix(self, req: Req) -> None:
        import torch

        n = len(req.prefix_idx)
        if n == 0:
            return
        at, rows = self.owned(req.prefix_idx)
        got = read_rows(self.kv, rows)
        want = expected_rows(req.tokens[:n])
        if at is not None:
            want = want[at]
        bad = (got != want).flatten(1).any(dim=1)
        if bool(bad.any()):
            pos = torch.nonzero(bad).flatten()
            pos = (pos if at is None else at[pos]).tolist()
            nodes = sorted({nid for nid, s, e in self._nodes_of(req.tokens, n) if any(s <= p < e for p in pos)})
            self.corruption.append({"step": self.copies.step, "where": "device", "rid": req.rid,
                                    "positions": len(pos), "nodes": nodes})

    def audit_host(self) -> None:
        """Every node whose host copy is complete (no pending write): its host KV equals the expected KV."""
        c = self.cache
        hp = c.token_to_kv_pool_host
        pending = {id(n) for _, _, pub in c.ongoing_write_through.values() for n in pub}
        pending |= {id(lk) for lk, _, _ in c.ongoing_write_through.values()}
        self.stats["host_audits"] += 1
        stack = [(c.root_node, [])]
        while stack:
            node, prefix = stack.pop()
            for child in list(node.children.values()):
                toks = prefix + list(child.key.token_ids)
                if child.host_value is not None and id(child) not in pending and len(child.host_value):
                    got = read_rows(hp, child.host_value)
                    want = expected_rows(toks)[len(prefix):]
                    if not bool((got == want).all()):
                        self.corruption.append({"step": self.copies.step, "where": "host", "nodes": [child.id]})
                stack.append((child, toks))

    def at_rest(self) -> list[tuple[Any, Any]]:
        """``(node id, host slots)`` of the nodes whose host copy is complete (no write pending), tree order."""
        c = self.cache
        pending = {id(n) for _, _, pub in c.ongoing_write_through.values() for n in pub}
        pending |= {id(lk) for lk, _, _ in c.ongoing_write_through.values()}
        out, stack = [], [c.root_node]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                if child.host_value is not None and id(child) not in pending and len(child.host_value):
                    out.append((child.id, child.host_value))
                stack.append(child)
        return sorted(out, key=lambda x: x[0])

    def rot(self) -> dict:
        """Flip one byte of the host copy of the complete host copy with the lowest node id (never reloaded after:
        called once the stream has ended)."""
        nodes = self.at_rest()
        if not nodes:
            raise RuntimeError("no complete host copy to corrupt")
        nid, hv = nodes[0]
        runtime.Faults._corrupt_host(self.cache, hv)
        return {"kind": "rot", "node_id": int(nid), "host_slot": int(hv[0])}

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        """The forward's write of the KV of ``tokens[start:]`` into device slots ``idx``."""
        write_rows(self.kv, idx, expected_rows(tokens)[start:])

    def host_ok(self, hp: Any, hv: Any, tokens: list[int], start: int) -> bool:
        """Whether host slots ``hv`` of the KV host pool ``hp`` hold the KV of ``tokens[start:]`` (the slots
        :meth:`owned` keeps)."""
        at, rows = self.owned(hv)
        want = expected_rows(tokens)[start:]
        return bool((read_rows(hp, rows) == (want if at is None else want[at])).all())

    def owned(self, idx: Any) -> tuple[Any, Any]:
        """``(positions, rows)``: which of the cache's slots ``idx`` this rank's pools hold (None: all of them) and
        their rows in those pools (here the slots themselves; shard_driver.py's KV sharding keeps a stripe)."""
        return None, idx

    def alloc_new(self, req: Req, need: int) -> Any:
        """The forward's ``need`` new slots for ``req`` (None: no room), as the scheduler allocates them."""
        return self.alloc.alloc(need)

    # -- the scheduler's calls -----------------------------------------------------------------------------------
    def admit(self, reqs: list[Req]) -> list[Req]:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        for req in reqs:
            m = c.match_prefix(MatchPrefixParams(key=RadixKey(req.tokens), req=req))
            idx, last = m.device_indices, m.last_device_node
            if m.host_hit_length > 0:
                vals, node = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                                 host_hit_length=m.host_hit_length, req=req))
                if len(vals):
                    self.stats["loads"] += 1
                    idx = torch.cat([idx, vals])
                last = node
            req.prefix_idx, req.last_node = idx, last
            c.inc_lock_ref(last)
        c.ready_to_load_host_cache()
        self.copies.wait_loads()   # the forward waits for its layers' loads
        running = []
        for req in reqs:
            self.check_prefix(req)
            need = len(req.tokens) - len(req.prefix_idx)
            new = self.alloc.alloc(need) if need else torch.empty((0,), dtype=torch.int64)
            if new is None:
                c.evict(EvictParams(num_tokens=need))
                new = self.alloc.alloc(need)
            if new is None:   # no room even after eviction: back to the queue
                c.dec_lock_ref(req.last_node)
                self.stats["deferred"] += 1
                continue
            self.store(new, req.tokens, len(req.prefix_idx))
            req.all_idx = torch.cat([req.prefix_idx, new])
            req.finish_step = self.copies.step + self.rng.randint(0, 2)
            running.append(req)
            self.stats["admitted"] += 1
        return running

    def finish(self, req: Req) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        res = c.insert(InsertParams(key=RadixKey(req.tokens), value=req.all_idx))
        protected = len(req.prefix_idx)
        if res.prefix_len > protected:   # cache_finished_req: the request's copies of what the tree already had
            self.alloc.free(req.all_idx[protected:res.prefix_len])
        c.dec_lock_ref(req.last_node)

    def reset(self) -> None:
        """flush_cache: every copy done and acknowledged, then the tree, the host pool and the allocator cleared."""
        self.settle()
        self.cache.reset()
        self.alloc.clear()
        self.stats["resets"] += 1

    def settle(self) -> None:
        self.copies.drain()
        self.copies.step += 1000
        self.cache.check_hicache_events()
        self.copies.step -= 1000

    def requeue(self, queue: list[Req], take: int, admitted: list[Req]) -> list[Req]:
        """The queue after a step that tried its first ``take`` requests: the deferred ones go to its end."""
        return queue[take:] + [r for r in queue[:take] if r not in admitted]

    def run(self, prompts: list[list[int]], batch: int, reset_at: int | None, audit_every: int = 5) -> None:
        """The request stream to the end; ``audit_every`` steps a host audit (0: only the final one)."""
        queue = [Req(f"r{i}", t) for i, t in enumerate(prompts)]
        running: list[Req] = []
        step = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while queue or running:
            step += 1
            self.copies.tick()
            self.cache.check_hicache_events()
            done = [r for r in running if r.finish_step <= self.copies.step]
            for r in done:
                self.finish(r)
            running = [r for r in running if r not in done]
            if reset_at is not None and step >= reset_at and not running:
                self.reset()
                reset_at = None
            take = min(len(queue), self.rng.randint(1, batch))
            admitted = self.admit(queue[:take])
            queue = self.requeue(queue, take, admitted)
            running += admitted
            if audit_every and step % audit_every == 0:
                self.audit_host()
            if step > 20 * len(prompts) + 100:
                raise RuntimeError("driver made no progress (device pool too small for the stream?)")
        self.stats["loop_s"] = time.perf_counter() - t0   # the scheduler steps (not the final settle and audit)
        self.stats["loop_cpu_s"] = time.process_time() - c0   # their CPU time (this process's threads)
        self.settle()
        self.audit_host()
        self.stats["steps"] = step


class Driver23(Driver):
    """The same scheduler steps against sglang 0.5.23's ``UnifiedRadixCache``: match results and locks carry node ids
    (``NodeId``), ``init_load_back`` returns ``(loaded tokens, node id)``, a lock returns the parameters of its
    release, the tree's nodes keep the full-attention KV in ``component_data[FULL]``, and ``insert`` frees the
    request's duplicate slots itself (``prev_prefix_len``: ``FreeDeviceKV``), as ``cache_finished_req`` relies on."""

    def _node(self, nid: Any) -> Any:
        return self.cache.tree_core.node_by_id(nid)

    def _nodes_of(self, tokens: list[int], upto: int) -> list[tuple[int, int, int]]:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        out, node, pos = [], self.cache.tree_core.root_node, 0
        key = RadixKey(tokens[:upto])
        while pos < upto:
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            out.append((child.id, pos, pos + len(child.key)))
            pos += len(child.key)
            node = child
        return out

    def walk(self) -> Iterator[tuple[Any, list[int], list[int]]]:
        """Every node of the tree, parents first: ``(node, the tokens before it, the tokens through it)``."""
        stack: list[tuple[Any, list[int]]] = [(self.cache.tree_core.root_node, [])]
        while stack:
            node, prefix = stack.pop()
            for child in list(node.children.values()):
                toks = prefix + list(child.key.token_ids)
                yield child, prefix, toks
                stack.append((child, toks))

    def pending_ids(self) -> set:
        """The ids of the nodes a write-through in flight covers (their host copies are not complete yet)."""
        ws = self.cache.ongoing_write_through.values()
        return {nid for w in ws for nid in w.publish_node_ids} | {w.node_id for w in ws}

    def audit_host(self) -> None:
        c = self.cache
        hp = runtime.host_pool(c)
        pending = self.pending_ids()
        self.stats["host_audits"] += 1
        stack = [(c.tree_core.root_node, [])]
        while stack:
            node, prefix = stack.pop()
            for child in list(node.children.values()):
                toks = prefix + list(child.key.token_ids)
                hv = runtime.full(child).host_value
                if (hv is not None and child.id not in pending and len(hv)
                        and not self.host_ok(hp, hv, toks, len(prefix))):
                    self.corruption.append({"step": self.copies.step, "where": "host", "nodes": [child.id]})
                stack.append((child, toks))

    def at_rest(self) -> list[tuple[Any, Any]]:
        c = self.cache
        pending = self.pending_ids()
        out, stack = [], [c.tree_core.root_node]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                hv = runtime.full(child).host_value
                if hv is not None and child.id not in pending and len(hv):
                    out.append((child.id, hv))
                stack.append(child)
        return sorted(out, key=lambda x: x[0])

    def admit(self, reqs: list[Req]) -> list[Req]:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        c = self.cache
        for req in reqs:
            self.match(req)
        c.ready_to_load_host_cache()
        self.copies.wait_loads()
        running = []
        for req in reqs:
            self.check_prefix(req)
            need = len(req.tokens) - len(req.prefix_idx)
            new = self.alloc_new(req, need) if need else torch.empty((0,), dtype=torch.int64)
            if new is None:
                c.evict(EvictParams(num_tokens=need))
                new = self.alloc_new(req, need)
            if new is None or not self.own_state(req):
                if new is not None:
                    self.alloc.free(new)
                c.dec_lock_ref(req.last_node, req.lock)
                self.drop_state(req)
                self.stats["deferred"] += 1
                continue
            self.forward(req, new)
            req.all_idx = torch.cat([req.prefix_idx, new])
            req.finish_step = self.copies.step + self.rng.randint(0, 2)
            running.append(req)
            self.stats["admitted"] += 1
        return running

    def match(self, req: Req) -> None:
        """The request's match, its load-back where the match ends on the host, the lock of its last node."""
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(req.tokens), req=req))
        plen, last = m.device_prefix_len, m.last_device_node
        req.last_node = last
        if m.host_hit_length > 0:
            n, last = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                          host_hit_length=m.host_hit_length, req=req))
            if n:
                self.stats["loads"] += 1
                plen += n
        req.prefix_idx = c.path_device_indices(last)[:plen] if plen else torch.empty((0,), dtype=torch.int64)
        req.last_node = last
        req.lock = c.inc_lock_ref(last).to_dec_params()

    def own_state(self, req: Req) -> bool:
        """Whether the request got the per-request state its forward needs besides its KV slots (mamba_driver.py's
        Mamba slot; none here)."""
        return True

    def drop_state(self, req: Req) -> None:
        """A request sent back to the queue gives up :meth:`own_state`'s state."""

    def forward(self, req: Req, new: Any) -> None:
        """The forward of ``req`` over its new slots ``new``: their KV stored."""
        self.store(new, req.tokens, len(req.prefix_idx))

    def finish(self, req: Req) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        c.insert(InsertParams(key=RadixKey(req.tokens), value=req.all_idx, prev_prefix_len=len(req.prefix_idx),
                              rotation_base=req.kv_rotation_base))
        c.dec_lock_ref(req.last_node, req.lock)


_GROUPS: dict = {}


def _init_group(world: int, rank: int, store: str) -> tuple[Any, Any]:
    """The CP group (the whole gloo world when ``world`` > 1) and this rank's TP group of one; made once per
    process (later runs in the process reuse them)."""
    import torch.distributed as dist

    if "cp" not in _GROUPS:
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
        tp_groups = [dist.new_group([r], backend="gloo") for r in range(world)]
        _GROUPS["cp"] = dist.group.WORLD if world > 1 else None
        _GROUPS["tp"] = tp_groups[rank]
    return _GROUPS["cp"], _GROUPS["tp"]


def run(version: str, out: str, policy: str = "write_through", page_size: int = 1, seed: int = 0,
        requests: int = 120, batch: int = 4, max_lag: int = 3, dev_tokens: int = 384, host_ratio: float = 3.0,
        reset: bool = True, fault: str | None = None, nth: int = 1, exact: bool = False, instrument: bool = True,
        world: int = 1, rank: int = 0, store: str | None = None, level: int = 2, audit_every: int = 5,
        cp_mode: str | None = "replicated", make_driver: Any = None, exporter: str = "thread",
        ring: bool = True, builder: Any = None, stream: Any = None, checks: bool = False,
        audit_mbps: float = 0.0, rot: bool = False, run_id: str | None = None) -> dict:
    """One run; returns ``{"corruption", "fault_hits", "stats", "log", "otlp", "seconds"}``.

    ``cp_mode`` is the ``config`` record's ``mode`` when ``world`` > 1: the driver's ranks each hold the whole
    stream's KV in their own cache (the same requests, the same KV bytes), which is ``replicated``; None: the
    instrumentation derives it from the server arguments (``builder``'s, cp_driver.py's prefill CP).
    ``make_driver``: a :class:`Driver` factory with its arguments (l3_driver.py's: storage on, the scheduler's
    storage calls). ``exporter``/``ring``: where records go (``process`` with ``ring``: the record ring, the
    default outside these tests; the tests export from a thread). ``builder``/``stream``: 0.5.23's cache builder
    (:func:`build23`'s arguments) and the prompt stream (:func:`request_stream`'s) for another pool kind
    (dsa_driver.py's). ``checks``: the exporter's online checks (their findings on the spans, ``hicache.violation``
    events). ``audit_mbps``: the audit of host copies at rest on at that rate (0: off); the run then waits for two
    more audit passes over the final cache before it flushes, and its summary has the audit's counts (``audit``).
    ``rot``: after the last step, one byte of a complete host copy is flipped in the host pool (a copy corrupted at
    rest that is never reloaded: the stream has ended; ``fault_hits`` names its node).
    ``run_id``: the records' run id (default: one per version, policy, page size and seed)."""
    t0 = time.monotonic()
    os.makedirs(out, exist_ok=True)
    import cptrace_otel

    log = os.path.join(out, f"rank-{rank}.log")
    otlp = os.path.join(out, f"rank-{rank}.otlp.jsonl")
    run_id = run_id or f"sglang-{version}-{policy}-p{page_size}-s{seed}"
    cptrace_otel.configure(level=(level if instrument else 0), file=otlp, log_file=log, exporter=exporter, ring=ring,
                           cp_rank=rank, run_id=run_id, checks=checks)
    if instrument:
        from cptrace_otel.traced.sglang import SGLangInstrumentor
        from cptrace_otel.traced.sglang._state import Recorder

        inst = SGLangInstrumentor()
        if inst.is_instrumented_by_opentelemetry and (Recorder.exact, Recorder.cp_mode, Recorder.audit_mbps) != \
                (exact, cp_mode or "", audit_mbps):
            inst.uninstrument()   # a later run of a --matrix with other options: instrument anew, never reuse
        if not inst.is_instrumented_by_opentelemetry:
            inst.instrument(exact=exact, cp_mode=cp_mode, audit_mbps=audit_mbps)
    if store is None:
        store = tempfile.mktemp(prefix="cptrace-gloo-")
    cp, tp = _init_group(world, rank, store)
    if version == "0.5.23":
        cache, kv, alloc = (builder or build23)(policy, page_size, dev_tokens, host_ratio, cp, tp)
    else:
        cache, kv, alloc = build(version, policy, page_size, dev_tokens, host_ratio, cp, tp)
    copies = runtime.Copies(seed * 31 + 1, max_lag)
    copies.install()
    faults = runtime.Faults(fault, nth)
    faults.install(cache, copies)
    drv = (make_driver or (Driver23 if version == "0.5.23" else Driver))(cache, kv, alloc, copies, seed, page_size)
    prompts = (stream or request_stream)(seed, requests, page_size)
    drv.run(prompts, batch, reset_at=(len(prompts) // (2 * batch) if reset else None), audit_every=audit_every)
    if rot:
        faults.hits.append(drv.rot())
    audit = None
    if instrument and audit_mbps > 0:
        from cptrace_otel.traced.sglang import _audit

        a = _audit.auditor()
        if a is None or not a.wait_passes(2, 120):
            raise RuntimeError("the host-copy audit did not complete its passes")
        audit = dict(_audit.STATS)
        _audit.stop()   # (a later run of a --matrix audits its own cache only: the next one starts a new thread)
        for k in _audit.STATS:
            _audit.STATS[k] = 0
    flushed = cptrace_otel.flush(60)
    if not flushed:   # records were lost: the caller's checks would read a partial run (say why, on stderr)
        from cptrace_otel.traced import pipeline

        print(f"driver: flush() returned False: {pipeline.stats()}", file=sys.stderr, flush=True)
    cptrace_otel.shutdown(60)
    return {"corruption": drv.corruption, "fault_hits": faults.hits, "stats": drv.stats, "log": log, "otlp": otlp,
            "seconds": round(time.monotonic() - t0, 2), "audit": audit, "flushed": flushed}


def run_hybrid(out: str, builder: Any, driver_cls: Any, install_fault: Any, fault: str | None, key: str,
               **kw: Any) -> dict:
    """One :func:`run` of 0.5.23 over a hybrid tree (swa_driver.py's, mamba_driver.py's): the cache from ``builder``,
    the driver ``driver_cls`` (with a ``fault_hits`` list), ``install_fault(cache, hits, fault)`` applied to it; the
    summary has the fault's hits under ``key``."""
    box: dict = {}

    def make_driver(cache: Any, *a: Any) -> Any:
        drv = box["drv"] = driver_cls(cache, *a)
        install_fault(cache, drv.fault_hits, fault)
        return drv

    res = run("0.5.23", out, builder=builder, make_driver=make_driver, **kw)
    res[key] = box["drv"].fault_hits
    return res


def at_first_load(cache: Any, hits: list[dict], kind: str, pool: str, corrupt: Any) -> None:
    """A hybrid driver's fault: at the first load-back whose op moves host pool ``pool``
    (``HybridCacheController.load``, SGLang's issue of the load op), ``corrupt(transfer)`` changes that pool's host
    copy before the copy reads it and returns the host slot it changed; ``hits`` gets what it did."""
    cc = cache.cache_controller
    orig = cc.load

    def load(*a: Any, **k: Any) -> Any:
        extra = k.get("extra_pools") or (a[2] if len(a) > 2 else None) or ()
        for t in extra:
            if getattr(t.name, "value", t.name) == pool and t.host_indices is not None and len(t.host_indices) \
                    and not hits:
                slot = corrupt(t)
                hits.append({"kind": kind, "host_slot": slot, "nodes": list(t.nodes_to_load or [])})
        return orig(*a, **k)

    cc.load = load


def hybrid_main(doc: str | None, faults: tuple[str, ...], run_one: Any, argv: list[str] | None = None) -> int:
    """The CLI of a hybrid tree's driver (``doc``: its module doc; ``run_one``: its ``run``): one run, its summary as
    JSON on stdout."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--fault", choices=faults)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--policy", default="write_through")
    p.add_argument("--no-instrument", dest="instrument", action="store_false")
    p.add_argument("--exact", action="store_true")
    p.add_argument("--boundary", action="store_true",
                   help="the tree core SGLang selects (its Rust one, under the torch it loads with)")
    a = vars(p.parse_args(argv))
    runtime.use_sglang("0.5.23", rust=a["boundary"])
    print(json.dumps(run_one(**a)))
    return 0


def run_ranks(version: str, out: str, world: int = 4, fault_rank: int | None = None,
              matrix: list[dict] | None = None, module: str | None = None, **kw: Any) -> Any:
    """``world`` rank processes (gloo on a ``file://`` store), the same request stream; ``kw['fault']`` on
    ``fault_rank`` only. One summary per rank.

    With ``matrix`` (a list of :func:`run` keyword sets, each over ``kw``), every rank process runs them one after the
    other in the same gloo group (one SGLang import and one group per rank for all of them), each in its own folder
    ``out/<i>``; an entry's ``fault`` too applies on ``fault_rank`` only. Returns one list of per-rank summaries per
    entry. ``module``: the rank processes' driver, the name of a module of this package, started with ``python -m``
    (default ``"driver"``, this one; another takes the options passed here)."""
    store = tempfile.mktemp(prefix="cptrace-gloo-")
    procs = []
    fault = kw.pop("fault", None)
    for r in range(world):
        args = runtime.module_cmd(module or "driver", "--version", version, "--out", out,
                                  "--world", str(world), "--rank", str(r), "--store", store)
        for k, v in kw.items():
            if isinstance(v, bool):   # the CLI's switches: --exact, --no-reset, --no-instrument
                if k in ("reset", "instrument"):
                    if not v:
                        args.append("--no-" + k)
                elif v:
                    args.append("--" + k.replace("_", "-"))
            elif v is not None:
                args += ["--" + k.replace("_", "-"), str(v)]
        if fault and r == fault_rank:
            args += ["--fault", fault]
        if matrix is not None:
            mine = [{k: v for k, v in m.items() if k != "fault" or r == fault_rank} for m in matrix]
            args += ["--matrix", json.dumps(mine)]
        procs.append(subprocess.Popen(args, env=runtime.sglang_env(version), cwd=runtime.ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = rank_summaries(procs)
    if matrix is not None:
        return [[outs[r][i] for r in range(world)] for i in range(len(matrix))]
    return outs


def rank_summaries(procs: list[subprocess.Popen], timeout: float = 900) -> list:
    """The last stdout line of each rank process, as JSON, in rank order; every rank is killed and the failed one's
    stderr raised when one fails."""
    outs = []
    for p in procs:
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"rank process failed ({p.returncode}): {se[-3000:]}")
        outs.append(json.loads(so.strip().splitlines()[-1]))
    return outs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--version", required=True, choices=runtime.VERSIONS)
    p.add_argument("--out", required=True)
    p.add_argument("--policy", default="write_through",
                   choices=("write_through", "write_through_selective", "write_back"))
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-lag", type=int, default=3)
    p.add_argument("--dev-tokens", type=int, default=384)
    p.add_argument("--host-ratio", type=float, default=3.0)
    p.add_argument("--no-reset", dest="reset", action="store_false")
    p.add_argument("--fault", choices=runtime.FAULTS)
    p.add_argument("--nth", type=int, default=1)
    p.add_argument("--exact", action="store_true")
    p.add_argument("--no-instrument", dest="instrument", action="store_false")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--store")
    p.add_argument("--audit-mbps", type=float, default=0.0, help="the host-copy audit's rate (0: off)")
    p.add_argument("--rot", action="store_true", help="flip a byte of a complete host copy after the last step")
    p.add_argument("--cp-mode", default="replicated", choices=("replicated", "sharded", "shared"),
                   help="the config record's mode when --world > 1 (the driver's ranks replicate the KV)")
    p.add_argument("--matrix", help="JSON list of run() keyword sets, run one after the other in this process "
                                    "(each in its own folder under --out): one SGLang import for many runs")
    a = vars(p.parse_args(argv))
    runtime.use_sglang(a["version"])
    matrix = a.pop("matrix")
    if matrix:
        base, out = dict(a), a["out"]
        res: Any = []
        for i, kw in enumerate(json.loads(matrix)):
            res.append(run(**{**base, **kw, "out": os.path.join(out, str(i))}))
    else:
        res = run(**a)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
