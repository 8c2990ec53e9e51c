"""SGLang's kv-canary violation lines (``--kv-canary``, SGLang PRs #26805-#26819) as records of the event model.

SGLang's ``ViolationReporter`` (``sglang/srt/kv_canary/runner/violation_reporter.py``, 0.5.23) logs each violation
as a WARNING (mode ``log``) or raises one ``RuntimeError`` holding them all (mode ``raise``). Each violation's text
starts with one line whose format SGLang declares frozen (its own tests parse it)::

    kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_chain_hash+verify_real_kv_hash slot_idx=17 \
position=42 stored_token=111 expected_token=0 stored_chain_hash=0x1111111111111111 expected_aux=0x2222222222222222

followed by a human-readable block (``KV cache canary violation detected (...)``, ``canary_kind: ...``, ...) that
repeats what the first line says. Only the first line is read: the block never becomes a second record. What comes
before the marker is the logger's prefix (``[2026-05-12 10:00:00 TP0] ``, ``RuntimeError: ``), parsed like the
prefix of a ``[CPTRACE tag]`` line.

A canary line becomes one record with tag :data:`TAG` (``kv_canary``) and the line's fields, typed by the same
grammar as every trace line (:func:`~cptrace_otel.model.logline.parse_value`): ``slot_idx``, ``position`` and the
tokens are ints, ``launch_tag`` and ``fail_reason`` words, the two 64-bit hashes stay the ``0x...`` text SGLang
printed (an unsigned 64-bit value does not fit the int64 attributes). The record carries no ``node_id``: which
node's device slots held ``slot_idx`` is decided by the ``CANARY`` rule (:mod:`cptrace_otel.checks.rules_canary`)
from the ranges the trace recorded.

``slot_idx`` is an index of the KV pool the launch read: the full-attention pool for the ``*_FULL`` launch tags
(the index space of the trace's ``dev`` ranges), the sliding-window pool for ``*_SWA`` (:func:`full_pool`).
"""

from __future__ import annotations

from typing import Any

from .logline import parse_value, render_value

TAG = "kv_canary"
MARKER = "kv_canary violation: "
# The fields of SGLang's line, in its order; the first four are required (the rest are read when present).
FIELDS = ("launch_tag", "fail_reason", "slot_idx", "position", "stored_token", "expected_token",
          "stored_chain_hash", "expected_aux")
REQUIRED = FIELDS[:4]
_INTS = ("slot_idx", "position")


def parse_canary_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(prefix, fields)`` of a canary violation line, None when ``line`` is not one (no marker, a required field
    missing, ``slot_idx``/``position`` not ints, or a token without ``=``: SGLang never prints those, so such a line
    is someone else's text and is left alone)."""
    idx = line.find(MARKER)
    if idx < 0:
        return None
    fields: dict[str, Any] = {}
    for tok in line[idx + len(MARKER):].split():
        k, eq, v = tok.partition("=")
        if not eq or not k:
            return None
        fields[k] = parse_value(v)
    for k in REQUIRED:
        if k not in fields:
            return None
    for k in _INTS:
        if type(fields[k]) is not int:
            return None
    return line[:idx], fields


def render_canary_line(fields: dict[str, Any]) -> str:
    """The line SGLang prints for ``fields`` (without a logger prefix): the inverse of :func:`parse_canary_line`."""
    return MARKER + " ".join(f"{k}={render_value(v)}" for k, v in fields.items())


def full_pool(launch_tag: object) -> bool:
    """True when ``launch_tag`` names a launch over the full-attention KV pool (``HEAD_K_FULL`` ...), whose slot
    indices are the trace's ``dev`` indices; False for the sliding-window pool (``*_SWA``) and unknown tags."""
    return isinstance(launch_tag, str) and launch_tag.endswith("_FULL")
