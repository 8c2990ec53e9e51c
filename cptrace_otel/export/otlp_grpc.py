"""OTLP/gRPC transport (grpcio): ``TraceService/Export`` with already-encoded request bytes.

The method is called through a channel stub with an identity request serializer instead of
``TraceServiceStub.Export``: the stub would need a parsed message, and our requests are already encoded bytes
(see :mod:`cptrace_otel.export.otlp_proto`); the wire call is the same (``/opentelemetry.proto.collector.trace.v1.
TraceService/Export``, response decoded with ``ExportTraceServiceResponse``). Endpoint ``http://host:port`` means an
insecure channel, ``https://`` a TLS one; an endpoint without a scheme is insecure unless
``OTEL_EXPORTER_OTLP_[TRACES_]INSECURE=false`` or a CA certificate is configured (the spec's INSECURE flag applies
to scheme-less endpoints only). TLS uses ``..._CERTIFICATE`` as root CAs (else gRPC's defaults) and
``..._CLIENT_CERTIFICATE``/``..._CLIENT_KEY`` for mTLS. Headers go out as metadata; compression gzip by default.
UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED and RESOURCE_EXHAUSTED-by-rate are retried by the spooling
sender, except a failed TLS handshake (FATAL: a configuration error); others drop the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlparse

from ..model.config import Config, mask, mask_url, secrets_of
from .sinks import SENT, Outcome, SendResult
from .tls import HandshakeStrikes, check_headers, is_tls_config_error, load_tls, tls_hint

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def grpc_target(endpoint: str, insecure: bool | None = None) -> tuple[str, bool]:
    """``(host:port, secure)`` for an OTLP gRPC endpoint (scheme optional; any path is ignored). ``insecure``
    (the INSECURE flag; None when unset) decides for an endpoint without a scheme: secure only when False."""
    if "://" not in endpoint:
        return endpoint.rstrip("/"), insecure is False
    u = urlparse(endpoint)
    port = u.port or (443 if u.scheme == "https" else 4317)
    return f"{u.hostname}:{port}", u.scheme == "https"


class GrpcTransport:
    """A :class:`~.sinks.Transport`: unary ``Export`` calls on one channel."""

    def __init__(self, endpoint: str, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 compression: str = "gzip", tls: Config | None = None) -> None:
        import grpc  # lazily: optional dependency, and never in the traced process
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        check_headers(headers)
        files = load_tls(tls) if tls is not None else None
        self._grpc = grpc
        insecure = getattr(tls, "insecure", None)
        if insecure is None and files is not None and files.ca is not None:
            insecure = False  # a CA was given for a scheme-less endpoint: TLS is meant
        target, secure = grpc_target(endpoint, insecure)
        self.url = mask_url(("https://" if secure else "http://") + target)
        self.secrets = secrets_of(endpoint, headers)
        self.retry_after: float | None = None
        self._secure = secure
        self._strikes = HandshakeStrikes()
        opts = [
            ("grpc.max_send_message_length", 64 << 20),
            # Reconnect quickly after a backend restart (gRPC's default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 300),
            ("grpc.min_reconnect_backoff_ms", 300),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if secure:
            creds = grpc.ssl_channel_credentials(
                root_certificates=files.ca if files else None, private_key=files.key if files else None,
                certificate_chain=files.cert if files else None)
            self._channel = grpc.secure_channel(target, creds, options=opts)
        else:
            self._channel = grpc.insecure_channel(target, options=opts)
        self._call = self._channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=lambda b: b,
            response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
        )
        self._metadata = tuple((k.lower(), v) for k, v in headers)
        self._compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        self.timeout_s = timeout_s
        c = grpc.StatusCode
        self._retry = {c.UNAVAILABLE, c.DEADLINE_EXCEEDED, c.ABORTED, c.CANCELLED, c.RESOURCE_EXHAUSTED}

    def send(self, body: bytes) -> SendResult:
        try:
            self._call(body, timeout=self.timeout_s, metadata=self._metadata or None, compression=self._compression)
            self._strikes.reset()
            return SENT
        except self._grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = mask(f"gRPC {getattr(code, 'name', code)}: {e.details() if hasattr(e, 'details') else e}",
                          self.secrets)
            if code == self._grpc.StatusCode.UNAVAILABLE and is_tls_config_error(detail):
                return SendResult(Outcome.FATAL, f"{tls_hint()}: {detail}")
            if self._secure and code == self._grpc.StatusCode.UNAVAILABLE and "Socket closed" in detail:
                fatal = self._strikes.hit(detail)  # closed in the handshake, or a server going away: see tls.py
                if fatal:
                    return SendResult(Outcome.FATAL, fatal)
            else:
                self._strikes.reset()
            if code == self._grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in detail:
                return SendResult(Outcome.DROP, detail)  # an oversize request will never fit: do not re-send it
            return SendResult(Outcome.RETRY if code in self._retry else Outcome.DROP, detail)
        except ValueError as e:  # e.g. metadata grpc refuses
            return SendResult(Outcome.FATAL, mask(f"configuration error: {type(e).__name__}: {e}", self.secrets))

    def close(self) -> None:
        try:
            self._channel.close()
        except Exception:
            pass
