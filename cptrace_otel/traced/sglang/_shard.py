"""The fingerprint of a rank's stripe under SGLang 0.5.23's logical-page KV sharding (``--enable-kv-cache-sharding``).

There the tree, its slots and every copy op are the same logical indices on all ranks, but a rank's device and host
pools hold only the pages it owns (``PageInterleavePlacement``: logical page ``l`` on rank ``l % N``, local page
``l // N``; the controller moves only those, ``HybridCacheController._move_kv_shard_indices``). So what a rank can
fingerprint of a node is its own stripe, and that is what SGLang's own copies of the node on this rank move.

Contract of :func:`stripe_fp` (None for a pool that is not sharded: the caller fingerprints as before):

* ``h``, ``nz``: ``khash``/``knz`` of the KV rows of the slots of ``idx`` this rank owns, in token order (every
  layer's K then V, the layout of the unsharded fingerprint); where it owns none of them, ``h=0`` and ``nz=-1``
  (nothing of the node's KV is here: ZERO skips it, and backup and reload agree);
* ``hp``: one entry per page of ``idx`` (the node's pages, so per-page slices line up across splits as they do
  unsharded): the ``khash`` of the page's rows where this rank owns it, 0 where another rank does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..api import khash, knz

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import KVPool


def stripe_fp(pool: KVPool, idx: Tensor, page_size: int, rows_of: Any) -> dict[str, Any] | None:
    """The fingerprint of this rank's stripe of slots ``idx`` (see the module doc); ``rows_of(pool, local_rows)``
    gathers KV rows as the unsharded fingerprint does. None where ``pool`` is not a sharded pool."""
    placement = getattr(pool, "placement", None)
    rank = getattr(pool, "shard_rank", None)
    if placement is None or rank is None:
        return None
    mask = placement.local_mask(idx, rank)
    local = placement.local_index(idx[mask])
    if len(local) == 0:
        return {"h": 0, "nz": -1, "hp": [0] * (-(-len(idx) // page_size))}
    rows = rows_of(pool, local)
    if rows is None:
        return {"h": -2, "nz": -2}
    owned = mask[::page_size].tolist()   # (owners change only at page boundaries)
    hp, at = [], 0
    for mine in owned:
        if mine:
            hp.append(int(khash(rows[at:at + page_size])))
            at += page_size
        else:
            hp.append(0)
    return {"h": int(khash(rows)), "nz": int(knz(rows)), "hp": hp}
