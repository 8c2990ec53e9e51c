"""OTLP/gRPC transport (grpcio): ``TraceService/Export`` with already-encoded request bytes.

The method is called through a channel stub with an identity request serializer instead of
``TraceServiceStub.Export``: the stub would need a parsed message, and our requests are already encoded bytes
(see :mod:`cptrace_otel.export.otlp`); the wire call is the same (``/opentelemetry.proto.collector.trace.v1.
TraceService/Export``, response decoded with ``ExportTraceServiceResponse``). Endpoint ``http://host:port`` means an
insecure channel, ``https://`` a TLS one; headers go out as metadata; compression gzip by default.
UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED and RESOURCE_EXHAUSTED-by-rate are retried by the spooling
sender; others drop the request.
"""

from __future__ import annotations

from typing import Sequence
from urllib.parse import urlparse

from .sinks import SENT, Outcome, SendResult

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """``(host:port, secure)`` for an OTLP gRPC endpoint (scheme optional; any path is ignored)."""
    if "://" not in endpoint:
        return endpoint.rstrip("/"), False
    u = urlparse(endpoint)
    port = u.port or (443 if u.scheme == "https" else 4317)
    return f"{u.hostname}:{port}", u.scheme == "https"


class GrpcTransport:
    """A :class:`~.sinks.Transport`: unary ``Export`` calls on one channel."""

    def __init__(self, endpoint: str, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 compression: str = "gzip") -> None:
        import grpc  # lazily: optional dependency, and never in the traced process
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self._grpc = grpc
        target, secure = grpc_target(endpoint)
        self.url = ("https://" if secure else "http://") + target
        opts = [
            ("grpc.max_send_message_length", 64 << 20),
            # Reconnect quickly after a backend restart (gRPC's default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 300),
            ("grpc.min_reconnect_backoff_ms", 300),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if secure:
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(), options=opts)
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
            return SENT
        except self._grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = f"gRPC {getattr(code, 'name', code)}: {e.details() if hasattr(e, 'details') else e}"
            if code == self._grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in detail:
                return SendResult(Outcome.DROP, detail)  # an oversize request will never fit: do not re-send it
            return SendResult(Outcome.RETRY if code in self._retry else Outcome.DROP, detail)

    def close(self) -> None:
        try:
            self._channel.close()
        except Exception:
            pass
