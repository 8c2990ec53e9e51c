"""Hostile backends that echo the credentials they are sent: an HTTP server (``http.server`` on 127.0.0.1) and a
gRPC server (grpcio), each a real server on a loopback port. Used to prove that no credential a server echoes
reaches the user.

The HTTP server answers every GET and POST by the first segment of its path:

* ``/m401/...``: 401 with a body echoing the credential (raw, percent-encoded, base64)
* ``/m403/...``: 403, the same body
* ``/m500/...``: 500, the same body
* ``/mother/...``: 307 to another origin (another port) with ``?token=<credential, percent-encoded>``
* ``/msame/...``: 307 to ``/m401/...`` on the same origin, with the token in the query; the target answers 401
* ``/mok/...``: 200 (an empty OTLP answer or ``{"data": []}``)

The credential is what the request carried: the token after ``Bearer``, or the password of a ``Basic`` credential.
The gRPC server aborts every ``TraceService/Export`` with ``UNAUTHENTICATED`` and details echoing the token.
"""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, quote_plus

from tests.helpers import free_port

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def credential_of(authorization: str) -> str:
    """The credential a server would echo: the bearer token, or a basic credential's password."""
    scheme, _, rest = authorization.partition(" ")
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(rest).decode().partition(":")[2]
        except ValueError:
            return rest
    return rest or authorization


def echo_text(cred: str) -> str:
    """What the hostile servers say: the credential in each form a server may quote it."""
    b64 = base64.b64encode(cred.encode()).decode()
    return f"invalid token {cred} (sent as {quote_plus(cred)}, {quote(cred, safe='')}, {b64})"


def forms(secret: str) -> list[str]:
    """The forms a test looks for in every output."""
    return sorted({secret, quote(secret, safe=""), quote_plus(secret), base64.b64encode(secret.encode()).decode()})


class EchoHttp:
    """The echoing HTTP server (see the module doc); ``base`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.other_port = free_port()   # nobody listens there: another origin
        self.seen: list[str] = []
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                srv.seen.append(self.path)
                cred = credential_of(self.headers.get("Authorization") or "")
                mode = self.path.split("/")[1]
                rest = self.path.split("?")[0][len(mode) + 1:]
                if mode in ("mother", "msame"):
                    host = f"http://127.0.0.1:{srv.other_port}" if mode == "mother" else ""
                    target = f"{host}/m401{rest}" if mode == "msame" else f"{host}{rest}"
                    self.send_response(307)
                    self.send_header("Location", f"{target}?token={quote(cred, safe='')}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "mok":
                    body = b"{\"data\": []}" if self.command == "GET" else b""
                    status = 200
                else:
                    body = echo_text(cred).encode()
                    status = {"m500": 500, "m403": 403}.get(mode, 401)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> EchoHttp:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EchoGrpc:
    """A gRPC server whose ``Export`` fails ``UNAUTHENTICATED`` with details echoing the bearer token it got."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc

        self.port = free_port()

        def export(_req: bytes, context: Any) -> bytes:
            md = dict(context.invocation_metadata() or ())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, echo_text(credential_of(md.get("authorization", ""))))
            return b""

        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                                           response_serializer=None)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        if self._server.add_insecure_port(f"127.0.0.1:{self.port}") != self.port:
            raise RuntimeError(f"cannot bind 127.0.0.1:{self.port}")
        self._server.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> EchoGrpc:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
