"""The sites of sglang 0.5.23 over its Rust tree core (``RustUnifiedTreeCore``, the one SGLang selects by default
wherever its extension loads): records written at the core's Python boundary, so the user's cache is never
switched. The default: the instrumentation leaves ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` alone, arms
:data:`RUST_SITES23` when SGLang imports the core's adapter (it never imports it itself: that loads the extension;
armed, they are wrapped while tracing is on, as the other hot sites) and traces a Rust-core cache with
:class:`RustState`, on top of :data:`._sites23.SITES23`'s cache, controller and allocator sites, which are Python
whatever the core. ``CPTRACE_SGLANG_TREE_CORE=python`` is the option that switches
to the Python core instead, where the variable is unset (it traces what the list below says is not traced here).

The Rust core's nodes are not Python objects: the records name nodes by the ids that cross the boundary and read
them through it (``collect_path_info``, ``get_component_device_value``, ``is_backuped``,
``build_storage_backup_spec``, ``root_node_handle``):

* written as on the Python core: ``insert`` (``begin_insert`` / ``resume_insert``, at the final step, before the
  cache applies its actions: the path of the result's ``last_device_node`` holds every node the insert walked; new:
  the last node when it starts at the result's ``prefix_len``; revive: a node on it that an ``evict tier=dev`` left
  without device copy and that has one again, ``full_value_len`` set; ``dev`` from ``get_component_device_value``),
  ``prepare`` + ``backup`` (``_track_write_through_node``: the controller's queued op;
  parent and ``pbk`` from ``collect_path_info`` and ``is_backuped``), ``ack dir=d2h`` (``clen`` from the path),
  a hybrid tree's ``swa`` and ``mamba`` records (:mod:`._swa23`, :mod:`._mamba23`: what the Python core's
  ``commit_hicache_transfer`` of the SWA or Mamba component gets, its node's id and transfers, is what crosses the
  boundary at ``commit_backup(node_id, host_indices, comp_xfers)`` and ``commit_load_back(..., comp_xfers)``; the
  records read the transfers' slots and the pools, never a node),
  ``reload`` (``commit_load_back``: the load-back spec's ``nodes_to_load``), ``ack dir=h2d`` (each chain node's
  device slots from ``get_component_device_value``), ``evict tier=dev`` (``evict_device_leaf`` / ``demote`` /
  ``drop_subtree_no_host`` return the frees; the node id is the argument; kind from ``is_backuped`` before the
  call), the ``free`` records (allocator and host pool sites) with ``why=evict`` and the node, ``rid_map``;
* inferred: ``split`` (splits happen inside Rust; a split is written, with ``inf=1``, when a node named by a record
  (an insert's path included) is seen with a later ``path_start`` than it was booked with, or when a new id on a
  path starts where a booked node started under the same parent and that node now lies below it, or has left the
  tree while the new id's host copy starts at its booked first host slot: the new id is the prefix fragment, as
  ``UnifiedTreeCore._split_node`` makes it). An inferred split carries the lengths only (no
  ``dev_*``/``host_*`` slots: those may have moved since); ``evict tier=host``: ``drive_host_eviction`` returns host
  slots without nodes, so each freed host run is attributed to the node whose booked host copy starts at its first
  slot (kind ``host``, or a ``free why=dup`` where the node keeps its device copy);
* the L3 storage tier: the sites of :mod:`._l3_sites23` (they read the cache and controller, not nodes), with
  ``l3_hit`` at the adapter's ``insert_host`` (:func:`_on_hits`: the node it added, ``inserted_host_node``, and the
  refilled nodes of its path, read with ``collect_path_info``, ``build_storage_backup_spec``, ``get_hash_values``);
* not traced over the Rust core (one warning, naming ``CPTRACE_SGLANG_TREE_CORE=python``, the option that traces
  it): the audit of host copies at rest and of L3 objects (it would call into the core off the scheduler's thread;
  the other records are written);
* missing: the ``lock``/``href`` fields of ``evict`` (no lock count crosses the boundary), the slots of an inferred
  split, a split the records never come back to, and the ``free`` attribution of a host run whose node's copy was
  booked under another first slot.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..api import cptrace
from ._l3_sites import hit_record, prefetch_insert_site
from ._l3_sites23 import insert_host_call
from ._mamba23 import MAMBA
from ._sites23 import FULL, STATE_FOR_CORE, State23, commit_load_back_site
from ._state import arg, safe, state_of
from ._swa23 import BACKUP_HOST, LOAD_BACK, SWA, commit_book

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import RadixCache, TreeCore

ADAPTER = "sglang.srt.mem_cache.rust_tree_core.adapter"


class RNode:
    """A node of the Rust core, by id: all the records need of a node object (``id``)."""

    __slots__ = ("id",)

    def __init__(self, nid: int) -> None:
        self.id = nid


class RustState(State23):
    """:class:`State23` over the Rust core: nodes by id, read through the boundary; splits inferred (module doc)."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__(cache)
        self.span: dict[int, tuple[int, int, int]] = {}   # node id -> (parent id, path start, path end) as booked
        # (parent id, path start) -> the booked nodes starting there (siblings share it)
        self.by_start: dict[tuple[int, int], set[int]] = {}
        self.host_first: dict[int, int] = {}             # first host slot of a booked host copy -> its node id
        self.gone: set[int] = set()   # nodes whose device copy an `evict tier=dev kind=backuped` took (no reload yet)

    def clear(self) -> None:
        super().clear()
        self.span.clear()
        self.by_start.clear()
        self.host_first.clear()
        self.gone.clear()

    # -- node fields through the boundary -------------------------------------------------------------------------
    def node(self, nid: int) -> Any:
        return RNode(int(nid))

    def dev(self, n: Any) -> Tensor | None:   # type: ignore[override]
        return self.cache.tree_core.get_component_device_value(n.id, FULL)

    def host(self, n: Any) -> Tensor | None:   # type: ignore[override]
        spec = self.cache.tree_core.build_storage_backup_spec(n.id, False)
        return spec.host_value if spec is not None else None

    def refs(self, n: Any, lock: bool) -> dict[str, int]:
        return {}   # no lock count crosses the boundary

    def at_rest(self, nodes: Any) -> None:
        """No audit of host copies at rest over the Rust core: its thread would call into the core off the
        scheduler's thread."""

    def path(self, nid: int) -> tuple:
        (p,) = self.cache.tree_core.collect_path_info([nid])
        self.sync(p)
        return p

    def parent_pbk(self, node_id: int) -> tuple[int, int]:
        info = self.path(node_id)[-1]
        tc = self.cache.tree_core
        parent = int(info.parent_id) if info.parent_id is not None else -1
        return parent, int(parent == int(tc.root_node_handle()) or (parent >= 0 and tc.is_backuped(parent)))

    def key_len(self, node_id: int) -> int:
        info = self.path(node_id)[-1]
        return int(info.path_end) - int(info.path_start)

    # -- splits inferred from the paths ---------------------------------------------------------------------------
    def book(self, nid: int, parent: int, start: int, end: int) -> None:
        old = self.span.get(nid)
        if old is not None:
            self.by_start.get((old[0], old[1]), set()).discard(nid)
        self.span[nid] = (parent, start, end)
        self.by_start.setdefault((parent, start), set()).add(nid)

    def sync(self, path: tuple) -> None:
        """Write the splits that happened inside Rust on ``path`` (root first) since its nodes were booked, then
        book every node of it."""
        for k, info in enumerate(path):
            nid, start = int(info.node_id), int(info.path_start)
            if nid not in self.span:   # a new id: the prefix fragment of a booked node that started here?
                for old in list(self.by_start.get((int(info.parent_id), start), ())):
                    if old in self.span and self.span[old][2] > int(info.path_end):
                        self._fragments_of(old, info)   # (a sibling's own fragments are written too: its path has
                        if nid in self.span:            # them)
                            break
            elif start > self.span[nid][1]:   # it lost a prefix: the new ids above it are the fragments
                self._fragments(nid, path[:k + 1])
            self.book(nid, int(info.parent_id), start, int(info.path_end))

    def _fragments_of(self, old: int, new: Any) -> None:
        """:meth:`_fragments` of booked ``old`` on its path now. Where ``old`` left the tree, new id ``new`` (a path
        entry starting where ``old`` was booked to start) is still its prefix fragment when its host copy starts at
        ``old``'s booked first host slot (a slot has one owner while allocated; a fresh node there would not hold
        it): that split is written, and ``old`` forgotten."""
        try:
            (p,) = self.cache.tree_core.collect_path_info([old])
        except KeyError:   # old left the tree
            bp, bstart, bend = self.span.pop(old)
            self.by_start.get((bp, bstart), set()).discard(old)
            nid, end = int(new.node_id), int(new.path_end)
            h = self.host(RNode(nid))
            if h is not None and len(h) and self.host_first.get(int(h[0])) == old:
                cptrace(1, "split", node_id=old, new_id=nid, parent=bp, pre_len=bend - bstart,
                        split_len=end - bstart, inf=1)
                self.split_loads(old, nid)
                self.book(nid, bp, bstart, end)
                if old in self.gone:
                    self.gone.add(nid)
                self.host_first[int(h[0])] = nid
            return
        self._fragments(old, p)

    def _fragments(self, nid: int, path: tuple) -> bool:
        """The splits of booked ``nid`` (``path`` ends at it): each new id on the path between its booked start and
        its start now is a prefix cut from it, in path order (the lineage the checker rebuilds then holds the same
        token ranges as the tree, whatever order Rust cut them in). True when one was written."""
        _, bstart, bend = self.span[nid]
        now = int(path[-1].path_start)
        done = False
        for a in path[:-1]:
            aid, astart, aend = int(a.node_id), int(a.path_start), int(a.path_end)
            if astart >= bstart and aend <= now and aid not in self.span:
                cptrace(1, "split", node_id=nid, new_id=aid, parent=int(a.parent_id), pre_len=bend - astart,
                        split_len=aend - astart, inf=1)
                self.split_loads(nid, aid)
                self.book(aid, int(a.parent_id), astart, aend)
                self.book(nid, aid, aend, bend)
                if nid in self.gone:   # the prefix of a node without device copy has none either
                    self.gone.add(aid)
                self.rebook_host(aid)
                done = True
        if done:
            self.rebook_host(nid)
        return done

    def rebook_host(self, nid: int) -> None:
        """Book the first slot of ``nid``'s host copy now (a split moved it)."""
        h = self.host(RNode(nid))
        if h is not None and len(h):
            self.host_first[int(h[0])] = nid

    def split_loads(self, child: int, new: int) -> None:
        from ._sites import split_loads

        split_loads(self, RNode(child), RNode(new))   # type: ignore[arg-type]

    # -- records --------------------------------------------------------------------------------------------------
    def inserted(self, res: Any) -> None:
        """The ``insert`` records of the insert whose final step returned ``res`` (an ``InsertResult``): the path of
        its ``last_device_node`` (splits inside Rust written first, :meth:`sync`) holds every node it walked. A node
        on it that an ``evict tier=dev`` left without device copy and that has one again is revived (an insert gives
        a walked evicted node the request's slots; a reload would have named it); the last node is new when it
        starts at ``prefix_len`` (the insert's walked length: the tail it added as a leaf)."""
        if res.last_device_node is None:
            return
        path = self.path(int(res.last_device_node))
        for info in path:
            nid = int(info.node_id)
            if nid in self.gone and info.full_value_len is not None:
                self.gone.discard(nid)
                self._insert_of(info, "revive")
        last = path[-1]
        if int(last.path_start) >= int(res.prefix_len) and int(last.path_end) > int(last.path_start):
            self._insert_of(last, "new")

    def _insert_of(self, info: Any, kind: str) -> None:
        nid = int(info.node_id)
        self.insert_record(nid, int(info.parent_id), int(info.path_end) - int(info.path_start),
                           self.dev(RNode(nid)), kind)

    def prepare23(self, node_id: int) -> None:
        super().prepare23(node_id)
        host = self.cache.cache_controller.write_queue[-1].host_indices
        if host is not None and len(host):
            self.host_first[int(host[0])] = int(node_id)

    def reload23(self, node_id: int, device_indices: Tensor, kv_xfer: Any) -> None:
        for nid in (*(kv_xfer.nodes_to_load or ()), node_id):
            self.path(int(nid))
            self.gone.discard(int(nid))
        super().reload23(node_id, device_indices, kv_xfer)

    def ack_h2d(self, ack_node_ids: list) -> None:
        for nid in ack_node_ids:
            if self.loads.get(nid):
                safe(self.path, int(nid))
        super().ack_h2d(ack_node_ids)

    def dev_evicted(self, node_id: int, kind: str, result: Any) -> None:
        """``evict tier=dev`` of ``node_id`` for each device run ``result`` (an eviction step's) frees."""
        for t in result.device_frees.get(FULL, ()):
            if t is not None and len(t):
                self.evict("dev", RNode(node_id), kind, t)   # type: ignore[arg-type]  # (a node by id)
        if kind == "backuped":
            self.gone.add(node_id)

    def host_evicted(self, result: Any) -> None:
        """``drive_host_eviction``'s host runs: each attributed to the node whose booked copy starts there."""
        tc = self.cache.tree_core
        for t in result.host_frees.get(FULL, ()):
            if t is None or not len(t):
                continue
            nid = self.host_first.pop(int(t[0]), None)
            if nid is None:
                continue
            try:
                kept = not tc.is_full_device_evicted(nid)
            except KeyError:   # the node left the tree with its host copy
                kept = False
            if kept:   # the node keeps its device copy: a host duplicate reclaimed
                self.expect_free[id(t)] = (t, nid, "dup")
            else:
                self.evict("host", RNode(nid), "host", t)   # type: ignore[arg-type]  # (a node by id)


STATE_FOR_CORE["RustUnifiedTreeCore"] = RustState


def _rs(obj: object) -> RustState | None:
    st = state_of(obj)
    return st if isinstance(st, RustState) else None


def _dev_evict(kind: str | None) -> Callable[..., Any]:
    """A wrapper of the core's eviction step ``method(node_id, ...)``: ``evict tier=dev`` of each device run it frees
    (kind ``kind``, else ``backuped``/``regular`` by ``is_backuped`` before the call)."""
    def wrapper(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
        st = _rs(instance)
        if st is None:
            return wrapped(*args, **kwargs)
        nid = arg(args, kwargs, 0, "node_id")
        safe(st.path, int(nid))   # (a split inside Rust since the node was booked is written first)
        k = kind or safe(lambda: "backuped" if instance.is_backuped(nid) else "regular")
        res = wrapped(*args, **kwargs)
        if k is not None:
            safe(st.dev_evicted, int(nid), k, res)
        return res
    return wrapper


def _insert_step(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    """``begin_insert`` / ``resume_insert``: the final step (its ``result`` set) gets the insert's records before
    the cache applies its actions (the new leaf's backup among them), as the Python core writes them in the walk."""
    step = wrapped(*args, **kwargs)
    if step.result is not None:
        st = _rs(instance)
        if st is not None:
            safe(st.inserted, step.result)
    return step


def _on_hits(st: RustState, tree: TreeCore, op: Any, pre: tuple, res: Any) -> None:
    """``insert_host(node_id, key, ...)`` over the Rust core returned ``res``: the node it added past the tree's path
    (``inserted_host_node``) and the nodes of its path below ``node_id`` whose host copies now start at a fetched
    slot (refilled host tombstones) took pages of this prefetch: one ``l3_hit`` each, with the node's page hashes
    (``get_hash_values``), as on the Python core (which writes no ``insert`` for such a node either). Each is booked
    as the Rust state books a backup (its host copy's first slot, for ``drive_host_eviction``) and, without device
    copy, as evicted (an insert over it later is its revive)."""
    start, _key, fetched = pre
    end = res.inserted_host_node if res.inserted_host_node is not None else res.last_device_node
    if end is None:
        return
    path = st.path(int(end))
    below = next((k + 1 for k, info in enumerate(path) if int(info.node_id) == int(start)), 0)
    for info in path[below:]:
        nid = int(info.node_id)
        host = st.host(RNode(nid))
        if host is not None and len(host) and int(host[0]) in fetched:
            node = SimpleNamespace(id=nid, parent=SimpleNamespace(id=int(info.parent_id)))
            hit_record(st, st.cache, op, node, tree.get_hash_values(nid))   # type: ignore[attr-defined]
            st.host_first[int(host[0])] = nid
            if info.full_value_len is None:
                st.gone.add(nid)


def _commit_backup(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    """``commit_backup(node_id, host_indices, comp_xfers)``: a hybrid tree's component transfers of the backup
    (queued), recorded as the Python core's component commit records them (:func:`._swa23.commit_book`)."""
    out = wrapped(*args, **kwargs)
    st = _rs(instance)
    if st is not None:
        _commit_books(st, arg(args, kwargs, 0, "node_id"), BACKUP_HOST, arg(args, kwargs, 2, "comp_xfers"))
    return out


def _commit_load_back(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    """``commit_load_back(node_id, device_indices, kv_xfer, comp_xfers)``: the ``reload`` (either core's site), then
    a hybrid tree's component transfers of the load (queued; their records wait for its ack)."""
    out = commit_load_back_site(wrapped, instance, args, kwargs)
    st = _rs(instance)
    if st is not None:
        _commit_books(st, arg(args, kwargs, 0, "node_id"), LOAD_BACK, arg(args, kwargs, 3, "comp_xfers"))
    return out


def _commit_books(st: RustState, node_id: int, phase: str, comp_xfers: Any) -> None:
    """Each component's transfers in ``comp_xfers`` (``{ComponentType: [PoolTransfer]}``) to its book, if traced."""
    for ct, xfers in (comp_xfers or {}).items():
        book = {SWA: st.swa, MAMBA: st.mamba}.get(int(ct))
        if book is not None:
            commit_book(st, book, RNode(int(node_id)), phase, xfers)


def _host_evict(wrapped: Callable[..., Any], instance: TreeCore, args: tuple, kwargs: dict) -> Any:
    res = wrapped(*args, **kwargs)
    st = _rs(instance)
    if st is not None:
        safe(st.host_evicted, res)
    return res


# (module, "Class.method", wrapper): the Rust core's boundary, armed when SGLang imports the adapter.
RUST_SITES23: list[tuple[str, str, Any]] = [
    (ADAPTER, "RustUnifiedTreeCore.begin_insert", _insert_step),
    (ADAPTER, "RustUnifiedTreeCore.resume_insert", _insert_step),
    (ADAPTER, "RustUnifiedTreeCore.commit_load_back", _commit_load_back),
    (ADAPTER, "RustUnifiedTreeCore.commit_backup", _commit_backup),
    (ADAPTER, "RustUnifiedTreeCore.evict_device_leaf", _dev_evict(None)),
    (ADAPTER, "RustUnifiedTreeCore.demote", _dev_evict("backuped")),
    (ADAPTER, "RustUnifiedTreeCore.drop_subtree_no_host", _dev_evict("drop")),
    (ADAPTER, "RustUnifiedTreeCore.drive_host_eviction", _host_evict),
    (ADAPTER, "RustUnifiedTreeCore.insert_host", prefetch_insert_site(insert_host_call, _on_hits)),
]
