"""Transport settings checked before the first request: TLS files and header syntax.

Both transports (:mod:`.otlp_http`, :mod:`.otlp_grpc`) call these when they are built, so a mistake in the
configuration is a :class:`~.sinks.ConfigError` with a clear message at start-up (reported once, nothing retried),
never an "outage" that spools for ever. Messages name variables and files, never a header value.

TLS variables (the OpenTelemetry spec's names; ``TRACES_`` before the generic form, resolved in :mod:`..config`):
``OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`` (PEM CA bundle that verifies the backend), ``..._CLIENT_CERTIFICATE``
and ``..._CLIENT_KEY`` (PEM, for mTLS; both or neither).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from .sinks import ConfigError

if TYPE_CHECKING:
    from ..model.config import Config

# RFC 7230 token for names; a value must not hold a control character (a CR/LF would split the request).
_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

VARS = "OTEL_EXPORTER_OTLP_[TRACES_]"


class TlsFiles(NamedTuple):
    """PEM file contents (None where not configured)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None
    paths: tuple[str | None, str | None, str | None]


def check_headers(headers: Sequence[tuple[str, str]]) -> None:
    """Raise :class:`ConfigError` (naming the header, not its value) for a name or value HTTP/gRPC would refuse."""
    for k, v in headers:
        if not _NAME_RE.match(k):
            raise ConfigError(f"OTLP header name {k[:40]!r} is not a valid header name ({VARS}HEADERS)")
        if _BAD_VALUE_RE.search(v) or v[:1] in (" ", "\t"):
            raise ConfigError(f"OTLP header {k!r} has an invalid value (a line break, control character or "
                              f"leading whitespace; value not shown) ({VARS}HEADERS)")
        try:
            v.encode("latin-1")
        except UnicodeEncodeError:
            raise ConfigError(f"OTLP header {k!r} has a value that is not Latin-1 text (value not shown)") from None


def _read(path: str, var: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {VARS}{var} file {path!r}: {e.strerror or e}") from None


def load_tls(cfg: Config) -> TlsFiles:
    """Read and check the configured PEM files: each must be readable, the CA must load as a CA bundle and the
    client certificate must match its key. Raises :class:`ConfigError`."""
    ca_p = getattr(cfg, "certificate", None)
    cert_p = getattr(cfg, "client_certificate", None)
    key_p = getattr(cfg, "client_key", None)
    if bool(cert_p) != bool(key_p):
        raise ConfigError(f"{VARS}CLIENT_CERTIFICATE and {VARS}CLIENT_KEY must be set together (mTLS)")
    ca = _read(ca_p, "CERTIFICATE") if ca_p else None
    cert = _read(cert_p, "CLIENT_CERTIFICATE") if cert_p else None
    key = _read(key_p, "CLIENT_KEY") if key_p else None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is not None:
        try:
            ctx.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(f"{VARS}CERTIFICATE file {ca_p!r} is not a PEM CA certificate ({e})") from None
    if cert_p:
        try:
            ctx.load_cert_chain(cert_p, key_p)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(f"{VARS}CLIENT_CERTIFICATE {cert_p!r} and {VARS}CLIENT_KEY {key_p!r} do not load as a "
                              f"PEM certificate and matching unencrypted key ({e})") from None
    return TlsFiles(ca, cert, key, (ca_p, cert_p, key_p))


_TLS_WORDS = ("CERTIFICATE", "certificate", "WRONG_VERSION_NUMBER", "Ssl handshake failed", "SSL_ERROR_SSL",
              "handshake failure", "HANDSHAKE_FAILURE", "UNKNOWN_CA", "unknown ca")


def is_tls_config_error(detail: str) -> bool:
    """True when a transport error text says the TLS handshake failed for a reason a retry cannot fix (the
    certificate is not trusted, the server wants a client certificate, TLS spoken to a plaintext port)."""
    return any(w in detail for w in _TLS_WORDS)


def tls_hint() -> str:
    return (f"TLS configuration error (check {VARS}CERTIFICATE, {VARS}CLIENT_CERTIFICATE, {VARS}CLIENT_KEY and the "
            f"endpoint's scheme)")


TLS_STRIKES = 3  # consecutive connections closed during the TLS handshake before it counts as a config error


class HandshakeStrikes:
    """Counts connections the server closed during the TLS handshake without saying why (TLS 1.3 servers that
    require a client certificate do this). One can be a server restart; :data:`TLS_STRIKES` in a row, with no other
    outcome between, are a configuration error: :meth:`hit` returns the FATAL detail then."""

    def __init__(self) -> None:
        self.n = 0

    def hit(self, detail: str) -> str | None:
        self.n += 1
        if self.n < TLS_STRIKES:
            return None
        return (f"{tls_hint()}: the server closed {self.n} TLS handshakes in a row; does it require a client "
                f"certificate ({VARS}CLIENT_CERTIFICATE / CLIENT_KEY)? Last error: {detail}")

    def reset(self) -> None:
        self.n = 0
