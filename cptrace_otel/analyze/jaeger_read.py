"""The records of Jaeger search answers, for ``cptrace-otel watch``: built by the compiled reader
(``_speedups/jaegerin.c``) straight from the answer's bytes, or by :func:`records_py`, its Python twin and reference,
from a parsed trace.

Contract:

* :func:`records_py` ``(trace) -> (run_ids, spans)`` for one trace in Jaeger's JSON model (a dict): ``run_ids`` the
  non-empty ``cptrace.run_id`` values of its processes (:func:`.sources.jaegerquery.run_ids_of`); ``spans`` one row
  ``(service, rank, codes, trace_id, span_id, start_us, levels, seqs, events)`` per span object, in order:
  its process's service name; its rank (the span's rank tag, else its process's cp rank tag, else 0); its violation
  tag's text or None; its ids and start (µs) as Jaeger wrote them; ``(rank, level)`` of its process's trace-level
  tag or None; the first ``cptrace.seq`` of each log (an int or None); its records as
  :class:`~cptrace_otel.model.events.Event` objects, exactly as ``collect`` builds them from
  :func:`.sources.tracedocs.v2_trace_to_otlp` of the trace (finding events and logs without a seq left out). A trace
  of the wrong shape raises one of :data:`.sources.otlpfile.BAD_SHAPE`, as ``collect`` and the index do.
* :func:`read` ``(trace)``: the same for a trace as a search hands it out: a parsed dict, or a
  :class:`.sources.jaegerstream.TraceText` (the bytes the C index cut out of an answer), read by the C reader, or
  parsed and read by :func:`records_py` when the C reader leaves the text to Python (an unusual shape) or was not
  built. Both give the same rows (held equal by tests/unit/test_jaegerin.py).
* :data:`C_READER`: the loaded C reader or None; ``twin_off(vars(jaeger_read), "C_READER")`` runs the twin.
"""

from __future__ import annotations

import json
from typing import Any

from .._speedups import jaegerin as _loader
from ..model import semconv as sc
from ..model.events import Event
from .sources.jaegerquery import run_ids_of
from .sources.jaegerstream import TraceText

SRC = "jaeger"   # Event.src of the records read back from Jaeger
C_READER = _loader.load(SRC)

Row = tuple[Any, int, "str | None", str, str, int, "tuple[int, int] | None", list, list[Event]]


def index(body: bytes, max_item: int) -> list[tuple[str | None, list[int], int, int]] | None:
    """The C index of a search answer (see jaegerin.c), or None: Python reads the answer (not built, or not
    certain)."""
    c = C_READER
    return None if c is None else c.index(body, max_item)


def read(trace: TraceText | dict[str, Any]) -> tuple[list[str], list[Row]]:
    """``(run_ids, spans)`` of one trace as a search hands it out (see the module doc)."""
    if isinstance(trace, TraceText):
        c = C_READER
        got = c.records(trace.text) if c is not None else None
        if got is not None:
            return sorted(set(got[0])), got[1]
        trace = json.loads(trace.text.decode("utf-8", "replace"))
        if not isinstance(trace, dict):
            raise TypeError("a trace that is not a JSON object")
    return records_py(trace)


def records_py(trace: dict[str, Any]) -> tuple[list[str], list[Row]]:
    """The Python twin of jaegerin.c's ``records`` (see the module doc)."""
    from .sources.otlpfile import OtlpInfo, collect
    from .sources.tracedocs import v2_trace_to_otlp

    procs = trace.get("processes") or {}
    rows: list[Row] = []
    for sp in trace.get("spans") or ():
        if not isinstance(sp, dict):
            continue
        proc = sp.get("process") if isinstance(sp.get("process"), dict) else procs.get(sp.get("processID"), {})
        proc = proc or {}
        rank = None
        codes = None
        for t in sp.get("tags") or ():
            k = t.get("key")
            if k == sc.RANK:
                rank = _as_int(t.get("value"))
            elif k == sc.VIOLATION:
                codes = str(t.get("value", ""))
        if rank is None:
            rank = next((_as_int(t.get("value")) for t in proc.get("tags") or () if t.get("key") == sc.CP_RANK), 0)
        if rank is None:
            rank = 0
        seqs: list[int | None] = []
        for log in sp.get("logs") or ():
            seqs.append(next((_as_int(f.get("value")) for f in log.get("fields") or () if f.get("key") == sc.SEQ),
                             None))
        info = OtlpInfo()
        per_rank: dict[Any, list] = {}
        collect(v2_trace_to_otlp(dict(trace, spans=[sp])), SRC, info, per_rank)
        events = [t[3] for lst in per_rank.values() for t in lst]
        levels = next(iter(info.levels.items()), None)
        rows.append((proc.get("serviceName"), rank, codes, str(sp.get("traceID", "")), str(sp.get("spanID", "")),
                     int(sp.get("startTime") or 0), levels, seqs, events))
    return sorted(run_ids_of(trace)), rows


def _as_int(v: Any) -> int | None:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
