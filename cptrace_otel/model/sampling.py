"""Deterministic sampling of node lineages (``CPTRACE_SAMPLE=<fraction>``), decided on the caller's path.

Contract:

* A node is kept when ``keep_node(run_id, node_id, fraction)``: the first 8 bytes of
  ``blake2b(f"{run_id}|{node_id}")`` read as an unsigned int, divided by 2**64, are below ``fraction``. Every rank
  of a run has the same run id and the same node ids, so every rank keeps the same nodes, with no coordination.
* Lineage: a ``split`` record (``node_id`` = the kept id, the suffix; ``new_id`` = the new prefix node) gives the new
  node its origin's decision, so a lineage is kept or dropped whole (the H1 rules and C1 follow a range across
  splits). The ``split`` record itself belongs to ``node_id``. A ``reset`` forgets the inherited decisions (the tree
  is rebuilt; hashes still decide every node alike).
* Records that belong to no node (no ``node_id``, or a negative one: ``config``, ``reset``, ``store``, ``fwd_hash``,
  ``free`` of unowned slots, rank-span records) are always kept.
* Cost: a sampled-out call pays one set lookup of its ``node_id`` in ``api.cptrace`` after the level compare (the
  set of nodes decided out, :func:`make_submit`'s ``drop``: with the C speedups an ``IdSet``, whose lookup of an
  int is a C hash probe, see ``_speedups/idset.c``); a node's hash is
  computed once (cached; the cache is bounded by :data:`MAX_CACHED`, inherited decisions by :data:`MAX_INHERITED`,
  past which the oldest lineage links are forgotten and the hash decides).
* The exporter's resource says ``cptrace.sample=<fraction>`` on a sampled stream, and ``check`` knows that a node
  missing from such a stream may have been sampled out (:func:`keep_node` with the stream's run id and fraction).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

MAX_CACHED = 1 << 20
MAX_INHERITED = 1 << 20
_SCALE = float(1 << 64)


def keep_node(run_id: str, node_id: object, fraction: float) -> bool:
    """True when node ``node_id`` of run ``run_id`` is kept at ``fraction`` (the hash rule, no lineage)."""
    if fraction >= 1.0:
        return True
    d = hashlib.blake2b(f"{run_id}|{node_id}".encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(d, "big") / _SCALE < fraction


_NO_NODE = object()


class DropSet(Protocol):
    """What :func:`make_submit` needs of its ``drop``: a ``set`` has it, and so has the C speedups' ``IdSet``."""

    def add(self, n: object, /) -> None: ...

    def discard(self, n: object, /) -> None: ...

    def clear(self) -> None: ...

    def __len__(self) -> int: ...

    def __contains__(self, n: object, /) -> bool: ...


def make_submit(inner: Callable[[int, str, dict], None], run_id: str, fraction: float,
                drop: DropSet | None = None) -> Callable[[int, str, dict], None]:
    """``inner`` (the pipeline's submit function) behind the sampling decision for ``run_id`` at ``fraction``.

    ``drop`` (filled here, read by ``api.cptrace``): the node ids decided out, so that the caller drops their later
    records with one set lookup before any call; it is cleared at a ``reset`` and when it grows past
    :data:`MAX_CACHED` (the decisions are then made again, alike)."""
    if drop is None:
        drop = set()
    decided: dict[Any, bool] = {_NO_NODE: True}
    inherited: dict[Any, bool] = {}
    get = decided.get

    def slow(level: int, tag: str, fields: dict) -> None:
        n = fields.get("node_id", _NO_NODE)
        k = decided.get(n)
        if k is None:
            if (type(n) is int and n < 0) or n is None:
                k = True   # unowned: belongs to no node
            else:
                k = inherited.get(n)
                if k is None:
                    k = keep_node(run_id, n, fraction)
            if len(decided) >= MAX_CACHED:
                decided.clear()
                decided[_NO_NODE] = True
            if len(drop) >= MAX_CACHED:
                drop.clear()
            decided[n] = k
            if not k:
                drop.add(n)
        if tag == "split":
            new = fields.get("new_id")
            if new is not None:
                if len(inherited) >= MAX_INHERITED:
                    inherited.clear()
                inherited[new] = k
                decided[new] = k
                if k:
                    drop.discard(new)
                else:
                    drop.add(new)
        elif tag == "reset":
            inherited.clear()
            decided.clear()
            drop.clear()
            decided[_NO_NODE] = True
        if k:
            inner(level, tag, fields)

    def submit(level: int, tag: str, fields: dict) -> None:
        try:
            k = get(fields.get("node_id", _NO_NODE))
            if tag != "split" and tag != "reset":
                if k is False:
                    return
                if k is True:
                    inner(level, tag, fields)
                    return
            slow(level, tag, fields)
        except Exception:  # the traced process must never see tracing fail; a signal handler's SystemExit or
            pass           # KeyboardInterrupt is the application's and propagates (see pipeline's _submit)

    return submit
