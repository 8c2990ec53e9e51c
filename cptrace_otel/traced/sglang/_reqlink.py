"""SGLang's own request span at the sites that record a request using a node (``rid_map``), both ways.

Where SGLang traces requests (``--enable-trace``, module ``request``), the scheduler's ``Req`` holds the request's
tracing context in ``req.time_stats.trace_ctx``: a ``TraceReqContext`` (or ``TraceReqContextAsync`` with
``SGLANG_TRACE_ASYNC=1``) whose ``root_span`` (in the process that started the request) or ``root_span_context``
(an ``opentelemetry-api`` context, in the scheduler, rebuilt from the propagated W3C carrier) names the request's
root span ``Req <rid>``; with tracing off it is a ``TraceNullContext``. The same holds in sglang 0.5.20 and 0.5.23.

* :func:`request_fields` -> ``{"req_span": "<trace id>-<span id>"}`` (:mod:`cptrace_otel.model.reqlink`) for the
  record, so the exporter links the node's span to the request span; ``{}`` when SGLang does not trace the
  request.
* :func:`note_node`: the way back. It adds one event ``cptrace.node`` (``hicache.node_id``, ``hicache.hit``,
  ``cptrace.run_id``) through SGLang's own ``trace_ctx.trace_event`` API, so SGLang's exporter, as SGLang
  configured it, puts it on the request's span in the scheduler (the stage slice that spans that time, else the
  scheduler's thread span). In Jaeger, a search for ``hicache.node_id=N cptrace.run_id=RUN`` then finds the node's
  traces (one per epoch; the one whose lane links back to this request is the one).

Both never raise and touch nothing of SGLang's but the request's own tracing context; they cost a few attribute
lookups per ``rid_map`` (and one list append in SGLang's context when it traces the request).
"""

from __future__ import annotations

from typing import Any

from ...model import semconv as sc
from ...model.reqlink import FIELD, format_context
from ..api import get_config

EVENT = "cptrace.node"
# SGLang's trace_event level: 1 is recorded at every SGLang trace level (SGLANG_TRACE_LEVEL, default 3)
EVENT_LEVEL = 1


def _trace_ctx(req: object) -> Any:
    """The request's SGLang tracing context when SGLang traces it, else None."""
    tc = getattr(getattr(req, "time_stats", None), "trace_ctx", None)
    # (a TraceNullContext answers every attribute with itself: tracing_enable is its only real field)
    if tc is None or getattr(tc, "tracing_enable", False) is not True:
        return None
    return tc


def request_fields(req: object) -> dict[str, str]:
    """``{"req_span": ...}`` naming the root span of ``req``'s SGLang request trace, or ``{}``. Never raises."""
    try:
        tc = _trace_ctx(req)
        if tc is None:
            return {}
        span = tc.__dict__.get("root_span")
        if span is None:
            ctx = tc.__dict__.get("root_span_context")
            if ctx is None:
                return {}
            from opentelemetry import trace  # (SGLang imported it already: it is tracing)

            span = trace.get_current_span(ctx)
        c = span.get_span_context()
        v = format_context(c.trace_id, c.span_id)
        return {FIELD: v} if v is not None else {}
    except Exception:  # a context of another shape: the record goes out without the link
        return {}


def note_node(req: object, node_id: object, hit: object) -> None:
    """Add the ``cptrace.node`` event to ``req``'s SGLang request span (see the module doc); call it after the
    ``rid_map`` record (the run id is settled at a process's first record). Never raises."""
    try:
        tc = _trace_ctx(req)
        if tc is None or type(node_id) is not int:
            return
        tc.trace_event(EVENT, EVENT_LEVEL, None, {sc.NODE_ID: node_id, sc.field_key("hit"): str(hit),
                                                  sc.RUN_ID: get_config().run_id})
    except Exception:  # SGLang's tracing is SGLang's: a failure here costs the event only
        pass
