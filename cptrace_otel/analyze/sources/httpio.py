"""One HTTP request to a backend the analyzer reads or posts to (Jaeger, Tempo, Alertmanager): fail closed, bounded.

Contract of :func:`request`:

* **A total deadline.** ``Limits.deadline_s`` bounds the whole request: connecting, sending, the status line and
  headers, every redirect and every read of the body, including the time the caller spends between reads of a
  streamed body. Each socket read also has ``Limits.read_timeout_s``. A server that answers one byte at a time
  ends the request with :class:`BackendUnreachable` ("no complete answer within N s") at the deadline, not never.
* **A size bound.** The body is read as a stream of chunks (:meth:`Answer.chunks`); more than ``max_bytes`` of it
  raises :class:`BackendError` ("answer larger than N bytes"). :meth:`Answer.read` reads a body whole within a bound.
* **Credentials stay with their origin.** ``user:password@`` in the URL becomes HTTP basic auth (and leaves the URL
  used in messages). A redirect (301, 302, 303, 307, 308) to the same origin (scheme, host, port) is followed with the
  credentials; a redirect to another origin is not followed when the request carries credentials (it raises
  :class:`BackendError` naming the masked target), and followed without any when it carries none. At most
  :data:`MAX_REDIRECTS`.
* **Errors say what came back.** An HTTP status >= 400 raises :class:`BackendError` with the status and an escaped
  excerpt of the body (:func:`excerpt`): never a raw, unbounded or unprintable body; a 401 or 403 is named an
  authentication failure. Messages never hold a credential: every message of :func:`request` goes through
  :func:`cptrace_otel.model.config.mask` with the request's credentials (the URL's userinfo, the ``Authorization``
  header, basic auth's decoded user and password, in every encoded form), so a body or ``Location`` that echoes one
  prints ``***``.

No proxy support (``HTTP_PROXY`` is not read): the backends are reached directly. Standard library only.
"""

from __future__ import annotations

import base64
import http.client
import io
import os
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from ...model.config import mask, mask_url, secrets_of
from ...model.exits import CptraceError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

MAX_REDIRECTS = 5
AUTH_STATUS = frozenset({401, 403})   # an authentication failure (BackendError says so)
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
CHUNK = 1 << 20            # bytes per chunk of a streamed body
EXCERPT_CHARS = 120        # characters of a body quoted in a message


def _env_num(name: str, default: float, cast: Any = float) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = cast(raw)
    except ValueError:
        return default
    return v if v > 0 else default


@dataclass(frozen=True)
class Limits:
    """The bounds of every backend request (see the module doc); :func:`limits_from_env` reads them.

    ``max_answer_bytes`` bounds one search answer and the text of the traces one search keeps; ``max_trace_bytes``
    bounds one trace (larger ones are reported as too large, never parsed); ``max_small_bytes`` bounds answers that
    are read whole and are small by nature (service lists, Alertmanager replies)."""

    deadline_s: float = 120.0
    read_timeout_s: float = 30.0
    max_answer_bytes: int = 128 << 20
    max_trace_bytes: int = 16 << 20
    max_small_bytes: int = 1 << 20


def limits_from_env(**over: float | None) -> Limits:
    """:class:`Limits` from ``CPTRACE_QUERY_DEADLINE_S``, ``CPTRACE_QUERY_READ_TIMEOUT_S``,
    ``CPTRACE_QUERY_MAX_BYTES``, ``CPTRACE_QUERY_MAX_TRACE_BYTES`` (unset, unparsable or <= 0: the defaults), then
    ``over`` (keyword arguments of the fields)."""
    d = Limits()
    vals = dict(
        deadline_s=_env_num("CPTRACE_QUERY_DEADLINE_S", d.deadline_s),
        read_timeout_s=_env_num("CPTRACE_QUERY_READ_TIMEOUT_S", d.read_timeout_s),
        max_answer_bytes=_env_num("CPTRACE_QUERY_MAX_BYTES", d.max_answer_bytes, int),
        max_trace_bytes=_env_num("CPTRACE_QUERY_MAX_TRACE_BYTES", d.max_trace_bytes, int),
    )
    vals.update({k: v for k, v in over.items() if v is not None})
    vals["max_trace_bytes"] = min(vals["max_trace_bytes"], vals["max_answer_bytes"])
    return Limits(**vals)


class BackendUnreachable(CptraceError, ConnectionError):
    """The backend could not be reached or did not answer in time (refused, DNS, TLS, deadline, connection cut).
    ``url`` (no credentials) is what was requested; ``reason`` is one line."""

    def __init__(self, url: str, reason: str, what: str = "Jaeger query service") -> None:
        super().__init__(f"{what} unreachable at {url}: {reason}")
        self.what = what
        self.url = url
        self.reason = reason


class BackendError(CptraceError, RuntimeError):
    """The backend answered, but not with what was asked for: an HTTP error status, a redirect that is not followed,
    an answer too large, or a body that is not the expected JSON. ``status`` is the HTTP status (200 for a bad body),
    ``body`` the server's message or an escaped excerpt."""

    def __init__(self, url: str, status: int, body: str) -> None:
        if status in AUTH_STATUS:   # the backend answered: not "unreachable", and not a bad request either
            body = f"authentication failed (the credentials were refused or missing): {body}"
        super().__init__(f"{url}: HTTP {status}: {body}")
        self.url = url
        self.status = status
        self.body = body


def excerpt(data: str | bytes, n: int = EXCERPT_CHARS) -> str:
    """A short, printable, quoted excerpt of ``data`` for a message: the first ``n`` characters with control and
    non-ASCII characters escaped (``ascii``), and the size when it was cut (``'}' (1 byte)``)."""
    if isinstance(data, (bytes, bytearray)):
        size, text = len(data), bytes(data[: n * 4]).decode("utf-8", "replace")
    else:
        size, text = len(data), data
    head = ascii(text[:n])
    unit = "bytes" if isinstance(data, (bytes, bytearray)) else "characters"
    more = "..." if len(text) > n else ""
    return f"{head}{more} ({size} {unit if size != 1 else unit[:-1]})"


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``(url without user:password@, the Authorization header value or None)``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    user, _, pw = parts.netloc.rpartition("@")[0].partition(":")
    cred = f"{unquote(user)}:{unquote(pw)}".encode()
    clean = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return clean, "Basic " + base64.b64encode(cred).decode()


def _origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    scheme = p.scheme.lower()
    try:
        port = p.port
    except ValueError:
        port = None
    return scheme, (p.hostname or "").lower(), port or (443 if scheme == "https" else 80)


class _DeadlineRaw(io.RawIOBase):
    """A socket's reads, each bounded by the time left to the deadline and the per-read timeout."""

    def __init__(self, owner: _DeadlineSocket) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        o = self._owner
        o.bound()
        return o._sock.recv_into(b)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._owner._unref()


class _DeadlineSocket:
    """What ``http.client`` sees as the connection's socket: sends bounded like reads, ``makefile`` over
    :class:`_DeadlineRaw`. Like ``socket.makefile``, the socket is closed once it and every file made from it are
    closed (``http.client`` closes the connection while the response still reads)."""

    def __init__(self, sock: socket.socket, deadline: float, per_read: float, what: str) -> None:
        self._sock, self._deadline, self._per_read, self._what = sock, deadline, per_read, what
        self._refs, self._closed = 0, False

    def bound(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(self._what)
        self._sock.settimeout(min(left, self._per_read))

    def makefile(self, mode: str = "rb", *a: object, **k: object) -> io.BufferedReader:
        self._refs += 1
        return io.BufferedReader(_DeadlineRaw(self))

    def sendall(self, data: ReadableBuffer) -> None:
        self.bound()
        self._sock.sendall(data)

    def _unref(self) -> None:
        self._refs -= 1
        if self._closed and self._refs <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._refs <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class Answer:
    """A response whose status is < 300: ``status``, ``url`` (the final one, no credentials), ``headers``, the body
    as :meth:`chunks` or :meth:`read`. Close it (or use ``with``) when not read to the end."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, url: str,
                 deadline: float, deadline_s: float, max_bytes: int) -> None:
        self._conn, self._resp = conn, resp
        self.url, self.status, self.headers = url, resp.status, resp.headers
        self._deadline, self._deadline_s, self.max_bytes = deadline, deadline_s, max_bytes
        self.read_bytes = 0

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        """The body in chunks of at most ``size`` bytes; raises :class:`BackendError` past ``max_bytes`` and
        :class:`BackendUnreachable` past the deadline or when the connection breaks. Closes the answer at the end."""
        try:
            while True:
                try:
                    data = self._resp.read1(size)
                except TimeoutError:
                    raise BackendUnreachable(self.url, self._late()) from None
                except (OSError, http.client.HTTPException) as e:
                    raise BackendUnreachable(self.url, f"the answer broke off after {self.read_bytes} bytes: "
                                             f"{type(e).__name__}: {e}"[:300]) from None
                if not data:
                    left = self._resp.length   # bytes the Content-Length still promised
                    if left:
                        raise BackendUnreachable(self.url, f"the answer broke off after {self.read_bytes} bytes, "
                                                 f"{left} bytes short of its Content-Length")
                    return
                self.read_bytes += len(data)
                if self.read_bytes > self.max_bytes:
                    raise BackendError(self.url, self.status, f"answer larger than {self.max_bytes} bytes: not read "
                                       "further (CPTRACE_QUERY_MAX_BYTES / CPTRACE_QUERY_MAX_TRACE_BYTES raise it)")
                if time.monotonic() > self._deadline:
                    raise BackendUnreachable(self.url, self._late())
                yield data
        finally:
            self.close()

    def read(self) -> bytes:
        """The whole body (within ``max_bytes`` and the deadline)."""
        return b"".join(self.chunks())

    def _late(self) -> str:
        return (f"no complete answer within {self._deadline_s:g} s (CPTRACE_QUERY_DEADLINE_S; "
                f"{self.read_bytes} bytes of the body read)")

    def close(self) -> None:
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *a: object) -> None:
        self.close()


def request(method: str, url: str, *, headers: Mapping[str, str] | None = None, body: bytes | None = None,
            limits: Limits | None = None, max_bytes: int | None = None, what: str = "Jaeger query service",
            ssl_context: ssl.SSLContext | None = None) -> Answer | None:
    """Send one request (see the module doc); the :class:`Answer` of a 2xx status, ``None`` for 404. ``url`` may hold
    ``user:password@`` (sent as basic auth); ``max_bytes`` defaults to ``limits.max_answer_bytes``."""
    lim = limits or limits_from_env()
    deadline = time.monotonic() + lim.deadline_s
    secrets = secrets_of(url, [(k, v) for k, v in (headers or {}).items() if k.lower() in CREDENTIAL_HEADERS])
    url, auth = split_userinfo(url)
    hdrs = dict(headers or {})
    if auth is not None and not any(k.lower() == "authorization" for k in hdrs):
        hdrs["Authorization"] = auth
    try:
        return _request(method, url, hdrs, body, lim, deadline, max_bytes, what, ssl_context, secrets)
    except (BackendError, BackendUnreachable) as e:   # whatever a message quotes (a Location, an error text)
        for attr in ("url", "body", "reason"):
            if isinstance(getattr(e, attr, None), str):
                setattr(e, attr, mask(getattr(e, attr), secrets))
        e.args = tuple(mask(a, secrets) if isinstance(a, str) else a for a in e.args)
        raise


def _request(method: str, url: str, hdrs: dict[str, str], body: bytes | None, lim: Limits, deadline: float,
             max_bytes: int | None, what: str, ssl_context: ssl.SSLContext | None,
             secrets: tuple[str, ...]) -> Answer | None:
    has_cred = any(k.lower() in ("authorization", "cookie") for k in hdrs)
    origin = _origin(url)
    for _hop in range(MAX_REDIRECTS + 1):
        conn, resp = _send(method, url, hdrs, body, deadline, lim, what, ssl_context)
        status = resp.status
        if status in (301, 302, 303, 307, 308):
            loc = resp.headers.get("Location")
            _drain_close(conn, resp)
            if not loc:
                raise BackendError(url, status, "a redirect without a Location")
            nxt = urljoin(url, loc.strip())
            nxt_clean, nxt_auth = split_userinfo(nxt)
            if urlsplit(nxt_clean).scheme.lower() not in ("http", "https"):
                raise BackendError(url, status, f"redirected to {excerpt(mask_url(nxt))}: not http(s), not followed")
            if _origin(nxt_clean) != origin and (has_cred or nxt_auth is not None):
                raise BackendError(url, status, f"redirected to {mask_url(nxt_clean)}, another origin: not "
                                   "followed (the request carries credentials for "
                                   f"{origin[0]}://{origin[1]}:{origin[2]} only)")
            url = nxt_clean
            if status == 303 or (status in (301, 302) and method == "POST"):
                method, body = "GET", None
            continue
        if status == 404:
            _drain_close(conn, resp)
            return None
        if status >= 300:
            text = _read_some(resp, deadline)
            conn.close()
            raise BackendError(url, status, _server_message(text, secrets))
        return Answer(conn, resp, url, deadline, lim.deadline_s, lim.max_answer_bytes if max_bytes is None
                      else max_bytes)
    raise BackendError(url, 310, f"more than {MAX_REDIRECTS} redirects")


def _send(method: str, url: str, hdrs: dict[str, str], body: bytes | None, deadline: float, lim: Limits,
          what: str, ssl_context: ssl.SSLContext | None) -> tuple[http.client.HTTPConnection, Any]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    late = f"no complete answer within {lim.deadline_s:g} s (CPTRACE_QUERY_DEADLINE_S)"
    try:
        if scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {excerpt(url)}")
        host, port = parts.hostname, parts.port
        if not host:
            raise ValueError(f"no host in {excerpt(url)}")
        left = deadline - time.monotonic()
        timeout = max(0.001, min(left, lim.read_timeout_s))
        if scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=ssl_context or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.connect()
        conn.sock = _DeadlineSocket(conn.sock, deadline, lim.read_timeout_s, late)
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
    except TimeoutError:
        raise BackendUnreachable(url, late, what) from None
    except ssl.SSLError as e:
        raise BackendUnreachable(url, f"TLS: {e}"[:300], what) from None
    except OSError as e:
        raise BackendUnreachable(url, (e.strerror or str(e) or type(e).__name__)[:300], what) from None
    except http.client.HTTPException as e:   # a status line or headers that are not HTTP
        raise BackendUnreachable(url, f"not an HTTP answer: {type(e).__name__}: {excerpt(str(e))}", what) from None
    except ValueError as e:   # a URL http.client cannot use (bad port, control characters)
        raise BackendUnreachable(url, str(e)[:300], what) from None
    return conn, resp


def _read_some(resp: http.client.HTTPResponse, deadline: float, n: int = 4096) -> bytes:
    """Up to ``n`` bytes of an error body (for the message), within the deadline; what could not be read is b""."""
    try:
        if time.monotonic() >= deadline:
            return b""
        return resp.read1(n)
    except (OSError, http.client.HTTPException, ValueError):
        return b""


def _drain_close(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
    try:
        resp.close()
    finally:
        conn.close()


def _server_message(data: bytes, secrets: tuple[str, ...] = ()) -> str:
    """Jaeger's ``{"errors": [{"msg": ...}]}``, Alertmanager's/Tempo's ``{"message"|"error": ...}`` or an excerpt,
    with ``secrets`` masked before it is cut or escaped (a credential the server echoes is never split or escaped
    into a form the masker does not know)."""
    import json

    text = data.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return excerpt(mask(text, secrets).encode())
    if isinstance(obj, dict):
        errs = obj.get("errors")
        if isinstance(errs, list) and errs:
            return mask("; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in errs),
                        secrets)[:300]
        for k in ("message", "error", "msg"):
            if isinstance(obj.get(k), str):
                return mask(obj[k], secrets)[:300]
    return excerpt(mask(text, secrets).encode())
