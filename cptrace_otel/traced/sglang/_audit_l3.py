"""The audit of L3 copies at rest: the stored objects this trace's ``l3_backup`` records wrote, read back through the
storage backend and re-fingerprinted by the audit thread (:mod:`._audit`), one level-2 ``audit tier=l3`` record per
backup operation, so that an object corrupted in storage is found (rule REST-l3,
:mod:`cptrace_otel.checks.rules_rest`) before, or without, a prefetch that reads it.

Contract:

* Which objects: the pages of a backup written by this rank (``l3_backup io=1``) join the L3 audit set when the
  scheduler's drain takes the backup's ack (``l3_ack dir=backup``: the pages it completed are in storage), only
  for a cache under audit (:func:`._audit.enrolled`; nothing is kept otherwise). The set is bounded
  (:data:`OPS_KEPT` operations, the oldest dropped); an operation leaves it once an audit found one of its objects
  gone (it was evicted or removed: one record says so, the next passes do not read it again).
* How an object is read: ``HiCacheFile.get(key, target)`` (SGLang's ``file`` backend, the read its prefetch I/O
  thread makes) into the audit's own scratch buffer (one flat data page, allocated once per cache), never a host
  slot. The call sits below the controller: no prefetch operation, no ``ongoing_prefetch`` entry, no host
  allocation, no prefetch token accounting. Its only other effects are the backend's ``metadata_cache`` (a key
  added for an object that exists, removed for one that does not: what ``exists`` does too) and its LRU
  evictor's ``touch``, which moves the key to most recently used when a size cap is set. So a backend whose evictor
  is enabled (``HiCacheFile(..., max size / free space watermark)``) is not audited (an audit's read would keep
  the objects it reads from eviction): one warning, ``STATS['l3_refused']``. Other backends (their ``get`` may
  count hits, fetch remotely or take locks the prefetch holds) are refused the same way.
* The fingerprint: the bytes the backend returns are the flat data page the backup stored
  (``get_data_page(flat=True)``, a C-order view of the non-flat page); :func:`._pagefp.page_fp` of them in the
  block structure of the host pool's own page gives the value ``l3_backup``'s ``hp`` carries for the same bytes.
* The rate: the audit thread's (``CPTRACE_AUDIT_MBPS``), shared with the host copies; a backup is charged its
  bytes and :data:`._audit.FLOOR` per page at least (each page is an object to open, read and hash).
* Errors: a read that raises costs that page (``hp`` :data:`~cptrace_otel.model.l3.AUDIT_UNREADABLE`,
  ``STATS['l3_unreadable']``), never the record or the traced process; ``get`` returning None (not found) is
  :data:`~cptrace_otel.model.l3.AUDIT_GONE`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ...model.l3 import AUDIT_GONE, AUDIT_UNREADABLE, TIER_L3

if TYPE_CHECKING:
    from torch import Tensor

    from ._types import CacheController

logger = logging.getLogger("cptrace_otel.sglang")

OPS_KEPT = 4096       # backup operations under audit per cache (oldest dropped)
PENDING_KEPT = 4096   # backups of a cache under audit still awaiting their ack (oldest dropped)
BACKENDS = {"HiCacheFile"}   # exact classes whose get() is a plain read (see the module doc)


class L3Rest:
    """The L3 audit set of one cache (``State.l3.audit``): written on the scheduler's thread, read by the audit's."""

    __slots__ = ("pending", "rest", "backend", "pool", "scratch", "form", "refused")

    def __init__(self) -> None:
        self.pending: OrderedDict = OrderedDict()   # op -> (node id, page hashes, keys): backups awaiting their ack
        self.rest: OrderedDict = OrderedDict()      # op -> (node id, page hashes, keys): acked, in storage
        self.backend: Any = None     # the controller's storage backend and host pool, from the last backup
        self.pool: Any = None
        self.scratch: Tensor | None = None   # one flat data page: where the audit reads an object into
        self.form: Tensor | None = None      # a page of the host pool: the block structure of the fingerprint
        self.refused = False


def on_backup(ra: L3Rest, cc: CacheController, op: int, nid: int, hashes: list[str], keys: list[str]) -> None:
    """``l3_backup io=1`` of a cache under audit (scheduler thread): the backup awaits its ack."""
    if ra.refused:
        return
    ra.backend, ra.pool = cc.storage_backend, cc.storage_host_pool
    ra.pending[op] = (nid, hashes, keys)
    while len(ra.pending) > PENDING_KEPT:
        ra.pending.popitem(last=False)


def on_ack(ra: L3Rest, op: int, done: int | None) -> None:
    """``l3_ack dir=backup`` (scheduler thread): the ``done`` pages it completed (all when None) go under audit."""
    entry = ra.pending.pop(op, None)
    if entry is None or ra.refused:
        return
    nid, hashes, keys = entry
    n = len(hashes) if done is None else done
    if n <= 0:
        return
    ra.rest[op] = (nid, hashes[:n], keys[:n])
    while len(ra.rest) > OPS_KEPT:
        ra.rest.popitem(last=False)


def refusal(ra: L3Rest) -> str | None:
    """Why the L3 copies of this cache cannot be audited (see the module doc), None when they can."""
    b = ra.backend
    if type(b).__name__ not in BACKENDS:
        return f"storage backend {type(b).__name__}"
    if getattr(getattr(b, "_evictor", None), "enabled", False):   # (SGLang's LRUFileEvictor; its get() touches)
        return "the file backend's LRU eviction is on (a read would refresh the object)"
    return None


def audit_op(ra: L3Rest, op: int, stats: dict) -> tuple[int, int] | None:
    """Read back and re-fingerprint the objects of backup ``op`` and record them (``audit tier=l3``); ``(bytes
    read, pages read)`` (zeros when it left the set), None when this cache's L3 copies cannot be audited
    (:func:`refusal`)."""
    import torch

    from ..api import cptrace
    from ._pagefp import page_fp

    entry = ra.rest.get(op)
    if entry is None:
        return 0, 0
    if refusal(ra) is not None:
        return None
    form, scratch = ra.form, ra.scratch
    if form is None or scratch is None:
        form = ra.form = ra.pool.get_data_page(0, flat=False)   # (a view of slot 0's page: its shape and strides)
        scratch = ra.scratch = torch.empty(form.numel(), dtype=form.dtype)
    nid, hashes, keys = entry
    page = scratch.view(form.shape)
    hp: list[int] = []
    for h in hashes:
        try:
            got = ra.backend.get(h, scratch)
        except Exception as e:  # an unreadable object (a short read, an I/O error): this page only
            stats["l3_unreadable"] += 1
            logger.debug("cptrace-otel: L3 audit read of %s failed (%s: %s)", h, type(e).__name__, e)
            hp.append(AUDIT_UNREADABLE)
            continue
        hp.append(page_fp(page, like=form) if got is not None else AUDIT_GONE)
    if AUDIT_GONE in hp:
        ra.rest.pop(op, None)   # evicted or removed: recorded once, not read again
        stats["l3_gone"] += hp.count(AUDIT_GONE)
    cptrace(2, "audit", tier=TIER_L3, node_id=nid, op=op, keys=keys, hp=hp)
    stats["l3_audited"] += 1
    return len(hashes) * scratch.numel() * scratch.element_size(), len(hashes)
