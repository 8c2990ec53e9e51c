"""Drive real SGLang HiCache with its L3 storage tier on: the ``file`` backend (``HiCacheFile`` over a temporary
folder, attached with SGLang's ``attach_storage_backend``, the controller path ``--hicache-storage-backend file``
takes too) under ``driver.py``'s scheduler steps, with the scheduler's storage calls, on CPU.

What this adds to ``driver.Driver`` / ``driver.Driver23`` (the scheduler's own flow, ``Scheduler._prefetch_kvcache``
and ``get_next_batch_to_run``, in SGLang 0.5.20 and 0.5.23):

* when a request arrives, ``match_prefix`` and ``prefetch_from_storage`` of the tokens past its device+host match
  (up to the last token, as ``_compute_max_prefix_len``) from its last host-backed node;
* each time it could be admitted, ``check_prefetch_progress`` first: a request whose prefetch is still running stays
  in the queue; once done, ``pop_prefetch_loaded_tokens`` and the usual admission (``match_prefix`` now finds the
  fetched pages on the host: ``init_load_back`` brings them to the device, and the forward checks their KV against
  the expected bytes: the L3 round trip checked end to end);
* the storage threads SGLang starts (query, I/O, backup, ack sync) run for real; before each
  ``check_hicache_events`` the driver waits until they finished what was handed to them (a fast storage: the steps,
  and so the records, are the same on every run and every rank), then the drain takes their acks as the scheduler
  does (``sync_storage=False``: it does not wait; the threads' timing decides). The prefetch policy is
  ``wait_complete``, the prefetch threshold one page (the prompts are short).

Faults (:data:`L3_FAULTS`, one per run): ``l3_flip`` flips a byte of the stored page file the n-th prefetch reads
first (before the read), ``l3_free`` frees the host pages of the n-th prefetch after the storage read and before its
ack is processed and lets another writer reuse them, ``l3_skip`` makes this rank skip its storage writes
(``backup_skip``, the switch SGLang sets on MLA ranks other than 0; 0.5.23 derives it from the storage config, which
the fault makes that of an MLA replica that is not its shard's writer: here a CP rank that never writes its shard),
``l3_drop`` deletes the stored object of the middle page of the n-th prefetch of two pages or more (before the read:
a store that lost an object, not a fault of the cache: the pages before it are a hit, those after it are not),
``l3_rot`` flips a byte of one stored page file after the last step (an object corrupted at rest that no request
reads again: the stream has ended; for the audit of L3 copies, ``audit_mbps``), ``l3_gone`` removes that file instead.

CLI, from the repository root: ``python -m tests.sglang_real.l3_driver --version 0.5.20|0.5.23 --out DIR --matrix
JSON [--world N --rank R --store S] [--backend seaweedfs --backend-config JSON]`` (a list of :func:`run_l3` keyword
sets; one JSON summary list on stdout), as ``driver.run_ranks(module="l3_driver")`` starts it. ``--backend
seaweedfs``: SGLang 0.5.23's ``SeaweedFSStore`` instead of the ``file`` backend, its extra config (``endpoint``, and
``access_key``/``secret_key`` or the AWS credential chain) in ``--backend-config``; the faults are the same, through
S3 (``l3_rot``/``l3_gone``: the file backend only).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from typing import Any

from tests.sglang_real import driver, runtime, rust_driver

L3_FAULTS = ("l3_flip", "l3_free", "l3_skip", "l3_drop", "l3_rot", "l3_gone")
QUIET_S = 120.0   # the storage threads answer within milliseconds; past this they are stuck (a clear error)


class L3Faults:
    """One L3 fault ``kind`` at the ``nth`` eligible site; ``hits`` lists what it did."""

    def __init__(self, kind: str | None, nth: int = 1) -> None:
        if kind is not None and kind not in L3_FAULTS:
            raise ValueError(f"unknown L3 fault {kind!r} (one of {', '.join(L3_FAULTS)})")
        self.kind, self.nth, self.seen = kind, nth, 0
        self.hits: list[dict] = []

    def _take(self) -> bool:
        if not self.kind or self.hits:
            return False
        self.seen += 1
        return self.seen >= self.nth

    def install(self, cache: Any) -> None:
        cc = cache.cache_controller
        if self.kind == "l3_skip":
            if isinstance(getattr(type(cc), "backup_skip", None), property):
                # 0.5.23 derives it from the storage config: this rank becomes what SGLang makes an MLA replica
                # that is not its shard's writer (the backend keeps its own config: the keys do not change)
                import dataclasses

                cc.storage_config = dataclasses.replace(cc.storage_config, is_mla_model=True,
                                                        tp_rank=cc.storage_config.dcp_rank + 1)
            else:
                cc.backup_skip = True
            assert cc.backup_skip
            self.hits.append({"kind": "l3_skip"})
        elif self.kind in ("l3_flip", "l3_drop"):
            orig = cc._page_transfer
            least = 1 if self.kind == "l3_flip" else 2

            def page_transfer(op: Any) -> int:   # (the I/O thread, before it reads the op's pages)
                if len(op.hash_value or ()) >= least and self._take():
                    (self._flip if self.kind == "l3_flip" else self._drop)(cc, op)
                return orig(op)

            cc._page_transfer = page_transfer

    def _flip(self, cc: Any, op: Any) -> None:
        backend = cc.storage_backend
        if hasattr(backend, "_object_key"):   # seaweedfs: the object rewritten through S3, one byte flipped
            key = backend._object_key(op.hash_value[0])
            s3, bucket = backend._s3, backend.config.bucket
            body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            body[0] ^= 0x10
            s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        else:
            key = backend._get_suffixed_key(op.hash_value[0])
            with open(os.path.join(backend.file_path, key + ".bin"), "r+b") as f:
                b = f.read(1)
                f.seek(0)
                f.write(bytes([b[0] ^ 0x10]))
        self.hits.append({"kind": "l3_flip", "op": op.id, "rid": str(op.request_id), "key": key})

    def _drop(self, cc: Any, op: Any) -> None:
        backend = cc.storage_backend
        page = len(op.hash_value) // 2
        if hasattr(backend, "_object_key"):   # seaweedfs: the object deleted through S3
            key = backend._object_key(op.hash_value[page])
            backend._s3.delete_object(Bucket=backend.config.bucket, Key=key)
        else:
            key = backend._get_suffixed_key(op.hash_value[page])
            os.remove(os.path.join(backend.file_path, key + ".bin"))
        self.hits.append({"kind": "l3_drop", "op": op.id, "rid": str(op.request_id), "key": key, "page": page,
                          "pages": len(op.hash_value)})

    def after_drain(self, cache: Any) -> None:
        """``l3_free``: after a drain handed a prefetch its host pages (its ``l3_prefetch``), before the ack."""
        if self.kind != "l3_free":
            return
        for info in list(cache.ongoing_prefetch.values()):
            node_id, op = prefetch_of(info)
            if op.host_indices is None or self.hits or not self._take():
                continue
            idx = op.host_indices[: cache.page_size]
            _free_and_reuse(runtime.host_pool(cache), idx)
            self.hits.append({"kind": "l3_free", "op": op.id, "rid": str(op.request_id),
                              "node_id": node_id, "host_slot": int(idx[0])})


def prefetch_of(info: Any) -> tuple[int, Any]:
    """``(anchor node id, operation)`` of an ``ongoing_prefetch`` value: 0.5.20's ``(node, key, op)`` tuple, 0.5.23's
    ``_OngoingPrefetch`` (the anchor's node id)."""
    if hasattr(info, "operation"):
        return int(info.anchor_node_id), info.operation
    return int(info[0].id), info[2]


def _free_and_reuse(hp: Any, idx: Any) -> None:
    """Host slots ``idx`` freed as SGLang frees them (``HostKVCache.free``) and taken at once by another writer, which
    overwrites them with 7.0. That writer holds them: they are taken back from the pool's free lists, so that the
    tree's later release of the prefetch's claim on them stays balanced (the pool asserts on a double free)."""
    import torch

    hp.free(idx)
    for buf in (hp.k_buffer, hp.v_buffer):
        buf[:, idx] = torch.full_like(buf[:, idx], 7.0)
    hp.slot_used[idx] = True
    hp.release_slots = [r[~torch.isin(r, idx)] for r in hp.release_slots]
    hp.num_release_slots = sum(len(r) for r in hp.release_slots)


class _Storage:
    """The scheduler's storage calls over :class:`driver.Driver` (0.5.20, :class:`StorageDriver`) or
    :class:`driver.Driver23` (0.5.23, :class:`StorageDriver23`); see the module doc."""

    cache: Any
    stats: dict

    def __init__(self, cache: Any, kv: Any, alloc: Any, copies: runtime.Copies, seed: int, page_size: int,
                 faults: L3Faults, sync_storage: bool = True, parallel: dict | None = None,
                 backend: str = "file", extra: dict | None = None) -> None:
        super().__init__(cache, kv, alloc, copies, seed, page_size)
        self.faults = faults
        self.sync_storage = sync_storage
        self.arrived: set[str] = set()
        self.stats.update({"l3_prefetches": 0, "l3_loaded_tokens": 0, "l3_waits": 0})
        attach_file_storage(cache, backend, extra, parallel=parallel)
        faults.install(cache)
        orig = cache.check_hicache_events   # (the instrumented method, bound)

        def check_hicache_events() -> None:
            if self.sync_storage:
                self.quiesce()
            orig()
            if faults.kind == "l3_free" and cache.ongoing_prefetch:
                self.quiesce()   # the storage read is done; the scheduler has not seen its ack
                faults.after_drain(cache)

        cache.check_hicache_events = check_hicache_events

    # -- the storage threads --------------------------------------------------------------------------------------
    def _busy(self) -> bool:
        c = self.cache
        cc = c.cache_controller
        acked = {op.id for op in _items(cc.ack_backup_queue)}
        if any(op_id not in acked for op_id in c.ongoing_backup):
            return True
        queried = {id(op) for op in _items(cc.prefetch_hit_queue)}
        done = {id(a.operation) for a in _items(cc.ack_prefetch_queue) if a.completed_req}
        for info in c.ongoing_prefetch.values():
            _node_id, op = prefetch_of(info)
            if op.host_indices is None and id(op) not in queried:
                return True   # its storage query is running
            if op.host_indices is not None and id(op) not in done:
                return True   # its storage read is running
        return False

    def quiesce(self) -> None:
        """Wait until the storage threads finished what they were handed (polls their queues)."""
        deadline = time.monotonic() + QUIET_S
        while self._busy():
            self.stats["l3_waits"] += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang's storage threads did not finish within {QUIET_S:.0f}s")
            time.sleep(0.0005)

    # -- the scheduler's calls ------------------------------------------------------------------------------------
    def arrive(self, req: driver.Req) -> None:
        """``Scheduler._prefetch_kvcache``: a prefetch of what the tree lacks, from the last host-backed node."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        self.arrived.add(req.rid)
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(req.tokens), req=req))
        matched = (m.device_prefix_len if hasattr(m, "device_prefix_len") else len(m.device_indices)) \
            + m.host_hit_length
        node = m.last_host_node
        if not (c.is_backuped(node) or c.is_root(node)):
            return
        tokens = req.tokens[matched:max(len(req.tokens) - 1, 0)]
        before = len(c.ongoing_prefetch)
        h = CacheRequestHandle(req.rid, 0)
        if isinstance(self, driver.Driver23):   # 0.5.23 also takes the matched tokens (the storage span's start)
            c.prefetch_from_storage(h, node, tokens, c.get_last_hash_value(node), None,
                                    matched_prefix_tokens=req.tokens[:matched])
        else:
            c.prefetch_from_storage(h, node, tokens, c.get_last_hash_value(node))
        self.stats["l3_prefetches"] += int(len(c.ongoing_prefetch) > before)

    def admit(self, reqs: list[driver.Req]) -> list[driver.Req]:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        c = self.cache
        ready = []
        for req in reqs:
            if req.rid not in self.arrived:
                self.arrive(req)
            h = CacheRequestHandle(req.rid, 0)
            if not c.check_prefetch_progress(h):
                continue   # its prefetch is running: it stays in the queue
            self.stats["l3_loaded_tokens"] += c.pop_prefetch_loaded_tokens(h)
            ready.append(req)
        return super().admit(ready) if ready else []  # type: ignore[misc]

    def rot(self) -> dict:
        """``l3_rot``: one byte of the stored object with the smallest key flipped in its file (after the last step;
        its write acknowledged); ``l3_gone``: that file removed; otherwise the host copy :meth:`driver.Driver.rot`
        corrupts."""
        kind = self.faults.kind
        if kind not in ("l3_rot", "l3_gone"):
            return super().rot()  # type: ignore[misc]
        self.settle()
        root = self.cache.cache_controller.storage_backend.file_path
        names = sorted(f for f in os.listdir(root) if f.endswith(".bin"))
        if not names:
            raise RuntimeError("no stored object to corrupt")
        path = os.path.join(root, names[0])
        if kind == "l3_gone":
            os.remove(path)
        else:
            with open(path, "r+b") as f:
                b = f.read(1)
                f.seek(0)
                f.write(bytes([b[0] ^ 0x10]))
        return {"kind": kind, "key": names[0][:-len(".bin")]}

    def requeue(self, queue: list[driver.Req], take: int, admitted: list[driver.Req]) -> list[driver.Req]:
        """The scheduler's waiting queue keeps its order: a request waiting for its prefetch stays at the head."""
        return [r for r in queue[:take] if r not in admitted] + queue[take:]

    def settle(self) -> None:
        """Every copy and every storage operation done and acknowledged (before a reset and at the end)."""
        c = self.cache
        for _ in range(100):
            self.quiesce()
            super().settle()  # type: ignore[misc]
            if not (c.ongoing_backup or c.ongoing_prefetch or c.ongoing_write_through):
                return
        raise RuntimeError("storage operations still pending after 100 settles: backups "
                           f"{list(c.ongoing_backup)[:5]}, prefetches {[str(k) for k in c.ongoing_prefetch][:5]}, "
                           f"host writes {list(c.ongoing_write_through)[:5]}")


class StorageDriver(_Storage, driver.Driver):
    """0.5.20 (``HiRadixCache``)."""


class StorageDriver23(_Storage, driver.Driver23):
    """0.5.23 (``UnifiedRadixCache``)."""


class BoundaryStorageDriver23(_Storage, rust_driver.BoundaryDriver23):
    """0.5.23 over the tree core SGLang selects, its Rust one included (``run_l3(..., boundary=True)``): the tree read
    through the core's interface only (rust_driver.py)."""


def _items(q: Any) -> list:
    with q.mutex:
        return list(q.queue)


def attach_file_storage(cache: Any, backend: str = "file", extra: dict | None = None,
                        parallel: dict | None = None) -> None:
    """SGLang's runtime attach of the ``file`` backend (``HiRadixCache.attach_storage_backend``, the path the
    controller's constructor takes for ``--hicache-storage-backend file`` too), into the folder
    ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` names; prefetch policy ``wait_complete``, threshold one page.
    ``backend``/``extra``: another backend and its extra config (e.g. ``dynamic``, with the class it loads).
    ``parallel``: SGLang's parallel state as the storage config reads it, over a TP group of one (e.g. the global
    TP rank and size of a prefill CP deployment, where every attention CP rank is a TP rank of its own)."""
    from sglang.srt import runtime_context as rc

    # the backend's config reads the TP/PP widths from SGLang's parallel state, which only a model runner sets up
    names = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    if hasattr(cache, "tree_core"):   # 0.5.23 also reads the attention TP/DP and decode-CP widths
        names.update(attn_tp_rank=0, attn_tp_size=1, attn_dp_rank=0, attn_dcp_rank=0, attn_dcp_size=1)
    names.update(parallel or {})
    with rc.get_parallel().override(**names):
        ok, why = cache.attach_storage_backend(
            backend, json.dumps({"prefetch_threshold": cache.page_size, **(extra or {})}), served_model_name="dummy",
            hicache_storage_prefetch_policy="wait_complete")
    if not ok:
        raise RuntimeError(f"SGLang refused the {backend} storage backend: {why}")


def run_l3(version: str, out: str, fault: str | None = None, nth: int = 1, l3_store: str | None = None,
           requests: int = 60, dev_tokens: int = 160, host_ratio: float = 1.5, sync_storage: bool = True,
           l3_from: str | None = None, drop_meta: bool = False, model_path: str | None = None,
           kv_dtype: str | None = None,
           l3_max_size: str | None = None, l3_backend: str = "file", l3_extra: dict | None = None,
           boundary: bool = False, **kw: Any) -> dict:
    """One run of :func:`driver.run` with storage on (a fresh ``file`` store under ``out/l3store``, or ``l3_store``:
    the one folder the ranks of a CP group share); ``kw`` are :func:`driver.run`'s. ``sync_storage=False``: the
    steps do not wait for the storage threads (their timing decides which step sees an ack, so the records differ
    from run to run). ``l3_from``: the fresh store starts as a copy of that one (an earlier run's: persisted
    storage), without the instrumentation's metadata files where ``drop_meta``; ``model_path``/``kv_dtype``: this
    run's model and KV dtype (:data:`driver.POOL`). ``l3_max_size``: the file backend's size cap (its LRU eviction on,
    ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``). ``l3_backend``/``l3_extra``: another backend and its extra
    config (``seaweedfs`` with its ``endpoint``: the run's objects go under a ``prefix`` of its own, or ``l3_store``'s
    where given). ``boundary`` (0.5.23): the tree core SGLang selects (its Rust one, under the torch it loads with),
    the driver reading the tree through the core's interface (:class:`BoundaryStorageDriver23`). The summary adds
    ``l3_fault_hits``, ``l3_files`` (the objects stored) and ``l3_store``."""
    driver.POOL.clear()
    driver.POOL.update({k: v for k, v in (("model_path", model_path), ("kv_dtype", kv_dtype)) if v})
    if boundary:   # SGLang's own tree core (the Rust one with its torch), driven through its interface
        driver.POOL["tree_core"] = ""
        kw.update(stream=rust_driver.request_stream, boundary=True)
    if l3_backend != "file":
        if l3_from is not None:
            raise ValueError("l3_from (a copy of an earlier store) is for the file backend only")
        l3_extra = {**(l3_extra or {})}
        l3_extra["prefix"] = l3_store or l3_extra.get("prefix") or f"cptrace-{uuid.uuid4().hex[:12]}"
        return _run(version, out, fault, nth, sync_storage, l3_backend, l3_extra, requests=requests,
                    dev_tokens=dev_tokens, host_ratio=host_ratio, **kw)
    root = l3_store or os.path.join(out, "l3store")
    if l3_store is None:
        shutil.rmtree(root, ignore_errors=True)
    if l3_from is not None:
        shutil.copytree(l3_from, root, dirs_exist_ok=True)
        if drop_meta:
            for f in os.listdir(root):
                if f.endswith(".cptrace"):
                    os.remove(os.path.join(root, f))
    os.makedirs(root, exist_ok=True)
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = root
    cap = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
    if l3_max_size is not None:
        os.environ[cap] = l3_max_size
    try:
        res = _run(version, out, fault, nth, sync_storage, "file", None, requests=requests, dev_tokens=dev_tokens,
                   host_ratio=host_ratio, **kw)
    finally:
        os.environ.pop(cap, None)
    res["l3_files"] = len([f for f in os.listdir(root) if f.endswith(".bin")])
    res["l3_store"] = root
    return res


def _run(version: str, out: str, fault: str | None, nth: int, sync_storage: bool, backend: str, extra: dict | None,
         **kw: Any) -> dict:
    """:func:`driver.run` with the storage driver over ``backend``; a ``seaweedfs`` run's summary counts the objects
    under its prefix. :data:`driver.POOL` (set by the caller) is cleared after."""
    faults = L3Faults(fault, nth)
    cls = BoundaryStorageDriver23 if kw.pop("boundary", False) else StorageDriver23 if version == "0.5.23" else \
        StorageDriver
    make = functools.partial(cls, faults=faults, sync_storage=sync_storage, backend=backend, extra=extra)
    if fault in ("l3_rot", "l3_gone"):
        kw["rot"] = True   # (driver.run calls the driver's rot() after the last step, before the audit's passes)
    try:
        res = driver.run(version, out, make_driver=make, **kw)
    finally:
        driver.POOL.clear()
    res["l3_fault_hits"] = faults.hits
    if extra is not None:
        res["l3_files"] = len(s3_objects(extra))
        res["l3_store"] = f"s3://{extra.get('bucket', 'sglang-hicache')}/{extra['prefix']}"
    return res


def s3_objects(extra: dict) -> list[str]:
    """The keys of the objects under ``extra``'s prefix in its bucket (the S3 gateway at its ``endpoint``)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=extra["endpoint"], region_name=extra.get("region", "us-east-1"),
                      aws_access_key_id=extra.get("access_key"), aws_secret_access_key=extra.get("secret_key"),
                      config=Config(s3={"addressing_style": "path"}))
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=extra.get("bucket", "sglang-hicache"),
                                                          Prefix=extra["prefix"] + "/")
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def run_matrix(version: str, out: str, matrix: list[dict], *args: str, timeout: float = 900) -> list[dict]:
    """This module's CLI in a subprocess (one rank), as a test runs it: the summaries of ``matrix`` over SGLang
    ``version`` into ``out``; ``args``: more of its options (``--backend``, ...)."""
    import subprocess

    p = subprocess.run(runtime.module_cmd("l3_driver", "--version", version, "--out", out, "--matrix",
                                          json.dumps(matrix), *args), env=runtime.sglang_env(version),
                       cwd=runtime.ROOT, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"l3_driver exited with {p.returncode}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None, run: Any = None, versions: tuple = runtime.VERSIONS,
         doc: str | None = None) -> int:
    """The CLI of the module doc: ``run`` (default :func:`run_l3`, or another with its signature: cp_driver.py's)
    for each matrix entry, over the SGLang ``versions`` it supports; ``doc``: the program's description."""
    run = run or run_l3
    p = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
    p.add_argument("--version", required=True, choices=versions)
    p.add_argument("--out", required=True)
    p.add_argument("--matrix", required=True,
                   help=f"JSON list of {run.__name__}() keyword sets, run one after the other")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--store")
    p.add_argument("--backend", default="file", choices=("file", "seaweedfs"),
                   help="SGLang's L3 backend (seaweedfs: give its endpoint in --backend-config)")
    p.add_argument("--backend-config", default="{}", help='the backend\'s extra config, JSON: {"endpoint": URL}')
    a = p.parse_args(argv)
    backend = {} if a.backend == "file" else {"l3_backend": a.backend, "l3_extra": json.loads(a.backend_config)}
    runtime.use_sglang(a.version)
    res = []
    for i, kw in enumerate(json.loads(a.matrix)):
        out = os.path.join(a.out, str(i))
        # the ranks of a CP group share one store (their keys carry the rank suffix), one per matrix entry: a
        # folder, or a key prefix of this launch alone (its folder and gloo store: a server outlives a test run)
        l3_store = None
        if a.world > 1:
            launch = hashlib.sha256(f"{os.path.abspath(a.out)}|{a.store}".encode()).hexdigest()[:12]
            l3_store = os.path.join(a.out, f"l3store-{i}") if not backend else f"cptrace-{launch}-{i}"
        res.append(run(a.version, out, world=a.world, rank=a.rank, store=a.store, l3_store=l3_store, **backend, **kw))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
