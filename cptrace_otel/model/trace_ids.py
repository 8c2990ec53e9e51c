"""The trace and span ids of the trace model (:mod:`cptrace_otel.model.spans`): deterministic hashes of the run id,
epoch, node, rank or request, so every rank process (and the watcher) names the same trace or span without any
coordination or context propagation."""

from __future__ import annotations

import hashlib

_DIGEST = hashlib.blake2b
# Empty hashers of the two id sizes: copying one is cheaper than a new hasher's parameter setup (the same digests).
_BLANK = {n: _DIGEST(digest_size=n) for n in (8, 16)}


def hashed_id(text: str, size: int) -> bytes:
    """The ``size``-byte id (trace id 16, span id 8) of ``text``: blake2b, never all zero (invalid in OTLP). Every
    trace and span id of the model is one of these, so any process can name a span without coordination."""
    blank = _BLANK.get(size)
    h = blank.copy() if blank is not None else _DIGEST(digest_size=size)
    h.update(text.encode("utf-8", "replace"))
    d = h.digest()
    return d if d.strip(b"\0") else (b"\x00" * (size - 1) + b"\x01")  # all-zero ids are invalid in OTLP


def node_trace_id(run_id: str, epoch: int, node_id: int) -> bytes:
    """Trace id of one node lineage: identical in every rank process of the run."""
    return hashed_id(f"{run_id}|{epoch}|{node_id}", 16)


def rank_trace_id(run_id: str, rank: int) -> bytes:
    """Trace id holding a rank's records that belong to no node (config, reset, free of unowned slots, ...)."""
    return hashed_id(f"{run_id}|rank|{rank}", 16)


def request_trace_id(run_id: str, rid: str) -> bytes:
    """Trace id of one request (``fwd_hash`` records; links to the node traces named by ``rid_map``)."""
    return hashed_id(f"{run_id}|rid|{rid}", 16)


def lane_span_id(run_id: str, epoch: int, node_id: int, rank: int, segment_seq: int | None = None) -> bytes:
    """Span id of ``rank``'s lane in the node trace ``(run_id, epoch, node_id)``: the first segment (``segment_seq``
    None) is computable by any process; a later segment hashes the seq of its first record in."""
    tail = "" if segment_seq is None else f"|{segment_seq}"
    return hashed_id(f"{run_id}|{epoch}|{node_id}|lane|{rank}{tail}", 8)
