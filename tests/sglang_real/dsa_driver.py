"""Drive real SGLang 0.5.23 HiCache over a DSA KV pool (DeepSeek-V3.2, GLM-5.x): ``DSATokenToKVPool`` (MLA KV plus
the indexer's ``index_k_with_scale_buffer``) under ``UnifiedRadixCache``, whose ``init_hicache`` picks SGLang's own
``_DsaStrategy``: an MLA host pool as the anchor and a ``DSAIndexerPoolHost`` sidecar (``PoolName.INDEXER``,
indices from the KV pool) in one host pool group, both moved by one ``HybridCacheController`` op per backup and
load. The scheduler steps are ``driver.Driver23``'s; this adds the indexer's content: the forward writes each new
token's index key and scale as it writes its KV, and every prefix check and host audit compares both pools.

DSA needs 64-token pages (``DSATokenToKVPool``'s assertion), so prompts are whole pages (:func:`dsa_stream`).

Faults (:data:`DSA_FAULTS`): ``dsa_no_idx_backup`` drops the indexer's transfer from every backup op
(``HybridCacheController.write`` gets the KV transfer only): what SGLang did before the DSA index buffers were
backed up to host (the GLM-5.3 host load-back report). The KV round trip stays correct; the indexer on the device
after a load-back is stale. ``dsa_l3_no_idx`` (with ``l3=True``: SGLang's ``file`` storage backend, l3_driver.py's
scheduler calls): the store reads the KV pages of an L3 hit but not the indexer's, and reports them read
(``HiCacheFile._read_page`` of the indexer pool does nothing): the shape of a store that registered ``kv_buffer``
but not ``index_k_with_scale_buffer`` (the GLM-5.1 + Mooncake report). The fetched KV is right, its indexer pages
on the host (and then the device) are whatever they held before. ``dsa_idx_no_wait`` (with ``layerwise=True``:
:class:`LayerwiseDsaDriver`'s forward under a layer-wise load-back): the indexer's read of a layer skips the wait for
that layer's load (:func:`install_no_wait`; the GLM-5 + L2 HiCache report), so it reads pages still being loaded.
``dsa_l3_idx_evicted`` (with ``l3=True`` and the backend under a size cap): the ``file`` backend's own
``LRUFileEvictor`` unlinks a page's indexer object between a prefetch's storage query and its read (the partial L3
prefetch report); ``dsa_l3_idx_evicted_unclamped`` also reads as SGLang did before that report's fix, committing
the KV read's pages whatever the indexer read got (:func:`_evict_idx_before_read`). ``dsa_early_release`` and
``dsa_early_release_idx``: a load-back's host pin released at issue and its slots reused (both pools' pages, or the
indexer's only) before the copy reads them (:func:`_early_release`; the GLM-5.2 MTP report's host-pin half).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import sys
from typing import Any

from tests.sglang_real import driver, l3_driver

PAGE = 64
RANK, ROPE, IDX_DIM = 16, 8, 128
DSA_FAULTS = ("dsa_no_idx_backup", "dsa_l3_no_idx", "dsa_idx_no_wait", "dsa_l3_idx_evicted",
              "dsa_l3_idx_evicted_unclamped", "dsa_early_release", "dsa_early_release_idx")


def make_dsa_pool(dev_tokens: int, page_size: int) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    return DSATokenToKVPool(size=dev_tokens, page_size=page_size, kv_lora_rank=RANK, dtype=torch.bfloat16,
                            qk_rope_head_dim=ROPE, layer_num=driver.LAYERS, device="cpu", index_head_dim=IDX_DIM,
                            enable_memory_saver=False, kv_cache_dim=RANK + ROPE)


build_dsa = functools.partial(driver.build23, make_kv=make_dsa_pool)


def dsa_stream(seed: int, n: int, page_size: int) -> list[list[int]]:
    """:func:`driver.request_stream`'s shape in whole pages: families of 1-3 shared pages, then 1-2 own pages."""
    r = random.Random(seed)
    fams = [[r.randrange(1, 5000) for _ in range(page_size * r.choice((1, 2, 3)))] for _ in range(5)]
    out = []
    for _ in range(n):
        base = list(r.choice(fams))
        if r.random() < 0.4:
            base = base[: page_size * r.randrange(1, len(base) // page_size + 1)]
        out.append(base + [r.randrange(1, 5000) for _ in range(page_size * r.randrange(1, 3))])
    return out


def expected_kv(tokens: list[int]) -> Any:
    """``[len(tokens), LAYERS, 1, RANK+ROPE]`` bf16: each position's MLA KV (a function of its whole prefix)."""
    import torch

    h = torch.tensor(driver._prefix_hashes(tokens), dtype=torch.int64)[:, None, None, None]
    lay = torch.arange(driver.LAYERS, dtype=torch.int64)[None, :, None, None]
    d = torch.arange(RANK + ROPE, dtype=torch.int64).view(1, 1, 1, -1)
    return (((h * 31 + lay * 7 + d * 3) % 251) + 1).to(torch.bfloat16)


def expected_idx(tokens: list[int]) -> Any:
    """``[len(tokens), LAYERS, IDX_DIM + 4]`` uint8: each position's index key (fp8 bytes) and scale (4 bytes)."""
    import torch

    h = torch.tensor(driver._prefix_hashes(tokens), dtype=torch.int64)[:, None, None]
    lay = torch.arange(driver.LAYERS, dtype=torch.int64)[None, :, None]
    d = torch.arange(IDX_DIM + 4, dtype=torch.int64).view(1, 1, -1)
    return ((h * 17 + lay * 5 + d * 11) % 255 + 1).to(torch.uint8)


def _idx_cols(pool: Any, idx: Any) -> tuple[Any, Any, Any]:
    """Where token slots ``idx`` live in a page-major index buffer row ``[page_size*IDX_DIM keys | page_size*4
    scales]`` (DSA's layout): ``(page, key columns [T, IDX_DIM], scale columns [T, 4])``."""
    import torch

    ps = pool.page_size
    page, off = idx // ps, idx % ps
    kcol = off[:, None] * IDX_DIM + torch.arange(IDX_DIM)[None, :]
    scol = ps * IDX_DIM + off[:, None] * 4 + torch.arange(4)[None, :]
    return page, kcol, scol


def idx_layers(pool: Any) -> list:
    """The indexer buffers of a device pool (per layer) or of a layer-first host pool (its ``[layers, ...]``)."""
    b = pool.index_k_with_scale_buffer
    return list(b)


def read_idx(pool: Any, idx: Any) -> Any:
    import torch

    page, kcol, scol = _idx_cols(pool, idx)
    out = []
    for b in idx_layers(pool):
        out.append(torch.cat([b[page[:, None], kcol], b[page[:, None], scol]], dim=1))
    return torch.stack(out, dim=1)


def write_idx(pool: Any, idx: Any, rows: Any) -> None:
    page, kcol, scol = _idx_cols(pool, idx)
    for i, b in enumerate(idx_layers(pool)):
        b[page[:, None], kcol] = rows[:, i, :IDX_DIM]
        b[page[:, None], scol] = rows[:, i, IDX_DIM:]


def read_kv(pool: Any, idx: Any) -> Any:
    import torch

    return torch.stack([b[idx] for b in pool.kv_buffer], dim=1)


class DsaDriver(driver.Driver23):
    """:class:`driver.Driver23` over a DSA pool: KV and indexer written, checked on the device and audited on the
    host; a mismatch is a ``corruption`` entry whose ``pool`` says which."""

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        kv = expected_kv(tokens)[start:]
        for i, b in enumerate(self.kv.kv_buffer):
            b[idx] = kv[:, i]
        write_idx(self.kv, idx, expected_idx(tokens)[start:])

    def check_prefix(self, req: driver.Req) -> None:
        n = len(req.prefix_idx)
        if n == 0:
            return
        for pool, got, want in (("kv", read_kv(self.kv, req.prefix_idx), expected_kv(req.tokens[:n])),
                                ("indexer", read_idx(self.kv, req.prefix_idx), expected_idx(req.tokens[:n]))):
            bad = (got != want).flatten(1).any(dim=1)
            if bool(bad.any()):
                self.corruption.append({"step": self.copies.step, "where": "device", "pool": pool, "rid": req.rid,
                                        "positions": int(bad.sum())})

    def host_ok(self, hp: Any, hv: Any, tokens: list[int], start: int) -> bool:
        idx_host = self.cache.cache_controller.mem_pool_host.get_pool(_indexer_name())
        return (bool((read_kv(hp, hv) == expected_kv(tokens)[start:]).all())
                and bool((read_idx(idx_host, hv) == expected_idx(tokens)[start:]).all()))


def _indexer_name() -> Any:
    from sglang.srt.mem_cache.hicache_storage import PoolName

    return PoolName.INDEXER


def install_fault(cache: Any, kind: str | None) -> list[dict]:
    """``kind`` (one of :data:`DSA_FAULTS`) on ``cache``'s controller; returns the list its hits go to."""
    hits: list[dict] = []
    if kind is None:
        return hits
    if kind not in DSA_FAULTS:
        raise ValueError(f"unknown DSA fault {kind!r} (one of {', '.join(DSA_FAULTS)})")
    cc = cache.cache_controller
    if kind.startswith("dsa_early_release"):
        _early_release(cache, hits, kv=(kind == "dsa_early_release"))
        return hits
    if kind.startswith("dsa_l3_idx_evicted"):
        _evict_idx_before_read(cc, hits, unclamped=kind.endswith("_unclamped"))
        return hits
    if kind == "dsa_l3_no_idx":
        backend = cc.storage_backend
        read = backend._read_page

        def read_page(pool_name: Any, key: str, host_pool: Any, page_offset: int) -> bool:
            if pool_name == _indexer_name():
                hits.append({"skipped": key})
                return True
            return read(pool_name, key, host_pool, page_offset)

        backend._read_page = read_page
        return hits
    orig = cc.write

    @functools.wraps(orig)
    def write(*a: Any, **k: Any) -> Any:
        extra = k.get("extra_pools")
        if extra:
            k["extra_pools"] = [x for x in extra if getattr(x, "name", None) != _indexer_name()]
            hits.append({"dropped": len(extra) - len(k["extra_pools"])})
        return orig(*a, **k)

    cc.write = write
    return hits


def _early_release(cache: Any, hits: list[dict], kv: bool) -> None:
    """The host pin of a load-back released before its ack (SGLang #30321, fix #31427), over the DSA pool: right
    after the first load-back is issued, its chain's first node's host slots are freed through the anchor host pool
    (``HostKVCache.free``; the indexer's host pool takes its indices from the KV pool, so the same slots are its
    pages too) and reused by another writer before the load's copy reads them. The writer overwrites the
    indexer's host pages; ``kv``: its KV pages too (``runtime.Faults._free_and_reuse``), else the KV half of its
    write has not landed when the copy reads (the KV comes back right, the indexer does not)."""
    import torch

    from tests.sglang_real import runtime

    faults = runtime.Faults(None)
    idx_host = cache.cache_controller.mem_pool_host.get_pool(_indexer_name())

    def hook(cache: Any, chain: list, res: Any) -> None:
        if res is None or not chain or hits:
            return
        host = chain[0].host   # (read through the tree core's boundary: runtime.Faults._wrap_load_back23)
        if kv:
            faults._free_and_reuse(cache, host)
        else:   # freed and taken at once as _free_and_reuse does, the KV rows left as they are
            hp = runtime.host_pool(cache)
            kept = hp.kv_buffer[:, host].clone()
            faults._free_and_reuse(cache, host)
            hp.kv_buffer[:, host] = kept
        write_idx(idx_host, host, torch.full((len(host), driver.LAYERS, IDX_DIM + 4), 7, dtype=torch.uint8))
        hits.append({"kind": "dsa_early_release", "kv": kv, "node_id": chain[0].id, "chain": [c.id for c in chain]})

    faults._wrap_load_back23(cache, hook)


def _evict_idx_before_read(cc: Any, hits: list[dict], unclamped: bool) -> None:
    """The partial L3 prefetch of DSA KV without its indexer pages (SGLang #30057): the first prefetch of 2+ pages
    loses its last page's indexer object between the storage query (``batch_exists_v2``, which found every page's
    KV and indexer objects) and the I/O thread's read. The object is unlinked by the ``file`` backend's own
    ``LRUFileEvictor`` (``_evict_one_lru_locked``, the step a write under the size cap takes; the backend must run
    with a cap, ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``), the entry made its oldest first. ``unclamped``: the read as
    it was before the fix (#31108), which committed the pages the KV read brought back whatever the indexer read
    got (``CacheController._page_transfer_kv_batch`` without its clamp to the sidecar's hits)."""
    backend, ev = cc.storage_backend, cc.storage_backend._evictor
    if not ev.enabled:
        raise RuntimeError("the file backend's LRUFileEvictor is off: set SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE")
    transfer = cc._page_transfer

    def page_transfer(op: Any) -> Any:   # (the I/O thread, after the query, before any read of the op's pages)
        if not hits and len(op.hash_value) >= 2:
            key = op.hash_value[-1]
            stem = backend._get_suffixed_key(backend._log_key(_indexer_name(), key))
            with ev._lock:
                if stem in ev._lru:
                    ev._lru.move_to_end(stem, last=False)
                    outcome, _ = ev._evict_one_lru_locked()
                    hits.append({"key": key, "evicted": stem, "outcome": outcome, "op": op.id,
                                 "pages": len(op.hash_value), "rid": str(op.request_id),
                                 "gone": not os.path.exists(os.path.join(backend.file_path, stem + ".bin"))})
        return transfer(op)

    cc._page_transfer = page_transfer
    if not unclamped:
        return
    kv_batch = cc._page_transfer_kv_batch

    def page_transfer_kv_batch(op: Any, hashes: list, host_indices: Any, extra: Any, derived: list) -> int:
        from sglang.srt.mem_cache.hicache_storage import PoolTransfer

        got = kv_batch(op, hashes, host_indices, extra, [])   # the KV read alone: its hits are committed
        if derived:   # the indexer read, its result not counted
            backend.batch_get_v2([PoolTransfer(name=t.name, host_indices=host_indices, keys=hashes)
                                  for t in derived], extra_info=extra)
        return int(got)

    cc._page_transfer_kv_batch = page_transfer_kv_batch


class LayerwiseDsaDriver(DsaDriver):
    """:class:`DsaDriver` whose load-backs complete layer by layer under the forward, as on a GPU: the batch's
    ``ready_to_load_host_cache`` slot goes to ``LayerDoneCounter.set_consumer`` (as ``TpModelWorker`` does), and
    the batch's forward reads each layer through SGLang's own getters, the indexer first
    (``DSATokenToKVPool.get_index_k_with_scale_buffer``, as ``dsa_indexer.py`` does), then attention
    (``get_key_buffer``/``get_value_buffer``). The copy engine holds a load back until a read waits for it: a wait
    on a layer's event (``LayerLoadingEvent.wait``, what ``wait_until`` calls) moves the load's data and fires its
    per-layer completions (``LayerLoadingEvent.complete``, SGLang's ``on_layer_done``), as the GPU's stream wait
    orders the read after the copy. Each read is compared with what the batch's prefixes must hold in that layer:
    a read of stale pages is a ``corruption`` entry with ``where="read"``."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.stats["layer_reads"] = 0
        self._reqs: list[driver.Req] = []
        self._forward_done = True
        for ev in self.cache.cache_controller.layer_done_counter.events:
            ev.wait = functools.partial(self._wait, ev.wait)

    def _wait(self, orig: Any, layer_index: int) -> None:
        self._load_now()   # the stream wait: the load's copies done before the read
        orig(layer_index)

    def admit(self, reqs: list[driver.Req]) -> list[driver.Req]:
        """:meth:`driver.Driver23.admit` with the forward between the load's start and the prefix checks, and no
        wait for the loads but the forward's own."""
        self._reqs = reqs
        copies = self.copies
        self._load_now = copies.wait_loads
        cache = self.cache
        ready = cache.ready_to_load_host_cache

        def start() -> Any:
            slot = ready()
            cache.cache_controller.layer_done_counter.set_consumer(slot)   # TpModelWorker.set_hicache_consumer
            self._forward_done = False
            return slot

        cache.ready_to_load_host_cache = start
        copies.wait_loads = lambda: None
        try:
            return super().admit(reqs)
        finally:
            copies.wait_loads = self._load_now
            del cache.ready_to_load_host_cache

    def check_prefix(self, req: driver.Req) -> None:
        if not self._forward_done:   # the first prefix check of the batch: its forward has run by then
            self._forward_done = True
            self.batch_forward()
        super().check_prefix(req)

    def run(self, *a: Any, **k: Any) -> None:
        super().run(*a, **k)
        # what is left hooked on the pool and the counter once every load-back was acked (the instrumentation
        # hooks them only while one is in flight)
        counter = self.kv.layer_transfer_counter
        self.stats["hooks_left"] = sorted([n for n in vars(self.kv) if n.startswith("get_")]
                                          + [n for n in vars(counter) if n == "wait_until"])

    def batch_forward(self) -> None:
        """The batch's forward under its layer-wise loads: each layer read through SGLang's getters (the indexer
        first) and checked against the expected content (not :meth:`driver.Driver.forward`, a request's store)."""
        pool = self.kv
        for layer in range(driver.LAYERS):
            self._check_read("indexer", layer, pool.get_index_k_with_scale_buffer(layer_id=layer))
            self._check_read("kv", layer, pool.get_key_buffer(layer))
            pool.get_value_buffer(layer)
            self.stats["layer_reads"] += 1
        self._load_now()   # the batch's end: its results need every layer

    def _check_read(self, reader: str, layer: int, buf: Any) -> None:
        for req in self._reqs:
            n = len(req.prefix_idx)
            if n == 0:
                continue
            if reader == "kv":
                bad = bool((buf[req.prefix_idx] != expected_kv(req.tokens[:n])[:, layer]).any())
            else:
                page, kcol, _ = _idx_cols(self.kv, req.prefix_idx)
                bad = bool((buf[page[:, None], kcol] != expected_idx(req.tokens[:n])[:, layer, :IDX_DIM]).any())
            if bad:
                self.corruption.append({"step": self.copies.step, "where": "read", "pool": reader, "rid": req.rid,
                                        "layer": layer})


def install_no_wait(pool: Any) -> list[dict]:
    """The indexer read that skips the per-layer wait (SGLang #22811, GLM-5 + L2 HiCache): the DSA pool's
    ``IndexKeyCache.get_local_buffer`` returns layer l's buffer without ``layer_transfer_counter.wait_until``, as
    the indexer's read did before the fix; attention's reads still wait. Returns the list of its reads made while
    a load-back was in flight on the consumer's slot."""
    hits: list[dict] = []
    ikc = pool.index_key_cache

    def get_local_buffer(layer_id: int) -> Any:
        c = pool.layer_transfer_counter
        if c is not None and c.consumer_index >= 0:
            hits.append({"layer": layer_id})
        return ikc._kernel_view(ikc.buffer[layer_id - pool.start_layer])

    ikc.get_local_buffer = get_local_buffer
    return hits


class StorageDsaDriver(l3_driver._Storage, DsaDriver):
    """:class:`DsaDriver` with the ``file`` storage backend and the scheduler's storage calls (l3_driver.py)."""


def run_dsa(out: str, fault: str | None = None, seed: int = 0, requests: int = 48, l3: bool = False,
            layerwise: bool = False, **kw: Any) -> dict:
    """One :func:`driver.run` of 0.5.23 over the DSA pool (``fault``: :data:`DSA_FAULTS`; ``l3``: with the ``file``
    storage backend in a fresh folder ``out/l3store``; ``layerwise``: :class:`LayerwiseDsaDriver`, whose forward reads
each layer while the load-back completes, the one ``dsa_idx_no_wait`` needs); its summary plus ``dsa_fault_hits``."""
    box: dict = {}

    def make_driver(cache: Any, *a: Any) -> DsaDriver:
        if l3:
            root = os.path.join(out, "l3store")
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = root
            drv: DsaDriver = StorageDsaDriver(cache, *a, faults=l3_driver.L3Faults(None))
        elif layerwise:
            drv = LayerwiseDsaDriver(cache, *a)
        else:
            drv = DsaDriver(cache, *a)
        box["hits"] = install_no_wait(drv.kv) if fault == "dsa_idx_no_wait" else install_fault(cache, fault)
        return drv

    kw.setdefault("dev_tokens", PAGE * 16)
    res = driver.run("0.5.23", out, page_size=PAGE, seed=seed, requests=requests, builder=build_dsa,
                     stream=dsa_stream, make_driver=make_driver, **kw)
    res["dsa_fault_hits"] = box.get("hits", [])
    return res


if __name__ == "__main__":
    import json

    from tests.sglang_real import runtime

    runtime.use_sglang("0.5.23")
    print(json.dumps(run_dsa(sys.argv[1], fault=(sys.argv[2] if len(sys.argv) > 2 else None))))
