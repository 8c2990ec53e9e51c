"""Find and read one run's traces in Grafana Tempo over its HTTP API, for ``cptrace-otel check --tempo``.

Written from Tempo's documented API (Tempo is AGPL: it is not run, built or vendored here, and this path is tested
only against fixtures in Tempo's documented response formats):

* Search: ``GET /api/search?q=<TraceQL>&start=&end=&limit=&spss=1`` (start/end: unix **seconds**) with
  :func:`run_query` = ``{ resource.cptrace.run_id = "ID" }``; the answer is ``{"traces": [{"traceID",
  "rootServiceName", "startTimeUnixNano", "durationMs", "spanSets": [...]}], "metrics": {...}}``. A search returns
  the "first N" of a parallel search, so a full page (``limit`` traces) is split into two halves of its time window
  until none is full; trace ids are deduplicated.
* Trace by id: ``GET /api/traces/<id>`` answers ``{"batches": [ResourceSpans ...]}`` (OTLP/JSON with Tempo's field
  name; ids may be base64, as protobuf JSON writes bytes); ``/api/v2/traces/<id>`` answers
  ``{"trace": {"resourceSpans": [...]}, "status": ...}``; both (and a plain ``{"resourceSpans": ...}``) are read by
  :func:`traces_data`.

Errors are those of :class:`~.jaeger.JaegerClient` (the same HTTP client): ``JaegerUnreachable`` /
``JaegerError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from .httpio import excerpt
from .jaeger import JaegerClient, JaegerError

DEFAULT_LIMIT = 500


def run_query(run_id: str) -> str:
    """The TraceQL that selects every span of one run (its resource attribute ``cptrace.run_id``)."""
    esc = run_id.replace("\\", "\\\\").replace('"', '\\"')
    return '{ resource.cptrace.run_id = "' + esc + '" }'


def traces_data(obj: Any) -> dict[str, Any]:
    """OTLP/JSON ``TracesData`` (``{"resourceSpans": [...]}``) of a Tempo trace-by-id answer (see the module doc)."""
    if not isinstance(obj, dict):
        return {"resourceSpans": []}
    if isinstance(obj.get("trace"), dict):
        obj = obj["trace"]
    rs = obj.get("resourceSpans")
    if rs is None:
        rs = obj.get("batches")
    return {"resourceSpans": rs if isinstance(rs, list) else []}


class TempoClient(JaegerClient):
    """Tempo's query frontend (``http://host:3200``; ``user:password@`` for basic auth)."""

    def search(self, q: str, start_s: int, end_s: int, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        params = [("q", q), ("start", str(int(start_s))), ("end", str(int(end_s))), ("limit", str(int(limit))),
                  ("spss", "1")]
        out = self._get("/api/search", params) or {}
        traces = out.get("traces") if isinstance(out, dict) else None
        if not isinstance(traces, (list, type(None))):
            raise JaegerError(self._url("/api/search", params), 200,
                              f"not a Tempo search answer: {excerpt(json.dumps(out))}")
        return [t for t in traces or [] if isinstance(t, dict) and isinstance(t.get("traceID"), str) and t["traceID"]]

    def trace(self, trace_id: str) -> dict[str, Any]:
        """The trace as OTLP/JSON ``TracesData`` (empty when Tempo does not have it); larger than
        ``limits.max_trace_bytes`` raises :class:`JaegerError`."""
        path = f"/api/traces/{quote(trace_id, safe='')}"
        out = self._get(path, max_bytes=self.limits.max_trace_bytes)
        if out is not None and not isinstance(out, dict):
            raise JaegerError(self._url(path), 200, f"not a Tempo trace: {excerpt(json.dumps(out))}")
        return traces_data(out)


def run_trace_ids(client: TempoClient, run_id: str, start_s: int, end_s: int,
                  limit: int = DEFAULT_LIMIT) -> Iterator[str]:
    """Every trace id of ``run_id`` with spans in [start_s, end_s], each once (see the module doc)."""
    q = run_query(run_id)
    seen: set[str] = set()
    todo = [(int(start_s), int(end_s))]
    while todo:
        a, b = todo.pop()
        found = client.search(q, a, b, limit)
        for t in found:
            tid = str(t["traceID"])
            if tid not in seen:
                seen.add(tid)
                yield tid
        if len(found) >= limit:
            if b - a < 2:
                raise ValueError(f"more than {limit} traces of run {run_id} within one second at {a}: raise --limit")
            m = (a + b) // 2
            todo += [(a, m), (m, b)]
