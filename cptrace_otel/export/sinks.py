"""The export stack's two protocols, a transport's result type and the network sink.

* A :class:`Transport` sends one encoded ``ExportTraceServiceRequest`` and says what happened: a
  :class:`SendResult` ``(outcome, detail)``, outcome :attr:`Outcome.OK`, :attr:`Outcome.RETRY` (the backend is
  unreachable or overloaded: keep the request) or :attr:`Outcome.DROP` (the request itself is bad: sending it again
  cannot help). ``Outcome`` is a ``str`` enum and ``SendResult`` a named tuple, so a result also compares equal to
  the plain ``("ok", "")`` tuples a test double may return; :class:`~.spool.ReliableSender` accepts both.
* A :class:`Sink` takes span groups ``[(resource attributes, spans), ...]`` (:meth:`Sink.export`) and has
  :meth:`~Sink.flush`, :meth:`~Sink.close` (True when everything was delivered or written) and :meth:`~Sink.stats`.
  :class:`OtlpSink` (network: encode, then deliver through a ReliableSender) and
  :class:`~.files.OtlpJsonFileSink` are sinks; :class:`~.files.LogLinesSink` has the same flush/close/stats but
  takes Records (``write``), not spans.

The sinks are built by :func:`cptrace_otel.export.stack.open_sinks`. This module imports no implementation (the
encoder is imported when an :class:`OtlpSink` is made), so the transports and the sender can import it.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, Protocol, Sequence


class Outcome(str, enum.Enum):
    """What became of one request."""

    OK = "ok"
    RETRY = "retry"
    DROP = "drop"


class SendResult(NamedTuple):
    """A transport's answer for one request: the outcome and a human-readable detail ("" when OK)."""

    outcome: Outcome
    detail: str = ""


SENT = SendResult(Outcome.OK)


class Transport(Protocol):
    """Sends encoded requests to one backend (OTLP/HTTP or gRPC). Not thread-safe: one sender thread uses it."""

    url: str

    def send(self, body: bytes) -> SendResult: ...

    def close(self) -> None: ...


SpanGroups = Sequence[tuple[dict[str, Any], Sequence[Any]]]


class Sink(Protocol):
    """Where finished spans go."""

    def export(self, groups: SpanGroups) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> bool: ...

    def stats(self) -> dict[str, Any]: ...


class OtlpSink:
    """Network sink: each export is encoded into requests (split below the size limit) and queued on a
    :class:`~.spool.ReliableSender`, which delivers them in order and spools them across outages."""

    def __init__(self, sender: Any) -> None:
        from .otlp import encode_requests

        self.sender = sender
        self._encode = encode_requests

    @property
    def url(self) -> str:
        return self.sender.url

    @property
    def spool_dir(self) -> str:
        return self.sender.spool.dir

    def export(self, groups: SpanGroups) -> None:
        submit = self.sender.submit
        for body in self._encode(groups):
            submit(body)

    def flush(self, timeout_s: float) -> bool:
        return self.sender.flush(timeout_s)

    def close(self, timeout_s: float) -> bool:
        return self.sender.close(timeout_s)

    def stats(self) -> dict[str, Any]:
        return self.sender.stats()
