"""Drive real SGLang 0.5.23 HiCache over a hybrid full + sliding-window (SWA) tree (gpt-oss, Gemma 4, Llama 4 and
MiMo style): ``UnifiedRadixCache`` with the FULL and SWA components (what ``registry.create_unified_radix_cache``
builds for a model with sliding-window layers) over an ``SWAKVPool`` (one MHA pool for the full-attention layers, one
for the SWA layers) and its ``SWATokenToKVPoolAllocator``; ``init_hicache`` picks SGLang's own strategy, which adds
an SWA host pool (``PoolName.SWA``) beside the KV anchor in the host pool group. The Python tree core, or with
``boundary`` (``--boundary``) the one SGLang selects, its Rust one (:class:`BoundarySwaDriver`).

The scheduler steps are ``driver.Driver23``'s; this adds the SWA layers' content: the forward writes each new
token's SWA KV at its SWA slot (the allocator's full -> SWA mapping) as it writes its full KV, a prefix check reads
the full layers over the whole prefix and the SWA layers over its last window (all a model reads), and the host
audit checks both host pools of every complete host copy. Page size 1 (the SWA allocator's ``alloc`` asserts it).
Requests finish after their prefill (no decode), so the scheduler's ``free_out_of_window_slots`` of a running
request is not called: the tombstones here come from SWA's own eviction (its pool is half the full one).

Faults (:data:`SWA_FAULTS`): ``swa_flip`` flips one byte of the SWA host copy of a load-back's last SWA token
before the copy reads it (the SWA pages of a round trip corrupted on the host; the full KV stays right).
"""

from __future__ import annotations

import sys
from typing import Any

from tests.sglang_real import driver, rust_driver

WINDOW = 8   # the sliding window (tokens): prompts of 8-40 tokens, so windows both cover and drop history
SWA_FAULTS = ("swa_flip",)


def make_swa_pool(dev_tokens: int, page_size: int) -> Any:
    """An ``SWAKVPool``: full-attention layers 1 and 3, SWA layers 0 and 2 (``driver.LAYERS`` each), half as many
    SWA slots as full ones (as ``--swa-full-tokens-ratio 0.5``), so SWA evicts on its own and leaves tombstones."""
    import torch
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    return SWAKVPool(size=dev_tokens, size_swa=dev_tokens // 2, page_size=page_size, dtype=torch.float32,
                     head_num=driver.HEADS, head_dim=driver.DIM, swa_attention_layer_ids=[0, 2],
                     full_attention_layer_ids=[1, 3], device="cpu", enable_memory_saver=False)


def make_swa_alloc(dev_tokens: int, page_size: int, kv: Any) -> Any:
    """SGLang's ``SWATokenToKVPoolAllocator`` over :func:`make_swa_pool`'s pool (the same slot counts)."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    return SWATokenToKVPoolAllocator(dev_tokens, dev_tokens // 2, page_size, torch.float32, "cpu", kv, need_sort=False)


def build_swa(policy: str, page_size: int, dev_tokens: int, host_ratio: float, cp_group: Any, tp_group: Any,
              window: int = WINDOW) -> tuple[Any, Any, Any]:
    """``driver.build23`` with the FULL and SWA components (``window``: the sliding window, tokens)."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    def params_hook(params: Any) -> None:
        params.sliding_window_size = window
        params.tree_components = (ComponentType.FULL, ComponentType.SWA)

    return driver.build23(policy, page_size, dev_tokens, host_ratio, cp_group, tp_group, make_kv=make_swa_pool,
                          make_alloc=make_swa_alloc, params_hook=params_hook)


def expected_swa(tokens: list[int]) -> Any:
    """The SWA layers' KV of every position: another function of the whole prefix than the full layers'."""
    return driver.expected_rows(tokens) + 1000.0


class SwaDriver(driver.Driver23):
    """:class:`driver.Driver23` over an ``SWAKVPool``: both pools written, read and audited (see the module)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.stats.update({"swa_tombstones": 0, "swa_checked": 0})
        self.fault_hits: list[dict] = []   # what the injected fault did (install_fault)

    def swa_of(self, full_idx: Any) -> Any:
        """The SWA slots of full slots ``full_idx`` (the allocator's mapping)."""
        return self.alloc.translate_swa_indices_for_transfer(full_idx).to(full_idx.dtype)

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        driver.write_rows(self.kv.full_kv_pool, idx, driver.expected_rows(tokens)[start:])
        driver.write_rows(self.kv.swa_kv_pool, self.swa_of(idx), expected_swa(tokens)[start:])

    def check_prefix(self, req: driver.Req) -> None:
        n = len(req.prefix_idx)
        if n == 0:
            return
        bad_full = (driver.read_rows(self.kv.full_kv_pool, req.prefix_idx)
                    != driver.expected_rows(req.tokens[:n])).flatten(1).any(dim=1)
        w0 = max(0, n - WINDOW)
        swa_idx = self.swa_of(req.prefix_idx[w0:])
        bad_swa = (driver.read_rows(self.kv.swa_kv_pool, swa_idx)
                   != expected_swa(req.tokens[:n])[w0:]).flatten(1).any(dim=1)
        self.stats["swa_checked"] += len(swa_idx)
        for where, bad, off in (("device", bad_full, 0), ("device-swa", bad_swa, w0)):
            if bool(bad.any()):
                pos = [p + off for p in bad.nonzero().flatten().tolist()]
                nodes = sorted({nid for nid, s, e in self._nodes_of(req.tokens, n) if any(s <= p < e for p in pos)})
                self.corruption.append({"step": self.copies.step, "where": where, "rid": req.rid,
                                        "positions": len(pos), "nodes": nodes})

    def audit_host(self) -> None:
        """Every complete host copy: its full KV (``driver.Driver23``'s audit) and its SWA host copy, where the
        node has one, equal the expected KV."""
        super().audit_host()
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        c = self.cache
        hp = swa_host_pool(c)
        pending = self.pending_ids()
        for child, prefix, toks in self.walk():
            cd = child.component_data[ComponentType.SWA]
            if cd.value is None and cd.host_value is None:
                self.stats["swa_tombstones"] += 1
            hv = cd.host_value
            if hv is not None and child.id not in pending and len(hv):
                got = driver.read_rows(hp, hv)
                if not bool((got == expected_swa(toks)[len(prefix):]).all()):
                    self.corruption.append({"step": self.copies.step, "where": "host-swa", "nodes": [child.id]})


def swa_host_pool(cache: Any) -> Any:
    """The SWA host pool of the cache's host pool group."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PoolName

    return cache.cache_controller.mem_pool_host.get_pool(PoolName.SWA)


def install_fault(cache: Any, hits: list[dict], kind: str | None) -> None:
    """``swa_flip``: at the first load-back with an SWA transfer, one byte of its last SWA host slot flipped
    before the copy reads it (:func:`driver.at_first_load`)."""
    if kind != "swa_flip":
        return

    def corrupt(t: Any) -> int:
        slot = int(t.host_indices[-1])   # the window's last token: one a model reads
        swa_host_pool(cache).k_buffer[0][slot].view(-1)[0] += 1.0
        return slot

    driver.at_first_load(cache, hits, kind, "swa", corrupt)


class BoundarySwaDriver(rust_driver.BoundaryDriver23, SwaDriver):
    """:class:`SwaDriver` over the tree core SGLang selects, its Rust one included: the tree read through the core's
    interface (rust_driver.py). Its host audit checks the full KV host copies only (it reads no node's SWA host
    slots through that interface); the SWA KV a load brings back is still checked where the forward reads it
    (:meth:`SwaDriver.check_prefix`)."""


def run(out: str, fault: str | None = None, boundary: bool = False, **kw: Any) -> dict:
    """One run of ``driver.run`` over the hybrid tree (``fault``: one of :data:`SWA_FAULTS`); ``boundary``: over
    the tree core SGLang selects (the Rust one, in a process with its torch: ``runtime.sglang_env(..., rust=True)``),
    with :class:`BoundarySwaDriver` and ``array('q')`` prompts."""
    kw.setdefault("dev_tokens", 160)
    kw.setdefault("requests", 80)
    if boundary:
        kw["stream"] = rust_driver.request_stream
    with rust_driver.core_selected_by_sglang(boundary):
        return driver.run_hybrid(out, build_swa, BoundarySwaDriver if boundary else SwaDriver, install_fault, fault,
                                 "swa_fault_hits", **kw)


if __name__ == "__main__":
    sys.exit(driver.hybrid_main(__doc__, SWA_FAULTS, run))
