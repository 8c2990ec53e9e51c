"""The server side of the exporter's TLS and authentication, for ``cptrace-otel serve``'s receivers (OTLP/HTTP and
OTLP/gRPC alike).

The exporter (``OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE``, ``CLIENT_CERTIFICATE``/``CLIENT_KEY``, ``HEADERS``)
verifies the receiver with a CA, may present a client certificate, and sends headers. Here the receiver's half:

* ``--tls-cert``/``--tls-key`` (PEM): both receivers speak TLS (HTTPS; gRPC with server credentials).
* ``--tls-client-ca`` (PEM): mutual TLS, a client must present a certificate this CA signed. gRPC: else the
  handshake fails. HTTP: a certificate that does not verify fails the handshake; none at all is let through the
  handshake so that ``/healthz`` and ``/readyz`` answer probes that carry none (a kubelet's), and every other
  request of that connection is answered 401 (:meth:`Guard.allows_peer`).
* ``--auth-token-file PATH`` or ``--auth-token-env VAR``: every OTLP request and ``/metrics`` must carry the header
  ``--auth-header`` (default ``Authorization``) with exactly this value (e.g. ``Bearer <token>``; the file's
  trailing newline is not part of it). Compared in constant time (:func:`hmac.compare_digest`); a request without it,
  or with another value, is answered 401 (HTTP: its body, bounded by ``--max-body``, is read, so the answer reaches
  the client, but never inflated or decoded) or ``UNAUTHENTICATED`` (gRPC: the message is not parsed). The
  value is never printed: not in a message, an answer or ``/metrics``. ``/healthz`` and ``/readyz`` stay open (a
  kubelet probe carries no token; they say only ok / not ready). ``/metrics`` needs the token: it names the runs and
  their violation codes; Prometheus sends it with its scrape config's ``authorization`` (``credentials_file``).

A token without TLS is allowed (a loopback or a private network the operator trusts) and said once on stderr: on a
plaintext connection anyone on the path reads the token.
"""

from __future__ import annotations

import argparse
import hmac
import os
from typing import Any

TOKEN_MAX = 16 << 10   # a token file is read up to this (a header value, not a document)


class Guard:
    """What ``serve``'s receivers require of a client (see the module doc). Built by :func:`from_args`; no TLS and
    no token when none was asked for (then :meth:`allows` is always True and nothing is wrapped)."""

    def __init__(self, cert: str | None = None, key: str | None = None, client_ca: str | None = None,
                 header: str = "authorization", token: bytes | None = None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.header = header.lower()
        self._token = token

    def __repr__(self) -> str:   # never the token
        return (f"Guard(tls={self.tls}, mtls={self.client_ca is not None}, header={self.header!r}, "
                f"token={'set' if self._token is not None else 'none'})")

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def allows(self, value: str | bytes | None) -> bool:
        """True when a request whose ``header`` value is ``value`` (None: absent) may pass; constant time in the
        value's content."""
        if self._token is None:
            return True
        if value is None:
            return False
        got = value if isinstance(value, bytes) else _raw(value)
        return hmac.compare_digest(got, self._token)

    def describe(self) -> str:
        """One line for stderr: what is required (never the token)."""
        parts = [("mutual TLS (client certificates of the given CA)" if self.client_ca else "TLS") if self.tls
                 else "plaintext"]
        if self._token is not None:
            parts.append(f"header {self.header!r} required on OTLP and /metrics (/healthz, /readyz open)")
        return ", ".join(parts)

    def ssl_context(self) -> Any:
        """The HTTPS server's :class:`ssl.SSLContext` (TLS 1.2+), or None without TLS. Raises ``OSError`` /
        ``ssl.SSLError`` for a file that cannot be read or does not match."""
        if not self.tls:
            return None
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)   # type: ignore[arg-type]
        if self.client_ca:
            ctx.load_verify_locations(self.client_ca)
            # OPTIONAL, not REQUIRED: a certificate sent is verified all the same; none lets the probes through,
            # and allows_peer() refuses everything else on such a connection
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def allows_peer(self, conn: Any) -> bool:
        """True unless mutual TLS is asked for and the TLS connection ``conn`` presented no client certificate (one
        that did not verify never got this far: the handshake failed)."""
        if not self.client_ca:
            return True
        getpeercert = getattr(conn, "getpeercert", None)
        return bool(getpeercert and getpeercert())

    def grpc_credentials(self) -> Any:
        """gRPC server credentials, or None without TLS (an insecure port)."""
        if not self.tls:
            return None
        import grpc

        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ca = read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials([(read(self.key), read(self.cert))],   # type: ignore[arg-type]
                                           root_certificates=ca, require_client_auth=ca is not None)

    def grpc_interceptors(self, on_refused: Any = lambda: None) -> list[Any]:
        """A server interceptor answering ``UNAUTHENTICATED`` to a call without the header (before its message is
        parsed; ``on_refused()`` is called for each); none when no token is required."""
        if self._token is None:
            return []
        import grpc

        guard = self

        def refuse(_request: Any, context: Any) -> Any:
            on_refused()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {guard.header!r} metadata")

        # the raw bytes are not parsed: no deserializer
        denied = grpc.unary_unary_rpc_method_handler(refuse)

        class Interceptor(grpc.ServerInterceptor):
            def intercept_service(self, continuation: Any, details: Any) -> Any:
                value = next((v for k, v in (details.invocation_metadata or ()) if k == guard.header), None)
                return continuation(details) if guard.allows(value) else denied

        return [Interceptor()]


def _raw(value: str) -> bytes:
    """A header value's bytes as sent: ``http.server`` decodes them as Latin-1 (gRPC metadata is ASCII)."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``serve``'s TLS and authentication flags."""
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="serve OTLP/HTTP and OTLP/gRPC over TLS with this certificate (chain), with --tls-key")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--tls-client-ca", default=None, metavar="PEM",
                   help="mutual TLS: require client certificates signed by this CA")
    p.add_argument("--auth-header", default="Authorization", metavar="NAME",
                   help="the header (gRPC metadata) that must carry the token (default Authorization)")
    p.add_argument("--auth-token-file", default=None, metavar="PATH",
                   help="require --auth-header with this file's content (e.g. 'Bearer <token>'; trailing newline "
                        "dropped) on OTLP and /metrics")
    p.add_argument("--auth-token-env", default=None, metavar="VAR",
                   help="as --auth-token-file, the value read from this environment variable")


def from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Guard:
    """The :class:`Guard` the flags ask for. ``ValueError`` (a usage error, never naming the token) when they do not
    fit together or a file cannot be read."""
    env = dict(os.environ) if env is None else env
    cert, key, ca = args.tls_cert, args.tls_key, args.tls_client_ca
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if ca is not None and cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", ca)):
        if path is not None and not os.access(path, os.R_OK):
            raise ValueError(f"{flag} {path!r}: not a readable file")
    if args.auth_token_file and args.auth_token_env:
        raise ValueError("--auth-token-file and --auth-token-env: give one")
    token: bytes | None = None
    if args.auth_token_file:
        try:
            with open(args.auth_token_file, "rb") as f:
                raw = f.read(TOKEN_MAX + 1)
        except OSError as e:
            raise ValueError(f"--auth-token-file {args.auth_token_file!r}: {e.strerror or type(e).__name__}") from None
        if len(raw) > TOKEN_MAX:
            raise ValueError(f"--auth-token-file {args.auth_token_file!r}: over {TOKEN_MAX} bytes (not a token)")
        token = raw.rstrip(b"\r\n")
        where = f"--auth-token-file {args.auth_token_file!r}"
    elif args.auth_token_env:
        val = env.get(args.auth_token_env)
        token = None if val is None else val.encode("utf-8", "surrogateescape")
        where = f"--auth-token-env {args.auth_token_env}"
        if token is None:
            raise ValueError(f"{where}: the variable is not set")
    if token is not None and (not token or b"\n" in token or b"\r" in token):
        raise ValueError(f"{where}: the value is empty or spans lines (a header value is one line)")
    header = (args.auth_header or "").strip()
    if not header or any(c in header for c in " :\r\n\t"):
        raise ValueError(f"--auth-header {header[:40]!r}: not a header name")
    return Guard(cert, key, ca, header, token)
