"""The fingerprint of one host pool page as the L3 records carry it (``hp`` of ``l3_backup``, ``l3_ack``, ``audit
tier=l3``): shared by the L3 sites (:mod:`._l3_sites`) and the audit's read-back of stored objects
(:mod:`._audit_l3`), which must agree on it to the bit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..api import khash

if TYPE_CHECKING:
    from torch import Tensor


def page_fp(page: Tensor, like: Tensor | None = None) -> int:
    """``khash`` of a contiguous page; of a strided one (a page of a ``layer_first`` host pool is one block per layer
    and K/V), ``khash`` of its blocks' ``khash`` values in order: equal bytes give equal values and a changed byte
    changes its block's value, without the copy that flattening a strided page makes (10x the hash's own time).
    ``like``: a page of the host pool whose block structure decides instead of ``page``'s own (``page`` its bytes in
    C order, e.g. a stored object read back into a contiguous buffer of that shape): the value is the one
    ``page_fp(like)`` gives for the same bytes."""
    form = page if like is None else like
    if form.is_contiguous():
        return int(khash(page))
    import itertools

    import torch

    lead = 1
    while lead < form.dim() and not form[(0,) * lead].is_contiguous():
        lead += 1
    blocks = [int(khash(page[ix])) for ix in itertools.product(*(range(n) for n in page.shape[:lead]))]
    return int(khash(torch.tensor(blocks, dtype=torch.int64)))
