"""OTLP/HTTP protobuf transport: POST ``ExportTraceServiceRequest`` bytes to the traces URL.

Honours the configured endpoint, headers, timeout, compression (gzip by default) and TLS files (an ``https://``
URL is verified against ``OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`` when set, else the system CAs; a client
certificate and key give mTLS). :meth:`HttpTransport.send` classifies the outcome for the spooling sender (a
:class:`~.sinks.SendResult`): ``OK``; ``RETRY`` (connection refused or reset, timeout, 408, 429, 502, 503, 504: the
backend is unreachable or overloaded, keep the request; ``retry_after`` holds a 429/503 ``Retry-After`` in seconds);
``DROP`` (any other status: the request itself is bad, sending it again cannot help; a 401/403 is an authentication
failure, :func:`~.sinks.is_auth_failure`); ``FATAL`` (a TLS handshake or header error: the configuration is wrong).
Every detail is masked (:func:`cptrace_otel.model.config.mask`), a body or ``Location`` echoing a credential too.

Credentials go only to the origin they were configured for (scheme, host and port of the endpoint): URL userinfo
(``http://user:pass@host``) is sent as HTTP basic auth, beside the OTLP headers, and redirects are never followed by
``requests``. A 307/308 to the same origin is followed here (at most :data:`MAX_REDIRECTS` hops, with the body and
the headers); a redirect to any other origin (another host, port or scheme, e.g. ``127.0.0.2``) or a 301/302/303
(which would turn the POST into a GET) is not followed: the request is not sent there and the answer is ``FATAL``,
a configuration error reported once with the masked ``Location`` (the endpoint should name the final URL), so
neither the spans nor the headers ever reach that other origin. ``redirects_refused`` counts them.
"""

from __future__ import annotations

import base64
import email.utils
import gzip
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from ..model.config import Config, mask, mask_url, secrets_of
from .sinks import SENT, Outcome, SendResult
from .tls import HandshakeStrikes, check_headers, is_tls_config_error, load_tls, tls_hint

RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})
MAX_RETRY_AFTER_S = 120.0   # a longer Retry-After is honoured as this (the spool keeps the requests meanwhile)
MAX_REDIRECTS = 3           # same-origin 307/308 hops followed for one request
REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_BODY_MASKED = 1 << 16   # characters of an error body masked, of which 200 are quoted


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, the default port made explicit: what credentials are bound to."""
    u = urlsplit(url)
    scheme = (u.scheme or "").lower()
    try:
        port = u.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (u.hostname or "").lower(), port


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its userinfo, and the ``Authorization`` value (HTTP basic) that userinfo stands for (None
    when there is none)."""
    u = urlsplit(url)
    if "@" not in u.netloc:
        return url, None
    userinfo, _, hostport = u.netloc.rpartition("@")
    user, _, pw = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(pw)}".encode()).decode("ascii")
    return urlunsplit((u.scheme, hostport, u.path, u.query, u.fragment)), "Basic " + token


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


def gzip_level1() -> Callable[[bytes], bytes]:
    """The gzip member of a request body at level 1: ISA-L's deflate (the ``isal`` package, a dependency where it
    has wheels) when it imports, else the standard library's zlib. On the exporter's OTLP bodies ISA-L is 5x as fast
    (0.24 against 1.22 µs of CPU per exported event, 1.5 against 0.3 GB/s) for 8% more bytes (ratio 8.4 against
    9.1): the compression was a sixth of the exporter's instructions per event (``bench/exporter_instructions.py``).
    Any gzip reader decodes both."""
    try:
        from isal import igzip
    except ImportError:
        return lambda body: gzip.compress(body, compresslevel=1)
    return lambda body: igzip.compress(body, compresslevel=1)


class HttpTransport:
    """A :class:`~.sinks.Transport`: POST to ``url`` over one keep-alive session. Raises
    :class:`~.sinks.ConfigError` for bad headers or TLS files."""

    def __init__(self, url: str, headers: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0,
                 compression: str = "gzip", tls: Config | None = None) -> None:
        import requests  # lazily: the traced process never imports this module

        check_headers(headers)
        files = load_tls(tls) if tls is not None else None
        self._url, basic = split_userinfo(url)
        self._origin = origin(self._url)
        self.secrets = secrets_of(url, headers)  # (with the basic credential's forms: user:password in base64)
        self.url = mask(url, self.secrets)
        self.redirects_refused = 0
        self.timeout_s = timeout_s
        self.gzip = compression == "gzip"
        self._gzip = gzip_level1() if self.gzip else None
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
        if basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
            h["Authorization"] = basic  # (an explicit Authorization header wins over the URL's userinfo)
        for k, v in headers:
            h[k] = v
        self._headers = h

    def send(self, body: bytes) -> SendResult:
        self.retry_after = None
        data = self._gzip(body) if self._gzip is not None else body
        rq = self._requests
        try:
            r = self._post(data)
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
        if isinstance(r, SendResult):
            return r
        if 200 <= r.status_code < 300:
            return SENT
        # Masked before it is cut and quoted: a secret the body echoes is never cut into an unmasked piece or
        # escaped into a form the masker does not know.
        detail = self._mask(f"HTTP {r.status_code} {self._mask(r.text[:MAX_BODY_MASKED])[:200]!r}")
        if r.status_code in (429, 503):
            self.retry_after = parse_retry_after(r.headers.get("Retry-After"))
        return SendResult(Outcome.RETRY if r.status_code in RETRYABLE_STATUS else Outcome.DROP, detail)

    def _post(self, data: bytes) -> Any:
        """POST ``data``, following same-origin 307/308 redirects only (see the module doc); the response, or a
        FATAL :class:`~.sinks.SendResult` for a redirect that is not followed."""
        url = self._url
        for _hop in range(MAX_REDIRECTS + 1):
            r = self._session.post(url, data=data, headers=self._headers, timeout=self.timeout_s,
                                   allow_redirects=False, **self._tls_kw)
            if r.status_code not in REDIRECT_STATUS:
                return r
            loc = r.headers.get("Location") or ""
            target = urljoin(url, loc)
            r.close()
            if r.status_code in (307, 308) and origin(target) == self._origin:
                url = target
                continue
            self.redirects_refused += 1
            why = ("to another origin" if origin(target) != self._origin else
                   f"with HTTP {r.status_code} (a POST would become a GET)")
            return SendResult(Outcome.FATAL, self._mask(
                f"configuration error: HTTP {r.status_code} redirect {why} ({mask_url(target)}) not followed: "
                f"credentials and spans go only to {self.url}; set the endpoint to the final URL"))
        self.redirects_refused += 1
        return SendResult(Outcome.FATAL, self._mask(
            f"configuration error: more than {MAX_REDIRECTS} redirects from {self.url}; not followed"))

    def _mask(self, text: str) -> str:
        return mask(text, self.secrets)

    def close(self) -> None:
        try:
            self._session.close()
        except Exception:
            pass


def _short(e: BaseException) -> str:
    s = str(e)
    return s if len(s) <= 200 else s[:200] + "..."
