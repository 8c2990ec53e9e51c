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
* Limit: the store is asked once, at this replica's end of the trace. Spans sent after that (a trace whose spans
  come further apart than ``--idle``) are not seen; a store that lags its intake by more than ``--idle`` is not
  either.
* Secrets: a ``user:password@`` in the URL is sent as basic auth (:mod:`.sources.httpio`) and never printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

MOVED = ("records of this trace in the span store never came here (the resolver moved its later spans to another "
         "replica): its end-of-trace findings C3-C5 and H4-open not reported")
STORES = ("jaeger", "tempo")


Lookup = Callable[[str], "set[tuple[int, int]]"]


class StoreConfirm:
    """Asks the span store at ``url`` (``store``: ``jaeger``, its query service, api_v3; ``tempo``, its query
    frontend) which records of a trace it holds. See the module doc. ``lookup`` (trace id -> the ``(rank, seq)`` of
    its records) stands in for the store's client: a benchmark's store of a whole run, a unit test's failing one."""

    def __init__(self, url: str = "", store: str = "jaeger", timeout_s: float = 2.0, backoff_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, lookup: Lookup | None = None) -> None:
        if store not in STORES:
            raise ValueError(f"store {store!r}: expected one of {', '.join(STORES)}")
        self.store = store
        self.lookup: Lookup = lookup or self._records
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

    def probe(self) -> None:
        """Raise the store's error (an ``OSError`` with the URL: unreachable; a ``RuntimeError``: it answered, not
        as a store does) when it cannot be asked: at start, so a wrong URL is said before anything listens."""
        self.lookup("0" * 31 + "1")

    def _records(self, trace_id: str) -> set[tuple[int, int]]:
        from .sources.jaeger import events_from_otlp
        from .sources.tempo import TempoClient

        c = self.client
        assert c is not None
        td = c.trace(trace_id) if isinstance(c, TempoClient) else c.get_trace_v3(trace_id, raw=True)
        return {(ev.rank, ev.seq) for ev in events_from_otlp(td)} if td else set()

    def missing(self, trace_id: str, have: Collection[tuple[int, int]]) -> int | None:
        """Records of ``trace_id`` in the store not in ``have``; None when not known (see the module doc)."""
        now = self.clock()
        if now < self.hold_until:
            self.unknown += 1
            return None
        self.asked += 1
        try:
            held = self.lookup(trace_id)
        except (OSError, RuntimeError, ValueError) as e:   # unreachable, an HTTP error, a body that is not a trace
            self.hold_until = now + self.backoff_s
            self.unknown += 1
            self.last_error = str(e)[:300]
            return None
        n = sum(1 for k in held if k not in have)
        if n:
            self.moved += 1
        return n
