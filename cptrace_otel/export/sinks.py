"""The export stack's two protocols, a transport's result type and the network sink.

* A :class:`Transport` sends one encoded ``ExportTraceServiceRequest`` and says what happened: a
  :class:`SendResult` ``(outcome, detail)``, outcome :attr:`Outcome.OK`, :attr:`Outcome.RETRY` (the backend is
  unreachable or overloaded: keep the request), :attr:`Outcome.DROP` (the request itself is bad: sending it again
  cannot help) or :attr:`Outcome.FATAL` (a configuration error: no request will ever go through; the sender reports
  it once and drops everything, counted). A transport may set ``retry_after`` (seconds, or None) after a RETRY: the
  backend asked for that pause (HTTP ``Retry-After``). ``Outcome`` is a ``str`` enum and ``SendResult`` a named tuple,
  so a result also compares equal to the plain ``("ok", "")`` tuples a test double may return;
  :class:`~.spool.ReliableSender` accepts both.
* A :class:`Sink` takes span groups ``[(resource attributes, spans), ...]`` (:meth:`Sink.export`) and has
  :meth:`~Sink.flush`, :meth:`~Sink.close` (True when everything was delivered or written) and :meth:`~Sink.stats`;
  ``waits`` says whether flushing may wait on a backend, ``what`` names it in messages. A sink may also take the
  Records of every batch (the optional per-record hook ``write(records)``) and count what reached a final state
  itself (``settled_records()``). :class:`OtlpSink` (network: encode, then deliver through a ReliableSender),
  :class:`~.file_sinks.OtlpJsonFileSink` and :class:`~.file_sinks.LogLinesSink` (Records as upstream log lines; no
  spans) are sinks; the exporter worker and ``ingest`` hold a list of them and know none by name.

The sinks are built by :func:`cptrace_otel.export.stack.open_sinks`. This module imports no implementation (the
encoder is imported when an :class:`OtlpSink` is made), so the transports and the sender can import it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..model.exits import CptraceError

if TYPE_CHECKING:
    from ..model.spans import Span


class Outcome(str, enum.Enum):
    """What became of one request."""

    OK = "ok"
    RETRY = "retry"
    DROP = "drop"
    FATAL = "fatal"   # a configuration error (bad certificate, bad header): no request can ever go through


class ConfigError(CptraceError):
    """A permanent configuration error of a sink (certificate files, TLS handshake, header syntax): reported once
    with a clear message, never retried. Its text never holds a secret (see :func:`cptrace_otel.model.config.mask`)."""


class SendResult(NamedTuple):
    """A transport's answer for one request: the outcome and a human-readable detail ("" when OK)."""

    outcome: Outcome
    detail: str = ""


SENT = SendResult(Outcome.OK)

# The details of the transports' authentication failures (HTTP 401/403, gRPC UNAUTHENTICATED/PERMISSION_DENIED):
# the backend answered and refused the credentials; it is not unreachable.
_AUTH_DETAIL = ("HTTP 401 ", "HTTP 403 ", "gRPC UNAUTHENTICATED:", "gRPC PERMISSION_DENIED:")


def is_auth_failure(detail: str) -> bool:
    """Whether a transport's :class:`SendResult` detail is an authentication failure: the backend refused the
    credentials (HTTP 401 or 403, gRPC ``UNAUTHENTICATED`` or ``PERMISSION_DENIED``)."""
    return detail.startswith(_AUTH_DETAIL)


class Transport(Protocol):
    """Sends encoded requests to one backend (OTLP/HTTP or gRPC). Not thread-safe: one sender thread uses it."""

    url: str

    def send(self, body: bytes) -> SendResult: ...

    def close(self) -> None: ...


SpanGroups = Sequence[tuple[dict[str, Any], Sequence[Any]]]


class Sink(Protocol):
    """Where the worker's output goes (see the module doc). Optional: ``write(records)``, the per-record hook (the
    Records of each batch, before their spans exist); ``settled_records()``, the records handed to the sink that
    reached a final state (a sink without it is settled by flushing)."""

    waits: bool   # flush and close may wait on a backend: done last, and not on the worker's idle timer

    @property
    def what(self) -> str:
        """How messages name it ("OTLP file", "log file", the endpoint ...)."""

    def export(self, groups: SpanGroups) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> bool: ...

    def stats(self) -> dict[str, Any]: ...


class _SpoolDir(Protocol):
    @property
    def dir(self) -> str: ...


class Sender(Protocol):
    """What an :class:`OtlpSink` queues its requests on: a :class:`~.spool.ReliableSender` (a Protocol because that
    module imports this one)."""

    @property
    def url(self) -> str: ...

    @property
    def spool(self) -> _SpoolDir: ...

    @property
    def settled_records(self) -> int: ...

    def submit(self, body: bytes, records: int = 0) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def adopt_orphans(self) -> int: ...   # (open_sinks calls it)


class OtlpSink:
    """Network sink: each export is encoded into requests (split below the size limit) and queued on a
    :class:`~.spool.ReliableSender`, which delivers them in order and spools them across outages."""

    waits = True

    def __init__(self, sender: Sender) -> None:
        from .otlp_proto import encode_requests

        self.sender = sender
        self._encode = encode_requests
        self.repaired_values = 0
        self.lost_records = 0   # records of spans that could not be encoded even after repair

    @property
    def url(self) -> str:
        return self.sender.url

    @property
    def what(self) -> str:
        return f"OTLP endpoint {self.url}"

    @property
    def spool_dir(self) -> str:
        return self.sender.spool.dir

    def export(self, groups: SpanGroups) -> None:
        """Encode and queue ``groups``. A span that does not encode (a value no encoder takes, such as an int of
        more than 4,300 digits) costs only its bad values: they become ``(err:<ExceptionType>)`` strings
        (``repaired_values``); a span that still does not encode is dropped, its events counted
        (``lost_records``)."""
        submit = self.sender.submit
        counts: list[int] = []
        try:
            bodies = self._encode(groups, records=counts)
        except Exception:
            bodies, counts = self._encode_repaired(groups)
        for body, n in zip(bodies, counts, strict=False):
            submit(body, n)

    def _encode_repaired(self, groups: SpanGroups) -> tuple[list[bytes], list[int]]:
        from .otlp_proto import encode_span

        fixed = []
        for resource, spans in groups:
            keep = []
            for sp in spans:
                try:
                    encode_span(sp)
                except Exception:
                    self.repaired_values += repair_span(sp)
                    try:
                        encode_span(sp)
                    except Exception:
                        self.lost_records += len(sp.events)
                        continue
                keep.append(sp)
            fixed.append((resource, keep))
        counts: list[int] = []
        return self._encode(fixed, records=counts), counts

    def flush(self, timeout_s: float) -> bool:
        return self.sender.flush(timeout_s)

    def close(self, timeout_s: float) -> bool:
        return self.sender.close(timeout_s)

    def stats(self) -> dict[str, Any]:
        st = self.sender.stats()
        st["lost_records"] = st.get("lost_records", 0) + self.lost_records
        if self.repaired_values:
            st["repaired_values"] = self.repaired_values
        return st

    def settled_records(self) -> int:
        """Records handed to this sink that reached a final state (delivered, spooled, or lost and counted)."""
        return self.sender.settled_records + self.lost_records


def _encodable(v: object) -> object:
    """``v`` if its attribute encoding works, else its ``(err:<ExceptionType>)`` stand-in (records.render_other's)."""
    if type(v) is int and not -(1 << 63) <= v < (1 << 63):
        try:
            str(v)
        except Exception as e:
            return f"(err:{type(e).__name__})"
    return v


def repair_span(sp: Span) -> int:
    """Replace the values of ``sp`` (its attributes, its events' fields) that cannot be encoded; how many."""
    n = 0
    # an event's attributes are built lazily from its typed fields (attrs.EventAttrs): repair those
    for attrs in [sp.attrs] + [getattr(a, "fields", a) for _, _, a in sp.events]:
        for k, v in list(attrs.items()):
            r = _encodable(v)
            if r is not v:
                attrs[k] = r
                n += 1
    return n
