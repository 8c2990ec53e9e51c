"""SGLang 0.5.23's logical-page KV sharding (``--enable-kv-cache-sharding``) on CPU: every rank process of a gloo
group runs its own ``UnifiedRadixCache`` (Python tree core, as the sharding hook requires) over SGLang's sharded
classes, so each rank holds its own stripe of every node's KV, device and host:

* the device pool is ``PageInterleaveMHATokenToKVPool`` (``mem_cache/page_interleave_pool.py``) with the
  ``PageShardSpec`` of this rank (``shard_rank`` = attention CP rank, ``shard_size`` = the group); the forward's
  write of the whole chunk's KV (prefill CP all-gathers it) keeps the rank's own pages by the pool's own write plan
  (``set_kv_buffer``'s ``_get_write_plan``);
* the allocator is ``PageInterleavePoolAllocator`` (``alloc_extend`` with the chain's rotation base, read through
  ``rotation_base_of(req.last_node)`` as ``allocation._kv_shard_rotation_bases`` does; the insert stamps it);
* ``init_hicache`` wraps the host pool in ``PageInterleaveHostPool`` itself (SGLang's assembler, for a sharded device
  pool), so the controller allocates host slots with the node's ``start_owner`` and moves only this rank's stripe
  (``_move_kv_shard_indices``: ``owned_rows``); loads allocate with ``alloc_cyclic`` (the host pages' owners).

What is not the stock path (the rest of it needs CUDA and the PD-prefill machinery): the server arguments are the
sharded deployment's (``enable_kv_cache_sharding``, ``disaggregation_mode=prefill``, prefill CP over the group), but
SGLang's resolution hook (``handle_kv_cache_sharding``, which refuses a non-CUDA attention backend and transfer
backend) is not run, and the ``PageShardSpec`` is built here with the fields ``make_page_shard_spec`` computes; the
pool's prefix gather for attention (``begin_shard_extend``: a ``PyNcclCommunicator`` allgather into scratch) is not
driven, its communicator replaced by one that refuses to be used; the rows the write plan keeps are stored by plain
indexing (``set_kv_buffer``'s store kernel imports the model runner). No L3 backend (SGLang refuses one with sharding).

Faults (``fault``, on the fault rank only, as ``driver.run_ranks`` passes it; ``nth``: at the n-th eligible copy):
``load_flip`` (one byte of this rank's host copy of its stripe flipped just before a host-to-device copy reads it),
``skip_stripe`` (a backup of this rank copies nothing of its stripe: its host rows keep what they held).

CLI, from the repository root: ``python -m tests.sglang_real.shard_driver --version 0.5.23 --out DIR --matrix JSON
--world N --rank R --store S`` (a list of :func:`run_shard` keyword sets; one JSON summary list on stdout), as
``driver.run_ranks(module="shard_driver")`` starts it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

from tests.sglang_real import driver, runtime

PAGE = 4
SHARD_FAULTS = ("load_flip", "skip_stripe")


def server_args(world: int) -> dict:
    """The ``ServerArgs`` fields of a KV-sharded PD-prefill worker over ``world`` attention CP ranks."""
    return {"attn_cp_size": world, "enable_prefill_cp": True, "cp_strategy": "interleave", "tp_size": world,
            "enable_kv_cache_sharding": True, "disaggregation_mode": "prefill", "chunked_prefill_size": 256}


class _NoGather:
    """The pool's prefix-gather communicator (NCCL in SGLang), never used on this path: any use raises."""

    def __init__(self, **kw: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"shard_driver: the KV prefix gather ({name}) is not driven on CPU")


def _spec(world: int, rank: int, page: int) -> Any:
    """This rank's ``PageShardSpec``, the fields ``make_page_shard_spec`` derives (prefix capacity a multiple of the
    group's span, chunk capacity of the chunked prefill size)."""
    from sglang.srt.mem_cache.page_interleave import PageShardSpec

    return PageShardSpec(shard_rank=rank, shard_size=world, page_size=page, max_prefix_tokens=8 * world * page * 16,
                         chunk_tokens=256)


def make_pool(world: int, rank: int, size: int, page: int) -> Any:
    """SGLang's sharded MHA device pool of this rank (the driver's model geometry)."""
    import sglang.srt.mem_cache.page_interleave_pool as pip
    import torch

    pip.PyNcclCommunicator = _NoGather
    group = SimpleNamespace(world_size=world, rank_in_group=rank, cpu_group=None, device="cpu")
    return pip.PageInterleaveMHATokenToKVPool(
        size=size, page_size=page, dtype=torch.float32, head_num=driver.HEADS, head_dim=driver.DIM,
        layer_num=driver.LAYERS, device="cpu", enable_memory_saver=False, shard_spec=_spec(world, rank, page),
        shard_group=group)


def make_alloc(world: int, rank: int, size: int, page: int, kv: Any) -> Any:
    """SGLang's owner-classed allocator over the widened logical slots (``size`` per rank)."""
    import torch
    from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator

    return PageInterleavePoolAllocator(size, physical_page_size=page, shard_size=world, dtype=torch.float32,
                                       device="cpu", kvcache=kv, need_sort=False, shard_spec=kv.shard_spec)


class ShardDriver(driver.Driver23):
    """:class:`driver.Driver23` over a sharded pool: allocation by rotation base, the forward's write through the
    pool's own owner filter, content checks of this rank's stripe only."""

    skipped: list[dict]
    flipped: list[dict]

    def owned(self, idx: Any) -> tuple[Any, Any]:
        import torch

        pl, rank = self.kv.placement, self.kv.shard_rank
        mask = pl.local_mask(idx, rank)
        return torch.nonzero(mask).flatten(), pl.local_index(idx[mask])

    def alloc_new(self, req: driver.Req, need: int) -> Any:
        import torch
        from sglang.srt.mem_cache.allocation import _kv_shard_rotation_bases

        plen = len(req.prefix_idx)
        lens = torch.tensor([plen], dtype=torch.int64)
        seq = torch.tensor([plen + need], dtype=torch.int64)
        bases = _kv_shard_rotation_bases(self.cache, SimpleNamespace(reqs=[req]), lens)
        last = req.prefix_idx[-1:] if plen else torch.tensor([-1], dtype=torch.int64)
        out = self.alloc.alloc_extend(lens, lens, seq, seq, last, need, rotation_bases=bases)
        if out is not None:
            req.kv_rotation_base = bases[0]   # (allocation.py stamps the request for the insert)
        return out

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        rows = driver.expected_rows(tokens)[start:]
        self.kv._epoch += 1   # a new batch (begin_shard_extend's): the write plan is per batch
        # set_kv_buffer's owner filter; its store kernel (_set_kv_buffer_impl) imports the model runner, so the
        # rows it keeps are written as driver.write_rows writes them
        owned, local = self.kv._get_write_plan(idx)
        driver.write_rows(self.kv, local, rows[owned])

    def install_load_flip(self, nth: int) -> None:
        """``load_flip``: before the ``nth`` host-to-device copy that moves some of this rank's stripe runs, one byte of
        the first host row it reads is flipped (this rank's host copy of its stripe, corrupted before the reload)."""
        copies, orig = self.copies, self.copies.submit
        self.flipped, seen = [], [0]

        def submit(stream: str, run: Any, transfers: list) -> Any:
            host = transfers[0].host_indices if transfers else None
            if stream == "h2d" and host is not None and len(host) and not self.flipped:
                seen[0] += 1
                if seen[0] == nth:
                    runtime.Faults._corrupt_host(self.cache, host)
                    row, ps, n = int(host[0]), self.page_size, self.kv.shard_size
                    self.flipped.append({"kind": "load_flip", "host_row": row,   # its logical host slot:
                                         "host_slot": row // ps * n * ps + self.kv.shard_rank * ps + row % ps})
            return orig(stream, run, transfers)
        copies.submit = submit  # type: ignore[method-assign]

    def install_skip(self, nth: int) -> None:
        """``skip_stripe``: the ``nth`` backup whose stripe on this rank is not empty moves none of it."""
        cc = self.cache.cache_controller
        orig = cc._move_write_operation   # (the backups' index preparation; loads take another)
        self.skipped, seen = [], [0]

        def move(op: Any) -> Any:
            host, dev, pools = orig(op)
            if not len(host) or self.skipped:
                return host, dev, pools
            seen[0] += 1
            if seen[0] < nth:
                return host, dev, pools
            self.skipped.append({"kind": "skip_stripe", "node_ids": [int(x) for x in op.node_ids],
                                 "rows": len(host)})
            return host[:0], dev[:0], pools
        cc._move_write_operation = move


def run_shard(version: str, out: str, fault: str | None = None, nth: int = 3, world: int = 2, rank: int = 0,
              store: str | None = None, **kw: Any) -> dict:
    """One rank's run of :func:`driver.run` under KV sharding (see the module doc); the instrumentation is given no
    mode (it derives ``sharded`` from the server arguments). The summary adds ``shard_fault_hits`` (what the fault
    did) and ``owned`` (slots of the tree this rank's device pool held at the end, of all)."""
    if fault is not None and fault not in SHARD_FAULTS:
        raise ValueError(f"run_shard: fault={fault!r} (one of {', '.join(SHARD_FAULTS)})")
    box: dict = {}

    def make_driver(cache: Any, *a: Any) -> Any:
        drv = ShardDriver(cache, *a)
        drv.skipped, drv.flipped = [], []
        if fault == "skip_stripe":
            drv.install_skip(nth)
        elif fault == "load_flip":
            drv.install_load_flip(nth)
        box["drv"] = drv
        return drv

    builder = functools.partial(
        driver.build23, server_args=server_args(world),
        make_kv=lambda size, page: make_pool(world, rank, size, page),
        make_alloc=lambda size, page, kv: make_alloc(world, rank, size, page, kv))
    kw.setdefault("requests", 60)
    kw.setdefault("dev_tokens", 192 // world)   # per rank: the same logical capacity (192 slots) for any group
    kw.setdefault("host_ratio", 2.0)
    res = driver.run(version, out, page_size=PAGE, world=world, rank=rank, store=store, cp_mode=None,
                     make_driver=make_driver, builder=builder, **kw)
    res["shard_fault_hits"] = box["drv"].skipped + box["drv"].flipped
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--version", required=True, choices=("0.5.23",))
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--store")
    p.add_argument("--fault", choices=SHARD_FAULTS)
    p.add_argument("--matrix", required=True, help="JSON list of run_shard() keyword sets")
    a = vars(p.parse_args(argv))
    runtime.use_sglang(a["version"])
    base, matrix = {k: v for k, v in a.items() if k not in ("matrix", "fault")}, json.loads(a["matrix"])
    res = [run_shard(**{**base, **m, "out": os.path.join(a["out"], str(i))}) for i, m in enumerate(matrix)]
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
