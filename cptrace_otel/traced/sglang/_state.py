"""The per-cache state the records need, the records' field layout, and the version check (the wrappers are in
:mod:`._sites`).

State: each ``HiRadixCache`` gets a :class:`State` (attribute ``_cptrace_sg``, shared with its controller, its
device allocator and its host pool, so their wrappers find it); objects without it (another cache, a test's bare
allocator) are passed through untouched.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, SupportsInt, TypeVar

from ...model import semconv as sc
from ..api import cptrace, khash, knz, rng, trace_level

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import CacheOperation, CacheParams, HostKVCache, KVPool, RadixCache, RadixKey, SidecarPool, TreeNode

logger = logging.getLogger("cptrace_otel.sglang")
_T = TypeVar("_T")

MIN_VERSION = (0, 5, 20)
MAX_VERSION = (0, 5, 23)
HIRADIX = "sglang.srt.mem_cache.hiradix_cache"
UNIFIED = "sglang.srt.mem_cache.unified_radix_cache"
# the modules whose source a build with its own call sites changes (one of them naming cp_hicache_trace)
FLAVOURS = {"hiradix": (HIRADIX,),
            "unified": (UNIFIED, "sglang.srt.mem_cache.unified_cache.unified_tree_core")}
POLICY = {"write_through": "wt", "write_through_selective": "wts", "write_back": "wb"}


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
    flavour = cache_flavour()
    if flavour is None:
        return False, f"sglang {v} has neither HiRadixCache nor UnifiedRadixCache"
    for mod in FLAVOURS[flavour]:
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.origin:
            return False, f"sglang {v} has no {mod}"
        try:
            with open(spec.origin, encoding="utf-8") as f:
                own = "cp_hicache_trace" in f.read()
        except OSError:
            own = False
        if own:
            return False, f"own-call-sites: sglang {v} ({spec.origin}) calls cp_hicache_trace itself"
    return True, str(v)


def cache_flavour() -> str | None:
    """``"hiradix"`` (0.5.20: ``HiRadixCache``), ``"unified"`` (0.5.23: ``UnifiedRadixCache`` over the Python tree
    core), or None: which site table applies to the importable SGLang."""
    if importlib.util.find_spec(HIRADIX) is not None:
        return "hiradix"
    if importlib.util.find_spec(UNIFIED) is not None:
        return "unified"
    return None


_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, msg: str) -> None:
    """One warning per ``key`` and process (a refusal repeats at every cache and every ``instrument()``)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg)


failures: dict[str, int] = {}   # wrapper-side failures so far, by the function that failed


def safe(fn: Callable[..., _T], *args: object) -> _T | None:
    """``fn(*args)``, or None where it raises: every read a wrapper makes of SGLang's arguments and objects runs
    here, so the wrapped call runs exactly as uninstrumented whatever SGLang passes. A failure costs that record
    only; it is counted in :data:`failures` and named once per function (one warning, then debug lines)."""
    try:
        return fn(*args)
    except Exception as e:  # recording never breaks SGLang
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        n = failures[name] = failures.get(name, 0) + 1
        if n == 1:
            logger.warning("cptrace-otel: a record skipped in %s (%s: %s); later ones are counted", name,
                           type(e).__name__, e)
        else:
            logger.debug("cptrace-otel: record skipped in %s (%s: %s)", name, type(e).__name__, e)
        return None


def arg(args: tuple, kwargs: dict, i: int, name: str, default: object = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


CACHE_CLASSES: list[type] = []   # the cache classes the instrumentor wrapped (HiRadixCache or UnifiedRadixCache)
_MISSING = object()


TREE_CORE_OPT = "CPTRACE_SGLANG_TREE_CORE"


def python_core_option() -> bool:
    """True when the user asked for 0.5.23's Python tree core (``CPTRACE_SGLANG_TREE_CORE=python``: the
    instrumentation sets ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`` where it is unset). Unset or ``rust``
    (the default): SGLang's own choice is kept and a Rust core is traced at its boundary. Another value: one
    warning naming the two, and the default."""
    v = os.environ.get(TREE_CORE_OPT, "").strip().lower()
    if v not in ("", "rust", "python"):
        warn_once("tree-core-opt", f"cptrace-otel: {TREE_CORE_OPT}={v!r} is neither 'rust' (the default: SGLang's "
                  "tree core kept, the Rust one traced at its boundary) nor 'python' (switch to the Python core "
                  "where SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND is unset); using the default")
    return v == "python"


# the Rust core's boundary sites once armed (all or none): SGLang imported its adapter and each site resolved; they
# are wrapped whenever tracing is on, as the other hot sites (the instrumentor's ``_switch``)
RUST_ARMED: list[tuple[str, str, Any]] = []


def rust_boundary_armed() -> bool:
    """True when the Rust tree core's boundary sites (``_rust23.RUST_SITES23``) are armed: a Rust-core cache can be
    traced."""
    return bool(RUST_ARMED)


def is_rust_core(cache: Any) -> bool:
    """True when ``cache``'s tree core is 0.5.23's Rust one (``RustUnifiedTreeCore``, :mod:`._rust23`)."""
    return type(cache.tree_core).__name__ == "RustUnifiedTreeCore"


def state_of(obj: object) -> State | None:
    """The state of ``obj`` when tracing is on and ``obj`` belongs to an instrumented cache.

    A cache built before ``instrument()`` has no state (it is attached when the cache is built): it is left
    untraced, with one warning, the first time one of its methods is called. Attaching then would trace it from
    the middle of its life (backups queued, loads in flight, nodes whose insert was never seen), and partial records
    give false findings."""
    if trace_level() < 1:
        return None
    st: Any = getattr(obj, "_cptrace_sg", _MISSING)
    if st is _MISSING:
        if CACHE_CLASSES and isinstance(obj, tuple(CACHE_CLASSES)) and \
                getattr(obj, "cache_controller", None) is not None:   # (a cache without HiCache is not traced)
            warn_once("built-before", f"cptrace-otel: this sglang {type(obj).__name__} was built before "
                      "SGLangInstrumentor().instrument() and is not traced (instrument first: CPTRACE_SGLANG=1 "
                      "does so when SGLang is imported)")
            safe(setattr, obj, "_cptrace_sg", None)   # (said once; later calls are one attribute read)
        return None
    return st


def exact_runs(t: Tensor) -> str:
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


class Load:
    __slots__ = ("op", "chain")

    def __init__(self, op: int, chain: list) -> None:
        self.op = op
        self.chain = chain   # the load's nodes, parent first; splits while in flight are applied (on_split)


class State:
    """What the records of one ``HiRadixCache`` need beyond SGLang's own state."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.page_size = int(cache.page_size)
        self.writing: list = []             # write_backup's node (innermost last)
        self.write_op: dict[int, int] = {}  # pending write ack id (node id) -> op id of its backup
        self.loads: dict[int, list[Load]] = {}  # load ack id (the load's last node id) -> its loads, FIFO
        self.expect_free: dict[int, tuple] = {}   # id(tensor) -> (tensor, owner node id[, why])
        # write_back: id(value) -> (value, node, lock, href)
        self.staged: dict[int, tuple[Tensor, TreeNode, int, int]] = {}
        self.in_evict_backuped = 0
        self.host_owner: dict | None = None   # inside HiRadixCache.evict_host: id(host value) -> node
        self.in_free = 0                     # inside an allocator free that calls another (0.5.23 free_segment)
        self.evict_kind: str | None = None   # 0.5.23: the kind the tree core's running eviction gets (drop, dup)
        self.insert_ctx: dict | None = None  # during insert: params, pre-evicted ids, counter, nodes announced
        self.loaded: Any = None              # during init_load_back: the last node of the load it issued
        self.side: list[tuple[str, SidecarPool]] = []  # sidecar pools riding on the KV's slots: (name, device pool)
        self.side_host: dict[str, HostKVCache] = {}  # the same pools' host pools, by name
        # the host-copy audit (._audit): node id -> node whose host copy is complete (published by its d2h ack), and
        # the count of host frees so far (the audit thread drops a sample read while it moved)
        self.rest: dict[int, Any] = {}
        self.host_gen = 0
        self.ident: dict | None = None         # the storage identity (model, kv_dtype, ...), read once: _l3_meta

    def clear(self) -> None:
        self.writing.clear()
        self.write_op.clear()
        self.loads.clear()
        self.expect_free.clear()
        self.staged.clear()
        self.insert_ctx = None
        self.rest.clear()
        self.host_gen += 1

    # -- node fields (0.5.20's TreeNode; State23 reads 0.5.23's per-component data) -------------------------------
    @staticmethod
    def dev(n: TreeNode) -> Tensor | None:
        return n.value

    @staticmethod
    def host(n: TreeNode) -> Tensor | None:
        return n.host_value

    @staticmethod
    def lock(n: TreeNode) -> int:
        return int(n.lock_ref)

    @staticmethod
    def href(n: TreeNode) -> int:
        return int(n.host_ref_counter)

    def refs(self, n: TreeNode, lock: bool) -> dict[str, int]:
        """An ``evict`` record's reference counts of ``n``: ``lock`` (when ``lock``) and ``href``."""
        return {"lock": self.lock(n), "href": self.href(n)} if lock else {"href": self.href(n)}

    def kv_pool(self) -> KVPool:
        return self.cache.kv_cache

    def host_pool(self) -> HostKVCache | None:
        return getattr(self.cache, "token_to_kv_pool_host", None)

    # -- fields ------------------------------------------------------------------------------------------------
    def xs(self, key: str, t: Tensor | None) -> dict[str, str]:
        if not Recorder.exact or t is None:
            return {}
        return {key: exact_runs(t)}

    def fp(self, idx: Tensor | None) -> dict[str, Any]:
        """``h``, ``nz``, ``hp``: the device KV of slots ``idx`` in token order, every layer's K then V; then, per
        sidecar pool (:attr:`side`), the same three of its pages holding those slots (``sh_<pool>``, ...)."""
        empty = idx is None or len(idx) == 0
        # (type: ignore: idx is not None where not empty; the checker does not follow the flag)
        out = {"h": 0, "nz": 0, "hp": []} if empty else _fp(kv_rows(self.kv_pool(), idx), self.page_size)  # type: ignore[arg-type]
        for name, pool in self.side:
            f = {"h": 0, "nz": 0, "hp": []} if empty else _fp(_side_rows(pool, idx, self.page_size), 1)  # type: ignore[arg-type]
            out.update({sc.side_field(k, name): f[key] for k, key in ((sc.SIDE_H, "h"), (sc.SIDE_NZ, "nz"),
                                                                     (sc.SIDE_HP, "hp")) if key in f})
        return out

    def fp_rows(self, rows: Tensor | None) -> dict[str, Any]:
        """``h``, ``nz``, ``hp`` of KV ``rows`` already gathered in :meth:`fp`'s layout (the host-copy audit's)."""
        return _fp(rows, self.page_size)

    def moved(self, op: CacheOperation) -> dict[str, str]:
        """``sp``: the sidecar pools (of :attr:`side`) that copy op ``op`` moves with its KV (``-``: none); nothing
        for a cache without sidecars."""
        if not self.side:
            return {}
        names = {getattr(t.name, "value", t.name) for t in (getattr(op, "pool_transfers", None) or ())}
        got = [n for n, _ in self.side if n in names]
        return {sc.SIDE_MOVED: "+".join(got) if got else "-"}

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
        host = self.host_pool()
        from ._cpmode import resolve
        from ._l3_meta import identity

        m = resolve(Recorder.cp_mode, Recorder.cp_mode_src, cp_size, safe(self.kv_pool), warn_once=warn_once)
        mode = {"mode": m.mode} if m.mode else {}   # unknown: no mode (check lists the rules it needs as unchecked)
        self.ident = safe(identity, self) or {}
        ident = {k: self.ident[k] for k in ("model", "kv_dtype") if k in self.ident}   # (FOREIGN: who wrote a page)
        cptrace(1, "config", cp_size=cp_size, cp_rank=cp_rank, **mode, mode_src=m.src, mode_why=m.why,
                page_size=self.page_size, policy=POLICY.get(cc.write_policy, cc.write_policy), level=trace_level(),
                io_backend=getattr(cc, "io_backend", "?"), layout=getattr(host, "layout", "?"), **ident,
                **({sc.SIDECARS: "+".join(n for n, _ in self.side)} if self.side else {}))

    def node_record(self, n: TreeNode, kind: str) -> None:
        self.insert_record(n.id, n.parent.id, len(n.key), self.dev(n), kind)

    def insert_record(self, nid: int, parent: int, length: int, v: Tensor | None, kind: str) -> None:
        """``insert`` of node ``nid`` (``kind`` new or revive) under ``parent``: ``length`` tokens in slots ``v``."""
        cptrace(1, "insert", node_id=nid, parent=parent, len=length, dev=rng(v), kind=kind, **self.xs("devx", v))

    def announce_inserted(self) -> None:
        """The ``insert`` records of the nodes the running insert created or revived so far (each once): walks
        the key's path as insert does, read-only."""
        ctx = self.insert_ctx
        if ctx is None:
            return
        for n in tree_path(self.cache, ctx["key"], self.page_size):
            if n in ctx["done"]:
                continue
            if n.id >= ctx["counter"] and n not in ctx["split_new"]:
                if n.value is not None:
                    ctx["done"].add(n)
                    self.node_record(n, "new")
            elif n.value is not None and (n.id in ctx["evicted"] or ctx["split_new"].get(n)):
                ctx["done"].add(n)
                self.node_record(n, "revive")

    def prepare_backup(self, ops: list[CacheOperation], merged_id: int) -> None:
        node = self.writing[-1] if self.writing else None
        for op in ops:
            nid = op.node_ids[0] if op.node_ids else -1
            n = node if node is not None and node.id == nid else None
            parent = n.parent if n is not None else None
            root = self.cache.root_node
            pbk = int(parent is root or bool(parent is not None and parent.host_value is not None))
            cptrace(1, "prepare", node_id=nid, op=op.id, len=(len(n.key) if n is not None else len(op.device_indices)),
                    dev=rng(op.device_indices), host=rng(op.host_indices),
                    policy=POLICY.get(self.cache.cache_controller.write_policy, "?"),
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
        self.at_rest(publish)

    def at_rest(self, nodes: Iterable[TreeNode | None]) -> None:
        """Nodes whose host copy an ack just completed join the audit set (only while the audit is on)."""
        if Recorder.audit_mbps > 0:
            for n in nodes:
                if n is not None:
                    self.rest[n.id] = n

    def ack_h2d(self, ack_node_ids: list) -> None:
        for nid in ack_node_ids:
            q = self.loads.get(nid)
            if not q:
                continue
            ld = q.pop(0)
            if not q:
                del self.loads[nid]
            for n in ld.chain:
                cptrace(2, "ack", dir="h2d", op=ld.op, node_id=n.id, **self.fp(self.dev(n)))

    def evict(self, tier: str, n: TreeNode, kind: str, t: Tensor | None) -> None:
        """``evict`` of node ``n`` on ``tier`` (the slots ``t`` it frees); the following ``free`` of ``t`` is
        attributed to ``n``."""
        if tier == "dev":
            cptrace(1, "evict", tier="dev", node_id=n.id, kind=kind, dev=rng(t), **self.refs(n, True),
                    **self.xs("devx", t))
        else:
            cptrace(1, "evict", tier="host", node_id=n.id, kind=kind, host=rng(t), **self.refs(n, False),
                    **self.xs("hostx", t))
        if t is not None:
            self.expect_free[id(t)] = (t, n.id)
        if tier != "dev":
            self.rest.pop(n.id, None)

    def free(self, pool: str, t: Tensor) -> None:
        owner = self.expect_free.pop(id(t), None)
        nid, why = (owner[1], owner[2] if len(owner) > 2 else "evict") if owner is not None else (-1, "finish")
        if pool == "host":   # (before SGLang's free runs: an audit reading these slots now drops its sample)
            self.host_gen += 1
            self.rest.pop(nid, None)
        cptrace(2, "free", pool=pool, idx=rng(t), node_id=nid, why=why, **self.xs("idx_x", t))


class Recorder:
    """Process-wide options of the instrumentation (set by :meth:`SGLangInstrumentor._instrument`)."""

    exact = False
    audit_mbps = 0.0      # the host-copy audit's rate (._audit; 0: off)
    cp_mode = ""          # a CP mode someone set ("": derived from SGLang's server arguments, ._cpmode)
    cp_mode_src = ""      # who set it: "instrument" or "CPTRACE_CP_MODE"

    @classmethod
    def configure(cls, exact: bool, cp_mode: str, cp_mode_src: str = "", audit_mbps: float = 0.0) -> None:
        cls.exact = exact
        cls.audit_mbps = audit_mbps
        cls.cp_mode = cp_mode
        cls.cp_mode_src = cp_mode_src


def _int(x: SupportsInt) -> int:
    return x if type(x) is int else int(x)


def _fp(rows: Tensor | None, per_page: int) -> dict[str, Any]:
    """``h``, ``nz`` of ``rows`` and ``hp``, one ``khash`` per ``per_page`` rows; the -2 sentinels for None (a pool
    layout the instrumentation does not know)."""
    if rows is None:
        return {"h": -2, "nz": -2}
    hp = [khash(rows[i:i + per_page]) for i in range(0, rows.shape[0], per_page)]
    return {"h": _int(khash(rows)), "nz": _int(knz(rows)), "hp": [_int(x) for x in hp]}


def _side_rows(pool: SidecarPool, idx: Tensor, page_size: int) -> Tensor | None:
    """``[pages, layers, page bytes]``: the sidecar pages holding KV slots ``idx`` (page-aligned, token order), one
    row per page with every layer's index keys then scales as the page holds them (DSA's
    ``index_k_with_scale_buffer``, one page row per KV page; layers without an indexer, 0-row placeholders, are
    left out). None for a layout this does not know (another sidecar, or index pages of another size)."""
    import torch

    bufs = getattr(pool, "index_k_with_scale_buffer", None)
    if not bufs or int(getattr(pool, "index_page_size", page_size)) != page_size:
        return None
    bufs = [b for b in bufs if b.shape[0] > 0]
    if not bufs:
        return None
    pages = (idx[::page_size] // page_size).to(bufs[0].device)
    return torch.stack([b[pages] for b in bufs], dim=1).contiguous()


def kv_rows(pool: KVPool, idx: Tensor) -> Tensor | None:
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


def tree_path(cache: RadixCache, key: RadixKey, page_size: int) -> list[TreeNode]:
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


def aligned_key(cache: RadixCache, params: CacheParams) -> RadixKey:
    key = params.key
    key, _ = key.maybe_to_bigram_view(cache.is_eagle)
    return key.page_aligned(cache.page_size)
