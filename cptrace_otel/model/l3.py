"""The L3 storage tier in the node lifecycle: the records an emitter logs around SGLang's HiCache storage paths
(``HiCacheController.write_storage`` / ``prefetch``, a ``HiCacheStorage`` backend such as ``file``), their fields,
and what the rules and the span builder read from them.

L3 keys are the page keys the backend stores under (SGLang's per-page ``hash_value`` chain, with the backend's own
suffix where it adds one: the ``file`` backend appends ``_<model>_<tp>_<tp size>[_cp<r>_<cp size>]``), one per page,
in page order; ``hp`` lists one fingerprint per page in the same order (``khash`` of the page's bytes as the host
pool holds them; the stock-SGLang instrumentation hashes a strided page block by block, ``khash`` of its blocks'
``khash`` values: exact either way, so equal bytes give equal values; ``-1``/``-2`` are the usual sentinels and are
skipped).

==============  ======  ========================================================================================
tag             level   fields
==============  ======  ========================================================================================
``l3_backup``   1       ``node_id``, ``op`` (the storage operation id ``write_storage`` returns), ``keys=[..]``,
                        ``hp=[..]`` (of the host pages the backup reads), ``host`` (+``hostx``) those host slots,
                        ``io`` (1: this rank writes; 0: it skips the write, e.g. ``backup_skip``)
``l3_ack``      2       ``dir`` = ``backup`` (the write finished: ``ack_backup_queue``) or ``prefetch`` (the read
                        finished: the prefetch's last ack), ``op``, ``node_id`` (as on the record it closes),
                        ``done`` (pages completed); ``dir=prefetch``: ``keys=[..]`` and ``hp=[..]`` of the host
                        pages after the storage read
``l3_query``    1       ``op``, ``rid``, ``keys=[..]`` queried, ``hit`` (pages the backend holds: the prefetch query)
``l3_prefetch`` 1       ``op``, ``rid``, ``node_id`` (the matched node the fetched pages extend), ``keys=[..]``,
                        ``host`` (+``hostx``) the host slots the pages are read into
``l3_hit``      1       ``node_id`` (the node that now holds the fetched pages: the storage hit enters the tree),
                        ``op``, ``keys=[..]``, ``host`` (+``hostx``), optional ``hp=[..]``
``audit``       2       with ``tier=l3`` (opt-in, off the scheduler's thread): the stored objects of one acked
                        ``l3_backup`` read back through the backend and re-fingerprinted: ``node_id``, ``op`` (the
                        backup's), ``keys=[..]``, ``hp=[..]`` in the backup's layout (:data:`AUDIT_GONE` where the
                        object is not in storage any more, :data:`AUDIT_UNREADABLE` where reading it failed)
==============  ======  ========================================================================================

What a page's writer was (``FOREIGN``): the ``config`` record names the run's storage identity, the fields of
:data:`IDENT_FIELDS` (``model``: SGLang's ``model_path``; ``kv_dtype``: the device KV pool's dtype; ``layout``: the
host pool's; ``page_size``). Where the backend keeps files (``file``), the instrumentation writes a small metadata
file beside each object it stored (:data:`META_EXT`: the page's fingerprint, the writer's identity and the object
file's size and mtime, so a metadata file outlived by a rewrite of its object is ignored), and an ``l3_ack
dir=prefetch`` whose pages have one adds ``wfp=[..]`` (per page, the fingerprint it was written with; ``-1`` none)
and ``wid=[..]`` (per page, the writer's identity, :func:`ident_str`; ``""`` none).

Rules (:mod:`cptrace_otel.checks.rules_l3`, :mod:`cptrace_otel.checks.rules_l3x`; code ``L3``): ``L3a`` content
survives the round trip (per key, the fingerprint after a prefetch is one the key was backed up with), ``L3b`` the
host pages of an L3 transfer are not freed, evicted or given to another copy before its ``l3_ack``, ``L3c``/``L3d``
under context parallelism every rank that owns a shard writes it, under keys of its own; ``REST-l3``
(:mod:`cptrace_otel.checks.rules_rest`, code ``REST``) an object at rest is one its key was written with.

Spans (:mod:`cptrace_otel.model.spans`): ``rank R · l3-backup`` (``l3_backup`` .. ``l3_ack dir=backup``) and
``rank R · l3-prefetch`` (``l3_prefetch`` .. ``l3_ack dir=prefetch``) are stage spans of the node's lane, like d2h
and h2d; an ``l3_hit`` goes to its node's lane with a link to the prefetch span that fetched it.
"""

from __future__ import annotations

BACKUP = "l3_backup"
ACK = "l3_ack"
QUERY = "l3_query"
PREFETCH = "l3_prefetch"
HIT = "l3_hit"
TAGS = (BACKUP, ACK, QUERY, PREFETCH, HIT)
DIR_BACKUP, DIR_PREFETCH = "backup", "prefetch"
TIER_L3 = "l3"   # the ``tier`` of an ``audit`` of stored objects (an audit without ``tier`` reads a host copy)
AUDIT_GONE, AUDIT_UNREADABLE = -1, -2   # an audit's ``hp`` of an object not found / one whose read failed

WFP, WID = "wfp", "wid"
META_EXT = ".cptrace"   # the metadata file beside a stored object: "<object key>.cptrace"
IDENT_FIELDS = ("model", "kv_dtype", "layout", "page_size")


def ident_str(ident: dict) -> str:
    """The storage identity ``ident`` (fields of :data:`IDENT_FIELDS`, any missing) as one string, ``|``-joined in
    that order (a missing field empty)."""
    return "|".join(str(ident.get(k, "")) for k in IDENT_FIELDS)


def ident_parse(s: object) -> dict[str, str]:
    """:func:`ident_str`'s inverse: the fields it names (empty ones left out); ``{}`` for anything else. The model
    (first) may hold ``|``: the other fields are split off from the right."""
    if type(s) is not str or not s:
        return {}
    parts = s.rsplit("|", len(IDENT_FIELDS) - 1)
    if len(parts) != len(IDENT_FIELDS):
        return {}
    return {k: v for k, v in zip(IDENT_FIELDS, parts, strict=True) if v}


def ident_diff(mine: dict, theirs: dict) -> list[tuple[str, str, str]]:
    """``(field, this run's, the writer's)`` for each identity field both name and that differs."""
    return [(k, str(mine[k]), str(theirs[k])) for k in IDENT_FIELDS
            if mine.get(k) not in (None, "") and theirs.get(k) not in (None, "") and str(mine[k]) != str(theirs[k])]
