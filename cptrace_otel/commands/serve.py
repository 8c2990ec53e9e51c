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
* ``GET /metrics``: Prometheus text (see :func:`metrics_text`); ``GET /healthz``: 200 while the process runs;
  ``GET /readyz``: 200 while it accepts data (not stopping, queue not full), else 503.

TLS and authentication (:mod:`~cptrace_otel.analyze.serve_guard`): ``--tls-cert``/``--tls-key`` put both receivers
on TLS, ``--tls-client-ca`` requires client certificates (mutual TLS), ``--auth-token-file``/``--auth-token-env``
require the ``--auth-header`` value on OTLP requests and ``/metrics`` (401 / ``UNAUTHENTICATED``, counted;
``/healthz`` and ``/readyz`` stay open): the server side of the exporter's ``OTEL_EXPORTER_OTLP_*`` settings.

The checking thread owns a :class:`~cptrace_otel.analyze.serve_state.ServeState`: records held by trace, each trace
checked when idle for ``--idle`` (default 30s); with ``--live``, records are fed to the per-rank rules as they arrive
through a per-rank reorder window (``--reorder``, ``--reorder-records``), so such a finding is reported as soon as the
record that decides it is checked (the cross-rank C3-C5 are then not reported: the ranks are fed in arrival order);
memory bounded by
``--max-nodes`` and ``--max-runs`` (past them the
least recently changed is finalised early and counted). Each finding is printed once on stdout (the line ``watch``
prints), written back into its node's trace as a span (``--endpoint``,
:class:`~cptrace_otel.analyze.finding_sinks.WriteBack`) and posted to Alertmanager (``--alertmanager``,
:class:`~cptrace_otel.analyze.finding_sinks.Alerts`, posted at once by its own thread (at most every 0.25s) and
re-posted every ``--alert-interval``, so a slow Alertmanager never holds the checking back).

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
from typing import TYPE_CHECKING, Any, TextIO

from ..model.exits import EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

if TYPE_CHECKING:
    from ..analyze.serve_state import ServeState

_PFX = "cptrace-otel serve"
LOST = "state lost: held when a previous process of this replica died, its records were not checked"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
ALERT_GAP = 0.25   # seconds between two posts of new findings to Alertmanager


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``serve`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
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
    s.add_argument("--reorder-records", type=int, default=4096, metavar="N",
                   help="records per rank and trace in the reorder window (default 4096); a record that comes "
                        "behind it is not checked and is counted")
    s.add_argument("--live", action="store_true",
                   help="check each record as it arrives (through the reorder window): a finding of the per-rank "
                        "rules is reported within --reorder, not --idle, late; the cross-rank C3-C5 are then not "
                        "reported (the ranks are fed in arrival order)")
    s.add_argument("--max-nodes", type=int, default=100_000, metavar="N",
                   help="traces held at once; past it the least recently changed is checked early (default 100000)")
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


class Counters:
    """What the HTTP threads count (under the server's lock)."""

    def __init__(self) -> None:
        self.requests = 0
        self.spans_received = 0
        self.spans_rejected = 0
        self.spans_dropped = 0     # in requests answered 503 (the collector sends them again)
        self.requests_dropped = 0
        self.bad_requests = 0      # 400/411/413/415
        self.unauthorized = 0      # 401 / UNAUTHENTICATED: the auth header missing or wrong


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
    metric("cptrace_serve_traces_held", "gauge", "traces held (state size)", [("", len(state.traces))])
    metric("cptrace_serve_records_held", "gauge", "records held", [("", state.records_held)])
    metric("cptrace_serve_runs_held", "gauge", "runs held", [("", len(state.runs))])
    metric("cptrace_serve_queue_requests", "gauge", "requests waiting for the checking thread", [("", queued)])
    lag = (now_ns - state.newest_ts) / 1e9 if state.newest_ts else 0.0
    metric("cptrace_serve_lag_seconds", "gauge", "now minus the newest record time seen", [("", float(lag))])
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    import gzip
    import queue
    import signal
    import threading
    import time
    import zlib
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ..analyze import links, serve_guard
    from ..analyze.finding_sinks import FindingSinks, SinkSetupError
    from ..analyze.otlp_intake import Intake, Undecodable, decode
    from ..analyze.serve_journal import Journal, JournalError, default_dir
    from ..analyze.serve_state import ServeState, TraceState, unchecked_rules
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
        alert_every = parse_duration(args.alert_interval)
        parse_duration(args.alert_hold)   # said here, before listening (the sinks read it again)
        bad = links.bad_link_base(args)
        if bad:
            raise ValueError(bad)
        if args.queue < 1 or args.max_body < 1 or args.max_nodes < 1 or args.max_runs < 1:
            raise ValueError("--queue, --max-body, --max-nodes and --max-runs must be at least 1")
        guard = serve_guard.from_args(args)
        try:
            tls_ctx = guard.ssl_context()
        except OSError as e:   # ssl.SSLError included: a PEM that does not parse, a key that does not match
            raise ValueError(f"--tls-cert/--tls-key/--tls-client-ca: {getattr(e, 'reason', None) or e}") from None
        if args.reorder_records < 0:
            raise ValueError("--reorder-records must be at least 0")
    except ValueError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_USAGE
    try:
        sinks = FindingSinks(args, alert_every, args.jaeger_url, out, note)
    except SinkSetupError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_UNREACHABLE

    fresh = threading.Event()   # a finding not posted yet (wakes the alert thread)

    def report(tr: TraceState, found: list) -> None:   # the checking thread, under `lock`
        sinks.report(tr.run_id, tr, found)
        if found and sinks.alerts is not None:
            fresh.set()

    journal = None
    state_dir = args.state_dir or (default_dir(port) if port else "off")
    if state_dir != "off":
        journal = Journal(state_dir, note=note)
        try:
            lost = journal.open()
        except JournalError as e:
            print(f"{_PFX}: {e}", file=err)
            return EXIT_USAGE
    state = ServeState(report, idle_s=idle, max_nodes=args.max_nodes, max_runs=args.max_runs, note=note,
                       journal=journal, unchecked=sinks.unchecked, live=args.live, window=args.reorder_records,
                       window_s=reorder)
    if journal is not None:
        note(f"journal in {state_dir}: {len(lost)} trace(s) held when the previous process died, reported "
             f"UNCHECKED{f'; {journal.skipped} unreadable line(s) skipped' if journal.skipped else ''}")
        for run_id, trace_id, records in lost:
            state.lost(run_id, trace_id, LOST, records)
    else:
        note("no journal (--state-dir off, or an ephemeral port): after a kill what was held is lost silently")
    lock = threading.Lock()        # the state: the checking thread changes it, /metrics reads it
    counters = Counters()
    clock = threading.Lock()       # the counters (HTTP threads)
    work: queue.Queue[Intake | None] = queue.Queue(maxsize=args.queue)
    stopping = threading.Event()
    max_body = args.max_body

    def accept(intake: Intake) -> str | None:
        """Queue a decoded request for the checking thread; None when queued, else why not (the answer is then
        503 / UNAVAILABLE, so the collector keeps and resends the data) and the spans are counted as dropped."""
        why = "stopping" if stopping.is_set() else None
        if why is None:
            try:
                work.put_nowait(intake)
            except queue.Full:
                why = "queue full"
            else:   # before the 200: once answered, the collector forgets these spans
                if journal is not None:
                    journal.opened(_records_by_trace(intake.spans))
        with clock:
            if why:
                counters.requests_dropped += 1
                counters.spans_dropped += intake.spans_seen
            else:
                counters.requests += 1
                counters.spans_received += intake.spans_seen
                counters.spans_rejected += intake.rejected
        return why

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "cptrace-otel-serve"

        def log_message(self, format: str, *a: Any) -> None:   # no line per request on stderr
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, why: str, close: bool = False) -> None:
            with clock:
                counters.bad_requests += 1
            if close:   # the body was not read: the connection cannot carry another request
                self.close_connection = True
            self._send(code, (why + "\n").encode(), headers={"Connection": "close"} if close else None)

        def _authorized(self) -> bool:
            """False (and answered 401) without the auth header, or, with mutual TLS, without a client certificate.
            Called once the body is read: closing a TLS connection with a body unread resets it, and the client
            would see no answer but a reset (retried)."""
            if not guard.allows_peer(self.connection):
                why = "a client certificate is required (mutual TLS)"
            elif not guard.allows(self.headers.get(guard.header)):
                why = f"missing or wrong {guard.header!r} header"
            else:
                return True
            with clock:
                counters.unauthorized += 1
            self._send(401, f"{why}\n".encode(), headers={"WWW-Authenticate": "Bearer"})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if not self._authorized():
                    return
                with lock:
                    text = metrics_text(state, counters, work.qsize(), time.time_ns())
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                if stopping.is_set() or work.full():
                    self._send(503, b"not ready: stopping or queue full\n")
                else:
                    self._send(200, b"ready\n")
            else:
                self._send(404, b"not found\n")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                return self._refuse(404, f"not found: POST {TRACES_PATH}", close=True)
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != PROTOBUF:
                return self._refuse(415, f"unsupported content type {ctype[:60]!r}: send {PROTOBUF}", close=True)
            size = self.headers.get("Content-Length")
            if size is None or not size.strip().isdigit():
                return self._refuse(411, "Content-Length required", close=True)
            n = int(size)
            if n > max_body:
                return self._refuse(413, f"body of {n} bytes is over the limit of {max_body} (--max-body)",
                                    close=True)
            body = self.rfile.read(n)
            if len(body) < n:
                return self._refuse(400, "body cut short", close=True)
            if not self._authorized():   # before it is inflated or decoded
                return
            enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if enc == "gzip":
                try:
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    body = d.decompress(body, max_body + 1)
                    if len(body) > max_body:
                        return self._refuse(413, f"body inflates past the limit of {max_body} bytes (--max-body)")
                    if not d.eof:
                        raise zlib.error("incomplete gzip stream")
                except (zlib.error, gzip.BadGzipFile) as e:
                    return self._refuse(400, f"gzip body does not inflate: {e}")
            elif enc != "identity":
                return self._refuse(415, f"unsupported Content-Encoding {enc[:40]!r}")
            try:
                intake = decode(body)
            except Undecodable as e:
                return self._refuse(400, str(e))
            busy = accept(intake)
            if busy:
                self._send(503, f"busy ({busy}): retry\n".encode(), headers={"Retry-After": "1"})
            else:
                self._send(200, _response(intake), PROTOBUF)

    class Server(ThreadingHTTPServer):
        request_queue_size = 128   # connections waiting to be accepted: a collector opens several at once
        daemon_threads = True

        def finish_request(self, request: Any, client_address: Any) -> None:
            if tls_ctx is None:
                return super().finish_request(request, client_address)
            request.settimeout(30.0)   # the handshake in the connection's thread: a slow client holds no other
            conn = tls_ctx.wrap_socket(request, server_side=True)   # takes the socket over (closed on failure)
            try:
                conn.settimeout(None)
                super().finish_request(conn, client_address)
            finally:
                conn.close()

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass   # a failed handshake or a client gone: its connection only, no traceback on stderr

    try:
        server = Server((host, port), Handler)
    except OSError as e:
        print(f"{_PFX}: cannot listen on {host}:{port}: {e.strerror or e}", file=err)
        return EXIT_UNREACHABLE
    gserver = None

    def count_unauthorized() -> None:
        with clock:
            counters.unauthorized += 1

    if grpc_at is not None:
        try:
            gserver = _grpc_server(grpc_at, max_body, accept, guard, count_unauthorized)
        except Exception as e:   # the port is taken, or grpcio is missing
            server.server_close()
            print(f"{_PFX}: cannot serve OTLP/gRPC on {args.grpc}: {type(e).__name__}: {e}", file=err)
            return EXIT_UNREACHABLE

    def check_loop() -> None:
        # live, a record waits at most --reorder plus one tick before it is checked
        tick = min(1.0, max(0.05, idle / 4), max(0.05, reorder / 2) if args.live else 1.0)
        while True:
            got = True
            try:
                item = work.get(timeout=tick)
            except queue.Empty:
                got, item = False, None
            if got and item is None:   # the end mark, queued after everything else
                return
            try:
                with lock:
                    if item is not None:
                        state.add(item.spans)
                    state.sweep()
                if journal is not None:
                    journal.tick()
            except Exception as e:   # a bug: said and counted, the thread goes on (a dead one would stall intake)
                state.errors += 1
                note(f"internal error while checking (some records NOT checked): {type(e).__name__}: "
                     f"{str(e)[:200]}")

    def alert_loop() -> None:
        # a new finding is posted at once (at most every ALERT_GAP s: a burst of findings is one post), and every
        # alert again each --alert-interval (Alertmanager resolves an alert not re-posted)
        while not stopping.is_set():
            fresh.wait(alert_every)
            fresh.clear()
            if stopping.is_set():
                return
            sinks.post_alerts()
            stopping.wait(min(ALERT_GAP, alert_every))

    checker = threading.Thread(target=check_loop, name="cptrace-serve-check", daemon=True)
    checker.start()
    poster = threading.Thread(target=alert_loop, name="cptrace-serve-alerts", daemon=True)
    if sinks.alerts is not None:
        poster.start()
    web = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="cptrace-serve-http",
                           daemon=True)
    web.start()
    bound_host, bound_port = server.server_address[:2]
    scheme = "https" if guard.tls else "http"
    when = (f"a trace is checked after {args.idle} without new records" if not args.live else
            f"records are checked as they arrive (reorder window {args.reorder}), a trace is finalised after "
            f"{args.idle} without new records")
    note(f"listening on {scheme}://{bound_host!s}:{bound_port}{TRACES_PATH} (OTLP/HTTP protobuf), /metrics, /healthz, "
         f"/readyz; {when}; not checked by a replica (they need "
         f"a rank's whole stream or the run's order: run check or watch for them): "
         f"{', '.join(unchecked_rules(args.live))}")
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
        stopping.set()
        fresh.set()             # the alert thread ends (the last post is made below)
        server.shutdown()       # no new request; those in flight finish (their answer: 503 while stopping)
        if gserver is not None:
            gserver[0].stop(grace=5.0).wait(10.0)
        server.server_close()
        work.put(None)          # after everything queued
        checker.join()
        with lock:
            state.finish_all()
        if journal is not None:
            journal.close()
        sinks.post_alerts()
        for sig, h in old.items():
            signal.signal(sig, h)
        sinks.close()
    st = state.stats()
    suppressed = ", ".join(f"{r} ({n})" for r, n in sorted(state.suppressed.items())) or "none"
    note(f"stopped: {counters.spans_received} spans received, {counters.spans_rejected} not readable, "
         f"{counters.spans_dropped} turned away with 503, {st['events_checked']} records checked, {sinks.total} "
         f"finding(s), {st['late_records']} late record(s) not checked, {st['past_window']} behind the reorder "
         f"window not checked, {st['finalised_early']} trace(s) checked early, {st['check_errors']} trace(s) NOT "
         f"checked (an error, said above), {st['unchecked']} trace(s) UNCHECKED (state lost at a kill, or moved) and "
         f"{st['lost_records']} later record(s) of them; UNCHECKED here (a rank's whole stream or the run's "
         f"order needed): {', '.join(unchecked_rules(args.live))}; their findings on "
         f"one trace, not trusted and not reported: {suppressed}")
    # no finding but traces whose state was lost: not a clean run (as check's 4 when rules could not run)
    return EXIT_FINDINGS if sinks.total else EXIT_INCOMPLETE if st["unchecked"] else EXIT_OK


def _records_by_trace(spans: Any) -> list[tuple[str, str, int]]:
    """(run id, trace id, records) of each trace in a decoded request, what the journal writes for it."""
    from collections import Counter

    n: Counter[tuple[str, str]] = Counter()
    for sp in spans:
        n[(sp.run_id, sp.trace_id)] += len(sp.events)
    return [(r, t, k) for (r, t), k in n.items()]


def _response(intake: Any) -> bytes:
    """The ``ExportTraceServiceResponse`` for one accepted request (``partial_success`` when spans were rejected)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    resp = ExportTraceServiceResponse()
    if intake.rejected:
        resp.partial_success.rejected_spans = intake.rejected
        resp.partial_success.error_message = "; ".join(intake.reasons)[:1000]
    return resp.SerializeToString()


def _grpc_server(at: tuple[str, int], max_body: int, accept: Any, guard: Any,
                 on_refused: Any) -> tuple[Any, str]:
    """An OTLP/gRPC ``TraceService`` on ``at`` feeding ``accept`` (started), with ``guard``'s TLS and auth
    (a :class:`~cptrace_otel.analyze.serve_guard.Guard`); (server, "host:port" bound)."""
    from concurrent import futures

    import grpc

    from ..analyze.otlp_intake import Undecodable, decode

    # The request's bytes, not a parsed message (no deserializer): decode() reads them with the C reader where it is
    # built, as the HTTP receiver does; grpcio has already undone any gRPC compression.
    def export(body: bytes, context: Any) -> bytes:
        try:
            intake = decode(body)
        except Undecodable as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        busy = accept(intake)
        if busy:   # retryable: the collector keeps it in its sending queue and sends it again
            context.abort(grpc.StatusCode.UNAVAILABLE, f"busy ({busy}): retry")
        return _response(intake)

    opts = [("grpc.max_receive_message_length", max_body)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="cptrace-serve-grpc"),
                         options=opts, interceptors=guard.grpc_interceptors(on_refused))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)}),))
    creds = guard.grpc_credentials()
    port = (server.add_secure_port(f"{at[0]}:{at[1]}", creds) if creds is not None
            else server.add_insecure_port(f"{at[0]}:{at[1]}"))
    if not port:
        raise OSError(f"cannot bind {at[0]}:{at[1]}")
    server.start()
    return server, f"{at[0]}:{port}"
