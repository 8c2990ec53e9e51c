"""The export stack, built once for the exporter worker and ``ingest`` alike: :func:`open_sinks` chooses gRPC or HTTP
(:func:`open_transport`), wraps the transport in the spooling sender (:class:`~.spool.ReliableSender`) as an
:class:`~.sinks.OtlpSink`, and opens the OTLP JSON-lines and log-lines file sinks. A sink that cannot be set up is a
:class:`SinkError`, raised or handed to the caller's ``on_error``; each caller words its own message.

Transports, sender and file sinks are imported only when asked for (gRPC and requests are heavy and optional).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model.config import Config, mask, secrets_of
from ..model.exits import CptraceError
from .sinks import ConfigError, OtlpSink, Outcome, Sink, SpanGroups, Transport, is_auth_failure


class SinkError(CptraceError):
    """A sink could not be set up. ``kind``: ``"otlp"`` (the transport or sender), ``"unreachable"`` (the probe
    request failed; ``cause`` is its detail), ``"auth"`` (the probe's answer was an authentication failure: HTTP
    401/403, gRPC ``UNAUTHENTICATED``/``PERMISSION_DENIED``), ``"config"`` (a permanent configuration error: bad
    TLS files or header syntax, ``cause`` a :class:`~.sinks.ConfigError`), ``"file"`` (the OTLP JSON-lines file),
    ``"log"`` (the log-lines file). ``target`` is the endpoint, URL or path, and ``cause`` its text, both masked
    (:func:`cptrace_otel.model.config.mask`): whoever prints them prints no secret."""

    def __init__(self, kind: str, target: str, cause: object, secrets: tuple[str, ...] = ()) -> None:
        target = mask(target, secrets)
        if isinstance(cause, str):
            cause = mask(cause, secrets)
        elif kind not in ("file", "log"):  # an exception's text may quote the URL or a header: keep str and repr
            cause = _MaskedText(mask(str(cause), secrets), mask(repr(cause), secrets))
        super().__init__(f"{kind} {target}: {cause}")
        self.kind = kind
        self.target = target
        self.cause = cause


class _MaskedText(str):
    """An exception's masked ``str``, whose ``repr`` is the exception's masked ``repr`` (messages use either)."""

    _rep: str

    def __new__(cls, text: str, rep: str) -> _MaskedText:
        o = str.__new__(cls, text)
        o._rep = rep
        return o

    def __repr__(self) -> str:
        return self._rep


def open_transport(endpoint: str, protocol: str, cfg: Config) -> Transport:
    """The transport for ``endpoint`` (``protocol`` ``"grpc"`` or HTTP), with ``cfg``'s headers, timeout and
    compression. The endpoint is used as given (:func:`cptrace_otel.model.config.traces_url` makes the HTTP URL)."""
    if protocol == "grpc":
        from .otlp_grpc import GrpcTransport

        return GrpcTransport(endpoint, cfg.headers, cfg.timeout_s, cfg.compression, tls=cfg)
    from .otlp_http import HttpTransport

    return HttpTransport(endpoint, cfg.headers, cfg.timeout_s, cfg.compression, tls=cfg)


def open_sinks(cfg: Config, *, endpoint: str | None = None, protocol: str = "http/protobuf", spool_dir: str = "",
               file: str | None = None, log_file: str | None = None, probe: bool = False, adopt_orphans: bool = False,
               on_error: Callable[[SinkError], None] | None = None) -> list[Sink]:
    """Open the sinks asked for, in this order (the order of the list): OTLP to ``endpoint`` (spooled in
    ``spool_dir``), the OTLP JSON-lines ``file``, the upstream ``log_file`` (ranks from ``cfg``).

    ``probe``: send an empty request first and fail unless the backend answers OK: ``"unreachable"`` (no answer,
    or a status worth retrying), ``"auth"`` (the credentials refused), ``"otlp"`` (any other error status).
    ``adopt_orphans``: the OTLP sender replays the spools that finished processes left behind for its endpoint (the
    exporter worker: one per traced process, a spool folder per pid). A sink that cannot be set up raises
    :class:`SinkError`, or, with ``on_error``, is reported there and left out (the others are still opened)."""

    def failed(err: SinkError) -> None:
        if on_error is None:
            raise err
        on_error(err)

    sinks: list[Sink] = []
    if endpoint:
        secrets = secrets_of(endpoint, getattr(cfg, "headers", ()))
        try:
            otlp = _open_otlp(cfg, endpoint, protocol, spool_dir, probe)
            if adopt_orphans:
                otlp.sender.adopt_orphans()
            sinks.append(otlp)
        except SinkError as e:
            failed(e)
        except ConfigError as e:
            failed(SinkError("config", endpoint, str(e), secrets))
            if on_error is not None:  # reported once; its spans are counted as dropped, never retried
                sinks.append(RefusingSink(mask(endpoint, secrets), str(e)))
        except Exception as e:
            failed(SinkError("otlp", endpoint, e, secrets))
    if file:
        from .file_sinks import OtlpJsonFileSink

        try:
            sinks.append(OtlpJsonFileSink(file))
        except OSError as e:
            failed(SinkError("file", file, e))
    if log_file:
        from .file_sinks import LogLinesSink

        try:
            sinks.append(LogLinesSink(log_file, cfg.cp_rank, cfg.tp_rank))
        except OSError as e:
            failed(SinkError("log", log_file, e))
    return sinks


class RefusingSink:
    """The network sink of a configuration that cannot work (:class:`~.sinks.ConfigError`, already reported): it
    sends nothing, counts every span handed to it as dropped and answers False to flush and close."""

    waits = True

    def __init__(self, url: str, error: str) -> None:
        self.url = url
        self.what = f"OTLP endpoint {url}"
        self.error = error
        self.dropped_spans = 0
        self.lost_records = 0   # the records (span events) of those spans: lost, counted, settled

    def export(self, groups: SpanGroups) -> None:
        for _res, spans in groups:
            self.dropped_spans += len(spans)
            self.lost_records += sum(len(getattr(sp, "events", ())) for sp in spans)

    def settled_records(self) -> int:
        return self.lost_records

    def flush(self, timeout_s: float) -> bool:
        return False

    def close(self, timeout_s: float) -> bool:
        return False

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "config_error": self.error, "otlp_dropped_spans": self.dropped_spans,
                "lost_records": self.lost_records}


def _open_otlp(cfg: Config, endpoint: str, protocol: str, spool_dir: str, probe: bool) -> OtlpSink:
    from .spool import ReliableSender

    transport = open_transport(endpoint, protocol, cfg)
    if probe:
        res, detail = transport.send(b"")  # an empty ExportTraceServiceRequest: is anyone there?
        if res == Outcome.FATAL:
            raise SinkError("config", transport.url, detail)
        if res == Outcome.DROP:   # it answered, with an error: not unreachable
            raise SinkError("auth" if is_auth_failure(detail) else "otlp", transport.url, detail)
        if res != Outcome.OK:
            raise SinkError("unreachable", transport.url, detail)
    max_bytes = int(getattr(cfg, "spool_max_bytes", 512 << 20))  # CPTRACE_SPOOL_MAX_BYTES
    return OtlpSink(ReliableSender(transport, spool_dir, max_bytes=max_bytes))
