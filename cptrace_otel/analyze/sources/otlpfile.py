"""OTLP JSON-lines files (one ``ExportTraceServiceRequest`` per line, protobuf JSON) -> :class:`Event` stream.

Every span event is one record: name = tag, ``timeUnixNano`` = ts, ``cptrace.seq``/``cptrace.epoch``/
``cptrace.record.level`` give its place, the ``hicache.*`` attributes its fields
(:func:`cptrace_otel.attrs.attributes_to_fields`). ``hicache.violation`` events (our own findings) are skipped.
Rank: the span's ``sglang.cp.rank`` attribute, else the resource's. Spans reach the file out of order, so events
are sorted per rank by seq (this source holds one run in memory; a few hundred bytes per record).

Parsed with the standard library's ``json`` (proto3 JSON: int64 values are strings, both camelCase and the
original snake_case field names are accepted).
"""

from __future__ import annotations

import heapq
import json
from typing import Any, Iterable, Iterator

from ... import semconv as sc
from ...attrs import attributes_to_fields
from ...events import Event
from .files import STDIN, open_text, stdin_head, truncated
from .logs import LogReadError


def _g(d: dict, camel: str, snake: str, default: Any = None) -> Any:
    v = d.get(camel)
    return d.get(snake, default) if v is None else v


def any_value(v: dict) -> Any:
    """Python value of an OTLP ``AnyValue`` in JSON form."""
    if not isinstance(v, dict):
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
    return [(a.get("key"), any_value(a.get("value", {}))) for a in (lst or ())]


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


def read_otlp_events(paths: Iterable[str], info: OtlpInfo | None = None) -> Iterator[Event]:
    """Events of all files, per rank in seq order, ranks merged by ts. Raises :class:`LogReadError` at once when
    a file cannot be read."""
    info = info if info is not None else OtlpInfo()
    per_rank: dict[int, list[tuple[int, int, int, Event]]] = {}
    for path in paths:
        collect_file(path, info, per_rank)
    return merge_ranks(per_rank)


def collect_file(path: str, info: OtlpInfo, per_rank: dict) -> None:
    """Add the events of one OTLP JSON-lines file to ``per_rank`` (rank -> ``[(epoch, seq, ts, Event)]``, unsorted).
    Raises :class:`LogReadError` when the file cannot be opened."""
    try:
        fh = open_text(path)
    except OSError as e:
        raise LogReadError(path, e.strerror or str(e)) from None
    line_no = 0
    with fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError as e:
                info.malformed.append((path, line_no, f"not JSON: {e}"))
                continue
            _collect(req, path, info, per_rank)
        why = truncated(fh)
        if why:
            info.malformed.append((path, line_no + 1, why))


def merge_ranks(per_rank: dict) -> Iterator[Event]:
    """The events of ``per_rank`` (as :func:`collect_file` fills it): each rank sorted by (epoch, seq, ts), ranks
    merged by the records' ``ts`` field."""
    streams = []
    for lst in per_rank.values():
        lst.sort(key=lambda t: (t[0], t[1], t[2]))
        streams.append([t[3] for t in lst])
    if len(streams) == 1:
        return iter(streams[0])
    # merge by the records' ts= field (monotonic, one clock for the ranks of a host) when they carry one: the event
    # time is each process's own call time, which does not order records across ranks
    return heapq.merge(*streams, key=lambda e: e.fields["ts"] if type(e.fields.get("ts")) is int else e.ts)


def _collect(req: dict, path: str, info: OtlpInfo, per_rank: dict) -> None:
    for rs in _g(req, "resourceSpans", "resource_spans", []) or []:
        res = dict(_attrs((rs.get("resource") or {}).get("attributes")))
        rrank = res.get(sc.CP_RANK)
        run_id = res.get(sc.RUN_ID)
        if isinstance(run_id, str):
            info.run_ids.add(run_id)
        lvl = res.get(sc.TRACE_LEVEL)
        for ss in _g(rs, "scopeSpans", "scope_spans", []) or []:
            for sp in ss.get("spans", []) or []:
                info.spans += 1
                sattrs = dict(_attrs(sp.get("attributes")))
                rank = sattrs.get(sc.RANK, rrank)
                if type(rank) is not int:
                    rank = 0
                if type(lvl) is int:
                    info.levels[rank] = max(info.levels.get(rank, 0), lvl)
                for e in sp.get("events", []) or []:
                    name = e.get("name", "")
                    if name == sc.EVENT_VIOLATION:
                        continue
                    attrs = _attrs(e.get("attributes"))
                    meta = {k: v for k, v in attrs if not k.startswith(sc.FIELD_PREFIX)}
                    seq = meta.get(sc.SEQ)
                    if type(seq) is not int:
                        continue
                    fields = attributes_to_fields(attrs)
                    ts = int(_g(e, "timeUnixNano", "time_unix_nano", 0) or 0)
                    epoch = meta.get(sc.EPOCH, 0)
                    level = meta.get(sc.LEVEL, 1)
                    ev = Event(name, rank, seq, ts, epoch if type(epoch) is int else 0, fields,
                               level if type(level) is int else 1, path, 0)
                    per_rank.setdefault(rank, []).append((ev.epoch, seq, ts, ev))
