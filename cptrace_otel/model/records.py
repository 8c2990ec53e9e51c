"""Record rendering, shared by the traced process (the drainer thread) and the exporter worker.

A call ``cptrace(level, tag, **fields)`` is buffered as an item ``(ts_ns, level, tag, fields)``. Its rendering is
split between the two processes so that the traced process does the least work:

* :func:`compact_item` (drainer, traced process): every field value made an exact int, str or float so the item
  pickles cheaply. Deferred fingerprints are resolved (only this process can: they wait on its CUDA events), bools
  become ``True``/``False``, any other value is rendered with upstream ``_fmt`` semantics, and a value whose ``str``
  raises becomes ``(err:<ExceptionType>)``.
* :func:`render_record` (worker): a compact item, or any item, -> the Record of docs/ARCHITECTURE.md,
  ``(seq, ts_ns, level, tag, ((k, v), ...))``: spaces removed from strings, strings capped at
  :data:`MAX_VALUE_CHARS` (:func:`cut`), non-finite floats as the strings ``nan``, ``inf``, ``-inf``.

Both apply :func:`render_other` to a value that is not a plain int/str and :func:`tag_level` to the tag and level,
so an item gives the same Record however the work was split. Imports only :mod:`cptrace_otel.model.logline`
(light); the drainer passes in the fingerprint package's ``is_deferred``/``resolve``.
"""

from __future__ import annotations

from collections.abc import Callable
from math import isfinite as _isfinite
from typing import Any

from .grammar import VALUE
from .logline import render_value  # light (re only); imported here, not per value

MAX_VALUE_CHARS = VALUE.max_value_chars   # longer values are cut (with a marker): keeps a span and a request bounded
RESOLVE_TIMEOUT_S = 30.0  # longest wait for one deferred fingerprint

_PRIM = frozenset((int, str, float))


def cut(s: str) -> str:
    """``s`` capped at :data:`MAX_VALUE_CHARS` characters, with a ``...(cut:N)`` marker when it was longer."""
    if len(s) > MAX_VALUE_CHARS:
        return s[:MAX_VALUE_CHARS] + f"...(cut:{len(s) - MAX_VALUE_CHARS})"
    return s


def render_other(v: Any, is_deferred: Callable[[object], bool] | None,
                 resolve: Callable[[object, float], object] | None) -> Any:
    """Render a value that is not a plain int/str: deferred fingerprint, bool, float, list, any object. Never raises.

    Returns an int (a resolved fingerprint), a finite float, or a str without spaces of at most
    :data:`MAX_VALUE_CHARS` (plus the cut marker)."""
    try:
        if is_deferred is not None and resolve is not None and is_deferred(v):  # passed together
            try:
                r = resolve(v, RESOLVE_TIMEOUT_S)  # its sentinel if the GPU never finishes
            except BaseException:  # noqa: BLE001
                return -1  # the upstream failure sentinel
            return r if type(r) is int else render_other(r, None, None)
        t = type(v)
        if t is bool:
            return VALUE.true_text if v else VALUE.false_text
        if t is float:
            # A finite float is what its log-line text parses back to. NaN, inf and -inf are all the strings
            # "nan", "inf", "-inf" (one form for the three; logline.parse_value keeps that text a string too), so
            # live records and log lines still give identical events and no check ever compares a NaN.
            return v if _isfinite(v) else repr(v)
        s = str.replace(v, " ", "") if isinstance(v, str) else render_value(v)
        if type(s) is not str:
            s = str(s)
        return cut(s)
    except BaseException as e:  # noqa: BLE001 - a value whose __str__ raises (even SystemExit or
        # KeyboardInterrupt) costs only that value: here, not in the drainer, so the thread survives it
        try:
            return f"(err:{type(e).__name__})"
        except BaseException:  # noqa: BLE001
            return "(err:?)"


def tag_level(tag: Any, level: Any) -> tuple[str, int]:
    """The record's tag as text and its level as an int (1 when the caller passed something that is not one)."""
    if type(tag) is not str:
        tag = render_other(tag, None, None)
    if type(level) is not int:
        try:
            level = int(level)
        except BaseException:  # noqa: BLE001 - as in render_other
            level = 1
    return tag, level


def render_record(seq: int, item: tuple, is_deferred: Callable[[object], bool] | None = None,
                  resolve: Callable[[object, float], object] | None = None) -> tuple:
    """``(ts, level, tag, fields dict)`` -> Record ``(seq, ts, level, tag, ((k, v), ...))``. Does not modify
    ``item``; raises only when ``item`` is not of that shape."""
    ts, level, tag, fields = item
    out = []
    for k, v in fields.items():
        t = type(v)
        if t is int:
            out.append((k, v))
        elif t is str:
            if " " in v or len(v) > MAX_VALUE_CHARS:
                v = cut(v.replace(" ", ""))
            out.append((k, v))
        else:
            out.append((k, render_other(v, is_deferred, resolve)))
    tag, level = tag_level(tag, level)
    return (seq, ts, level, tag, tuple(out))


def compact_item(item: tuple, is_deferred: Callable[[object], bool] | None = None,
                 resolve: Callable[[object, float], object] | None = None) -> tuple:
    """The drainer's share of rendering: ``(ts, level, tag, fields)`` with every field value an exact int, str or
    float, so it pickles cheaply. The common case (all values already are) returns the item itself; deferred
    fingerprints are resolved and every other value rendered here, because only this process can. The worker
    finishes with :func:`render_record` (seq, spaces in strings, length cap, non-finite floats)."""
    ts, level, tag, fields = item
    for v in fields.values():
        if type(v) not in _PRIM:
            break
    else:
        if type(tag) is str and type(level) is int:
            return item
    f2 = {k: (v if type(v) in _PRIM else render_other(v, is_deferred, resolve)) for k, v in fields.items()}
    tag, level = tag_level(tag, level)
    return (ts, level, tag, f2)
