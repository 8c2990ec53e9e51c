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

from typing import Any, Iterator

from .jaeger import JaegerClient

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
        out = self._get("/api/search", [("q", q), ("start", str(int(start_s))), ("end", str(int(end_s))),
                                        ("limit", str(int(limit))), ("spss", "1")]) or {}
        traces = out.get("traces") if isinstance(out, dict) else None
        return [t for t in traces or [] if isinstance(t, dict) and t.get("traceID")]

    def trace(self, trace_id: str) -> dict[str, Any]:
        """The trace as OTLP/JSON ``TracesData`` (empty when Tempo does not have it)."""
        return traces_data(self._get(f"/api/traces/{trace_id}"))


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
