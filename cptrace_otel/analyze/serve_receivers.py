"""``cptrace-otel serve``'s receivers: OTLP/HTTP (with ``/metrics``, ``/healthz``, ``/readyz``) and OTLP/gRPC, behind
one :class:`~cptrace_otel.analyze.serve_guard.Guard` (TLS, mutual TLS, the auth header).

Contract: a request is read (its body bounded by ``max_body``, inflated too), authenticated, then decoded in the
request's own thread (:func:`~cptrace_otel.analyze.otlp_intake.decode`) and handed to ``offer``, which either queues
it (returns None: the answer is 200 with an ``ExportTraceServiceResponse``, ``partial_success`` naming the spans that
could not be read) or says why not (the answer is 503 with ``Retry-After`` / gRPC ``UNAVAILABLE``: the collector keeps
the data and sends it again). Nothing here checks records or holds state beyond :class:`Counters`, which count every
answer: spans received, rejected, turned away (dropped, with the collector retrying them), bad requests (400, 411,
413, 415) and refused ones (401 / ``UNAUTHENTICATED``). A client's failure (a handshake, a connection gone) ends its
connection only, without a traceback. See :mod:`cptrace_otel.commands.serve` for the answers of each route.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .otlp_intake import Intake, Undecodable, decode
from .serve_guard import Guard

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"


class Counters:
    """What the receivers' threads count (under :attr:`lock`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.spans_received = 0
        self.spans_rejected = 0
        self.spans_dropped = 0     # in requests answered 503 (the collector sends them again)
        self.requests_dropped = 0
        self.bad_requests = 0      # 400/411/413/415
        self.unauthorized = 0      # 401 / UNAUTHENTICATED: the auth header missing or wrong

    def took(self, intake: Intake, busy: str | None) -> None:
        """Count one decoded request: accepted (``busy`` None) or turned away."""
        with self.lock:
            if busy:
                self.requests_dropped += 1
                self.spans_dropped += intake.spans_seen
            else:
                self.requests += 1
                self.spans_received += intake.spans_seen
                self.spans_rejected += intake.rejected

    def refused(self) -> None:
        with self.lock:
            self.unauthorized += 1

    def bad(self) -> None:
        with self.lock:
            self.bad_requests += 1


class Receivers:
    """The two receivers over one ``offer(intake) -> None | why not``. ``ready()`` answers ``/readyz``,
    ``metrics()`` the body of ``/metrics``; ``tls_ctx`` is ``guard``'s server context (None: plaintext)."""

    def __init__(self, guard: Guard, tls_ctx: Any, max_body: int, offer: Callable[[Intake], str | None],
                 ready: Callable[[], bool], metrics: Callable[[], str]) -> None:
        self.guard, self.tls_ctx, self.max_body = guard, tls_ctx, max_body
        self.offer, self.ready, self.metrics = offer, ready, metrics
        self.counters = Counters()

    def accept(self, intake: Intake) -> str | None:
        """Offer a decoded request and count it; None when queued, else why not."""
        busy = self.offer(intake)
        self.counters.took(intake, busy)
        return busy

    def http_server(self, host: str, port: int) -> ThreadingHTTPServer:
        """The OTLP/HTTP server bound on ``host:port`` (OSError when it cannot be), not serving yet."""
        return _Server((host, port), _Handler, self)

    def grpc_server(self, at: tuple[str, int]) -> tuple[Any, str]:
        """An OTLP/gRPC ``TraceService`` on ``at``, started; (server, "host:port" bound). Raises when the port is
        taken or grpcio is missing."""
        from concurrent import futures

        import grpc

        # The request's bytes, not a parsed message (no deserializer): decode() reads them with the C reader where
        # it is built, as the HTTP receiver does; grpcio has already undone any gRPC compression.
        def export(body: bytes, context: Any) -> bytes:
            try:
                intake = decode(body)
            except Undecodable as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            busy = self.accept(intake)
            if busy:   # retryable: the collector keeps it in its sending queue and sends it again
                context.abort(grpc.StatusCode.UNAVAILABLE, f"busy ({busy}): retry")
            return response(intake)

        opts = [("grpc.max_receive_message_length", self.max_body)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="cptrace-serve-grpc"),
                             options=opts, interceptors=self.guard.grpc_interceptors(self.counters.refused))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)}),))
        creds = self.guard.grpc_credentials()
        port = (server.add_secure_port(f"{at[0]}:{at[1]}", creds) if creds is not None
                else server.add_insecure_port(f"{at[0]}:{at[1]}"))
        if not port:
            raise OSError(f"cannot bind {at[0]}:{at[1]}")
        server.start()
        return server, f"{at[0]}:{port}"


def response(intake: Intake) -> bytes:
    """The ``ExportTraceServiceResponse`` for one accepted request (``partial_success`` when spans were rejected)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    resp = ExportTraceServiceResponse()
    if intake.rejected:
        resp.partial_success.rejected_spans = intake.rejected
        resp.partial_success.error_message = "; ".join(intake.reasons)[:1000]
    return resp.SerializeToString()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128   # connections waiting to be accepted: a collector opens several at once
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: Any, rx: Receivers) -> None:
        self.rx = rx
        super().__init__(addr, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls_ctx = self.rx.tls_ctx
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cptrace-otel-serve"
    server: _Server

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
        self.server.rx.counters.bad()
        if close:   # the body was not read: the connection cannot carry another request
            self.close_connection = True
        self._send(code, (why + "\n").encode(), headers={"Connection": "close"} if close else None)

    def _authorized(self) -> bool:
        """False (and answered 401) without the auth header, or, with mutual TLS, without a client certificate.
        Called once the body is read: closing a TLS connection with a body unread resets it, and the client would
        see no answer but a reset (retried)."""
        guard = self.server.rx.guard
        if not guard.allows_peer(self.connection):
            why = "a client certificate is required (mutual TLS)"
        elif not guard.allows(self.headers.get(guard.header)):
            why = f"missing or wrong {guard.header!r} header"
        else:
            return True
        self.server.rx.counters.refused()
        self._send(401, f"{why}\n".encode(), headers={"WWW-Authenticate": "Bearer"})
        return False

    def do_GET(self) -> None:
        rx = self.server.rx
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            if self._authorized():
                self._send(200, rx.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            if rx.ready():
                self._send(200, b"ready\n")
            else:
                self._send(503, b"not ready: stopping or queue full\n")
        else:
            self._send(404, b"not found\n")

    def do_POST(self) -> None:
        max_body = self.server.rx.max_body
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
            return self._refuse(413, f"body of {n} bytes is over the limit of {max_body} (--max-body)", close=True)
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
        busy = self.server.rx.accept(intake)
        if busy:
            self._send(503, f"busy ({busy}): retry\n".encode(), headers={"Retry-After": "1"})
        else:
            self._send(200, response(intake), PROTOBUF)
