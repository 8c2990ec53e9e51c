"""``cptrace-otel serve``: an OTLP/HTTP receiver that checks node traces as they arrive, one replica of many behind
the OTel Collector's ``loadbalancing`` exporter (routing key ``traceID``; deploy/collector/config-checkers.yaml).

HTTP (``--listen HOST:PORT``) and, with ``--grpc HOST:PORT``, OTLP/gRPC (``TraceService/Export``; the
``loadbalancing`` exporter of collector v0.161.0 speaks only gRPC to its backends). gRPC answers as HTTP does:
``UNAVAILABLE`` when the queue is full or the server stops (the collector retries it), ``partial_success`` for
rejected spans (a message that does not parse is refused by gRPC itself); ``--max-body`` bounds its messages too.

HTTP:

* ``POST /v1/traces`` with ``Content-Type: application/x-protobuf`` (``Content-Encoding: gzip`` accepted, as the
  collector's ``otlphttp`` exporter sends by default): the body is decoded in the request's thread
  (:func:`~cptrace_otel.analyze.otlp_intake.decode`) and queued for the checking thread. Answers: 200 with an
  ``ExportTraceServiceResponse`` (its ``partial_success`` names the spans that could not be read and why); 400 for
  a body that is not such a request (or a gzip body that does not inflate); 411 without ``Content-Length``; 413 for
  a body, or its inflated size, over ``--max-body``; 415 for another content type; 503 with ``Retry-After`` while
  the queue (``--queue`` requests) is full or the server is stopping: the collector's ``retry_on_failure`` and
  ``sending_queue`` keep the data and send it again, so a slow replica slows the collector instead of losing
  spans; what this replica turned away is counted (``cptrace_serve_spans_dropped_total``).
* ``GET /metrics``: Prometheus text (see :func:`metrics_text`); ``GET /healthz``:
  200 while the process runs; ``GET /readyz``: 200 while it accepts data (not stopping, queue not full), else 503.

TLS and authentication (:mod:`~cptrace_otel.analyze.serve_guard`): ``--tls-cert``/``--tls-key`` put both receivers
on TLS, ``--tls-client-ca`` requires client certificates (mutual TLS), ``--auth-token-file``/``--auth-token-env``
require the ``--auth-header`` value on OTLP requests and ``/metrics`` (401 / ``UNAUTHENTICATED``, counted;
``/healthz`` and ``/readyz`` stay open): the server side of the exporter's ``OTEL_EXPORTER_OTLP_*`` settings.

``--scope run`` (behind the collector's ``load_balancing/runs`` exporter, keyed by the run id): each run is held and
checked live as one stream, every rule (C1, C2 and C5-fence included), instead of each trace.

The checking thread owns a :class:`~cptrace_otel.analyze.serve_state.ServeState`: records held by trace, each trace
checked when idle for ``--idle`` (default 30s); with ``--live``, records are fed to the per-rank rules as they arrive
through a per-rank reorder window (``--reorder``, ``--reorder-records``), so such a finding is reported as soon as the
record that decides it is checked (the cross-rank C3-C5 once every rank of the CP group has sent past that record:
the ranks merged by ``ts`` as on the idle path); memory bounded by
``--max-nodes`` and ``--max-runs`` (past them the
least recently changed is finalised early and counted). Each finding is printed once on stdout (the line ``watch``
prints), written back into its node's trace as a span (``--endpoint``,
:class:`~cptrace_otel.analyze.finding_sinks.WriteBack`) and posted to Alertmanager (``--alertmanager``,
:class:`~cptrace_otel.analyze.finding_sinks.Alerts`, posted at once by its own thread (at most every 0.25s) and
re-posted every ``--alert-interval``, so a slow Alertmanager never holds the checking back).

Where it lives: this module parses and checks the arguments, starts both halves and stops them at the signal; the
receivers (HTTP and gRPC intake, TLS and auth, the counters) are :mod:`~cptrace_otel.analyze.serve_receivers`, the
checking loop (queue, state, journal, sinks, live mode) :mod:`~cptrace_otel.analyze.serve_loop`; the
exposition of both on ``/metrics`` is here (:func:`metrics_text`).

Why the standard library's ``ThreadingHTTPServer`` and not a web framework: four routes, protobuf bodies and no
templates; it adds no dependency to the package, and the work that costs (decoding, checking) is bounded by the
queue, not by the server.

SIGTERM or SIGINT: stop accepting, check everything queued, finalise every held trace, flush the write-back, print
a summary on stderr; exit 0 when no finding was reported, 1 when some was, 4 when none was but traces held by a
killed earlier process were reported UNCHECKED (``--state-dir``: :mod:`~cptrace_otel.analyze.serve_journal`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from ..model.exits import EXIT_UNREACHABLE, EXIT_USAGE

if TYPE_CHECKING:
    from ..analyze.serve_receivers import Counters
    from ..analyze.serve_state import ServeState

_PFX = "cptrace-otel serve"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``serve`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    from ..analyze.serve_confirm import STORES  # (light: the store's client is imported only when one is made)

    s = sub.add_parser("serve", help="receive OTLP/HTTP from a collector and check node traces as they arrive "
                                     "(one replica behind the loadbalancing exporter)")
    s.add_argument("--listen", default="127.0.0.1:4320", metavar="HOST:PORT",
                   help="address to serve OTLP/HTTP, /metrics, /healthz and /readyz on (default 127.0.0.1:4320)")
    s.add_argument("--grpc", default=None, metavar="HOST:PORT",
                   help="also receive OTLP/gRPC here (the loadbalancing exporter of collector v0.161.0 speaks gRPC)")
    s.add_argument("--idle", default="30s", metavar="DURATION",
                   help="a trace without new records this long is finalised (end-of-stream rules) and freed "
                        "(default 30s)")
    s.add_argument("--reorder", default="2s", metavar="DURATION",
                   help="how long a record may wait in its rank's reorder window before it is checked (default 2s: "
                        "more than the exporter's 1s span timeout)")
    s.add_argument("--reorder-records", type=int, default=None, metavar="N",
                   help="records per rank and trace in the reorder window (default 4096; with --scope run 65536, "
                        "which must exceed a rank's records per --reorder); a record that comes behind it is not "
                        "checked and is counted")
    s.add_argument("--scope", default="trace", choices=("trace", "run"),
                   help="what one replica checks as one stream: each trace (default; behind the loadbalancing "
                        "exporter's routing_key traceID, every rule one trace decides), or each whole run (behind "
                        "routing_key attributes on cptrace.run_id: every rule check runs, C1, C2 and C5-fence "
                        "included, live; a run's rate is then one replica's). --scope run implies --live")
    s.add_argument("--live", action="store_true",
                   help="check each record as it arrives (through the reorder window): a finding of the per-rank "
                        "rules is reported within --reorder, not --idle, late; one of the cross-rank C3-C5 once "
                        "every rank of the CP group has sent records past it (or when the trace is finalised)")
    s.add_argument("--max-nodes", type=int, default=100_000, metavar="N",
                   help="traces held at once; past it the least recently changed is checked early (default 100000)")
    s.add_argument("--max-trace-records", type=int, default=200_000, metavar="N",
                   help="records one trace holds (live: remembers) before those are checked as one segment and "
                        "dropped; a rank trace lives as long as its run (default 200000)")
    s.add_argument("--max-runs", type=int, default=256, metavar="N",
                   help="runs held at once; past it the least recently changed is finished early (default 256)")
    s.add_argument("--queue", type=int, default=64, metavar="N",
                   help="requests waiting for the checking thread; when full the answer is 503 (default 64)")
    s.add_argument("--max-body", type=int, default=32 << 20, metavar="BYTES",
                   help="largest request body, and its size once inflated (default 32 MiB); larger: 413")
    s.add_argument("--endpoint", default=None, metavar="OTLP",
                   help="OTLP traces URL to write the findings back into their traces (e.g. the collector's)")
    s.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    s.add_argument("--alertmanager", default=None, metavar="URL", help="Alertmanager base URL to post findings to")
    s.add_argument("--alert-interval", default="15s", metavar="DURATION",
                   help="how often the alerts are (re-)posted (default 15s)")
    s.add_argument("--alert-hold", default="1h", metavar="DURATION",
                   help="keep re-posting an alert this long after its last finding (default 1h)")
    s.add_argument("--jaeger-url", default="http://127.0.0.1:16686", help="Jaeger base URL for the links")
    s.add_argument("--confirm-url", default=None, metavar="URL",
                   help="the span store the collector also writes to (Jaeger's query service, or Tempo with "
                        "--confirm-store tempo): asked at a trace's end, when that end decided C3-C5 or H4-open, "
                        "whether records of the trace went to another replica (a resolver change cut it); if so "
                        "those findings are not reported here and the trace is reported UNCHECKED. The replica "
                        "that received the later records (or a short CP group) checks the trace whole from the "
                        "store, reporting what the other did not. Default: not asked")
    s.add_argument("--confirm-store", default="jaeger", choices=STORES,
                   help="what --confirm-url is (default jaeger: its api_v3)")
    s.add_argument("--confirm-timeout", default="2s", metavar="DURATION",
                   help="bound of one --confirm-url query (default 2s; after a failure none for 30s)")
    s.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the replica's journal (traces held, checked, findings emitted), read at start so a kill "
                        "loses nothing silently; 'off' for none (default: $XDG_STATE_HOME/cptrace-otel/serve-PORT, "
                        "off for an ephemeral --listen port 0)")
    from ..analyze import serve_guard

    serve_guard.add_arguments(s)
    return s


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def metrics_text(state: ServeState, c: Counters, queued: int, now_ns: int) -> str:
    """Prometheus text exposition (0.0.4) of one replica. Labels: ``run_id`` and ``code`` on the violations
    (runs are few, codes a fixed set: node ids and trace ids never become labels), ``rule`` on the suppressed."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{lbl} {val:g}" if isinstance(val, float) else f"{name}{lbl} {val}"
                     for lbl, val in samples)

    metric("cptrace_serve_spans_received_total", "counter", "spans received in accepted requests",
           [("", c.spans_received)])
    metric("cptrace_serve_spans_rejected_total", "counter", "spans that could not be read (partial_success)",
           [("", c.spans_rejected)])
    metric("cptrace_serve_spans_dropped_total", "counter",
           "spans in requests answered 503 (queue full or stopping; the collector retries them)",
           [("", c.spans_dropped)])
    metric("cptrace_serve_requests_bad_total", "counter", "requests answered 400, 411, 413 or 415",
           [("", c.bad_requests)])
    metric("cptrace_serve_requests_unauthorized_total", "counter",
           "requests refused for a missing or wrong auth header (401 / UNAUTHENTICATED)", [("", c.unauthorized)])
    metric("cptrace_serve_events_checked_total", "counter", "records checked", [("", state.events_checked)])
    metric("cptrace_serve_violations_total", "counter", "findings reported, by run and code",
           [(f'{{run_id="{esc(r)}",code="{esc(code)}"}}', n) for (r, code), n in sorted(state.findings.items())])
    metric("cptrace_serve_suppressed_total", "counter",
           "findings of rules a replica cannot decide on one trace (not reported: unchecked here)",
           [(f'{{rule="{esc(rule)}"}}', n) for rule, n in sorted(state.suppressed.items())])
    metric("cptrace_serve_late_records_total", "counter", "records of a trace already checked (not checked again)",
           [("", state.late)])
    metric("cptrace_serve_finalised_early_total", "counter", "traces checked before their idle window (a bound)",
           [("", state.early)])
    metric("cptrace_serve_trace_segments_total", "counter",
           "segments checked of traces that reached --max-trace-records", [("", state.segments)])
    metric("cptrace_serve_past_window_records_total", "counter",
           "records that came behind their rank's reorder window (NOT checked)", [("", state.past_window)])
    metric("cptrace_serve_duplicate_records_total", "counter", "records received again (checked once)",
           [("", state.duplicates)])
    metric("cptrace_serve_check_errors_total", "counter", "traces whose check failed (NOT checked; see stderr)",
           [("", state.errors)])
    metric("cptrace_serve_unchecked_traces_total", "counter",
           "traces NOT checked (their state died with a previous process of this replica), by run and reason",
           [(f'{{run_id="{esc(r)}",reason="{esc(why)}"}}', n) for (r, why), n in sorted(state.unchecked.items())])
    j = state.journal
    metric("cptrace_serve_unchecked_records_total", "counter",
           "records taken by a previous process of this replica in the traces reported UNCHECKED (died with it)",
           [("", state.unchecked_records)])
    metric("cptrace_serve_lost_records_total", "counter",
           "records of an UNCHECKED trace that arrived after the restart (not checked)",
           [("", j.lost_records if j is not None else 0)])
    metric("cptrace_serve_journal_errors_total", "counter", "journal writes that failed (see stderr)",
           [("", j.errors if j is not None else 0)])
    conf = state.confirm
    metric("cptrace_serve_confirm_queries_total", "counter",
           "span store queries made at a trace's end (--confirm-url)", [("", conf.asked if conf else 0)])
    metric("cptrace_serve_confirm_unknown_total", "counter",
           "traces whose end-of-trace findings were reported unconfirmed: the span store could not be asked (error, "
           "timeout, or on hold after one)",
           [("", conf.unknown if conf else 0)])
    metric("cptrace_serve_rechecked_total", "counter",
           "traces cut by a resolver change (first records, or a rank of the CP group, elsewhere) checked whole from "
           "the span store (--confirm-url)", [("", state.rechecked)])
    metric("cptrace_serve_withheld_total", "counter",
           "end-of-trace findings not reported: the span store held records of their trace that never came here",
           [(f'{{rule="{esc(rule)}"}}', n) for rule, n in sorted(state.withheld.items())])
    metric("cptrace_serve_traces_held", "gauge", "traces held (state size)", [("", len(state.traces))])
    metric("cptrace_serve_records_held", "gauge", "records held", [("", state.records_held)])
    metric("cptrace_serve_runs_held", "gauge", "runs held", [("", len(state.runs))])
    metric("cptrace_serve_queue_requests", "gauge", "requests waiting for the checking thread", [("", queued)])
    lag = (now_ns - state.newest_ts) / 1e9 if state.newest_ts else 0.0
    metric("cptrace_serve_lag_seconds", "gauge", "now minus the newest record time seen", [("", float(lag))])
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Serve until SIGTERM or SIGINT (see the module doc): the arguments checked before anything listens, the
    checking side (:class:`~cptrace_otel.analyze.serve_loop.Checker`) and the receivers
    (:class:`~cptrace_otel.analyze.serve_receivers.Receivers`) started, and at the signal stopped in that order
    (receivers first, so what they took is checked); returns the exit code."""
    import signal
    import threading
    import time

    from ..analyze import links, serve_guard
    from ..analyze.serve_live import RUN_WINDOW, WINDOW
    from ..analyze.serve_loop import Checker, SetupError
    from ..analyze.serve_receivers import TRACES_PATH, Receivers
    from ..analyze.serve_state import unchecked_rules
    from ..analyze.sources.jaegerquery import parse_duration

    out = out or sys.stdout
    err = err or sys.stderr

    def note(text: str) -> None:
        print(f"serve: {text}", file=err, flush=True)

    try:
        host, port = _host_port(args.listen)
        grpc_at = _host_port(args.grpc) if args.grpc else None
        idle = parse_duration(args.idle)
        reorder = parse_duration(args.reorder)
        parse_duration(args.confirm_timeout)   # said here, before listening (the checker reads it again)
        alert_every = parse_duration(args.alert_interval)
        parse_duration(args.alert_hold)   # said here, before listening (the sinks read it again)
        bad = links.bad_link_base(args)
        if bad:
            raise ValueError(bad)
        if min(args.queue, args.max_body, args.max_nodes, args.max_runs, args.max_trace_records) < 1:
            raise ValueError("--queue, --max-body, --max-nodes, --max-trace-records and --max-runs must be at least 1")
        guard = serve_guard.from_args(args)
        try:
            tls_ctx = guard.ssl_context()
        except OSError as e:   # ssl.SSLError included: a PEM that does not parse, a key that does not match
            raise ValueError(f"--tls-cert/--tls-key/--tls-client-ca: {getattr(e, 'reason', None) or e}") from None
        if args.reorder_records is None:
            args.reorder_records = RUN_WINDOW if args.scope == "run" else WINDOW
        if args.reorder_records < 0:
            raise ValueError("--reorder-records must be at least 0")
        if args.scope == "run":
            if args.confirm_url:
                raise ValueError("--confirm-url: a run-scope replica holds whole runs, no trace of one is cut")
            args.live = True
        checker = Checker(args, idle, reorder, alert_every, port, out, note)
    except (ValueError, SetupError) as e:
        print(f"{_PFX}: {e}", file=err)
        return e.code if isinstance(e, SetupError) else EXIT_USAGE

    rx = Receivers(guard, tls_ctx, args.max_body, checker.offer, checker.ready,
                   lambda: checker.read(lambda state, queued: metrics_text(state, rx.counters, queued, time.time_ns())))
    try:
        server = rx.http_server(host, port)
    except OSError as e:
        print(f"{_PFX}: cannot listen on {host}:{port}: {e.strerror or e}", file=err)
        return EXIT_UNREACHABLE
    gserver = None
    if grpc_at is not None:
        try:
            gserver = rx.grpc_server(grpc_at)
        except Exception as e:   # the port is taken, or grpcio is missing
            server.server_close()
            print(f"{_PFX}: cannot serve OTLP/gRPC on {args.grpc}: {type(e).__name__}: {e}", file=err)
            return EXIT_UNREACHABLE

    checker.start()
    web = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="cptrace-serve-http",
                           daemon=True)
    web.start()
    bound_host, bound_port = server.server_address[:2]
    scheme = "https" if guard.tls else "http"
    what = "a trace" if args.scope == "trace" else "a run"
    when = (f"a trace is checked after {args.idle} without new records" if not args.live else
            f"records are checked as they arrive (reorder window {args.reorder}, {args.reorder_records} records), "
            f"{what} is finalised after {args.idle} without new records")
    unchecked = ("not checked by a replica (they need a rank's whole stream or the run's order: run check or watch, "
                 f"or replicas with --scope run, for them): {', '.join(unchecked_rules())}" if args.scope == "trace"
                 else "each run checked whole, every rule (the replica must receive every span of a run: "
                      "routing_key attributes, routing_attributes [cptrace.run_id])")
    note(f"listening on {scheme}://{bound_host!s}:{bound_port}{TRACES_PATH} (OTLP/HTTP protobuf), /metrics, /healthz, "
         f"/readyz; {when}; {unchecked}")
    if gserver is not None:
        note(f"OTLP/gRPC on {gserver[1]}")
    note(f"receivers: {guard.describe()}")
    if guard.needs_token and not guard.tls:
        note("an auth token without TLS: anyone on the network path can read it (add --tls-cert/--tls-key)")

    done = threading.Event()

    def on_signal(*_a: object) -> None:
        done.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not done.wait(0.5):
            pass
    finally:
        checker.begin_stop()
        server.shutdown()       # no new request; those in flight finish (their answer: 503 while stopping)
        if gserver is not None:
            gserver[0].stop(grace=5.0).wait(10.0)
        server.server_close()
        checker.stop()
        for sig, h in old.items():
            signal.signal(sig, h)
    c = rx.counters
    line, code = checker.summary()
    note(f"stopped: {c.spans_received} spans received, {c.spans_rejected} not readable, {c.spans_dropped} turned "
         f"away with 503, {line}")
    return code
