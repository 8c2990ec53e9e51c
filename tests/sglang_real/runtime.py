"""Real SGLang HiCache on CPU, for tests: the three runtime answers, copies that complete steps later, and faults.

Runs inside a process whose ``PYTHONPATH`` has ``.sglang/<version>/`` (see :func:`sglang_env`). Patches are narrow
and test-only (never shipped), and the same three serve 0.5.20 and 0.5.23 (0.5.23's host pool takes ``pin_memory``
at the same position, its controller and ``l2_transfer`` take ``device_module`` the same way, and its direct IO
copies through the same ``transfer_kv_direct``); 0.5.23's page-first direct IO (the Mamba state host pool's only
kind) adds two copies to the third:

* the host pools (MHA; 0.5.23's MLA, DSA indexer and Mamba state pools too) are built with ``pin_memory=False``
  (pinning calls ``cudaHostRegister``);
* ``device_module`` of ``cache_controller`` and ``l2_transfer`` is ``torch.cpu`` (no-op streams and events; SGLang
  took ``torch.get_device_module()``, ``torch.cuda`` on a CUDA build of torch even without a GPU);
* ``transfer_kv_direct`` (imported from sgl_kernel only under CUDA, in each host pool module) is a plain indexed copy;
  so are the page-first direct IO's ``transfer_kv_per_layer_direct_pf_lf`` and ``transfer_kv_all_layer_direct_lf_pf``
  (0.5.23's Mamba state host pool takes only page-first layouts: mamba_driver.py's caches use them);
* :class:`Copies`: ``L2TransferEngine.submit_*`` run SGLang's own copy code later: each copy is queued with a
  seeded lag (scheduler steps); its data moves when it completes (due at a step, or forced by a ``synchronize``
  or by the forward's wait on a load) and its ack becomes visible to ``finish_event.query()`` at its due step.
  Copies on one stream complete in order.
* :class:`Faults`: one injected fault per run (:data:`FAULTS`), at the n-th eligible site (0.5.23: the same
  five shapes at its own sites, ``_install23_*``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import types
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSIONS = ("0.5.20", "0.5.23")
FAULTS = ("flip", "unpinned", "midchain", "early_release", "split_no_rewrite")


def sglang_dir(version: str) -> str:
    return os.path.join(ROOT, ".sglang", version)


def rust_torch_dir() -> str:
    """The torch that 0.5.23's Rust tree core loads with (2.11-2.14; deploy/sglang/install puts 2.14.1 there): with
    another torch SGLang falls back to its Python core without a word."""
    return os.path.join(ROOT, ".sglang", "torch-2.14")


def missing_reason(version: str, rust: bool = False) -> str | None:
    """Why real SGLang ``version`` cannot run here (None when it can): the folder deploy/sglang/install fills;
    ``rust``: with 0.5.23's Rust tree core (its torch, :func:`rust_torch_dir`, too)."""
    d = sglang_dir(version)
    if not os.path.isfile(os.path.join(d, "sglang", "srt", "mem_cache", "radix_cache.py")):
        return f"sglang {version} is not installed in {d} (run deploy/sglang/install)"
    if rust and not os.path.isfile(os.path.join(rust_torch_dir(), "torch", "__init__.py")):
        return (f"torch 2.14 for sglang {version}'s Rust tree core is not installed in {rust_torch_dir()} "
                "(run deploy/sglang/install)")
    return None


def need(version: str, rust: bool = False) -> None:
    """In a test: skip when SGLang ``version`` (``rust``: with its Rust tree core's torch) is missing here, fail
    instead under ``CPTRACE_REQUIRE_SGLANG=1`` (``.ci/run`` installs it and requires it)."""
    why = missing_reason(version, rust)
    if why is None:
        return
    import pytest  # (only tests call this; the driver's processes never import pytest)

    if os.environ.get("CPTRACE_REQUIRE_SGLANG", "").strip().lower() in ("1", "true", "yes", "on"):
        pytest.fail(why + " (CPTRACE_REQUIRE_SGLANG=1)")
    pytest.skip(why)


def sglang_env(version: str, rust: bool = False, **extra: str) -> dict[str, str]:
    """Environment for a subprocess that imports SGLang ``version`` and this checkout; ``rust``: with the torch
    0.5.23's Rust tree core loads with (:func:`rust_torch_dir`) ahead of this interpreter's. Which core a cache gets
    is still SGLang's choice (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, in ``extra`` or the caller's environment)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *([rust_torch_dir()] if rust else []), sglang_dir(version)])
    env.setdefault("SGLANG_LOG_LEVEL", "warning")
    env.update(extra)
    return env


def rust_default_env(version: str = "0.5.23") -> dict[str, str]:
    """:func:`sglang_env` with the Rust core's torch, SGLang's own selection of the tree core (the Rust one) and the
    instrumentation's default (neither ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` nor ``CPTRACE_SGLANG_TREE_CORE``
    set, whatever the caller's environment says)."""
    env = sglang_env(version, rust=True)
    for var in ("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "CPTRACE_SGLANG_TREE_CORE"):
        env.pop(var, None)
    return env


def run_json(code: str, *args: str, env: dict[str, str], timeout: float) -> Any:
    """``python -c code args`` from the repository root under ``env``; its last stdout line, as JSON (its stderr's
    tail in the assertion when it fails)."""
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- reading the runs back ---------------------------------------------------------------------------------------
def check_json(paths: list[str]) -> dict:
    """``cptrace-otel check --json`` over the given logs, as a user runs it (this checkout's package)."""
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "check", "--json", "--no-progress", *paths],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout)


def log_events(paths: list[str]) -> list:
    """The records of the given logs, as ``check`` reads them."""
    from cptrace_otel.analyze.sources.logs import read_log_events

    return list(read_log_events(paths))


def fmt_findings(d: dict, width: int | None = 160) -> list[str]:
    """The first findings of a :func:`check_json` answer, one line each (messages cut at ``width``), for asserts."""
    return [f"{f['severity']} {f['rule']} r{f['rank']} n{f['node_id']} op{f['op']}: {f['message'][:width]}"
            for f in d["findings"][:8]]


# -- CPU answers ----------------------------------------------------------------------------------------------
def _transfer_kv_direct(src_layers: list, dst_layers: list, src_indices: Any, dst_indices: Any,
                        page_size: int = 1) -> None:
    """sgl_kernel's ``transfer_kv_direct`` on CPU: ``dst[dst_indices] = src[src_indices]`` per layer buffer."""
    for s, d in zip(src_layers, dst_layers, strict=False):
        d[dst_indices.to(d.device)] = s[src_indices.to(s.device)]


def _transfer_kv_per_layer_direct_pf_lf(src_ptrs: list, dst_ptrs: list, src_indices: Any, dst_indices: Any,
                                        layer_id: int, page_size: int = 1) -> None:
    """sgl_kernel's ``transfer_kv_per_layer_direct_pf_lf`` on CPU: a page-first host buffer
    ``[page, layer, page_size, ...]``'s layer ``layer_id`` rows into a layer-first device layer, page by page."""
    for s, d in zip(src_ptrs, dst_ptrs, strict=False):
        pages = src_indices[::page_size].to(s.device) // page_size
        d[dst_indices.to(d.device)] = s[pages, layer_id].reshape(len(dst_indices), *d.shape[1:]).to(d.device)


def _transfer_kv_all_layer_direct_lf_pf(src_ptrs: list, dst_ptrs: list, src_indices: Any, dst_indices: Any,
                                        page_size: int = 1) -> None:
    """sgl_kernel's ``transfer_kv_all_layer_direct_lf_pf`` on CPU: the layer-first device layers ``src_ptrs`` (as
    many per page-first host buffer of ``dst_ptrs``, in order) into their host pages, every layer."""
    per = len(src_ptrs) // len(dst_ptrs)
    for j, d in enumerate(dst_ptrs):
        pages = dst_indices[::page_size].to(d.device) // page_size
        for layer in range(per):
            s = src_ptrs[j * per + layer]
            d[pages, layer] = s[src_indices.to(s.device)].reshape(len(pages), *d.shape[2:]).to(d.device)


def apply_cpu_answers() -> None:
    import sglang.srt.managers.cache_controller as cc
    import sglang.srt.mem_cache.l2_transfer as l2
    import sglang.srt.mem_cache.pool_host.mha as mha
    import torch

    cc.device_module = torch.cpu
    l2.device_module = torch.cpu
    mods: list[tuple[Any, str, int]] = [(mha, "MHATokenToKVPoolHost", 6)]
    try:   # 0.5.23's MLA host pool, the DSA indexer's host pool (the DSA sidecar) and the Mamba state host pool;
        # 0.5.20 has none of the last two
        import sglang.srt.mem_cache.pool_host.dsa as dsa
        import sglang.srt.mem_cache.pool_host.mamba as mamba
        import sglang.srt.mem_cache.pool_host.mla as mla

        mods += [(mla, "MLATokenToKVPoolHost", 6), (dsa, "DSAIndexerPoolHost", 1 << 30),
                 (mamba, "MambaPoolHost", 1 << 30)]
    except ImportError:
        pass
    answers = {"transfer_kv_direct": _transfer_kv_direct,
               "transfer_kv_per_layer_direct_pf_lf": _transfer_kv_per_layer_direct_pf_lf,
               "transfer_kv_all_layer_direct_lf_pf": _transfer_kv_all_layer_direct_lf_pf}
    for mod, name, pos in mods:
        for fn, answer in answers.items():
            if getattr(mod, fn, None) is None:   # (the Mamba module binds some of them to None off CUDA)
                setattr(mod, fn, answer)
        _unpinned(getattr(mod, name), pos)


def _unpinned(cls: Any, pos: int) -> None:
    """``cls`` built with ``pin_memory=False`` unless its caller passed it (positional index ``pos`` of ``a``)."""
    if getattr(cls.__init__, "_cpu_unpinned", False):
        return
    orig = cls.__init__

    @functools.wraps(orig)
    def init(self: Any, *a: Any, **k: Any) -> None:
        if len(a) < pos:
            k["pin_memory"] = False
        orig(self, *a, **k)

    init._cpu_unpinned = True  # type: ignore[attr-defined]
    cls.__init__ = init


def host_pool(cache: Any) -> Any:
    """The full-attention KV host pool: ``token_to_kv_pool_host`` (0.5.20), the host pool group's anchor (0.5.23)."""
    hp = getattr(cache, "token_to_kv_pool_host", None)
    return hp if hp is not None else cache.cache_controller.mem_pool_host.anchor_entry.host_pool


def full(node: Any) -> Any:
    """0.5.23: the node's full-attention component data (``value``, ``host_value``, ``lock_ref``)."""
    return node.component_data[0]


# -- copies that complete later ---------------------------------------------------------------------------------
class _Job:
    __slots__ = ("run", "due", "done", "stream", "op_kind", "meta")

    def __init__(self, run: Any, due: int, stream: str, meta: dict) -> None:
        self.run, self.due, self.done, self.stream, self.meta = run, due, False, stream, meta


class _Event:
    """The finish event of a deferred copy."""

    def __init__(self, copies: Copies, job: _Job) -> None:
        self.copies, self.job = copies, job

    def query(self) -> bool:
        return self.copies.poll(self.job)

    def synchronize(self) -> None:
        self.copies.complete(self.job)

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        self.copies.complete(self.job)

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class Copies:
    """The deferred copy engine (see the module doc). ``step`` is the scheduler step the driver is in."""

    def __init__(self, seed: int, max_lag: int) -> None:
        self.rng = random.Random(seed)
        self.max_lag = max_lag
        self.step = 0
        self.queues: dict[str, list[_Job]] = {"d2h": [], "h2d": []}
        self.after_copy: list[Any] = []   # hooks(job) after a copy's data moved (faults)
        self.force_lag: dict[str, int] = {}   # direction -> lag for its next copy (faults)

    def install(self) -> None:
        import sglang.srt.mem_cache.l2_transfer as l2

        eng = l2.L2TransferEngine
        if getattr(eng, "cptrace_deferred", None) is not None:
            eng.cptrace_deferred = self
            return
        eng.cptrace_deferred = self
        orig_d2h, orig_h2d = eng.submit_device_to_host, eng.submit_host_to_device

        def d2h(self_: Any, transfers: list) -> Any:
            return eng.cptrace_deferred.submit("d2h", functools.partial(orig_d2h, self_, transfers), transfers)

        def h2d(self_: Any, transfers: list, **kw: Any) -> Any:
            return eng.cptrace_deferred.submit("h2d", functools.partial(orig_h2d, self_, transfers, **kw), transfers)

        eng.submit_device_to_host = d2h
        eng.submit_host_to_device = h2d

    def submit(self, stream: str, run: Any, transfers: list) -> Any:
        import sglang.srt.mem_cache.l2_transfer as l2
        import torch

        lag = self.force_lag.pop(stream, None)
        if lag is None:
            lag = self.rng.randint(0, self.max_lag)
        meta = {"host": [t.host_indices.clone() for t in transfers],
                "dev": [t.device_indices.clone() for t in transfers], "pools": transfers}
        job = _Job(run, self.step + lag, stream, meta)
        self.queues[stream].append(job)
        return l2.TransferCompletion(torch.cpu.Event(), _Event(self, job), False)

    def complete(self, job: _Job) -> None:
        """Move ``job``'s data now, and that of every copy before it on its stream."""
        q = self.queues[job.stream]
        while not job.done and q:
            j = q.pop(0)
            j.run()
            j.done = True
            for hook in self.after_copy:
                hook(j)

    def poll(self, job: _Job) -> bool:
        if self.step >= job.due:
            self.complete(job)
            return True
        return False

    def tick(self) -> None:
        self.step += 1
        for q in self.queues.values():
            while q and q[0].due <= self.step:
                self.complete(q[0])

    def wait_loads(self) -> None:
        """The forward's wait on the load stream (``wait_until`` per layer): every issued load's data moved."""
        q = self.queues["h2d"]
        if q:
            self.complete(q[-1])

    def drain(self) -> None:
        """Every issued copy done now, and its finish event says so from now on (a copy issued inside a settle's
        check, at ``step + 1000``, would otherwise stay unfinished for its lag after the step is wound back)."""
        for q in self.queues.values():
            jobs = list(q)
            if q:
                self.complete(q[-1])
            for j in jobs:
                j.due = min(j.due, self.step)


# -- faults -------------------------------------------------------------------------------------------------------
class Faults:
    """One fault ``kind`` (:data:`FAULTS`) hitting the ``nth`` eligible site; ``hits`` lists what it did."""

    def __init__(self, kind: str | None, nth: int = 1) -> None:
        if kind is not None and kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r} (one of {', '.join(FAULTS)})")
        self.kind, self.nth = kind, nth
        self.seen = 0
        self.hits: list[dict] = []

    def _take(self) -> bool:
        if not self.kind or self.hits:
            return False
        self.seen += 1
        return self.seen >= self.nth

    def install(self, cache: Any, copies: Copies) -> None:
        if hasattr(cache, "tree_core") and self.kind in ("unpinned", "midchain", "early_release",
                                                         "split_no_rewrite"):
            getattr(self, "_install23_" + self.kind)(cache, copies)
        elif self.kind == "flip":
            copies.after_copy.append(functools.partial(self._flip, cache))
        elif self.kind == "unpinned":
            self._unpinned(cache, copies)
        elif self.kind == "midchain":
            self._wrap_load_back(cache, self._midchain)
        elif self.kind == "early_release":
            self._wrap_load_back(cache, self._early_release)
        elif self.kind == "split_no_rewrite":
            self._split_no_rewrite(cache)

    @staticmethod
    def _corrupt_host(cache: Any, host_idx: Any) -> None:
        """Flip every bit of the first byte of layer 0's K row of host slot ``host_idx[0]``."""
        import torch

        hp = host_pool(cache)
        row = hp.k_buffer[0][int(host_idx[0])]
        b = row.view(torch.uint8).view(-1)
        b[0] ^= 0xFF

    def _flip(self, cache: Any, job: _Job) -> None:
        if job.stream != "d2h" or not self._take():
            return
        host = job.meta["host"][0]
        self._corrupt_host(cache, host)
        self.hits.append({"kind": "flip", "host_slot": int(host[0])})

    def _unpinned(self, cache: Any, copies: Copies) -> None:
        """The n-th write-through backup is not pinned (no inc_lock_ref) while its copy is in flight (lag 4)."""
        orig_wb, orig_ack = cache.write_backup, cache._finish_write_through_ack
        unpinned: set[int] = set()

        def write_backup(node: Any, write_back: bool = False) -> int:
            if write_back or not self._take_if(node, cache):
                return orig_wb(node, write_back)
            cache.inc_lock_ref = lambda n: None   # this backup only
            copies.force_lag["d2h"] = 4
            try:
                r = orig_wb(node, write_back)
            finally:
                del cache.inc_lock_ref
            if r:
                unpinned.add(node.id)
                self.hits.append({"kind": "unpinned", "node_id": node.id})
            return r

        def finish(ack_id: int, *, release_lock: bool) -> None:
            if ack_id in unpinned:
                unpinned.discard(ack_id)
                release_lock = False   # it was never taken
            return orig_ack(ack_id, release_lock=release_lock)

        cache.write_backup = write_backup
        cache._finish_write_through_ack = finish

    def _take_if(self, node: Any, cache: Any) -> bool:
        if node.backuped or (node.parent is not cache.root_node and not node.parent.backuped):
            return False   # SGLang would not back it up now: not an eligible site
        return self._take()

    def _wrap_load_back(self, cache: Any, hook: Any) -> None:
        orig = cache.load_back

        def load_back(node: Any, mem_quota: Any = None) -> Any:
            chain = []
            n = node
            while n.evicted:
                chain.insert(0, n)
                n = n.parent
            hook(cache, chain, None)
            res = orig(node, mem_quota)
            if res is not None:
                hook(cache, chain, res)
            return res

        cache.load_back = load_back

    def _midchain(self, cache: Any, chain: list, res: Any) -> None:
        """Before a load of a chain of 3+ nodes: corrupt a host slot of a middle node (its copy completed)."""
        if res is not None or len(chain) < 3 or not self._take():
            return
        mid = chain[len(chain) // 2]
        self._corrupt_host(cache, mid.host_value)
        self.hits.append({"kind": "midchain", "node_id": mid.id, "chain": [n.id for n in chain]})

    def _early_release(self, cache: Any, chain: list, res: Any) -> None:
        """After a load is issued, before its copy: the first chain node's host pages are freed (the pin is already
        released at issue in this SGLang) and reused by another writer, which overwrites them."""
        if res is None or not chain or not self._take():
            return
        n = chain[0]
        self._free_and_reuse(cache, n.host_value)
        self.hits.append({"kind": "early_release", "node_id": n.id, "chain": [c.id for c in chain]})

    @staticmethod
    def _free_and_reuse(cache: Any, idx: Any) -> None:
        import torch

        hp = host_pool(cache)
        hp.free(idx)                        # the release SGLang #31427 moves to the ack ...
        mla = not hasattr(hp, "k_buffer")
        for buf in ((hp.kv_buffer,) if mla else (hp.k_buffer, hp.v_buffer)):
            buf[:, idx] = torch.full_like(buf[:, idx], 7.0)   # ... and the writer that reused the pages
        # the reusing writer holds the pages: take them back from the free lists so the tree's later host
        # eviction of this node stays balanced (the pool asserts on a double free)
        hp.slot_used[idx] = True
        hp.release_slots = [r[~torch.isin(r, idx)] for r in hp.release_slots]
        hp.num_release_slots = sum(len(r) for r in hp.release_slots)

    def _split_no_rewrite(self, cache: Any) -> None:
        """A split of a node with a pending write does not rewrite the pending entry (the shape of #27072)."""
        orig = cache._replace_pending_write_through_node

        def replace(old: Any, new_nodes: list) -> None:
            ack_id = old.write_through_pending_id
            if ack_id is not None and ack_id in cache.ongoing_write_through and self._take():
                self.hits.append({"kind": "split_no_rewrite", "node_id": old.id, "new_id": new_nodes[0].id})
                return
            return orig(old, new_nodes)

        cache._replace_pending_write_through_node = replace


    # -- sglang 0.5.23 (UnifiedRadixCache): the same shapes at its own sites ------------------------------------------
    def _install23_unpinned(self, cache: Any, copies: Copies) -> None:
        """The n-th write-through backup action (a chain, parent first) pins none of its nodes while its copy is in
        flight (lag 4): ``inc_lock_ref`` is skipped for it, and its ack releases nothing."""
        orig = cache._execute_and_commit_kv_backup

        class _NoLock:
            @staticmethod
            def to_dec_params() -> None:
                return None   # _finish_write_through_ack releases no lock then

        def backup(action: Any, write_back: bool = False) -> int:
            tc = cache.tree_core
            todo = [nid for nid in action.node_ids if not tc.is_backuped(nid)]
            if write_back or not todo or not self._take():
                return orig(action, write_back)
            cache.inc_lock_ref = lambda *a, **k: _NoLock()   # this action only
            copies.force_lag["d2h"] = 4
            try:
                r = orig(action, write_back)
            finally:
                del cache.inc_lock_ref
            self.hits.append({"kind": "unpinned", "node_id": todo[-1], "chain": todo})
            return r

        cache._execute_and_commit_kv_backup = backup

    def _wrap_load_back23(self, cache: Any, hook: Any) -> None:
        """``hook(cache, chain, None)`` before a load-back and ``(cache, chain, True)`` after one that was issued;
        ``chain``: the nodes it loads, parent first, each ``(id, host)`` read through the tree core's boundary (the
        Rust core's nodes are not Python objects): the trailing nodes of the path without device KV."""
        orig = cache.load_back

        def load_back(node_id: Any, mem_quota: Any = None, req: Any = None) -> Any:
            tc = cache.tree_core
            chain: list = []
            for info in reversed(tc.collect_path_info([node_id])[0]):
                if info.full_value_len is not None:
                    break
                host = tc.build_storage_backup_spec(info.node_id, False).host_value
                chain.insert(0, types.SimpleNamespace(id=info.node_id, host=host))
            hook(cache, chain, None)
            ok = orig(node_id, mem_quota, req=req)
            if ok:
                hook(cache, chain, True)
            return ok

        cache.load_back = load_back

    def _install23_midchain(self, cache: Any, copies: Copies) -> None:
        def hook(cache: Any, chain: list, res: Any) -> None:
            if res is not None or len(chain) < 3 or not self._take():
                return
            mid = chain[len(chain) // 2]
            self._corrupt_host(cache, mid.host)
            self.hits.append({"kind": "midchain", "node_id": mid.id, "chain": [n.id for n in chain]})

        self._wrap_load_back23(cache, hook)

    def _install23_early_release(self, cache: Any, copies: Copies) -> None:
        """0.5.23 holds the host pin to the ack (``ongoing_load_back``); the fault frees the first chain node's host
        pages right after the load is issued and lets another writer overwrite them, as if the pin went at issue."""
        def hook(cache: Any, chain: list, res: Any) -> None:
            if res is None or not chain or not self._take():
                return
            n = chain[0]
            self._free_and_reuse(cache, n.host)
            self.hits.append({"kind": "early_release", "node_id": n.id, "chain": [c.id for c in chain]})

        self._wrap_load_back23(cache, hook)

    def _install23_split_no_rewrite(self, cache: Any, copies: Copies) -> None:
        """A split of a node with a pending write does not rewrite the pending entry's publish list (#27072): the
        ``UpdatePendingBackupOnNodeSplit`` action's relocation is skipped once."""
        orig = cache._replace_pending_write_through_node

        def replace(ack_id: int, old_node_id: Any, new_node_ids: list) -> None:
            if ack_id in cache.ongoing_write_through and self._take():
                self.hits.append({"kind": "split_no_rewrite", "node_id": old_node_id, "new_id": new_node_ids[0]})
                return
            return orig(ack_id, old_node_id, new_node_ids)

        cache._replace_pending_write_through_node = replace


def use_sglang(version: str, rust: bool = False) -> None:
    """Make this process one that imports SGLang ``version`` from its folder, with no ``sys.path`` edit: a process
    started under :func:`sglang_env` (every driver the tests start) returns at once; a driver started by hand
    (``python -m tests.sglang_real.driver --version ...``) is executed again, the same module and arguments, under
    ``sglang_env(version)``. Call it first in a driver's ``main`` (the process image is replaced: nothing may have
    started yet). Raises ``SystemExit`` with how to start it where it cannot: not started with ``-m``, or the folder
    still missing from ``sys.path`` after that."""
    want = {os.path.realpath(sglang_dir(version)), *([os.path.realpath(rust_torch_dir())] if rust else [])}
    if want <= {os.path.realpath(p or os.curdir) for p in sys.path}:
        return
    env = sglang_env(version, rust)
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None or os.environ.get("PYTHONPATH") == env["PYTHONPATH"]:   # (the second: do not exec in a loop)
        raise SystemExit(f"SGLang {version} is not on sys.path: start a driver as `python -m {__package__}.MODULE` "
                         f"from {ROOT}, or with PYTHONPATH={env['PYTHONPATH']}")
    os.execve(sys.executable, [sys.executable, "-m", spec.name, *sys.argv[1:]], env)


def module_cmd(module: str, *args: str) -> list[str]:
    """The command line that starts ``module`` of this package (``"driver"``, ``"l3_driver"``, ...) as
    ``python -m tests.sglang_real.<module>``; run it with ``cwd=ROOT`` and the environment of :func:`sglang_env`."""
    return [sys.executable, "-m", f"{__package__}.{module}", *args]
