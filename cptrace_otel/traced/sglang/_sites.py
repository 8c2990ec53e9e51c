"""The sites: one ``wrapt`` wrapper per SGLang method, and the per-cache state the records need.

Every wrapper calls the wrapped method exactly as it was called and returns what it returns; the recording around
it runs under :func:`_safe` (an error costs that record, never SGLang's call). Below the trace level a wrapper costs
one attribute lookup and one int compare.

State: each ``HiRadixCache`` gets a :class:`_State` (attribute ``_cptrace_sg``, shared with its controller, its
device allocator and its host pool, so their wrappers find it); objects without it (another cache, a test's bare
allocator) are passed through untouched.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from ... import cptrace, khash, knz, rng, trace_level

logger = logging.getLogger("cptrace_otel.sglang")

MIN_VERSION = (0, 5, 20)
MAX_VERSION = (0, 5, 23)
HIRADIX = "sglang.srt.mem_cache.hiradix_cache"
CONTROLLER = "sglang.srt.managers.cache_controller"
TOKEN_ALLOC = "sglang.srt.mem_cache.allocator.token"
PAGED_ALLOC = "sglang.srt.mem_cache.allocator.paged"
HOST_POOL = "sglang.srt.mem_cache.pool_host.base"
_POLICY = {"write_through": "wt", "write_through_selective": "wts", "write_back": "wb"}


def _vtuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
        if not part.isdigit():
            if digits:
                out.append(int(digits))
            break   # 0.5.20.post1 / 0.5.21rc0: the release part decides
        out.append(int(part))
    return tuple(out)


def version_verdict() -> tuple[bool, str]:
    """``(True, version)`` when the importable SGLang can be instrumented, else ``(False, why)``; ``why`` starts
    with ``own-call-sites:`` for a build that ships its own ``cp_hicache_trace`` call sites."""
    import sglang  # noqa: F401  (the version module needs the package)
    from sglang.version import __version__ as v

    vt = _vtuple(str(v))
    if not (MIN_VERSION <= vt[:3] <= MAX_VERSION):
        return False, f"sglang {v} is outside the supported range"
    spec = importlib.util.find_spec(HIRADIX)
    if spec is None or not spec.origin:
        return False, f"sglang {v} has no HiRadixCache (UnifiedRadixCache is not covered yet)"
    try:
        with open(spec.origin, encoding="utf-8") as f:
            own = "cp_hicache_trace" in f.read()
    except OSError:
        own = False
    if own:
        return False, f"own-call-sites: sglang {v} ({spec.origin}) calls cp_hicache_trace itself"
    return True, str(v)


def _safe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # recording never breaks SGLang
        logger.debug("cptrace-otel: record skipped (%s: %s)", type(e).__name__, e)
        return None


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


def _st(obj: Any) -> "_State | None":
    """The state of ``obj`` when tracing is on and ``obj`` belongs to an instrumented cache."""
    if trace_level() < 1:
        return None
    return getattr(obj, "_cptrace_sg", None)


def _runs(t: Any) -> str:
    """Exact set (domain 3.1): inclusive runs ``a-b:c-d`` of ``t``'s values in their order; ``(0)`` when empty."""
    xs = t.tolist() if hasattr(t, "tolist") else list(t)
    if not xs:
        return "(0)"
    out = []
    lo = prev = int(xs[0])
    for x in xs[1:]:
        x = int(x)
        if x == prev + 1:
            prev = x
            continue
        out.append(f"{lo}-{prev}" if prev != lo else str(lo))
        lo = prev = x
    out.append(f"{lo}-{prev}" if prev != lo else str(lo))
    return ":".join(out)


class _Load:
    __slots__ = ("op", "chain")

    def __init__(self, op: int, chain: list) -> None:
        self.op = op
        self.chain = chain   # the load's nodes, parent first; splits while in flight are applied (on_split)


class _State:
    """What the records of one ``HiRadixCache`` need beyond SGLang's own state."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.page_size = int(cache.page_size)
        self.writing: list = []             # write_backup's node (innermost last)
        self.write_op: dict[int, int] = {}  # pending write ack id (node id) -> op id of its backup
        self.loads: dict[int, list[_Load]] = {}  # load ack id (the load's last node id) -> its loads, FIFO
        self.expect_free: dict[int, tuple[Any, int]] = {}   # id(tensor) -> (tensor, owner node id)
        self.staged: dict[int, tuple[Any, int, int, int]] = {}  # write_back: id(value) -> (value, node, lock, href)
        self.in_evict_backuped = 0
        self.in_evict_host = 0
        self.insert_ctx: dict | None = None  # during insert: params, pre-evicted ids, counter, nodes announced
        self.loaded: Any = None              # during init_load_back: the last node of the load it issued

    def clear(self) -> None:
        self.writing.clear()
        self.write_op.clear()
        self.loads.clear()
        self.expect_free.clear()
        self.staged.clear()
        self.insert_ctx = None

    # -- fields ------------------------------------------------------------------------------------------------
    def xs(self, key: str, t: Any) -> dict[str, str]:
        if not Recorder.exact or t is None:
            return {}
        return {key: _runs(t)}

    def fp(self, idx: Any) -> dict[str, Any]:
        """``h``, ``nz``, ``hp``: the device KV of slots ``idx`` in token order, every layer's K then V."""
        if idx is None or len(idx) == 0:
            return {"h": 0, "nz": 0, "hp": []}
        rows = _kv_rows(self.cache.kv_cache, idx)
        if rows is None:
            return {"h": -2, "nz": -2}
        ps = self.page_size
        hp = [khash(rows[i:i + ps]) for i in range(0, rows.shape[0], ps)]
        return {"h": _int(khash(rows)), "nz": _int(knz(rows)), "hp": [_int(x) for x in hp]}

    # -- records -----------------------------------------------------------------------------------------------
    def config(self) -> None:
        c = self.cache
        cp_size, cp_rank = 1, 0
        g = getattr(c, "attn_cp_group", None)
        try:
            import torch.distributed as dist

            if g is not None and dist.is_initialized():
                cp_size, cp_rank = dist.get_world_size(group=g), dist.get_rank(group=g)
        except Exception:
            pass
        cc = c.cache_controller
        host = getattr(c, "token_to_kv_pool_host", None)
        cptrace(1, "config", cp_size=cp_size, cp_rank=cp_rank, mode=(Recorder.cp_mode if cp_size > 1 else "none"),
                page_size=self.page_size, policy=_POLICY.get(cc.write_policy, cc.write_policy), level=trace_level(),
                io_backend=getattr(cc, "io_backend", "?"), layout=getattr(host, "layout", "?"))

    def node_record(self, n: Any, kind: str) -> None:
        cptrace(1, "insert", node_id=n.id, parent=n.parent.id, len=len(n.key), dev=rng(n.value), kind=kind,
                **self.xs("devx", n.value))

    def announce_inserted(self) -> None:
        """The ``insert`` records of the nodes the running insert created or revived so far (each once): walks
        the key's path as insert does, read-only."""
        ctx = self.insert_ctx
        if ctx is None:
            return
        for n in _path(self.cache, ctx["key"], self.page_size):
            if n in ctx["done"]:
                continue
            if n.id >= ctx["counter"] and n not in ctx["split_new"]:
                if n.value is not None:
                    ctx["done"].add(n)
                    self.node_record(n, "new")
            elif n.value is not None and (n.id in ctx["evicted"] or ctx["split_new"].get(n)):
                ctx["done"].add(n)
                self.node_record(n, "revive")

    def prepare_backup(self, ops: list, merged_id: int) -> None:
        node = self.writing[-1] if self.writing else None
        for op in ops:
            nid = op.node_ids[0] if op.node_ids else -1
            n = node if node is not None and node.id == nid else None
            parent = n.parent if n is not None else None
            root = self.cache.root_node
            pbk = int(parent is root or bool(parent is not None and parent.host_value is not None))
            cptrace(1, "prepare", node_id=nid, op=op.id, len=(len(n.key) if n is not None else len(op.device_indices)),
                    dev=rng(op.device_indices), host=rng(op.host_indices),
                    policy=_POLICY.get(self.cache.cache_controller.write_policy, "?"),
                    parent=(parent.id if parent is not None else -1), pbk=pbk,
                    **self.xs("hostx", op.host_indices), **self.xs("devx", op.device_indices))
            self.write_op[nid] = merged_id
        for op in ops:
            nid = op.node_ids[0] if op.node_ids else -1
            cptrace(1, "backup", op=merged_id, node_id=nid, dev=rng(op.device_indices), host=rng(op.host_indices),
                    io=1, **self.fp(op.device_indices), **self.xs("devx", op.device_indices),
                    **self.xs("hostx", op.host_indices))

    def ack_d2h(self, ack_id: int) -> None:
        pending = self.cache.ongoing_write_through.get(ack_id)
        if pending is None:
            return
        lock_node, backup_len, publish = pending
        cptrace(2, "ack", dir="d2h", op=self.write_op.pop(ack_id, -1), node_id=ack_id, blen=int(backup_len),
                clen=len(lock_node.key), pub=[n.id for n in publish])

    def ack_h2d(self, ack_node_ids: list) -> None:
        for nid in ack_node_ids:
            q = self.loads.get(nid)
            if not q:
                continue
            ld = q.pop(0)
            if not q:
                del self.loads[nid]
            for n in ld.chain:
                cptrace(2, "ack", dir="h2d", op=ld.op, node_id=n.id, **self.fp(n.value))

    def evict(self, tier: str, n: Any, kind: str, t: Any) -> None:
        """``evict`` of node ``n`` on ``tier`` (the slots ``t`` it frees); the following ``free`` of ``t`` is
        attributed to ``n``."""
        if tier == "dev":
            cptrace(1, "evict", tier="dev", node_id=n.id, kind=kind, dev=rng(t), lock=n.lock_ref,
                    href=n.host_ref_counter, **self.xs("devx", t))
        else:
            cptrace(1, "evict", tier="host", node_id=n.id, kind=kind, host=rng(t), href=n.host_ref_counter,
                    **self.xs("hostx", t))
        if t is not None:
            self.expect_free[id(t)] = (t, n.id)

    def free(self, pool: str, t: Any) -> None:
        owner = self.expect_free.pop(id(t), None)
        nid, why = (owner[1], "evict") if owner is not None else (-1, "finish")
        cptrace(2, "free", pool=pool, idx=rng(t), node_id=nid, why=why, **self.xs("idx_x", t))


class Recorder:
    """Process-wide options of the instrumentation (set by :meth:`SGLangInstrumentor._instrument`)."""

    exact = False
    cp_mode = "sharded"

    @classmethod
    def configure(cls, exact: bool, cp_mode: str) -> None:
        cls.exact = exact
        cls.cp_mode = cp_mode


def _int(x: Any) -> Any:
    return x if type(x) is int else int(x)


def _kv_rows(pool: Any, idx: Any) -> Any:
    """``[tokens, 2*layers, ...]``: the KV of slots ``idx`` in token order (K of every layer, then V); None for a
    pool layout this does not know (the record then carries the -2 sentinel)."""
    import torch

    ks, vs = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
    if ks is not None and vs is not None:
        bufs = list(ks) + list(vs)
    elif getattr(pool, "kv_buffer", None) is not None:
        bufs = list(pool.kv_buffer)
    else:
        return None
    idx = idx.to(bufs[0].device)
    return torch.stack([b[idx] for b in bufs], dim=1).contiguous()


def _path(cache: Any, key: Any, page_size: int) -> list:
    """The nodes an insert of ``key`` walks (stops where the key diverges from the tree)."""
    out = []
    node = cache.root_node
    while len(key) > 0:
        ck = key.child_key(page_size)
        child = node.children.get(ck)
        if child is None:
            break
        m = child.key.match(key, page_size=page_size)
        if m == 0:
            break
        out.append(child)
        if m < len(child.key):
            break
        key = key[m:]
        node = child
    return out


def _aligned_key(cache: Any, params: Any) -> Any:
    key = params.key
    key, _ = key.maybe_to_bigram_view(cache.is_eagle)
    return key.page_aligned(cache.page_size)


# -- wrappers -----------------------------------------------------------------------------------------------------
def _cache_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    out = wrapped(*args, **kwargs)
    _safe(_attach, instance)
    return out


def _attach(cache: Any) -> None:
    st = _State(cache)
    cache._cptrace_sg = st
    cc = cache.cache_controller
    cc._cptrace_sg = st
    cc.mem_pool_device_allocator._cptrace_sg = st
    if getattr(cache, "token_to_kv_pool_host", None) is not None:
        cache.token_to_kv_pool_host._cptrace_sg = st
    if trace_level() >= 1:
        st.config()


def _reset(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        _safe(lambda: cptrace(1, "reset", reason="flush"))
        st.clear()
    return wrapped(*args, **kwargs)


def _match_prefix(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    res = wrapped(*args, **kwargs)
    st = _st(instance)
    if st is not None:
        _safe(_rid_map_match, instance, _arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_match(cache: Any, params: Any, res: Any) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None or res.host_hit_length > 0:
        return   # no request, or the decision is init_load_back's
    dlen = len(res.device_indices)
    cptrace(1, "rid_map", rid=str(rid), node_id=res.last_device_node.id, hit=("dev" if dlen else "miss"), dlen=dlen,
            hlen=0, plen=len(params.key))


def _init_load_back(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    st.loaded = None
    res = wrapped(*args, **kwargs)
    _safe(_rid_map_load, st, _arg(args, kwargs, 0, "params"), res)
    return res


def _rid_map_load(st: _State, params: Any, res: Any) -> None:
    req = getattr(params, "req", None)
    rid = getattr(req, "rid", None)
    if rid is None:
        return
    values, node = res
    loaded = getattr(st, "loaded", None)
    hlen = len(values) if loaded is not None else 0
    hit = "host" if loaded is not None else ("dev" if node is not st.cache.root_node else "miss")
    cptrace(1, "rid_map", rid=str(rid), node_id=node.id, hit=hit, hlen=hlen, plen=len(getattr(req, "origin_input_ids", ()) or ()))


def _split_node(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    child = _arg(args, kwargs, 1, "child")
    split_len = _arg(args, kwargs, 2, "split_len")
    pre = _safe(lambda: (len(child.key), child.parent.id, child.write_through_pending_id, child.lock_ref))
    new = wrapped(*args, **kwargs)
    if pre is not None:
        _safe(_on_split, st, child, new, int(split_len), pre)
    return new


def _on_split(st: _State, child: Any, new: Any, split_len: int, pre: tuple) -> None:
    pre_len, parent_id, pend, lock = pre
    cptrace(1, "split", node_id=child.id, new_id=new.id, parent=parent_id, pre_len=pre_len, split_len=split_len,
            dev_p=rng(new.value), dev_c=rng(child.value), host_p=rng(new.host_value), host_c=rng(child.host_value),
            pend=(pend if pend is not None else -1), lock=lock)
    for q in st.loads.values():   # a split of a node whose load is in flight: the load now covers both fragments
        for ld in q:
            for i, n in enumerate(ld.chain):
                if n is child:
                    ld.chain.insert(i, new)
                    break
    if st.insert_ctx is not None:
        st.insert_ctx["split_new"][new] = new.value is None


def _insert(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None or st.insert_ctx is not None:
        return wrapped(*args, **kwargs)
    params = _arg(args, kwargs, 0, "params")
    ctx = _safe(_insert_ctx, instance, st, params)
    st.insert_ctx = ctx
    try:
        res = wrapped(*args, **kwargs)
        _safe(st.announce_inserted)
    finally:
        st.insert_ctx = None
    return res


def _insert_ctx(cache: Any, st: _State, params: Any) -> dict:
    key = _aligned_key(cache, params)
    from sglang.srt.mem_cache.radix_cache import TreeNode

    return {"key": key, "counter": TreeNode.counter, "split_new": {}, "done": set(),
            "evicted": {n.id for n in _path(cache, key, st.page_size) if n.value is None}}


def _write_backup(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    _safe(st.announce_inserted)   # a backup inside insert: its node's insert record goes first
    st.writing.append(_arg(args, kwargs, 0, "node"))
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.writing.pop()


def _start_writing(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None and instance.write_queue:
        ops = list(instance.write_queue)
        merged = ops[0].id if len(ops) == 1 else type(ops[0]).counter   # merge_ops takes the next op id
        _safe(st.prepare_backup, ops, merged)
    return wrapped(*args, **kwargs)


def _finish_write_ack(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        _safe(st.ack_d2h, _arg(args, kwargs, 0, "ack_id"))
    return wrapped(*args, **kwargs)


def _load_back(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    node = _arg(args, kwargs, 0, "node")
    chain = _safe(_evicted_chain, node) or []
    res = wrapped(*args, **kwargs)
    if res is not None:
        _safe(_on_reload, st, node, chain, res)
    return res


def _evicted_chain(node: Any) -> list:
    chain = []
    while node.evicted:
        chain.insert(0, node)
        node = node.parent
    return chain


def _on_reload(st: _State, last: Any, chain: list, dev: Any) -> None:
    import torch

    op = st.cache.cache_controller.load_queue[-1]
    host = torch.cat([n.host_value for n in chain]) if chain else None
    cptrace(1, "reload", node_id=last.id, chain=[n.id for n in chain], op=op.id, host=rng(host), dev=rng(dev),
            **st.xs("hostx", host), **st.xs("devx", dev))
    st.loads.setdefault(last.id, []).append(_Load(op.id, list(chain)))
    st.loaded = last


def _loading_check(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    before = list(instance.cache_controller.ack_load_queue)
    res = wrapped(*args, **kwargs)
    n_done = len(before) - len(instance.cache_controller.ack_load_queue)
    for ack in before[:max(n_done, 0)]:
        _safe(st.ack_h2d, list(ack.node_ids))
    return res


def _evict_backuped(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    node = _arg(args, kwargs, 0, "node")
    _safe(st.evict, "dev", node, "backuped", node.value)
    st.in_evict_backuped += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.in_evict_backuped -= 1


def _detach_backuped(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None and not st.in_evict_backuped:
        # write_back staging: detached now, its device pages freed by the flush's evict_device (after the acks)
        node = _arg(args, kwargs, 0, "node")
        v = node.value
        if v is not None:
            st.staged[id(v)] = (v, node, node.lock_ref, node.host_ref_counter)
    return wrapped(*args, **kwargs)


def _evict_device(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        t = _arg(args, kwargs, 0, "device_indices")
        staged = st.staged.pop(id(t), None)
        if staged is not None and staged[0] is t:
            _, node, lock, href = staged
            _safe(_evict_staged, st, node, t, lock, href)
    return wrapped(*args, **kwargs)


def _evict_staged(st: _State, node: Any, t: Any, lock: int, href: int) -> None:
    cptrace(1, "evict", tier="dev", node_id=node.id, kind="backuped", dev=rng(t), lock=lock, href=href,
            **st.xs("devx", t))
    st.expect_free[id(t)] = (t, node.id)


def _evict_regular(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        node = _arg(args, kwargs, 0, "node")
        _safe(st.evict, "dev", node, "regular", node.value)
    return wrapped(*args, **kwargs)


def _drop_subtree(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        _safe(_on_drop, st, _arg(args, kwargs, 0, "root"))
    return wrapped(*args, **kwargs)


def _on_drop(st: _State, root: Any) -> None:
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


def _evict_host_tree(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    st.in_evict_host += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        st.in_evict_host -= 1


def _controller_evict_host(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None and st.in_evict_host:
        t = _arg(args, kwargs, 0, "host_indices")
        node = next((n for n in st.cache.evictable_host_leaves if n.host_value is t), None)
        if node is not None:
            _safe(st.evict, "host", node, "host", t)
    return wrapped(*args, **kwargs)


def _dev_free(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        t = _arg(args, kwargs, 0, "free_index")
        if t is not None and t.numel() > 0:
            _safe(st.free, "dev", t)
    return wrapped(*args, **kwargs)


def _host_free(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    st = _st(instance)
    if st is not None:
        t = _arg(args, kwargs, 0, "indices")
        if t is not None and t.numel() > 0:
            _safe(st.free, "host", t)
    return wrapped(*args, **kwargs)


# (module, "Class.method", wrapper): every site, for HiRadixCache builds (sglang 0.5.20 ... 0.5.22).
SITES: list[tuple[str, str, Any]] = [
    (HIRADIX, "HiRadixCache.__init__", _cache_init),
    (HIRADIX, "HiRadixCache.reset", _reset),
    (HIRADIX, "HiRadixCache.match_prefix", _match_prefix),
    (HIRADIX, "HiRadixCache.init_load_back", _init_load_back),
    (HIRADIX, "HiRadixCache.insert", _insert),
    (HIRADIX, "HiRadixCache._split_node", _split_node),
    (HIRADIX, "HiRadixCache.write_backup", _write_backup),
    (HIRADIX, "HiRadixCache._finish_write_through_ack", _finish_write_ack),
    (HIRADIX, "HiRadixCache.load_back", _load_back),
    (HIRADIX, "HiRadixCache.loading_check", _loading_check),
    (HIRADIX, "HiRadixCache._evict_backuped", _evict_backuped),
    (HIRADIX, "HiRadixCache._detach_backuped", _detach_backuped),
    (HIRADIX, "HiRadixCache._evict_regular", _evict_regular),
    (HIRADIX, "HiRadixCache._drop_subtree_no_host", _drop_subtree),
    (HIRADIX, "HiRadixCache.evict_host", _evict_host_tree),
    (CONTROLLER, "HiCacheController.start_writing", _start_writing),
    (CONTROLLER, "HiCacheController.evict_device", _evict_device),
    (CONTROLLER, "HiCacheController.evict_host", _controller_evict_host),
    (TOKEN_ALLOC, "TokenToKVPoolAllocator.free", _dev_free),
    (PAGED_ALLOC, "PagedTokenToKVPoolAllocator.free", _dev_free),
    (HOST_POOL, "HostKVCache.free", _host_free),
]
