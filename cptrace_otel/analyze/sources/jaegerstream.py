"""Jaeger's ``/api`` answers read as a stream, one trace at a time, in bounded memory (for :mod:`.jaeger` and Jaeger
documents on disk, :mod:`.tracedocs`).

Contract of :func:`iter_data`: the elements of the ``data`` array of ``{"data": [...], ..., "errors": ...}`` are
pulled from text pieces only as far as the parse has got; an element longer than ``max_item`` characters is scanned
to its end without being kept (:class:`_Skip`) and handed out as :class:`Unread` (its id, why, a sample of its span
start times); the ``errors`` after the array are checked (:func:`data_list`). Text that is not JSON, or that ends
early, raises :class:`.httpio.BackendError` with an escaped excerpt. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .httpio import BackendError as JaegerError, excerpt


class Unread(NamedTuple):
    """A trace of a search answer that was not parsed: ``trace_id`` (from its head, "" if none), ``reason`` (one
    line), ``starts``: a sample (at most :data:`_START_SAMPLE`) of its spans' ``startTime`` values (µs)."""

    trace_id: str
    reason: str
    starts: list


class TraceText(NamedTuple):
    """A trace of a search answer cut out by the compiled index (``_speedups/jaegerin.c``), not parsed: its
    ``trace_id`` (None when it has none), its spans' ``starts`` (µs) and its JSON ``text`` (bytes)."""

    trace_id: str | None
    starts: list
    text: bytes


def data_list(out: object, url: str) -> list[dict[str, Any]]:
    """The ``data`` list of a Jaeger ``/api`` answer; :class:`JaegerError` for its ``errors`` or another shape."""
    if not isinstance(out, dict):
        raise JaegerError(url, 200, f"not a Jaeger answer (an object with \"data\"): {excerpt(json.dumps(out))}")
    errs = out.get("errors")
    if errs:
        if not isinstance(errs, list):
            raise JaegerError(url, 200, f"\"errors\" is not a list: {excerpt(json.dumps(errs))}")
        raise JaegerError(url, 200, "; ".join(str(e.get("msg", e) if isinstance(e, dict) else e) for e in errs)[:300])
    data = out.get("data")
    if data is None:
        return []
    if not isinstance(data, list):
        raise JaegerError(url, 200, f"\"data\" is not a list: {excerpt(json.dumps(data))}")
    return data


DATA_HEAD = re.compile(r'\s*\{\s*"data"\s*:\s*\[\s*')
_SEP = re.compile(r"\s*(,|\])\s*")
AHEAD = 1 << 18   # characters kept ahead of the parse position: most traces parse at the first try
_TRACE_ID = re.compile(r'"traceID"\s*:\s*"([^"\\]{0,64})"')
_START = re.compile(r'"startTime"\s*:\s*(\d{1,20})')
_START_SAMPLE = 4096
_STR_BODY = re.compile(r'[^"\\]*')
_STRUCT = re.compile(r'["\[\]{}]')
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_PREFIX = re.compile(r'[^"]*(?:"[^"\\]*(?:\\.[^"\\]*)*"[^"]*)*')   # non-string text and complete strings
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_CLOSERS = re.compile(r"[\]}]*")
_CARRY_MAX = 1 << 16   # an unfinished string longer than this is walked instead of carried


class _Skip:
    """Finds the end of one JSON value without keeping it (strings, escapes and nesting tracked across pieces), and
    samples the ``startTime`` values it passes (for a window split around a trace too large to parse).

    Fast path (a piece in which the value cannot end): the piece's complete strings and every character but brackets
    are dropped and balanced pairs removed, all in C (``re``, ``str.replace``); the closers left before any opener
    say whether the depth reaches 0 inside the piece. An unfinished string at its end is carried into the next
    piece. The piece where the value may end is walked token by token."""

    def __init__(self) -> None:
        self.depth, self.in_str, self.esc = 0, False, False
        self.starts: list[int] = []
        self._stride, self._k = 1, 0
        self.chars = 0
        self._carry = ""

    def feed(self, s: str) -> str | None:
        """Scan the next piece: the text after the value's end, or None when it goes on in the next piece."""
        if self._carry:
            s, self._carry = self._carry + s, ""
        if not self.in_str and self.depth > 0:
            cut = _PREFIX.match(s).end()   # type: ignore[union-attr]   # up to an unfinished string
            if len(s) - cut <= _CARRY_MAX:
                br = _NOT_BRACKET.sub("", _STRING.sub("", s[:cut]))   # the piece's brackets, outside strings
                while True:   # drop balanced pairs, innermost first: what is left is closers, then openers
                    shorter = br.replace("{}", "").replace("[]", "")
                    if len(shorter) == len(br):
                        break
                    br = shorter
                closes = len(_CLOSERS.match(br).group())   # type: ignore[union-attr]
                if self.depth - closes > 0:   # the value cannot end inside this piece
                    self.depth += len(br) - 2 * closes
                    self._sample(s, 0, cut)
                    self.chars += cut
                    self._carry = s[cut:]
                    return None
        end = self._scan(s, 0)
        stop = len(s) if end is None else end
        self._sample(s, 0, stop)
        self.chars += stop
        return None if end is None else s[end:]

    def _sample(self, s: str, i: int, stop: int) -> None:
        for m in _START.finditer(s, i, stop):   # a cut between pieces may lose one sample: it is a sample
            self._k += 1
            if self._k % self._stride == 0:
                self.starts.append(int(m.group(1)))
                if len(self.starts) >= _START_SAMPLE:
                    del self.starts[::2]
                    self._stride *= 2

    def _scan(self, s: str, i: int) -> int | None:
        n = len(s)
        while i < n:
            if self.in_str:
                if self.esc:
                    self.esc = False
                    i += 1
                    continue
                i = _STR_BODY.match(s, i).end()   # type: ignore[union-attr]
                if i >= n:
                    return None
                if s[i] == "\\":
                    self.esc = True
                else:
                    self.in_str = False
                i += 1
                continue
            m = _STRUCT.search(s, i)
            if m is None:
                return None
            c, i = m.group(), m.end()
            if c == '"':
                self.in_str = True
            elif c in "[{":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    return i
        return None


def iter_data(parts: str | Iterable[str], url: str, with_text: bool = False,
              max_item: int | None = None) -> Iterator[Any]:
    """The elements of the ``data`` array of a Jaeger ``/api/...`` answer (text, or text in pieces, pulled as
    needed), parsed one at a time, then its ``errors`` checked (:class:`JaegerError`, as :func:`iter_data` does);
    ``with_text``: ``(element, its JSON text)`` pairs.

    Pieces are pulled only as far as the parse has got, so the text is held about once, and only one element's
    worth. An element whose text exceeds ``max_item`` characters is scanned to its end without being kept and comes
    out as :class:`Unread` (never a pair). Jaeger writes ``data`` first (``{"data":[...],"total":..,"errors":..}``);
    an answer of another layout is parsed whole. JSON that does not parse, or text that ends early, raises
    JaegerError with an escaped excerpt of where it failed."""
    src = iter([parts] if isinstance(parts, str) else parts)
    buf, pos = "", 0
    more = True

    def ahead(n: int) -> None:   # at least n characters after pos in buf, unless the text ends first
        nonlocal buf, pos, more
        if len(buf) - pos >= n or not more:
            return
        got = [buf[pos:]]
        size = len(got[0])
        while size < n:
            piece = next(src, None)
            if piece is None:
                more = False
                break
            got.append(piece)
            size += len(piece)
        buf, pos = "".join(got), 0

    ahead(64)
    m = DATA_HEAD.match(buf, pos)
    if m is None:
        text = buf[pos:] + "".join(src)
        more = False
        try:
            out = json.loads(text)
        except RecursionError:
            raise JaegerError(url, 200, "JSON nested too deeply to read") from None
        except ValueError as e:
            raise JaegerError(url, 200, f"not JSON ({e}): the answer begins {excerpt(text)}") from None
        for item in data_list(out, url):
            yield (item, json.dumps(item)) if with_text else item
        return
    pos = m.end()
    dec = json.JSONDecoder()
    ahead(1)
    if buf.startswith("]", pos):
        pos += 1
    else:
        while True:
            ahead(AHEAD)
            try:
                item, end = dec.raw_decode(buf, pos)
            except RecursionError:
                raise JaegerError(url, 200, f"trace nested too deeply to read, at {excerpt(buf[pos:])}") from None
            except ValueError as e:
                if more and _incomplete(e, buf):
                    # a trace longer than what is buffered: find its end first (no partial parses, which build
                    # objects for all that was read), keeping its text only while it is within the bound
                    text, rest, unread = _take(buf, pos, src, max_item, url)
                    buf, pos = rest, 0   # the parse resumes with the text after the trace
                    if unread is not None:
                        yield unread
                    else:
                        try:
                            item = json.loads(text)
                        except RecursionError:
                            raise JaegerError(url, 200,
                                              f"trace nested too deeply to read, at {excerpt(text)}") from None
                        except ValueError as e2:
                            raise JaegerError(url, 200, f"not JSON ({e2}), at {excerpt(text)}") from None
                        yield (item, text) if with_text else item
                        del item, text
                else:
                    why = "the answer ends inside a trace" if _incomplete(e, buf) else f"not JSON ({e})"
                    raise JaegerError(url, 200, f"{why}, at {excerpt(buf[pos:])}") from None
            else:
                if max_item is not None and end - pos > max_item:
                    yield _unread(buf[pos:pos + 4096], end - pos, max_item, _starts_of(item))
                else:
                    yield (item, buf[pos:end]) if with_text else item
                pos = end
            ahead(64)
            sep = _SEP.match(buf, pos)
            if sep is None:
                if not buf[pos:].strip():
                    raise JaegerError(url, 200, "the answer ends early (cut off after a trace)")
                raise JaegerError(url, 200, f"not Jaeger's JSON: after a trace comes {excerpt(buf[pos:])}")
            pos = sep.end()
            if sep.group(1) == "]":
                break
    rest = (buf[pos:] + "".join(src)).lstrip()
    try:
        # after the data array: more members (", ...}"), or the object's end alone ("}": Jaeger always writes more,
        # but an answer of the data member alone is JSON all the same, and the C reader reads it)
        tail = json.loads("{" + rest[1:] if rest.startswith(",") else "{" + rest if rest.startswith("}") else
                          rest or "{}")
    except (ValueError, RecursionError):
        raise JaegerError(url, 200, f"not Jaeger's JSON after the traces: {excerpt(rest)}") from None
    data_list(dict(tail, data=None) if isinstance(tail, dict) else tail, url)


def _take(buf: str, pos: int, src: Iterator[str], max_item: int | None, url: str
          ) -> tuple[str, str, Unread | None]:
    """The value starting at ``buf[pos]``, read on through ``src`` to its end: ``(its text, the text after it in the
    last piece, None)``, or, when it is longer than ``max_item`` characters, ``("", the text after it, its
    Unread)`` (its text is dropped as soon as it passes the bound: memory stays about ``max_item``)."""
    head = buf[pos:pos + 4096]
    sk = _Skip()
    first = buf[pos:]
    kept: list[str] | None = [first]
    size = len(first)
    rest = sk.feed(first)
    while rest is None:
        cur = next(src, None)
        if cur is None:
            raise JaegerError(url, 200, f"the answer ends inside a trace ({_trace_id(head) or 'no id'}, "
                              f"{sk.chars} characters read), at {excerpt(head)}")
        rest = sk.feed(cur)
        if kept is not None:
            kept.append(cur)
            size += len(cur)
            if max_item is not None and size - (len(rest) if rest is not None else 0) > max_item:
                kept = None
    if kept is None:
        return "", rest, _unread(head, sk.chars, max_item or 0, sk.starts)
    text = "".join(kept)
    return text[:len(text) - len(rest)], rest, None


def _unread(head: str, size: int, max_item: int, starts: list) -> Unread:
    return Unread(_trace_id(head), f"trace too large to check: more than {max_item} characters of JSON (about "
                  f"{size >> 20} MiB seen; CPTRACE_QUERY_MAX_TRACE_BYTES raises the bound, memory is about 20 times "
                  "it)", starts)


def _starts_of(item: object) -> list:
    """A sample of the span start times of a parsed trace, whatever its shape."""
    spans = item.get("spans") if isinstance(item, dict) else None
    out = [sp.get("startTime") for sp in spans or () if isinstance(sp, dict)] if isinstance(spans, list) else []
    out = [v for v in out if type(v) is int]
    return out[:: max(1, len(out) // _START_SAMPLE)]


def _trace_id(head: str) -> str:
    m = _TRACE_ID.search(head)
    return m.group(1) if m else ""


def _incomplete(e: ValueError, buf: str) -> bool:
    """Whether a JSON error can be the text ending early (more may come) rather than bad JSON."""
    msg = getattr(e, "msg", str(e))
    p = getattr(e, "pos", len(buf))
    # a cut inside a literal is reported where the literal starts: "nu" of null, "fals", "-", "1e" (at most 5 back)
    return msg.startswith("Unterminated string") or p >= len(buf.rstrip()) - 5
