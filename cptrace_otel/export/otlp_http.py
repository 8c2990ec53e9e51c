"""OTLP/HTTP protobuf transport: POST ``ExportTraceServiceRequest`` bytes to the traces URL.

Honours the configured endpoint, headers, timeout, compression (gzip by default) and TLS files (an ``https://``
URL is verified against ``OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`` when set, else the system CAs; a client
certificate and key give mTLS). :meth:`HttpTransport.send` classifies the outcome for the spooling sender (a
:class:`~.sinks.SendResult`): ``OK``; ``RETRY`` (connection refused or reset, timeout, 408, 429, 502, 503, 504: the
backend is unreachable or overloaded, keep the request; ``retry_after`` holds a 429/503 ``Retry-After`` in seconds);
``DROP`` (any other status: the request itself is bad, sending it again cannot help); ``FATAL`` (a TLS handshake or
header error: the configuration is wrong). Every detail is masked (:func:`cptrace_otel.model.config.mask`).
"""

from __future__ import annotations

import email.utils
import gzip
import time
from typing import Any, Sequence

from ..model.config import mask, mask_url, secrets_of
from .sinks import SENT, Outcome, SendResult
from .tls import HandshakeStrikes, check_headers, is_tls_config_error, load_tls, tls_hint

RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})
MAX_RETRY_AFTER_S = 120.0   # a longer Retry-After is honoured as this (the spool keeps the requests meanwhile)


def parse_retry_after(raw: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP date), capped at
    :data:`MAX_RETRY_AFTER_S`; None when absent or unparsable."""
    if not raw:
        return None
    raw = raw.strip()
    try:
        s = float(int(raw))
    except ValueError:
        try:
            dt = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if dt is None:
            return None
        s = dt.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, s), MAX_RETRY_AFTER_S)


class HttpTransport:
    """A :class:`~.sinks.Transport`: POST to ``url`` over one keep-alive session. Raises
    :class:`~.sinks.ConfigError` for bad headers or TLS files."""

    def __init__(self, url: str, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 compression: str = "gzip", tls: Any = None) -> None:
        import requests  # lazily: the traced process never imports this module

        check_headers(headers)
        files = load_tls(tls) if tls is not None else None
        self._url = url
        self.url = mask_url(url)
        self._secrets = secrets_of(url, headers)
        self.timeout_s = timeout_s
        self.gzip = compression == "gzip"
        self.retry_after: float | None = None
        self._strikes = HandshakeStrikes()
        self._requests = requests
        self._session = requests.Session()
        # Given on every call: a Session attribute loses to REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE in the environment.
        self._tls_kw: dict[str, Any] = {}
        if files is not None:
            ca_p, cert_p, key_p = files.paths
            if ca_p:
                self._tls_kw["verify"] = ca_p
            if cert_p:
                self._tls_kw["cert"] = (cert_p, key_p)
        h = {"Content-Type": "application/x-protobuf", "User-Agent": "cptrace-otel"}
        if self.gzip:
            h["Content-Encoding"] = "gzip"
        for k, v in headers:
            h[k] = v
        self._headers = h

    def send(self, body: bytes) -> SendResult:
        self.retry_after = None
        data = gzip.compress(body, compresslevel=1) if self.gzip else body
        rq = self._requests
        try:
            r = self._session.post(self._url, data=data, headers=self._headers, timeout=self.timeout_s,
                                   **self._tls_kw)
        except rq.exceptions.SSLError as e:
            detail = self._mask(f"{type(e).__name__}: {_short(e)}")
            if is_tls_config_error(detail):
                return SendResult(Outcome.FATAL, f"{tls_hint()}: {detail}")
            fatal = self._strikes.hit(detail)
            return SendResult(Outcome.FATAL, fatal) if fatal else SendResult(Outcome.RETRY, detail)
        except (rq.exceptions.InvalidHeader, rq.exceptions.InvalidURL, rq.exceptions.MissingSchema,
                rq.exceptions.InvalidSchema, ValueError) as e:
            return SendResult(Outcome.FATAL, self._mask(f"configuration error: {type(e).__name__}: {_short(e)}"))
        except rq.RequestException as e:
            self._strikes.reset()
            return SendResult(Outcome.RETRY, self._mask(f"{type(e).__name__}: {_short(e)}"))
        self._strikes.reset()
        if 200 <= r.status_code < 300:
            return SENT
        detail = self._mask(f"HTTP {r.status_code} {r.text[:200]!r}")
        if r.status_code in (429, 503):
            self.retry_after = parse_retry_after(r.headers.get("Retry-After"))
        return SendResult(Outcome.RETRY if r.status_code in RETRYABLE_STATUS else Outcome.DROP, detail)

    def _mask(self, text: str) -> str:
        return mask(text, self._secrets)

    def close(self) -> None:
        try:
            self._session.close()
        except Exception:
            pass


def _short(e: BaseException) -> str:
    s = str(e)
    return s if len(s) <= 200 else s[:200] + "..."
