"""Confirming a trace's end against the span store (``cptrace-otel serve --confirm-url``): was the trace whole here?

Why: when the collector's resolver list changes (a replica added or removed), a trace in flight is cut. Its later
spans go to another replica, which reports that tail UNCHECKED (it lacks a rank's first lane span). But the head
left on the old replica holds every rank's first lane span, so it looks whole, and a join decided at the trace's end
then lacks the side of a rank whose later records went away: a false C3 (bench/serve_moved_traces.py measured 34 in
13 of 24 cuts). The replica alone cannot tell that head from a whole trace; the span store the same collector
writes to (Jaeger or Tempo) can: it holds every span of the trace.

Contract (:class:`StoreConfirm`):

* :meth:`StoreConfirm.missing` ``(trace_id, have)``: how many records of the trace the store holds whose
  ``(rank, seq)`` is not in ``have`` (the records this replica received), or ``None`` when that is not known (the
  store is unreachable, answers an error or times out, or a recent failure put the confirmations on hold for
  ``backoff_s``). Finding events (``hicache.violation``) are not records. A trace the store does not have gives 0
  (nothing says it moved).
* It is asked only at a trace's end, and only when the end decided a finding that a cut could make false
  (:data:`~.serve_state.END_DECIDED`): healthy traces cost no query. Each query is bounded by ``timeout_s``; after
  a failure none is made for ``backoff_s``, so a store that is down costs the checking thread at most one timeout
  per ``backoff_s``.
* What the caller does with the answer (:meth:`~.serve_state.ServeState._counted`): > 0, those findings are not
  reported and the trace is reported UNCHECKED (:data:`MOVED`); ``None``, they are reported as without the store
  (a real C3 is never dropped because the store was down) and counted in :attr:`StoreConfirm.unknown`.
* The other side of the cut (:meth:`~.serve_state.ServeState._rechecked`): the replica that received a trace's later
  records (a node trace lacking a rank's first lane span) asks :meth:`StoreConfirm.whole` for the trace at its end
  and checks it whole: it reports the whole trace's findings less those the head's replica reported (a replica set
  up as this one, run over the head with this answer: :meth:`~.serve_state.ServeState._head_reported`) and less
  those it reported itself before the end (live). A trace holding records of fewer ranks than its CP group (each
  of them whole here) has its joins C3-C5 checked whole the same way, reported by the replica that holds the
  first lane span of the trace's lowest rank only. Either way no finding is reported twice; where the store
  cannot be asked, lags (a record that came here is not in it yet) or lacks a rank's first records, the trace is
  reported UNCHECKED as without a store. Live, a join whose deciding record the head holds is left to the head's
  replica (it may have reported it before the trace's end): if that replica withheld it instead, the trace was
  reported UNCHECKED there. Two cuts in one trace's life are not foreseen: the middle part's replica finds the head
  cut and reports what the head's replica did not, which the last part's replica may report again.
* Limit: the store is asked once, at this replica's end of the trace. Spans sent after that (a trace whose spans
  come further apart than ``--idle``) are not seen; a store that lags its intake by more than ``--idle`` is not
  either.
* Secrets: a ``user:password@`` in the URL is sent as basic auth (:mod:`.sources.httpio`) and never printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # (the intake is imported when a store is asked: the CLI's parser imports STORES from here)
    from .otlp_intake import SpanRecords

MOVED = ("records of this trace in the span store never came here (the resolver moved its later spans to another "
         "replica): its end-of-trace findings C3-C5 and H4-open not reported here (that replica, with --confirm-url, "
         "checks the trace whole from the store)")
STORES = ("jaeger", "tempo")


Lookup = Callable[[str], "list[SpanRecords]"]


class StoreConfirm:
    """Asks the span store at ``url`` (``store``: ``jaeger``, its query service, api_v3; ``tempo``, its query
    frontend) for a trace's spans. See the module doc. ``lookup`` (trace id -> the trace's spans that hold records,
    as the intake reads them) stands in for the store's client: a benchmark's store of a whole run, a unit test's
    failing one."""

    def __init__(self, url: str = "", store: str = "jaeger", timeout_s: float = 2.0, backoff_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, lookup: Lookup | None = None) -> None:
        if store not in STORES:
            raise ValueError(f"store {store!r}: expected one of {', '.join(STORES)}")
        self.store = store
        self.lookup: Lookup = lookup or self._spans
        self.client = None
        self.base_url = "(a lookup)"
        if lookup is None:
            from .sources.httpio import limits_from_env
            from .sources.jaeger import JaegerClient
            from .sources.tempo import TempoClient

            cls = TempoClient if store == "tempo" else JaegerClient
            self.client = cls(url, timeout_s=timeout_s, limits=limits_from_env(deadline_s=timeout_s,
                                                                              read_timeout_s=timeout_s))
            self.base_url = self.client.base_url   # without its password: for messages
        self.backoff_s, self.clock = backoff_s, clock
        self.hold_until = 0.0
        self.asked = 0      # queries made
        self.moved = 0      # traces the store showed to be cut here
        self.unknown = 0    # traces whose confirmation could not be made (error, timeout, on hold)
        self.last_error = ""

    @classmethod
    def holding(cls, spans: Iterable[SpanRecords], **kw: Any) -> StoreConfirm:
        """A store that holds ``spans`` (as the Jaeger the collector also writes to holds a whole run): for the
        benchmarks and tests that replay a run into replicas."""
        by: dict[str, list[SpanRecords]] = {}
        for sp in spans:
            by.setdefault(sp.trace_id, []).append(sp)
        return cls(lookup=lambda tid: by.get(tid, []), **kw)

    def probe(self) -> None:
        """Raise the store's error (an ``OSError`` with the URL: unreachable; a ``RuntimeError``: it answered, not
        as a store does) when it cannot be asked: at start, so a wrong URL is said before anything listens."""
        self.lookup("0" * 31 + "1")

    def _spans(self, trace_id: str) -> list[SpanRecords]:
        from .sources.tempo import TempoClient

        c = self.client
        assert c is not None
        td = c.trace(trace_id) if isinstance(c, TempoClient) else c.get_trace_v3(trace_id, raw=True)
        return spans_from_otlp(td) if td else []

    def whole(self, trace_id: str) -> list[SpanRecords] | None:
        """The spans of ``trace_id`` the store holds ([] when it has none); None when not known (see the module
        doc: an error, a timeout, or on hold after one)."""
        now = self.clock()
        if now < self.hold_until:
            self.unknown += 1
            return None
        self.asked += 1
        try:
            return self.lookup(trace_id)
        except (OSError, RuntimeError, ValueError) as e:   # unreachable, an HTTP error, a body that is not a trace
            self.hold_until = now + self.backoff_s
            self.unknown += 1
            self.last_error = str(e)[:300]
            return None

    def missing(self, trace_id: str, have: Collection[tuple[int, int]]) -> int | None:
        """Records of ``trace_id`` in the store not in ``have``; None when not known (see the module doc)."""
        spans = self.whole(trace_id)
        if spans is None:
            return None
        n = sum(1 for sp in spans for ev in sp.events if (ev.rank, ev.seq) not in have)
        if n:
            self.moved += 1
        return n


def spans_from_otlp(td: Mapping[str, Any]) -> list[SpanRecords]:
    """The spans of an OTLP/JSON ``TracesData`` (a store's answer) that hold records, read as the intake reads a
    request (:mod:`.otlp_intake`): run id, level and config stamp from the resource, the records of each span
    (:func:`~.sources.jaeger.span_events`); the checker's own write-back spans and spans without a run id are left
    out."""
    from ..model import semconv as sc
    from ..model.config_stamp import record as config_record
    from .incremental import WATCH_SERVICE, SpanRef
    from .otlp_intake import SRC, SpanRecords
    from .sources.jaeger import hex_id, iter_spans, otlp_attrs, span_events

    out: list[SpanRecords] = []
    for res, span in iter_spans(td):
        run_id = res.get(sc.RUN_ID)
        if res.get(sc.SERVICE_NAME) == WATCH_SERVICE or not isinstance(run_id, str) or not run_id:
            continue
        sattrs = dict(otlp_attrs(span.get("attributes")))
        evs = span_events(res, span, sattrs, SRC)
        if not evs:
            continue
        rrank, lvl = res.get(sc.CP_RANK), res.get(sc.TRACE_LEVEL)
        codes = frozenset(str(sattrs[sc.VIOLATION]).split(",")) if sc.VIOLATION in sattrs else frozenset()
        start_us = int(span.get("startTimeUnixNano") or 0) // 1000
        ref = SpanRef(hex_id(span.get("traceId", "")), hex_id(span.get("spanId", "")), start_us, codes)
        out.append(SpanRecords(run_id, ref.trace_id, ref, lvl if type(lvl) is int else None, evs,
                               config_record(res, rrank if type(rrank) is int else 0)))
    return out

