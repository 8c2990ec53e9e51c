"""What an input of ``check`` is, told by its content (never by its name), and what a folder holds.

:func:`sniff` classifies one file (plain or gzip; ``-`` is standard input, only peeked at):

* ``"log"``: text holding a ``[CPTRACE`` marker somewhere (the whole file is scanned when its start has none:
  an SGLang log may print a lot before the first record), or SGLang's kv-canary violation marker
  (:data:`cptrace_otel.model.canary.MARKER`: a server log whose only records are violations), unless its first
  line is a whole OTLP request or trace document (JSON lines with a stray line of log text: that line is reported);
* ``"otlp"``: OTLP JSON lines (one ``ExportTraceServiceRequest`` per line, the project's file sink);
* ``"jaeger"``: a JSON document from a trace backend: Jaeger's ``/api/traces`` (api_v2: ``{"data": [trace...]}``,
  also the UI's "Download Results" and a single trace object), ``/api/v3/traces`` (``{"result": {"resourceSpans"``)
  or any OTLP/JSON ``TracesData`` document, pretty-printed or not (read by :mod:`.tracedocs`);
* ``None``: nothing ``check`` can read; :attr:`Sniff.what` says what it looked like (empty, only whitespace, binary
  data, plain text with no record, JSON of another kind, broken gzip), for the error message.

A document classified ``"otlp"``/``"jaeger"`` may still turn out to hold no cptrace record (the traces of another
service): the readers count per file and ``check`` rejects those with the services they name.

:func:`expand` turns the command line into files: a folder contributes every file below it that :func:`sniff`
recognises (recursively, sorted, hidden names and symlinked folders skipped); the others are listed as skipped. A
file named on the command line that is not recognised is rejected. The same file reached twice is read once.
Only regular files and ``-`` are read: a FIFO or device named on the command line is rejected with the reason
(:class:`.inputs.NotRegular`), one inside a folder is skipped with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zlib

from ...model.canary import MARKER as CANARY_MARKER
from ...model.grammar import LINE
from .inputs import GZIP_MAGIC, STDIN, open_text, stdin_head, truncated

MARKER = LINE.marker.encode()
CANARY = CANARY_MARKER.encode("ascii")
HEAD = 1 << 16          # bytes looked at to classify
_BLOCK = 1 << 22        # read size when scanning a whole text file for the marker
_FIRST_KEY = re.compile(rb'\A\s*\{\s*"([A-Za-z_]+)"')
_ARRAY = re.compile(rb'\A\[\s*\{\s*"')
_OTLP_KEYS = ("resourceSpans", "resource_spans")
_DOC_KEYS = ("result", "data", "traceID", "spans", "error")


@dataclasses.dataclass
class Sniff:
    path: str
    kind: str | None          # "log", "otlp", "jaeger", or None (not a cptrace input)
    what: str = ""            # what it looked like, for messages (always set when kind is None)


def sniff(path: str) -> Sniff:
    """Classify ``path`` (see the module doc). Raises OSError when it cannot be opened or read."""
    if path == STDIN:
        head = stdin_head()
        if head[:2] == GZIP_MAGIC:   # only peeked at: decompress what is there
            try:
                head = zlib.decompressobj(31).decompress(head, HEAD)
            except zlib.error as e:
                return Sniff(path, None, f"gzip data that does not decompress ({e})")
        return _classify(path, head, None)
    with open_text(path) as fh:
        head = fh.buffer.read(HEAD)  # type: ignore[attr-defined]
        if not head and truncated(fh):
            return Sniff(path, None, f"gzip data that does not decompress ({truncated(fh)})")
        return _classify(path, head, fh)


def _classify(path: str, head: bytes, fh) -> Sniff:
    if not head:
        return Sniff(path, None, "empty")
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    # a first line that is a whole OTLP request or trace document: JSON lines, even where a later line holds the
    # marker (a line of log text pasted into the file: the reader reports that line and reads the rest)
    parsed = _first_line(body) if body[:1] == b"{" else None
    kind = _object_kind(parsed[0]) if parsed is not None and parsed[1] else None
    if kind is not None:
        return Sniff(path, kind)
    if MARKER in head or CANARY in head:   # before the JSON and text tests: a log may hold a few binary bytes (NULs
        return Sniff(path, "log")         # after a crash) and still its records, or begin with a JSON object
    if parsed is not None:   # before the text test: a JSON-lines file whose first line parses is JSON even where a
        js = _json_kind(path, body, *parsed)   # later line holds a NUL (that line is reported by the reader, the rest
        if js is not None:                    # read)
            return js
    if not _is_text(head):
        return Sniff(path, None, f"binary data, not text (starts with bytes {head[:8].hex(' ')})")
    if not body:
        return Sniff(path, None, "only whitespace")
    if _ARRAY.match(body):   # a JSON list of traces (e.g. the "data" of an answer, saved alone)
        return Sniff(path, "jaeger")
    lines = head.count(b"\n")
    last = head[-1:]
    if fh is not None:
        found, more, last = _scan(fh, head)
        if found:
            return Sniff(path, "log")
        lines += more
    elif len(head) >= HEAD:   # standard input: only its start can be looked at; the reader decides
        return Sniff(path, "log", f"text with no {LINE.marker} marker in its first 64 KiB")
    first = body.split(b"\n", 1)[0][:60].decode("utf-8", "replace").rstrip()
    lines += last != b"\n"
    return Sniff(path, None, f"plain text with no {LINE.marker} record ({lines} line{'s' if lines != 1 else ''}, the "
                            f"first: {first!r})")


def _is_text(b: bytes) -> bool:
    """No NUL byte and few control bytes (ANSI colour escapes and form feeds are fine): random or compressed data
    fails this within a few hundred bytes."""
    if b"\x00" in b:
        return False
    ctrl = sum(b.count(bytes([c])) for c in range(32) if c not in (9, 10, 11, 12, 13, 27))
    if ctrl * 100 > len(b):
        return False
    return b.decode("utf-8", "replace").count("\ufffd") * 50 <= len(b)


def _first_line(body: bytes) -> tuple[object, bool]:
    """(``body``'s first line as JSON, None where it does not parse or is not whole: it did not end before the
    head did; whether a newline ended it)."""
    first, nl, _ = body.partition(b"\n")
    obj = None
    if nl or len(body) < HEAD:
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):   # too deep for json: the reader records it as malformed
            obj = None
    return obj, bool(nl)


def _object_kind(obj: object) -> str | None:
    """"otlp" or "jaeger" for a JSON object of that kind, else None."""
    if isinstance(obj, dict):
        if any(k in obj for k in _OTLP_KEYS):
            return "otlp"
        if any(k in obj for k in _DOC_KEYS):
            return "jaeger"
    return None


def _json_kind(path: str, body: bytes, obj: object, nl: bool) -> Sniff | None:
    """OTLP JSON lines, a trace document, or None (not JSON: then it is text); ``obj``, ``nl``: :func:`_first_line`
    of ``body``."""
    if isinstance(obj, dict):   # the first line is a JSON object of its own: JSON lines
        kind = _object_kind(obj)
        return Sniff(path, kind) if kind is not None else Sniff(path, None, f"JSON of another kind (keys: "
                                                                          f"{_keys(obj)})")
    m = _FIRST_KEY.match(body)
    if m is not None and not nl:   # one line longer than the head: its first key says what it is
        key = m.group(1).decode()
        if key in _OTLP_KEYS:
            return Sniff(path, "otlp")
        return Sniff(path, "jaeger") if key in _DOC_KEYS else Sniff(path, None, f"JSON of another kind (key {key})")
    if m is not None:              # a pretty-printed document: the reader parses it whole and says what it holds
        return Sniff(path, "jaeger")
    return None


def _keys(obj: dict) -> str:
    ks = list(obj)[:6]
    return ", ".join(map(str, ks)) + (", ..." if len(obj) > 6 else "") if ks else "none"


def _scan(fh, head: bytes) -> tuple[bool, int, bytes]:
    """(whether the rest of ``fh`` holds the marker, newlines counted until then, the last byte read)."""
    keep = len(CANARY) - 1   # (the longer marker: a marker split between two blocks is still seen)
    tail = head[-keep:]
    lines = 0
    while True:
        b = fh.buffer.read(_BLOCK)
        if not b:
            return False, lines, tail[-1:]
        tb = tail + b
        if MARKER in tb or CANARY in tb:
            return True, lines, b""
        lines += b.count(b"\n")
        tail = b[-keep:]


def count_markers(path: str) -> int:
    """``[CPTRACE`` markers in ``path`` (decompressed when gzip): about its records, without parsing them. Standard
    input cannot be read twice: 0. Raises OSError."""
    if path == STDIN:
        return 0
    n = 0
    with open_text(path) as fh:
        tail = b""
        while True:
            b = fh.buffer.read(_BLOCK)  # type: ignore[attr-defined]
            if not b:
                return n
            n += (tail + b).count(MARKER)   # a marker split between two blocks is counted once
            tail = b[-(len(MARKER) - 1):]


@dataclasses.dataclass
class Plan:
    """The files of one ``check`` command line, by kind, in command-line order (folders sorted)."""

    logs: list[str] = dataclasses.field(default_factory=list)
    otlp: list[str] = dataclasses.field(default_factory=list)
    docs: list[str] = dataclasses.field(default_factory=list)
    rejected: list[Sniff] = dataclasses.field(default_factory=list)   # named files that are no cptrace input
    skipped: list[Sniff] = dataclasses.field(default_factory=list)    # files in folders that are none
    empty_dirs: list[str] = dataclasses.field(default_factory=list)   # folders with no cptrace input at all
    twice: list[str] = dataclasses.field(default_factory=list)        # files reached more than once
    notes: dict[str, str] = dataclasses.field(default_factory=dict)   # path -> what sniff saw (standard input)

    def add(self, s: Sniff) -> None:
        {"log": self.logs, "otlp": self.otlp, "jaeger": self.docs}[s.kind].append(s.path)  # type: ignore[index]
        if s.what:
            self.notes[s.path] = s.what


def expand(paths: list[str]) -> Plan:
    """Classify every path (folders expanded). Raises OSError for a named file that cannot be read (not for one
    inside a folder: that one is skipped with the reason)."""
    plan = Plan()
    seen: set[str] = set()
    for p in paths:
        if p != STDIN and os.path.isdir(p):
            n0 = len(plan.logs) + len(plan.otlp) + len(plan.docs)
            for f in _walk(p):
                if _once(f, seen, plan):
                    try:
                        s = sniff(f)
                    except OSError as e:
                        s = Sniff(f, None, f"unreadable ({e.strerror or e})")
                    (plan.add(s) if s.kind else plan.skipped.append(s))
            if len(plan.logs) + len(plan.otlp) + len(plan.docs) == n0:
                plan.empty_dirs.append(p)
            continue
        if p == STDIN or _once(p, seen, plan):
            s = sniff(p)
            (plan.add(s) if s.kind else plan.rejected.append(s))
    return plan


def _once(path: str, seen: set[str], plan: Plan) -> bool:
    key = os.path.realpath(path)
    if key in seen:
        plan.twice.append(path)
        return False
    seen.add(key)
    return True


def _walk(top: str) -> list[str]:
    out: list[str] = []
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        out.extend(os.path.join(d, f) for f in sorted(files) if not f.startswith("."))
    return out
