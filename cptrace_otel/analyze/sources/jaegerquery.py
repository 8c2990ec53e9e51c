"""Find every trace of one run in a Jaeger query service, for ``cptrace-otel check --jaeger``.

How (Jaeger v1.76 / v2.13 and later, any storage; facts in the project's backend notes):

* Search with the api_v2 HTTP API, ``GET /api/traces?service=S&tags={"cptrace.run_id":"ID"}&start=&end=&limit=L
  &raw=true``: every span of the run carries the run id (a resource attribute, which the tag search matches), and
  the answer holds each matching trace whole, in Jaeger's JSON model, so one request reads up to L traces. (api_v3's
  HTTP search takes no attribute filter before v2.19; ``raw=true`` keeps the spans as stored: no dedup, no sorting.)
* Pagination: a search returns at most L traces (the memory store walks its ring newest-first until L match; L, its
  "search depth", must not exceed ``max_traces``) and has no offset. A window [start, end] (µs, bounds on span start
  times, inclusive) that comes back full is split into closed windows that share their ends (so every span start
  of the window is in one of them): at the median span start of the page, and older than it into windows as long
  as the page's newer half (:meth:`Search._split`), until no window is full; traces are deduplicated by id. A node
  trace lives as long as its node, so windows overlap in traces: the searches grow faster than traces / L, and a
  larger L (up to ``max_traces``) saves most of them. When Jaeger refuses L ("search depth ... max traces"), L is
  halved and the search retried.
* Without ``--run-id``: the newest L traces of the service in the window are searched and the run ids of their
  processes listed; exactly one must be there.

Standard library only.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...model import semconv as sc
from ...model.exits import CptraceError
from .httpio import excerpt
from .jaeger import JaegerClient, JaegerError, Unread
from .jaegerstream import TraceText

if TYPE_CHECKING:
    import argparse

DEFAULT_SINCE_S = 7 * 86400
DEFAULT_LIMIT = 1000
SPLIT_BACK = 9   # the windows a full page's window is split into, at most (see Search._split)
_DUR = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

_Client = TypeVar("_Client", covariant=True)


class ClientClass(Protocol[_Client]):
    """How :func:`open_query` makes a query client (``JaegerClient``, ``TempoClient``): the base URL, a timeout."""

    def __call__(self, url: str, /, *, timeout_s: float) -> _Client: ...


def parse_duration(text: str) -> float:
    """Seconds of ``30s``, ``15m``, ``1h``, ``1h30m``, ``2d``, ``1w`` (a bare number is seconds). Raises ValueError."""
    s = text.strip()
    try:
        v = float(s)
    except ValueError:
        pos, v = 0, 0.0
        for m in _DUR.finditer(s):
            if m.start() != pos:
                break
            v += float(m.group(1)) * _UNIT_S[m.group(2).lower()]
            pos = m.end()
        if pos != len(s) or not s:
            raise ValueError(f"not a duration: {text!r} (e.g. 30m, 1h, 2d)") from None
    if v <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return v


def parse_time(text: str) -> int:
    """Unix µs of an ISO 8601 time (``2026-12-01T21:13:00Z``, ``2026-12-01 21:13``; no zone = UTC) or of a number of
    unix seconds. Raises ValueError."""
    s = text.strip()
    try:
        return int(float(s) * 1e6)
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(s[:-1] + "+00:00" if s[-1:] in "zZ" and s else s)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (ISO 8601 such as 2026-12-01T21:13:00Z, or unix seconds)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return int(t.timestamp() * 1e6)


def open_query(client_cls: ClientClass[_Client], url: str, args: argparse.Namespace) -> tuple[_Client, int, int]:
    """The query client of ``url`` (``JaegerClient``, ``TempoClient``) and the search window in µs from ``args``
    (``--since`` / ``--start`` / ``--end``), as ``check --jaeger`` and ``check --tempo`` both take them. Raises
    ValueError for a bad URL or window (a usage error)."""
    client = client_cls(url, timeout_s=30.0)
    start_us, end_us = window(getattr(args, "since", None), getattr(args, "start", None), getattr(args, "end", None))
    return client, start_us, end_us


def window(since: str | None, start: str | None, end: str | None, now_s: float | None = None) -> tuple[int, int]:
    """(start µs, end µs) of the search: ``--start``/``--end`` (end defaults to now), else the last ``--since``
    (default :data:`DEFAULT_SINCE_S`). Raises ValueError."""
    now_us = int((time.time() if now_s is None else now_s) * 1e6)
    if since is not None and (start is not None or end is not None):
        raise ValueError("--since cannot be combined with --start/--end")
    if start is not None or end is not None:
        e = parse_time(end) if end is not None else now_us
        s = parse_time(start) if start is not None else e - int(DEFAULT_SINCE_S * 1e6)
        if s > e:
            raise ValueError("--start is after --end")
        return s, e
    return now_us - int((parse_duration(since) if since is not None else DEFAULT_SINCE_S) * 1e6), now_us


def iso_us(us: int) -> str:
    """RFC 3339 (UTC, µs) of unix µs, for messages."""
    return _dt.datetime.fromtimestamp(us / 1e6, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PageTooSmall(CptraceError):
    """More traces than one search returns start within one microsecond: no window split can page through them."""


class Search:
    """Paginated searches of one service in one Jaeger (see the module doc). ``progress(traces, searches)`` is called
    after every search.

    Fail closed, one trace at a time: a trace that cannot be used (too large to parse, :class:`.jaeger.Unread`; not a
    JSON object; spans that are not a list of objects; a ``startTime`` that is not an integer) is recorded in
    :attr:`unread` (trace id -> why) and skipped, and the rest is read; a caller that finds :attr:`unread` non-empty
    has not read everything it was asked for. The text of the traces one search keeps is bounded by the client's
    ``limits.max_answer_bytes``: a page past it is searched again with half the search depth.

    ``index`` (``jaeger_read.index``, the compiled reader): the answers are indexed by it where it can, and the
    traces it cut out are handed out as :class:`.jaegerstream.TraceText` (not parsed; ``jaeger_read.read`` reads
    them), the others parsed as without it."""

    def __init__(self, client: JaegerClient, service: str = sc.DEFAULT_SERVICE_NAME, limit: int = DEFAULT_LIMIT,
                 progress: Callable[[int, int], None] | None = None,
                 index: Callable[[bytes, int], list | None] | None = None) -> None:
        self.client, self.service, self.limit = client, service, max(1, int(limit))
        self.index = index
        self.progress = progress
        self.searches = 0
        self.notes: list[str] = []   # limits lowered, for stderr
        self.unread: dict[str, str] = {}   # trace id -> why it was not read
        lim = getattr(client, "limits", None)
        self.page_chars = lim.max_answer_bytes if lim is not None else 1 << 62

    def _search(self, tags: dict[str, Any] | None, start_us: int, end_us: int) -> Iterator[Any]:
        """One search: ``(trace, its JSON text)`` as the iterator parses them, or :class:`.jaeger.Unread` (the request
        is made, and a refused search depth retried with half of it, before this returns)."""
        while True:
            try:
                extra: dict[str, Any] = {"index": self.index} if self.index is not None else {}
                out = self.client.search_iter(self.service, tags, start_us=start_us, end_us=end_us,
                                              limit=self.limit, raw=True, with_text=True, **extra)
                self.searches += 1
                return out
            except JaegerError as e:
                text = str(e).lower()
                if self.limit > 1 and ("search depth" in text or "max traces" in text or "max_traces" in text):
                    self.limit = max(1, self.limit // 2)
                    self.notes.append(f"Jaeger refused the search depth; searching {self.limit} traces at a time")
                    continue
                raise

    def run_ids(self, start_us: int, end_us: int) -> list[str]:
        """Run ids (resource ``cptrace.run_id``) among the newest traces of the service, the newest run first."""
        newest: dict[str, int] = {}
        for got in self._search(None, start_us, end_us):
            if isinstance(got, Unread):
                continue
            tr = got[0]
            t = _starts(tr)
            if t is None:
                continue
            for rid in _run_ids(tr):
                newest[rid] = max(newest.get(rid, 0), min(t, default=0))
        return sorted(newest, key=lambda r: -newest[r])

    def run_traces(self, run_id: str, start_us: int, end_us: int) -> Iterator[dict[str, Any]]:
        """Every trace of ``run_id`` with a span starting in [start_us, end_us] (:meth:`traces`)."""
        return self.traces({sc.RUN_ID: run_id}, start_us, end_us, f"run {run_id}")

    def traces(self, tags: dict[str, Any] | None, start_us: int, end_us: int,
               what: str = "the service") -> Iterator[Any]:
        """Every trace matching ``tags`` (None: every trace of the service) with a span starting in
        [start_us, end_us], each once (Jaeger JSON model, or TraceText with ``index``), the oldest first (by first
        span start; a search answers newest first), window after window from the oldest. Traces that cannot be used
        go to :attr:`unread`.

        Memory: one answer's kept text (at most ``page_chars``) and one parsed trace. An answer is parsed once to find
        its traces, their starts (for the split of a full page) and their text; a full page is not handed out (the
        searches of its halves return its traces again), the others are parsed again from their text in start order.
        So a consumer that needs records in order (``watch``) never holds much more than a page of them. (With
        ``index``, an answer's bytes are held whole while it is indexed, within ``max_answer_bytes``.)"""
        seen: set[str] = set()
        todo = [(start_us, end_us)]
        while todo:
            a, b = todo.pop()
            n = 0
            starts: list[int] = []   # span starts inside the window, for the split of a full page
            keep: list[tuple[int, str, Any]] = []   # (first span start, trace id, JSON text) of the new traces
            chars = 0
            it = self._search(tags, a, b)
            over = False
            for got in it:
                n += 1
                if isinstance(got, Unread):
                    starts.extend(x for x in got.starts if type(x) is int and a <= x <= b)
                    self.unread.setdefault(got.trace_id or "(no id)", got.reason)
                    continue
                t: list[int] | None
                if isinstance(got, TraceText):   # (indexed by the compiled reader: of the expected shape)
                    tid, t, text = got.trace_id or "", got.starts, got
                    size = len(got.text)
                else:
                    tr, text = got
                    tid = str(tr.get("traceID", "")) if isinstance(tr, dict) else ""
                    t = _starts(tr)
                    if t is None:
                        self.unread.setdefault(tid or "(no id)", "not a Jaeger trace of the expected shape: "
                                               + excerpt(text, 80))
                        continue
                    size = len(text)
                starts.extend(x for x in t if a <= x <= b)
                if tid not in seen and tid not in self.unread:
                    keep.append((min(t, default=0), tid, text))
                    chars += size
                    if chars > self.page_chars and self.limit > 1:
                        over = True
                        break
            if over:
                close = getattr(it, "close", None)
                if close is not None:
                    close()   # the rest of the answer is not read
                self.limit = max(1, self.limit // 2)
                self.notes.append(f"one search's traces passed {self.page_chars} characters "
                                  f"(CPTRACE_QUERY_MAX_BYTES); searching {self.limit} traces at a time")
                todo.append((a, b))
                continue
            if n >= self.limit:
                todo.extend(self._split(a, b, starts, what)[::-1])   # the older half first
            else:
                keep.sort(key=lambda k: k[0], reverse=True)   # popped oldest first; each text freed once parsed
                while keep:
                    _t0, tid, text = keep.pop()
                    if tid not in seen:
                        seen.add(tid)
                        yield text if isinstance(text, TraceText) else json.loads(text)
            if self.progress is not None:
                self.progress(len(seen), self.searches)

    def _split(self, a: int, b: int, starts: list[int], what: str) -> list[tuple[int, int]]:
        """Closed windows covering [a, b], oldest first (neighbours share their end), for a search that came back
        full: ``[m, b]``, ``m`` the median of the page's span ``starts`` inside the window (else the middle; a run is
        short next to a default window of days, and its traces live long: halving the time would take many searches
        to reach the data); then, back from ``m``, windows as long as the page's newer half (its newest start minus
        ``m``), at most :data:`SPLIT_BACK` in all, the oldest reaching back to ``a``. A search answers newest first
        (Jaeger's memory store does), so the page is the window's newest traces and each window back from ``m``
        holds about half a page where the run goes on at the page's rate: the older traces are read in windows that
        come back short, not by halving the older part again and again (each time a full page fetched and dropped:
        about three fetches a trace over a run several pages long). A window that comes back full is split again;
        with another answer order the page's starts spread over [a, b] and this is the split at ``m`` alone."""
        if b - a < 2:
            raise PageTooSmall(f"more than {self.limit} traces of {what} have spans starting within "
                               f"{iso_us(a)}..{iso_us(b)}: raise --limit (at most the store's max_traces)")
        starts.sort()
        m = starts[len(starts) // 2] if starts else a
        if not a < m < b:
            m = (a + b) // 2
        w = starts[-1] - m if starts else 0
        out = [(m, b)]
        t = m
        for _ in range(SPLIT_BACK - 2):   # ([m, b] and the oldest window are the other two)
            if w <= 0 or t - w <= a:
                break
            out.append((t - w, t))
            t -= w
        out.append((a, t))
        return out[::-1]


def _starts(trace: object) -> list[int] | None:
    """The span start times (µs) of a Jaeger-model trace; None when it is not of that shape (not an object, spans not
    a list of objects, a ``startTime`` that is not an integer, a ``traceID`` that is not a string)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceID", ""), str):
        return None
    spans = trace.get("spans")
    if not isinstance(spans, (list, type(None))):
        return None
    out = []
    for sp in spans or ():
        if not isinstance(sp, dict):
            return None
        v = sp.get("startTime", 0)
        if type(v) is not int:
            return None
        out.append(v)
    return out


def run_ids_of(trace: dict[str, Any]) -> set[str]:
    """The run ids (resource ``cptrace.run_id``) of a Jaeger-model trace's processes; tags of the wrong shape are
    ignored."""
    out = set()
    procs = trace.get("processes")
    plist = list(procs.values()) if isinstance(procs, dict) else []
    plist += [s["process"] for s in trace.get("spans") or []
              if isinstance(s, dict) and isinstance(s.get("process"), dict)]
    for p in plist:
        tags = p.get("tags") if isinstance(p, dict) else None
        for t in tags if isinstance(tags, list) else ():
            if isinstance(t, dict) and t.get("key") == sc.RUN_ID and t.get("value") not in (None, ""):
                out.add(str(t["value"]))
    return out


_run_ids = run_ids_of
