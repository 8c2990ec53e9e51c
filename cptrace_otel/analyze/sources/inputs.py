"""Opening the files the sources read: plain text or gzip-compressed, or standard input for the path ``-``.

Compression is told by the gzip magic bytes, not by the name, so rotated logs (``rank0.log.1.gz``) and renamed
ones read the same. A gzip stream that ends early (a file still being written, or cut off by a copy) is read up to
where it breaks and then ends like a file would; the reader reports it through :func:`truncated` (a malformed
line in ``check``), so the events before the break are not lost.

Bounds, so that no input can take the memory or the time of the machine:

* Only standard input (``-``) and regular files are read. A FIFO, character device (``/dev/zero``), socket or
  other special file named by path is refused (:class:`NotRegular`, an OSError): opening a FIFO with no writer
  blocks for ever and a device never ends. Such a stream is given as standard input instead (``check - < FIFO``).
* A gzip stream whose decompressed size exceeds :data:`MAX_RATIO` times its compressed size, once past
  :data:`RATIO_FREE` decompressed bytes, is a gzip bomb: reading stops there and :func:`truncated` says why (the
  ratio is set with ``CPTRACE_GZIP_MAX_RATIO``; ``0`` reads any stream whole). Ordinary logs compress 5-50 times;
  the ratio of gzip is at most about 1,030.
* The readers cap the length of one line at :data:`MAX_LINE` bytes (``CPTRACE_MAX_LINE`` overrides it): a longer
  line is reported and skipped, never held whole.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib

GZIP_MAGIC = b"\x1f\x8b"


def _env_int(name: str, default: int) -> int:
    try:
        v = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return v if v >= 0 else default


MAX_LINE = _env_int("CPTRACE_MAX_LINE", 1 << 20) or (1 << 20)   # bytes of one log line (0 is not "no cap")
MAX_JSON_LINE = max(MAX_LINE, 64 << 20)   # one OTLP JSON line: an export batch of thousands of spans
MAX_RATIO = _env_int("CPTRACE_GZIP_MAX_RATIO", 500)
RATIO_FREE = 64 << 20   # decompressed bytes read before the ratio is looked at


class NotRegular(OSError):
    """A path that is neither ``-`` nor a regular file (see the module doc)."""


def require_regular(path: str) -> None:
    """Raise :class:`NotRegular` when ``path`` is a FIFO, device, socket or other special file (a folder passes:
    the callers handle it). Raises OSError when it cannot be looked at."""
    if path == STDIN:
        return
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
    raise NotRegular(22, f"{kind}, not a regular file: only regular files are read by path (it could block or "
                         f"never end); give it as standard input instead: - < {path}", path)


STDIN = "-"


class _Counted:
    """A byte stream's ``read``, counting what it gave (``tell`` for a pipe, which has no position)."""

    def __init__(self, src) -> None:
        self._src, self.n = src, 0

    def read(self, n: int = -1) -> bytes:
        b = self._src.read(n)
        self.n += len(b)
        return b

    def tell(self) -> int:
        return self.n


class _TolerantGzip(io.RawIOBase):
    """A readable raw stream over a gzip file that turns a broken or early end into EOF and remembers why."""

    def __init__(self, source: str | io.BufferedReader) -> None:
        self._gz = gzip.GzipFile(source, "rb") if isinstance(source, str) else gzip.GzipFile(fileobj=_Counted(source))  # type: ignore[call-overload]
        self.broken: str | None = None   # why the stream ended early, None while it reads cleanly
        self._out = 0                     # decompressed bytes returned so far

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.broken is not None:
            return 0
        try:
            # read1: at most one decompression step, so a break loses nothing that was already decompressed (a
            # readinto that fills the whole buffer raises and drops the part it had)
            data = self._gz.read1(len(b))
            b[:len(data)] = data
            self._out += len(data)
            if MAX_RATIO and self._out > RATIO_FREE and self._out > MAX_RATIO * max(1, self._compressed()):
                self.broken = (f"decompressed data exceeds {MAX_RATIO} times its compressed size (a gzip bomb?): "
                               f"reading stopped after {self._out >> 20} MiB (CPTRACE_GZIP_MAX_RATIO=0 reads it whole)")
            return len(data)
        except EOFError:
            self.broken = "the gzip stream ends early (file cut off or still being written)"
        except (gzip.BadGzipFile, zlib.error) as e:
            self.broken = f"corrupt gzip data ({e})"
        return 0

    def _compressed(self) -> int:
        """Compressed bytes consumed so far (standard input: what went through the stream)."""
        try:
            return self._gz.fileobj.tell()   # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            return 0

    def close(self) -> None:
        try:
            self._gz.close()
        finally:
            super().close()


def is_gzip(path: str) -> bool:
    """True when ``path`` starts with the gzip magic. Raises OSError when it cannot be opened."""
    if path == STDIN:
        return _stdin().peek(2)[:2] == GZIP_MAGIC
    require_regular(path)
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def stdin_head() -> bytes:
    """The first bytes waiting on standard input (what one read gives, at most the buffer), not consumed."""
    return _stdin().peek(1 << 16)


def _stdin() -> io.BufferedReader:
    """Standard input's byte stream, buffered so that its start can be peeked at without consuming it (kept in
    ``sys.stdin`` so that every look at ``-`` sees the same bytes)."""
    import sys

    buf = getattr(sys.stdin, "buffer", None)
    if buf is None:
        raise OSError(9, "standard input is closed or not readable")
    if not hasattr(buf, "peek"):
        buf = io.BufferedReader(buf)
        sys.stdin = io.TextIOWrapper(buf)
    return buf


def open_text(path: str, buffering: int = 1 << 20) -> io.TextIOBase:
    """``path`` as text: UTF-8 with undecodable bytes replaced and line endings kept (``newline=""``), decompressed
    when it is gzip; ``-`` reads standard input (closing the result does not close it). The result's ``buffer``
    reads the (decompressed) bytes. Raises OSError, IsADirectoryError for a folder, :class:`NotRegular` for a
    FIFO or device."""
    if path == STDIN:
        src = _stdin()
        raw: io.BufferedIOBase = (io.BufferedReader(_TolerantGzip(src), buffer_size=buffering)
                                  if src.peek(2)[:2] == GZIP_MAGIC else _Unclosed(src))
        return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")  # type: ignore[type-var]
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory", path)
    if is_gzip(path):
        raw = io.BufferedReader(_TolerantGzip(path), buffer_size=buffering)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="", buffering=buffering)


class _Unclosed(io.BufferedIOBase):
    """Reads from ``src`` (standard input) and leaves it open when closed itself."""

    def __init__(self, src: io.BufferedReader) -> None:
        self._src = src

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        return self._src.read(n)

    def read1(self, n: int = -1) -> bytes:
        return self._src.read1(n)

    def readinto(self, b) -> int:
        return self._src.readinto(b)

    def peek(self, n: int = 0) -> bytes:
        return self._src.peek(n)


def truncated(fh: io.TextIOBase) -> str | None:
    """Why a file from :func:`open_text` ended early (a broken gzip stream), None when it read to its end."""
    raw = getattr(getattr(fh, "buffer", None), "raw", None)
    return raw.broken if isinstance(raw, _TolerantGzip) else None


def consumed(fh: io.TextIOBase) -> int | None:
    """Bytes of the file on disk that a file from :func:`open_text` has read so far (compressed bytes for gzip), for
    progress bars; None once it is closed (it was read to its end, or given up)."""
    if fh.closed:
        return None
    buf = getattr(fh, "buffer", None)
    raw = getattr(buf, "raw", None)
    try:
        if isinstance(raw, _TolerantGzip):
            return raw._gz.fileobj.tell()   # type: ignore[union-attr]
        return buf.tell() if buf is not None else None
    except (OSError, ValueError):
        return None

