"""OTLP/HTTP protobuf transport: POST ``ExportTraceServiceRequest`` bytes to the traces URL.

Honours the configured endpoint, headers, timeout and compression (gzip by default). :meth:`HttpTransport.send`
classifies the outcome for the spooling sender (a :class:`~.sinks.SendResult`): ``OK``; ``RETRY`` (connection
refused or reset, timeout, 408, 429, 502, 503, 504: the backend is unreachable or overloaded, keep the request);
``DROP`` (any other status: the request itself is bad, sending it again cannot help).
"""

from __future__ import annotations

import gzip
from typing import Sequence

from .sinks import SENT, Outcome, SendResult

RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})


class HttpTransport:
    """A :class:`~.sinks.Transport`: POST to ``url`` over one keep-alive session."""

    def __init__(self, url: str, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 compression: str = "gzip") -> None:
        import requests  # lazily: the traced process never imports this module

        self.url = url
        self.timeout_s = timeout_s
        self.gzip = compression == "gzip"
        self._requests = requests
        self._session = requests.Session()
        h = {"Content-Type": "application/x-protobuf", "User-Agent": "cptrace-otel"}
        if self.gzip:
            h["Content-Encoding"] = "gzip"
        for k, v in headers:
            h[k] = v
        self._headers = h

    def send(self, body: bytes) -> SendResult:
        data = gzip.compress(body, compresslevel=1) if self.gzip else body
        try:
            r = self._session.post(self.url, data=data, headers=self._headers, timeout=self.timeout_s)
        except self._requests.RequestException as e:
            return SendResult(Outcome.RETRY, f"{type(e).__name__}: {_short(e)}")
        if 200 <= r.status_code < 300:
            return SENT
        detail = f"HTTP {r.status_code} {r.text[:200]!r}"
        return SendResult(Outcome.RETRY if r.status_code in RETRYABLE_STATUS else Outcome.DROP, detail)

    def close(self) -> None:
        try:
            self._session.close()
        except Exception:
            pass


def _short(e: BaseException) -> str:
    s = str(e)
    return s if len(s) <= 200 else s[:200] + "..."
