"""The online checks of :class:`~cptrace_otel.model.spans.SpanBuilder` (mixed in as :class:`SpanChecks`): each
record the builder places is checked by its rank's checker (``checker_factory(rank)``, a
:class:`~cptrace_otel.checks.RankChecker` in the exporter and ``ingest``), and the findings are stamped on the span
holding the record when that span closes (:func:`.violations.stamp_findings`).

Contract: the checks run over batches. ``add`` places a record and queues it (:attr:`SpanChecks._pending`); a span
closed while records are queued is queued after them. :meth:`SpanChecks.flush_checks` checks the queued records in
order and stamps each queued span where it closed, so every span gets the findings, and the evidence references
(``seq`` -> span, bounded by ``MAX_SEQ_REFS``), that checking each record as it was placed gives it:
tests/unit/test_spans.py holds the two byte for byte on fault runs. It runs every :data:`CHECK_BATCH` records, at
the end of each of the exporter's batches, and before anything that hands spans or findings out (``take``,
``finish``, ``close_all``, ``expire``, ``unchecked``). A record the checker must see before it is placed (a canary,
a free without a node: the checker names its node) is checked after the queued ones. A checker that raises is
switched off there (one message on stderr): the records before it keep their findings, the ones after it are not
checked. Why batches: the checker and the span building each run with their own data in the CPU's caches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from . import semconv as sc
from .events import Event
from .violations import stamp_findings

# a spans.Span (named here as Any: spans imports this module, and the package has no import cycle, type-only ones
# included)
Span = Any

# records placed before their online checks run: run in turn per record, the checker and the span building took
# 1.4 µs a record more on the Jaeger stream (5.7 against 4.3 µs, the checks outside the builder,
# bench/jaeger_export.py's records); the exporter worker's CPU per event went 11.4-12.0 -> 9.1-9.8 µs
CHECK_BATCH = 512
MAX_SEQ_REFS = 1 << 16   # records whose span can still be named as evidence (and the L3 prefetches an l3_hit links to)


class SpanChecks:
    """The check state and steps of a :class:`~cptrace_otel.model.spans.SpanBuilder` (its ``__init__`` sets the
    attributes below)."""

    _checker_factory: Callable[[int], Any] | None
    _checkers: dict[int, Any]
    _feeds: dict[int, Callable[[Event], Any]]      # rank -> its checker's feed method
    _seq_refs: dict[int, tuple[bytes, bytes, str, Any]]
    _pending: list[tuple[Event | None, Span]]
    _open: dict[Any, Span]
    findings: int
    _rank_span: Callable[[int, str], Span]

    def flush_checks(self) -> None:
        """Run the online checks of the records placed since the last call, in order, and stamp the spans closed
        among them where they closed: each span gets the findings, and the evidence references, it would have had
        with each record checked as it was placed. The builder's ``take``, ``close_all`` and ``expire``,
        :meth:`finish_checks` and :meth:`unchecked` call it first; its ``add`` every :data:`CHECK_BATCH` records."""
        pend = self._pending
        if not pend:
            return
        self._pending = []
        refs = self._seq_refs
        feeds = self._feeds
        for ev, sp in pend:
            if ev is None:   # a span closed after the records before it
                if sp.findings:
                    stamp_findings(sp, refs)
                continue
            if self._checker_factory is None:
                continue   # switched off by an error: the records after it are not checked (nor referenced)
            if len(refs) >= MAX_SEQ_REFS:
                refs.clear()
            refs[ev.seq] = (sp.trace_id, sp.span_id, ev.tag, ev.fields.get("op"))
            rank = ev.rank
            fd = feeds.get(rank)
            if fd is None:
                ck = self._checkers.get(rank)
                if ck is not None:
                    # feed_fast (RankChecker): feed without the empty list per record; same findings
                    fd = feeds[rank] = getattr(ck, "feed_fast", None) or ck.feed
            if fd is None:
                found = self._feed_now(ev)   # (the rank's checker created)
            else:
                try:
                    found = fd(ev)
                except Exception as e:  # a broken rule must not stop tracing
                    self._checks_failed(e)
                    continue
            if found:
                self._found(sp, found)

    def _found(self, sp: Span, found: list[Any]) -> None:
        if not sp.findings:
            sp.findings = []
        sp.findings.extend(found)
        self.findings += len(found)

    def _checks_on(self) -> bool:
        """Whether the online checks run, the records placed before now checked first (a record checked before it
        is placed, a canary or a free without a node, is checked after them)."""
        self.flush_checks()
        return self._checker_factory is not None

    def _checks_failed(self, e: Exception) -> None:
        """The checker raised ``e``: the online checks are switched off, said once on stderr."""
        self._checker_factory = None
        print(f"cptrace_otel: online checks disabled after an error in the checker: {e!r}", file=sys.stderr)

    def _feed_now(self, ev: Event) -> list[Any] | None:
        """The findings of ``ev`` from its rank's checker (created if needed); None when the checks are off or the
        checker failed (it is then switched off, as in :meth:`flush_checks`)."""
        try:
            ck = self._checkers.get(ev.rank)
            if ck is None and self._checker_factory is not None:
                ck = self._checkers[ev.rank] = self._checker_factory(ev.rank)
            return ck.feed(ev) if ck is not None else None
        except Exception as e:  # a broken rule must not stop tracing
            self._checks_failed(e)
            return None

    def finish_checks(self) -> None:
        """End of stream: the findings that only the end reveals (each checker's ``finish``), each stamped on the open
        span holding its last evidence record, else on its rank's rank span. A checker whose ``finish`` raises is
        skipped (one message on stderr); the others still finish."""
        if not self._checks_on():
            return
        for rank, ck in list(self._checkers.items()):
            try:
                found = ck.finish() or []
            except Exception as e:  # a broken rule must not stop tracing
                print(f"cptrace_otel: checker finish failed: {e!r}", file=sys.stderr)
                continue
            for fd in found:
                self._stamp_late(rank, fd)

    def _stamp_late(self, rank: int, fd: object) -> None:
        evidence = list(getattr(fd, "evidence", None) or [])
        target = None
        if evidence:
            want = evidence[-1]
            for sp in self._open.values():
                if sp.rank == rank and any(a.get(sc.SEQ) == want for _, _, a in sp.events):
                    target = sp
                    break
        target = target or self._rank_span(rank, "finish")
        target.findings = [*target.findings, fd]   # (a new list: a builder's span has _NONE until its first)
        self.findings += 1

    def unchecked(self) -> list[Any]:
        self.flush_checks()
        out: list[Any] = []
        for ck in self._checkers.values():
            try:
                out.extend(ck.unchecked())
            except Exception:
                pass
        return out
