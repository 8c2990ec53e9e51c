"""The upstream ``[CPTRACE <tag>] k=v ...`` line format: render and parse, value by value.

This is the one place that knows the text form. The hot path renders non-scalar values with :func:`render_value`
(upstream ``_fmt`` semantics: lists recursively, everything else ``str(v)`` with spaces removed), and every reader
(the exporter, the log parser, the OTLP file reader) turns text back into typed values with :func:`parse_value`.
Because a record takes the same text -> value step whether it came from a log file or from the live pipeline, the
checks see identical events from both.

:func:`parse_value` is exact by construction: a token becomes an int or float only when rendering that number gives
the same text back (``"007"`` stays a string), so ``render_value(parse_value(s)) == s`` for every space-free ``s``.

:func:`fast_value` is its one fast path (the log reader and the exporter worker call it, the C speedups mirror it):
the common shapes without the general machinery, anything else through :func:`parse_value`, so the two agree.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from .grammar import LINE

_LINE_RE = re.compile(re.escape(LINE.opening) + r"(?P<tag>\w+)\](?: (?P<body>.*))?$")
_RNG_RE = re.compile(r"\(cnt=(-?\d+),min=([^,()]+),max=([^,()]+),first=([^,()]+),last=([^,()]+)\)$")
_INT_RE = re.compile(r"-?\d+$")


class Rng(NamedTuple):
    """A parsed ``rng()`` summary ``(cnt=N,min=a,max=b,first=c,last=d)``. Parts are ints (floats for float data)."""

    cnt: int
    min: Any
    max: Any
    first: Any
    last: Any

    def render(self) -> str:
        return f"(cnt={self.cnt},min={self.min},max={self.max},first={self.first},last={self.last})"


# Range sentinels that stay strings: tensor None, empty, summary failure.
RNG_NONE = "(none)"
RNG_EMPTY = "(0)"


def render_value(v: Any) -> str:
    """Upstream ``_fmt``: no internal spaces, lists and tuples rendered as ``[a,b]`` recursively. An int with more
    digits than ``str`` converts (4,300 by default) is ``(err:ValueError)``, the stand-in the OTLP sinks use too
    (:func:`cptrace_otel.export.sinks.repair_span`), so a log line and the live span carry the same value."""
    t = type(v)
    if t is str:   # the common scalars first (the same text as below, without the isinstance tests)
        return v.replace(" ", "")
    if t is int:
        try:
            return str(v)
        except ValueError:
            return "(err:ValueError)"
    if isinstance(v, (list, tuple)) and not isinstance(v, Rng):
        return "[" + ",".join(render_value(x) for x in v) + "]"
    if isinstance(v, Rng):
        return v.render()
    try:
        return str(v).replace(" ", "")
    except ValueError:
        if isinstance(v, int):
            return "(err:ValueError)"
        raise


def _scalar(s: str) -> Any:
    if _INT_RE.match(s):
        i = int(s)
        return i if str(i) == s else s
    if s and (s[0].isdigit() or s[0] in "-.") and s not in ("-",):
        try:
            f = float(s)
        except ValueError:
            return s
        # "-inf" stays text like "inf" and "nan" (which never reach float() here): non-finite values are strings
        return f if repr(f) == s and f - f == 0.0 else s
    return s


def _split_top(s: str) -> list[str] | None:
    """Split the inside of ``[...]`` on top-level commas; None if brackets are unbalanced."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            out.append(s[start:i])
            start = i + 1
    if depth != 0:
        return None
    out.append(s[start:])
    return out


def parse_value(s: str) -> Any:
    """Typed value of one space-free token value: int, float, :class:`Rng`, list (nested), or the string itself."""
    if not s:
        return s
    c = s[0]
    if c == "(":
        m = _RNG_RE.match(s)
        if m:
            parts = [_scalar(p) for p in m.groups()[1:]]
            r = Rng(int(m.group(1)), *parts)
            return r if r.render() == s else s
        return s
    if c == "[" and s[-1] == "]":
        inner = s[1:-1]
        if inner == "":
            return []
        items = _split_top(inner)
        if items is None or any(x == "" for x in items):
            return s
        vals = [parse_value(x) for x in items]
        return vals if render_value(vals) == s else s
    return _scalar(s)


# The shapes fast_value decodes itself. A canonical int is exactly a text parse_value turns into an int ("007", "-0"
# and non-ASCII digits stay strings); ranges and lists of such ints are what parse_value would build from them.
_I = r"(0|-?[1-9][0-9]*)"
_RNG_FAST = re.compile(rf"\(cnt={_I},min={_I},max={_I},first={_I},last={_I}\)").fullmatch
_INTLIST_FAST = re.compile(rf"\[(?:{_I}(?:,{_I})*)?\]").fullmatch


def fast_value(s: str) -> Any:
    """``parse_value(s)``, faster for the common shapes: canonical ints, ``rng`` summaries of five canonical ints,
    flat lists of canonical ints (``chain``, ``pub``, ``hp``: a fresh list each call) and bare ASCII words. Every
    other text takes :func:`parse_value` itself, so the result is always the same (tests/unit/test_logline.py)."""
    if not s:
        return s
    c = s[0]
    if c.isdigit():
        if s.isdigit() and s.isascii() and (c != "0" or len(s) == 1):
            return int(s)
        return parse_value(s)
    if c == "-":
        if len(s) > 1 and s[1] != "0" and s.isascii() and s[1:].isdigit():
            return int(s)
        return parse_value(s)
    if c == "(":
        m = _RNG_FAST(s)
        if m is not None:
            a, b, c_, d, e = m.groups()
            return Rng(int(a), int(b), int(c_), int(d), int(e))
        return parse_value(s)
    if c == "[":
        if _INTLIST_FAST(s) is not None:
            inner = s[1:-1]
            return list(map(int, inner.split(","))) if inner else []
        return parse_value(s)
    if c.isalpha() and c.isascii():
        return s  # a bare word: _scalar keeps any text that starts with a letter
    return parse_value(s)


class ParsedLine(NamedTuple):
    prefix: str                 # whatever the logger put before "[CPTRACE"
    tag: str
    fields: dict[str, Any]      # typed, in line order
    bad_tokens: list[str]       # tokens without "=" (kept out of fields, reported as warnings)


def parse_line(line: str) -> ParsedLine | None:
    """Parse one log line; None when it holds no ``[CPTRACE tag]`` marker (not a trace line)."""
    idx = line.find(LINE.opening)
    if idx < 0:
        return None
    m = _LINE_RE.match(line.rstrip("\r\n"), idx)
    if not m:
        return None
    fields: dict[str, Any] = {}
    bad: list[str] = []
    body = m.group("body") or ""
    for tok in body.split():
        k, eq, v = tok.partition("=")
        if not eq or not k:
            bad.append(tok)
            continue
        fields[k] = parse_value(v)
    return ParsedLine(line[:idx], m.group("tag"), fields, bad)


def render_line(tag: str, fields: dict[str, Any]) -> str:
    """``[CPTRACE tag] k=v ...`` exactly as the upstream ``cptrace`` formats it (without the logger prefix)."""
    parts = " ".join(f"{k}={render_value(v)}" for k, v in fields.items())
    return f"{LINE.opening}{tag}] {parts}"


# SGLang's logger prefix, e.g. "[2026-07-18 03:03:06 ATTN_CP5 TP5] " (the format of sgl-project/sglang#31600).
_PREFIX_RANK = re.compile(re.escape(LINE.rank_prefix) + r"(\d+)")
_PREFIX_TP = re.compile(r"\bTP(\d+)")
_PREFIX_DP = re.compile(r"\bDP(\d+)")
_PREFIX_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)")


class Prefix(NamedTuple):
    cp_rank: int | None
    tp_rank: int | None
    dp_rank: int | None
    wall: str | None


def parse_prefix(prefix: str) -> Prefix:
    """Rank and wall time from the SGLang log prefix; None for what it does not carry."""

    def grab(rx: re.Pattern[str]) -> int | None:
        m = rx.search(prefix)
        return int(m.group(1)) if m else None

    t = _PREFIX_TIME.search(prefix)
    return Prefix(grab(_PREFIX_RANK), grab(_PREFIX_TP), grab(_PREFIX_DP), t.group(1) if t else None)
