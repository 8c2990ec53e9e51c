"""Where ``cptrace-otel watch`` and ``serve`` send a finding: one line on stdout, back into its trace, and to
Alertmanager.

* :class:`FindingSinks`: the three built from the commands' shared flags (``--endpoint``/``--protocol``,
  ``--alertmanager``/``--alert-hold``, the Jaeger link base) and fed one finding list at a time
  (:meth:`FindingSinks.report`); one place, so both commands print, write back and alert the same way.

* :class:`WriteBack`: one span per finding, named :data:`SPAN_FINDING`, in the finding's node trace
  (``spans.node_trace_id(run_id, epoch, node_id)``; a finding without a node goes to its rank trace), stamped by
  ``spans.stamp_findings`` (the exporter's violation attributes: ``cptrace.violation`` = the code, the rules,
  certainty, status ERROR, one ``hicache.violation`` event), with ``sglang.cp.rank``/``hicache.node_id`` span
  attributes and an OTLP span link to the span of each evidence record still in the evidence index. The resource is
  service :data:`~.incremental.WATCH_SERVICE` with the run id, so Jaeger's span metrics count the codes
  (``cptrace_violation``) like the exporter's and watch skips its own spans when it reads. The span id is derived
  from the finding, so writing the same finding twice gives the same span. Sent through the project's export stack
  (``export.stack.open_sinks``: OTLP HTTP or gRPC, spooled while the collector is down).
* :class:`Alerts`: Alertmanager v2 (``POST /api/v2/alerts``). One alert per (run id, code, rank): labels
  ``alertname`` (:data:`ALERTNAME`), ``severity``, ``code``, ``rank``, ``run_id``; annotations ``message`` (the
  latest finding, with the count), ``jaeger`` (the trace of the latest finding) and ``summary``. Every poll re-posts
  the alerts found in the last ``hold_s`` with the same labels and ``startsAt`` and an ``endsAt`` a few polls ahead,
  so Alertmanager keeps one alert per label set; an alert not re-posted resolves at its ``endsAt``. The post goes
  through the analyzer's HTTP transport (:mod:`.sources.httpio`): ``user:password@`` in the URL is sent as basic auth
  (to that origin only), the request has a total deadline, the reply is not read beyond a small bound, and any answer
  (refused, cut, not HTTP, an error status, a redirect elsewhere) is one line on stderr (the URL masked) and a retry
  at the next poll, never the watcher's end.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..model import semconv as sc
from ..model.spans import Span, stamp_findings
from ..model.trace_ids import hashed_id, node_trace_id, rank_trace_id
from .incremental import WATCH_SERVICE, RunWatch

if TYPE_CHECKING:
    from ..checks.findings import Finding

SPAN_FINDING = "cptrace.finding"
ALERTNAME = "CptraceInvariantViolated"
MAX_LINKS = 16


def finding_trace(run_id: str, f: Finding) -> bytes:
    """The trace a finding belongs to: its node's trace, else its rank's."""
    if isinstance(f.node_id, int) and f.node_id >= 0:
        return node_trace_id(run_id, f.epoch, f.node_id)
    return rank_trace_id(run_id, f.rank)


def already_stamped(state: RunWatch, f: Finding) -> bool:
    """True when the span holding the finding's last evidence record already carries its code (the exporter's
    online check found it): writing it again would count it twice."""
    if not f.evidence:
        return False
    ref = state.span_of(f.rank, f.evidence[-1])
    return ref is not None and f.code in ref.codes


def finding_span(state: RunWatch, f: Finding, now_ns: int) -> Span:
    """The write-back span of one finding (see the module doc)."""
    tid = finding_trace(state.run_id, f)
    sid = hashed_id(f"watch|{state.run_id}|{f.code}|{f.rule}|{f.rank}|{f.epoch}|{f.node_id}|{f.evidence}", 8)
    refs = [(s, state.span_of(f.rank, s)) for s in f.evidence]
    last = next((r for _, r in reversed(refs) if r is not None), None)
    start = last.start_us * 1000 if last is not None and last.start_us else now_ns
    attrs: dict[str, Any] = {sc.RANK: f.rank}
    if isinstance(f.node_id, int):
        attrs[sc.NODE_ID] = f.node_id
    sp = Span(tid, sid, SPAN_FINDING, start, f.rank, ("watch",), attrs)
    sp.findings.append(f)
    # The evidence spans as the exporter's stamp links them (one link per span, naming its codes and seqs).
    ids: dict[int, tuple[bytes, bytes, str, Any]] = {}
    for seq, ref in refs:
        if ref is None or len({r[1] for r in ids.values()}) >= MAX_LINKS:
            continue
        try:
            ids[seq] = (bytes.fromhex(ref.trace_id.rjust(32, "0")), bytes.fromhex(ref.span_id.rjust(16, "0")),
                        "record", None)
        except ValueError:
            continue
    stamp_findings(sp, ids)
    return sp


def finding_line(run_id: str, f: Finding, link: str) -> str:
    """The one stdout line of a finding (``watch`` and ``serve`` print the same; tests parse it)."""
    seq = f.evidence[-1] if f.evidence else "?"
    node = f"node {f.node_id}" if f.node_id is not None else "(no node)"
    return (f"{f.severity} {f.code} {f.rule} run {run_id} rank {f.rank} {node} (epoch {f.epoch}) seq {seq}: "
            f"{f.message}  {link}")


class SinkSetupError(Exception):
    """The write-back's OTLP endpoint cannot be used (its message names the endpoint masked: no secret in it)."""


class FindingSinks:
    """stdout, the write-back (``args.endpoint``) and the alerts (``args.alertmanager``) of one command run.

    ``args`` carries ``endpoint``, ``protocol``, ``alertmanager`` and ``alert_hold`` (the flags both commands
    declare); ``alert_interval_s`` is how often the alerts are re-posted (it sets their ``endsAt``), ``link_base``
    the Jaeger base URL of the links. Raises :class:`SinkSetupError` when the endpoint cannot be used and
    ``ValueError`` for a bad ``--alert-hold`` (read only with ``--alertmanager``). :meth:`report` may be called from
    one thread while :meth:`post_alerts` runs in another: the alerts are read and changed under :attr:`lock`,
    posted outside it (a slow Alertmanager never holds the reporting back)."""

    def __init__(self, args: Any, alert_interval_s: float, link_base: str, out: Any,
                 note: Callable[[str], None] = lambda s: None) -> None:
        import threading

        from ..model.config import mask_url, traces_url
        from .sources.jaegerquery import parse_duration

        hold = parse_duration(args.alert_hold) if args.alertmanager else 0.0
        self.wb: WriteBack | None = None
        if args.endpoint:
            try:
                self.wb = WriteBack(traces_url(args.endpoint, args.protocol), args.protocol)
            except Exception as e:
                raise SinkSetupError(f"cannot use OTLP endpoint {mask_url(str(args.endpoint))}: "
                                     f"{mask_url(str(e))}") from None
        self.alerts = Alerts(args.alertmanager, alert_interval_s, hold, note) if args.alertmanager else None
        self.link_base = link_base
        self.out = out
        self.note = note
        self.lock = threading.Lock()
        self.total = 0   # findings reported

    def report(self, run_id: str, state: Any, found: list[Finding]) -> None:
        """Print each finding, add it to the alerts, and write those not already stamped back into their traces
        (``state`` answers ``run_id`` and ``span_of``: a :class:`~.incremental.RunWatch` or a trace's state)."""
        from . import links

        for f in found:
            link = links.trace_url(self.link_base, finding_trace(run_id, f))
            print(finding_line(run_id, f, link), file=self.out, flush=True)
            if self.alerts is not None:
                with self.lock:
                    self.alerts.found(run_id, f, link)
        self.total += len(found)
        if self.wb is not None and found:
            self.wb.write(state, found)

    def unchecked(self, run_id: str, trace_id: str, why: str, records: int) -> None:
        """A trace NOT checked (``serve``: its state died with an earlier process, or its first records were not
        seen here): an ``UNCHECKED run ... trace ...`` line, and an :data:`UNCHECKED` alert for the run. Never a
        silent pass."""
        from ..checks.findings import Finding
        from . import links

        link = links.trace_url(self.link_base, trace_id)
        print(f"UNCHECKED run {run_id} trace {trace_id}: {why} ({records} record(s))  {link}", file=self.out,
              flush=True)
        if self.alerts is not None:
            with self.lock:
                self.alerts.found(run_id, Finding(UNCHECKED, "serve-state-lost", -1, 0, None, None, "exact", [],
                                                  f"trace {trace_id} NOT checked: {why}"), link)

    def post_alerts(self) -> None:
        """(Re-)post the alerts (nothing without ``--alertmanager``); never raises (see :meth:`Alerts.post`)."""
        if self.alerts is None:
            return
        with self.lock:
            body = self.alerts.payload()
        self.alerts.post(body=body)

    def close(self) -> None:
        """Flush and close the write-back; a line through ``note`` when some finding span was not delivered."""
        if self.wb is not None:
            if not self.wb.flush(30.0):
                self.note("some finding spans could not be delivered to the OTLP endpoint")
            self.wb.close(1.0)


class WriteBack:
    """Finding spans to an OTLP endpoint through the export stack (see the module doc)."""

    def __init__(self, endpoint: str, protocol: str = "http/protobuf") -> None:
        from ..export.stack import open_sinks
        from ..model import config as _config

        self.cfg = _config.from_env()
        self.sinks = open_sinks(self.cfg, endpoint=endpoint, protocol=protocol, spool_dir="")
        self.written = 0

    def write(self, state: RunWatch, findings: list[Any]) -> int:
        """Send the spans of ``findings`` not already stamped in their traces; how many were sent."""
        now = time.time_ns()
        spans = [finding_span(state, f, now) for f in findings if not already_stamped(state, f)]
        if spans and self.sinks:
            res = {sc.SERVICE_NAME: WATCH_SERVICE, sc.RUN_ID: state.run_id}
            for s in self.sinks:
                s.export([(res, spans)])
            self.written += len(spans)
        return len(spans)

    def flush(self, timeout_s: float = 30.0) -> bool:
        return all([s.flush(timeout_s) for s in self.sinks])

    def close(self, timeout_s: float = 30.0) -> bool:
        return all([s.close(timeout_s) for s in self.sinks])


UNCHECKED = "UNCHECKED"   # the code of the alert ``serve`` posts for traces whose state died with a replica


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Alerts:
    """Alertmanager v2 poster (see the module doc). ``note(text)`` gets one line per change of reachability."""

    def __init__(self, url: str, interval_s: float, hold_s: float = 3600.0,
                 note: Callable[[str], None] = lambda s: None) -> None:
        from ..model.config import mask_url

        self._post_url = url.rstrip("/") + "/api/v2/alerts"   # may hold user:password@ (sent as basic auth)
        self.url = mask_url(self._post_url)                   # for messages
        self.ends_after = max(4 * interval_s, 120.0)
        self.hold_s = hold_s
        self.note = note
        self.active: dict[tuple, dict[str, Any]] = {}   # (run id, code, rank) -> alert state
        self.down = False
        self.posts = 0

    def found(self, run_id: str, f: Finding, jaeger_link: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        key = (run_id, f.code, f.rank)
        a = self.active.get(key)
        if a is None:
            a = self.active[key] = {"starts": now, "count": 0}
        a.update(last=now, message=f.message, link=jaeger_link, rule=f.rule, node=f.node_id)
        a["count"] += 1

    def payload(self, now: float | None = None) -> list[dict[str, Any]]:
        """The alerts to (re-)post now; alerts past ``hold_s`` are forgotten (they resolve at their endsAt)."""
        now = time.time() if now is None else now
        out = []
        for key, a in list(self.active.items()):
            if now - a["last"] > self.hold_s:
                del self.active[key]
                continue
            run_id, code, rank = key
            more = f" ({a['count']} findings of {code} on rank {rank} in all)" if a["count"] > 1 else ""
            out.append({
                "labels": {"alertname": ALERTNAME, "severity": "page", "code": code, "rank": str(rank),
                           "run_id": run_id},
                "annotations": {"summary": f"HiCache KV traces NOT checked in run {run_id} (a checker's state was lost)"
                                if code == UNCHECKED else
                                f"HiCache KV invariant {code} violated on CP rank {rank} in run {run_id}",
                                "message": f"{a['rule']} node {a['node']}: {a['message']}{more}",
                                "jaeger": a["link"]},
                "startsAt": _iso(a["starts"]), "endsAt": _iso(now + self.ends_after),
                "generatorURL": a["link"],
            })
        return out

    def post(self, now: float | None = None, body: list[dict[str, Any]] | None = None) -> bool:
        """Post :meth:`payload` (or ``body``, a payload taken earlier: a caller that shares the alerts between threads
        takes it under its lock and posts outside it); True when Alertmanager took it (2xx). Never raises: a failure
        is one line through ``note`` when Alertmanager goes from reachable to not (and one when it is back)."""
        from ..model.config import mask_url
        from .sources import httpio

        if body is None:
            body = self.payload(now)
        if not body:
            return True
        lim = httpio.limits_from_env(deadline_s=min(30.0, httpio.limits_from_env().deadline_s), read_timeout_s=10.0)
        try:
            ans = httpio.request("POST", self._post_url, body=json.dumps(body).encode(), limits=lim,
                                 headers={"Content-Type": "application/json"}, max_bytes=lim.max_small_bytes,
                                 what="Alertmanager")
            if ans is None:
                raise httpio.BackendError(self.url, 404, "not found (is it Alertmanager's base URL?)")
            try:   # 2xx: a reply cut short is a failure (posted again), one past the small bound is not read on
                ans.read()
            except httpio.BackendError:
                ans.close()
        except Exception as e:   # whatever came back: reported, posted again at the next poll
            why = getattr(e, "reason", None) or (f"HTTP {e.status}: {e.body}" if isinstance(e, httpio.BackendError)
                                                 else f"{type(e).__name__}: {e}")
            if not self.down:
                self.note(f"Alertmanager at {self.url} is unreachable or refused the alerts "
                          f"({mask_url(str(why))[:300]}): "
                          "the alerts are posted again at the next poll")
            self.down = True
            return False
        if self.down:
            self.note(f"Alertmanager at {self.url} is reachable again")
        self.down = False
        self.posts += 1
        return True
