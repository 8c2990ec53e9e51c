"""OTLP JSON-lines files (one ``ExportTraceServiceRequest`` per line, protobuf JSON) -> :class:`Event` stream.

Every span event is one record: name = tag, ``timeUnixNano`` = ts, ``cptrace.seq``/``cptrace.epoch``/
``cptrace.record.level`` give its place, the ``hicache.*`` attributes its fields
(:func:`cptrace_otel.model.attrs.attributes_to_fields`). ``hicache.violation`` events (our own findings) are skipped.
Rank: the span's ``sglang.cp.rank`` attribute, else the resource's. Spans reach the file out of order, so events
are sorted per rank by seq (:func:`read_otlp_events` holds one run in memory; :class:`.tracedocs.TraceDocs`, what
``check`` and ``report`` read with, sorts runs of a bounded size on disk and merges them).

Two twins read a line. The C reader (``_speedups/otlpjson.c``, when built) reads the line's text straight into the
records :func:`collect` builds, for every line it reads with certainty (strict JSON, camelCase names, the common
value shapes); any other line it leaves to :func:`collect` over the standard library's ``json`` (proto3 JSON: int64
values are strings, both camelCase and the original snake_case field names are accepted), which is the reference.
tests/unit/test_otlpjson_c.py holds the two equal; ``twin_off(vars(otlpfile), "C_READER")`` runs the Python one.

Bad input costs only itself: a line that is not JSON, is nested too deeply, or is not shaped like a request (a
list where an object belongs, ...) is recorded in :attr:`OtlpInfo.malformed` with its file and line and adds
nothing; a span event whose values do not convert (``"intValue": "abc"``, an int of more than 4,300 digits) is
recorded and skipped, the other events of its line are kept. A line longer than :data:`.inputs.MAX_JSON_LINE` is
recorded and not read.
"""

from __future__ import annotations

import heapq
import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...model import semconv as sc
from ...model.attrs import attributes_to_fields
from ...model.events import Event
from .inputs import MAX_JSON_LINE, STDIN, open_text, stdin_head, truncated
from .logs import LogReadError
from .sortedruns import RECORD_KEY


def _g(d: dict, camel: str, snake: str, default: object = None) -> Any:
    v = d.get(camel)
    return d.get(snake, default) if v is None else v


def any_value(v: dict) -> Any:
    """Python value of an OTLP ``AnyValue`` in JSON form."""
    if type(v) is dict:   # the common shapes first: one string or one int value (one lookup each)
        x = v.get("stringValue")
        if x is not None:
            return x
        x = v.get("intValue")
        if x is not None and len(v) == 1:
            return int(x)
    elif not isinstance(v, dict):
        return v
    for camel, snake in (("stringValue", "string_value"), ("intValue", "int_value"),
                         ("doubleValue", "double_value"), ("boolValue", "bool_value")):
        if camel in v or snake in v:
            x = _g(v, camel, snake)
            if camel == "intValue":
                return int(x)
            if camel == "doubleValue":
                return float(x)
            return x
    arr = _g(v, "arrayValue", "array_value")
    if arr is not None:
        return [any_value(x) for x in arr.get("values", [])]
    return None


def _attrs(lst: Iterable[dict] | None) -> list[tuple[str, Any]]:
    return [(a.get("key"), any_value(a.get("value", {}))) for a in (lst or ())]  # type: ignore[misc]


def looks_like_otlp(path: str) -> bool:
    """True when the first non-blank line of ``path`` is an OTLP/JSON request (``{"resourceSpans": ...``).
    Standard input (``-``) is only peeked at, not consumed: plain OTLP JSON lines are recognised there, a gzip
    stream on standard input is taken for a log."""
    try:
        if path == STDIN:
            head = stdin_head().lstrip()
            return head.startswith(b"{") and (b'"resourceSpans"' in head[:200] or b'"resource_spans"' in head[:200])
        with open_text(path) as fh:
            for line in fh:
                s = line.strip()
                if s:
                    return s.startswith("{") and ('"resourceSpans"' in s[:200] or '"resource_spans"' in s[:200])
    except OSError as e:
        raise LogReadError(path, e.strerror or str(e)) from None
    return False


class OtlpInfo:
    """What the files say about the run: run ids, trace levels per rank, malformed lines."""

    def __init__(self) -> None:
        self.run_ids: set[str] = set()
        self.levels: dict[int, int] = {}
        self.malformed: list[tuple[str, int, str]] = []
        self.spans = 0
        self.streams: dict[str, int] = {}                     # service.instance.id -> its resource's cp rank
        self.sampled: dict[int, tuple[str, float]] = {}       # rank -> (run id, cptrace.sample) of sampled streams
        # by run (the resource's cptrace.run_id, "" where it has none), as per_rank is keyed when by_run is set
        self.by_run = False                                   # per_rank keys are (run id, rank), not rank
        self.run_levels: dict[str, dict[int, int]] = {}       # run -> rank -> trace level
        self.run_sampled: dict[str, dict[int, tuple[str, float]]] = {}   # run -> rank -> (run id, fraction)

    def unknown_rank_streams(self) -> int:
        """Streams (exporter processes) whose resource says their rank is unknown (-1)."""
        return sum(1 for r in self.streams.values() if r < 0)


def read_otlp_events(paths: Iterable[str], info: OtlpInfo | None = None) -> Iterator[Event]:
    """Events of all files, per rank in seq order, ranks merged by ts. Raises :class:`LogReadError` at once when
    a file cannot be read."""
    info = info if info is not None else OtlpInfo()
    per_rank: dict[int, list[tuple[int, int, int, Event]]] = {}
    for path in paths:
        collect_file(path, info, per_rank)
    return merge_ranks(per_rank)


# what a JSON value of the wrong shape raises in the collector (OverflowError: an intValue of Infinity, which
# Python's json reads): such a value is a malformed record
BAD_SHAPE = (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError, RecursionError)


def bad_shape(e: BaseException, what: str = "not an OTLP request of the expected shape") -> str:
    """The reason recorded for a value the collector could not read (one line, bounded)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, ValueError) and "digits" in str(e):
        return "an integer of more than 4300 digits"
    return f"{what} ({type(e).__name__}: {str(e)[:160]})"


def json_lines(fh, path: str, info: OtlpInfo) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of ``fh`` that parses as JSON; the others (not JSON, too
    deep, longer than :data:`MAX_JSON_LINE`, read only up to that bound) are recorded in ``info.malformed``."""
    for line_no, line in text_lines(fh, path, info):
        req = loads(line, path, line_no, info)
        if req is not NOT_JSON:
            yield line_no, req


NOT_JSON: Any = object()   # what :func:`loads` returns for a line that is not JSON


def loads(line: str, path: str, line_no: int, info: OtlpInfo) -> Any:
    """``json.loads(line)``, or :data:`NOT_JSON` with the reason recorded in ``info.malformed``."""
    try:
        return json.loads(line)
    except RecursionError:
        info.malformed.append((path, line_no, "not JSON: nested too deeply"))
    except ValueError as e:
        info.malformed.append((path, line_no, f"not JSON: {e}"))
    return NOT_JSON


def _too_long(info: OtlpInfo, path: str, line_no: int, limit: int) -> None:
    """Line ``line_no`` of ``path`` is longer than ``limit`` and was not read: a malformed line."""
    info.malformed.append((path, line_no, f"a line longer than {limit} bytes (not read)"))


def text_lines(fh, path: str, info: OtlpInfo) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each non-blank line of ``fh``; a line longer than :data:`MAX_JSON_LINE` is
    recorded in ``info.malformed`` and not read (only up to that bound at a time)."""
    line_no = 0
    readline = fh.readline
    while True:
        line = readline(MAX_JSON_LINE)
        if not line:
            return
        line_no += 1
        if len(line) >= MAX_JSON_LINE and line[-1] not in "\r\n":
            _too_long(info, path, line_no, MAX_JSON_LINE)
            while line and line[-1] not in "\r\n":
                line = readline(MAX_JSON_LINE)
            continue
        if not line.strip():
            continue
        yield line_no, line


READ_BLOCK = 4 << 20   # bytes byte_lines reads at a time (its buffer grows to hold a longer line)


def byte_lines(fh, path: str, info: OtlpInfo, block: int = READ_BLOCK,
               limit: int = MAX_JSON_LINE) -> Iterator[tuple[int, memoryview]]:
    """:func:`text_lines` over the bytes of a file from :func:`.inputs.open_text` (its ``buffer``, which the text
    layer must not read from too): ``(line number, line)`` of each line, numbered as :func:`text_lines` numbers
    them (a line ends at ``\n``, ``\r\n`` or ``\r``, as ``open_text``'s ``newline=""`` has them). Blank lines are
    given too (``text.strip()`` of the decoded line decides, as :func:`text_lines` does). A line longer than
    ``limit`` (:data:`MAX_JSON_LINE`) bytes is recorded in ``info.malformed`` and not read (only up to that bound at
    a time).

    Each line is a memoryview of the reader's own buffer, valid until the next line is asked for (copy it to keep
    it). Why bytes: the C reader reads them as they are (UTF-8 checked), where a text line was decoded, then encoded
    again for it; only a line it declines is decoded (``"replace"``, as ``open_text`` decodes). Why one buffer, read
    ``block`` bytes at a time: an export batch is a line of megabytes, and ``readline`` gave each one a new bytes
    object, whose fresh pages cost more than reading them (400 MB of OTLP JSON lines: 0.38-0.68 s of CPU against
    0.14 s)."""
    buf = bytearray(block)
    mv = memoryview(buf)
    start = end = 0   # the bytes read and not yet given: buf[start:end]
    line_no = 0
    eof = skipping = False   # skipping: inside a line longer than limit (reported; read up to its end)
    readinto = fh.readinto
    while True:
        nl = buf.find(b"\n", start, end)
        if nl >= 0:
            stop = nl + 1
        elif end - start >= limit or skipping:   # (a line without its end yet, at least limit bytes long)
            if not skipping:
                line_no += 1
                _too_long(info, path, line_no, limit)
                skipping = True
            start = end = 0
            stop = -1
        elif eof:
            if end == start:
                return
            stop = end   # the last line, without an end
        else:
            stop = -1
        if stop < 0:   # more bytes, at the end of the ones not given
            if eof:
                return
            if start:   # (the same size: a line given before may still be held, so the buffer cannot be resized)
                buf[:end - start] = buf[start:end]
                end -= start
                start = 0
            if end == len(buf):   # a line longer than the buffer: a larger one (the old one stays the caller's)
                buf = buf + bytearray(len(buf))
                mv = memoryview(buf)
            got = readinto(mv[end:])
            if got:
                end += got
            else:
                eof = True
            continue
        if skipping:
            skipping = False
        elif stop - start > limit:
            line_no += 1
            _too_long(info, path, line_no, limit)
        elif buf.find(b"\r", start, stop) < 0:
            line_no += 1
            yield line_no, mv[start:stop]
        else:   # (bytes split at \r, \n only)
            for line in bytes(mv[start:stop]).splitlines(keepends=True):
                line_no += 1
                yield line_no, memoryview(line)
        start = stop


def collect_guarded(req: object, path: str, line_no: int, info: OtlpInfo, per_rank: dict) -> int:
    """:func:`collect` of one request; returns the events it added. When it is not shaped like one, it is recorded
    as malformed at ``line_no`` and adds no event (they are collected aside, then added)."""
    staged: dict = {}
    try:
        if not isinstance(req, dict):
            raise TypeError(f"a JSON {type(req).__name__}, not an object")
        collect(req, path, info, staged, line_no)
    except BAD_SHAPE as e:
        info.malformed.append((path, line_no, bad_shape(e)))
        return 0
    n = 0
    for rank, lst in staged.items():
        per_rank.setdefault(rank, []).extend(lst)
        n += len(lst)
    return n


def collect_file(path: str, info: OtlpInfo, per_rank: dict, after_line: Callable[[int], None] | None = None) -> None:
    """Add the events of one OTLP JSON-lines file to ``per_rank`` (rank -> ``[(epoch, seq, ts, Event)]``, unsorted).
    ``after_line(n)`` is called after each line's ``n`` events were added (the caller may move them out of
    ``per_rank``, in place, to bound its memory; ``n`` lets it count what it holds without walking ``per_rank``,
    whose keys grow with the runs). Raises :class:`LogReadError` when the file cannot be opened or read."""
    try:
        fh = open_text(path)
    except OSError as e:
        raise LogReadError(path, e.strerror or str(e)) from None
    line_no = 0
    c = c_reader()
    with fh:
        try:
            assert isinstance(fh, io.TextIOWrapper)   # (what open_text gives: its bytes are fh.buffer)
            for line_no, line in byte_lines(fh.buffer, path, info):
                rows = c(line, path) if c is not None else None
                if rows is not None:
                    n = add_rows(rows, path, info, per_rank)
                else:
                    text = str(line, "utf-8", "replace")
                    if not text.strip():
                        continue
                    req = loads(text, path, line_no, info)
                    n = 0 if req is NOT_JSON else collect_guarded(req, path, line_no, info, per_rank)
                if after_line is not None:
                    after_line(n)
        except OSError as e:
            raise LogReadError(path, e.strerror or str(e)) from None
        why = truncated(fh)
        if why:
            info.malformed.append((path, line_no + 1, why))


def merge_ranks(per_rank: dict) -> Iterator[Event]:
    """The events of ``per_rank`` (as :func:`collect_file` fills it): each rank sorted by (epoch, seq, ts), ranks
    merged by the records' ``ts`` field."""
    streams = []
    for lst in per_rank.values():
        lst.sort(key=RECORD_KEY)
        streams.append([t[3] for t in lst])
    return merge_streams(streams)


def merge_streams(streams: list) -> Iterator[Event]:
    """Per-rank event streams (each in its rank's order) merged by :func:`merge_key`, lazily (in C where
    ``_speedups/sortedruns.c`` is built: its ``merge`` keys Events as :func:`merge_key` does)."""
    if len(streams) == 1:
        return iter(streams[0])
    from .sortedruns import c_runs

    c = c_runs()
    if c is None:
        return heapq.merge(*streams, key=merge_key)
    return c.merge(streams, MERGE_FIELD)


MERGE_FIELD = "ts"   # the record field the ranks' streams are merged by (merge_key)


def merge_key(e: Event) -> int:
    """The key the ranks' streams are merged by: the record's ``ts=`` field (monotonic, one clock for the ranks of a
    host) when it carries one, else its event time (each process's own call time, which does not order records
    across ranks as well). Ties go to the lower rank (the streams are given in rank order)."""
    t = e.fields.get(MERGE_FIELD)
    return t if type(t) is int else e.ts


def collect(req: dict, path: str, info: OtlpInfo, per_rank: dict, line_no: int = 0) -> None:
    """The cptrace events of one request into ``per_rank`` (keyed by rank, or by ``(run id, rank)`` when
    ``info.by_run``: the resource's ``cptrace.run_id``, ``""`` when it has none). A span event whose values do not
    convert is recorded in ``info.malformed`` (at ``line_no``) and skipped; a request of the wrong shape raises one
    of :data:`BAD_SHAPE`."""
    prefix = sc.FIELD_PREFIX
    for rs in _g(req, "resourceSpans", "resource_spans", []) or []:
        res = dict(_attrs((rs.get("resource") or {}).get("attributes")))
        rrank = res.get(sc.CP_RANK)
        run, lvl = resource(res, path, info)
        for ss in _g(rs, "scopeSpans", "scope_spans", []) or []:
            for sp in ss.get("spans", []) or []:
                info.spans += 1
                sattrs = dict(_attrs(sp.get("attributes")))
                rank = sattrs.get(sc.RANK, rrank)
                if type(rank) is not int:
                    rank = 0
                span_level(info, run, rank, lvl)
                key = (run, rank) if info.by_run else rank
                for e in sp.get("events", []) or []:
                    try:
                        name = e.get("name", "")
                        if name == sc.EVENT_VIOLATION:
                            continue
                        fattrs, meta = [], {}   # (one pass: the record's fields, and seq / epoch / level)
                        for a in e.get("attributes") or ():
                            k, v = a.get("key"), any_value(a.get("value", {}))
                            if k.startswith(prefix):
                                fattrs.append((k, v))
                            else:
                                meta[k] = v
                        seq = meta.get(sc.SEQ)
                        if type(seq) is not int:
                            continue
                        fields = attributes_to_fields(fattrs)
                        ts = int(_g(e, "timeUnixNano", "time_unix_nano", 0) or 0)
                        if type(name) is not str:
                            raise TypeError(f"event name {str(name)[:40]} is not a string")
                    except BAD_SHAPE as x:
                        why = bad_shape(x, "a value of the wrong type")
                        info.malformed.append((path, line_no, "span event skipped: " + why))
                        continue
                    epoch = meta.get(sc.EPOCH, 0)
                    level = meta.get(sc.LEVEL, 1)
                    ev = Event(name, rank, seq, ts, epoch if type(epoch) is int else 0, fields,
                               level if type(level) is int else 1, path, 0)
                    per_rank.setdefault(key, []).append((ev.epoch, seq, ts, ev))


def resource(res: dict[str, Any], path: str, info: OtlpInfo) -> tuple[str, Any]:
    """What a resource's attributes ``res`` tell ``info`` (its run id, its stream's rank, its sampling), and
    ``(run, level)``: its run id (``""`` when it has none) and its trace-level attribute (any value)."""
    rrank = res.get(sc.CP_RANK)
    run_id = res.get(sc.RUN_ID)
    if isinstance(run_id, str):
        info.run_ids.add(run_id)
    if type(rrank) is int:
        info.streams[str(res.get(sc.SERVICE_INSTANCE_ID, path))] = rrank
        frac = res.get(sc.SAMPLE)
        if type(frac) is float and rrank >= 0 and isinstance(run_id, str):
            info.sampled[rrank] = (run_id, frac)
            info.run_sampled.setdefault(run_id, {})[rrank] = (run_id, frac)
    return (run_id if isinstance(run_id, str) else ""), res.get(sc.TRACE_LEVEL)


def span_level(info: OtlpInfo, run: str, rank: int, lvl: Any) -> None:
    """A span of ``rank`` under a resource of trace level ``lvl`` (kept when an int): the highest level per rank."""
    if type(lvl) is int:
        info.levels[rank] = max(info.levels.get(rank, 0), lvl)
        by = info.run_levels.setdefault(run, {})
        by[rank] = max(by.get(rank, 0), lvl)


def add_rows(rows: list, path: str, info: OtlpInfo, per_rank: dict) -> int:
    """The C reader's answer for one line (otlpjson.c: ``[(resource, spans, ranks, records), ...]``) into ``info``
    and ``per_rank`` as :func:`collect_guarded` adds the same line; returns the events it added."""
    n = 0
    for res, spans, ranks, records in rows:
        run, lvl = resource(res, path, info)
        info.spans += spans
        for rank in ranks:
            span_level(info, run, rank, lvl)
        for rank, lst in records.items():
            per_rank.setdefault((run, rank) if info.by_run else rank, []).extend(lst)
            n += len(lst)
    return n


_UNLOADED: Any = object()
C_READER: Any = _UNLOADED   # otlpjson.c's read() once loaded; None when not built (or switched off: twin_off)


def c_reader() -> Callable[[str | bytes | memoryview, str], Any] | None:
    """The C reader of a line (loaded on first use), or None: :func:`collect` reads every line."""
    global C_READER
    if C_READER is _UNLOADED:
        from ..._speedups.otlpjson import load

        C_READER = load()
    return C_READER
