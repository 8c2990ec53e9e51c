"""File sinks: OTLP JSON lines (the OpenTelemetry Collector file exporter's format) and upstream log lines.

* :class:`OtlpJsonFileSink` appends one ``ExportTraceServiceRequest`` per line in OTLP/JSON (camelCase names, hex
  trace/span ids, int64 values as strings), which the Collector's ``otlpjsonfile`` receiver, ``cptrace-otel check``
  and the analyzer read back. Lines are built directly from spans (:func:`cptrace_otel.export.otlp_json.request_json`)
  rather than through ``json_format.MessageToJson`` (several times slower); tests parse every line back with
  ``google.protobuf.json_format`` against the proto schema.
* Both have the sink interface's ``flush``/``close``/``stats`` (:class:`~.sinks.Sink`); the OTLP file sink is a
  span sink (``export``), the log-lines sink takes Records (``write``).
* :class:`LogLinesSink` writes ``[<YYYY-mm-dd HH:MM:SS> ATTN_CP<r> TP<t>] [CPTRACE tag] k=v ...``: SGLang's log
  prefix (so the log parser recovers the rank) plus the upstream body, byte for byte (``logline.render_line``).
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..model.grammar import LINE
from ..model.logline import render_line
from .otlp_json import request_json


class _AppendFile:
    """A line-oriented file opened for append (parents created), with the sink interface's flush/close.

    Write errors never turn the sink off and never leave a torn line. Lines are buffered whole in memory and
    written in chunks with ``os.write`` on an ``O_APPEND`` descriptor; when a chunk fails part-way (``ENOSPC``, a
    quota, an I/O error) the file is truncated back to its last whole line, so it always ends with one, and the
    rest stays buffered to be written again at the next write or flush (the worker flushes every second): writing
    resumes by itself once the disk has room, line by line, whatever the backlog (what fits goes, the rest waits).
    While writing fails at most :attr:`MAX_PENDING` bytes are kept; older lines beyond that, and what is still
    buffered at :meth:`close`, are dropped and counted (``<prefix>_dropped_lines``, the spans or records they held
    and ``<prefix>_dropped_records``, in :meth:`stats`; the exporter counts those records lost). Failure and
    resumption are each reported once on stderr. :meth:`flush` answers False while lines are pending or once any
    was dropped."""

    waits = False   # a local file: flushing never waits on anyone

    CHUNK = 1 << 20          # buffered bytes that trigger a write
    MAX_PENDING = 16 << 20   # buffered bytes kept while the file cannot be written
    STAT = "file"            # stats key prefix

    def __init__(self, path: str) -> None:
        self.path = path
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                                       0o644)
        # (data, lines, units, records): units are spans (OTLP file) or records (log file)
        self._pend: collections.deque[tuple[bytes, int, int, int]] = collections.deque()
        self._pend_bytes = 0
        self.lines = 0
        self.dropped_lines = 0
        self.dropped_units = 0
        self.dropped_records = 0   # records in dropped lines (the exporter counts them lost)
        self.write_errors = 0
        self.repaired_values = 0
        self._failing: str | None = None   # the error while writing fails
        self._lost_in_outage = 0

    def _add(self, text: str, lines: int, units: int, records: int | None = None) -> None:
        """Buffer ``text`` (whole lines, each ending in a newline) holding ``units`` spans or records and ``records``
        records (= ``units`` when not given)."""
        records = units if records is None else records
        if self._fd is None:  # closed: nothing can be written any more
            self._drop(lines, units, records)
            return
        data = text.encode("utf-8", "replace")
        self._pend.append((data, lines, units, records))
        self._pend_bytes += len(data)
        if self._pend_bytes >= self.CHUNK:
            self._write_out()

    def _write_out(self) -> bool:
        """Write what is buffered, oldest first, as many whole lines as the file takes: a chunk that fails part-way
        is truncated back to its last whole line and the rest stays buffered, so writing resumes with whatever room
        comes back, however long the backlog. False (the rest kept, up to MAX_PENDING) when not all could go."""
        if not self._pend:
            return True
        if self._fd is None:
            return False
        while self._pend:
            data, lines, units, records = self._pend[0]
            start = done = -1
            try:
                start = os.fstat(self._fd).st_size
                done = 0
                view = memoryview(data)
                while done < len(data):
                    done += os.write(self._fd, view[done:])
            except OSError as e:
                keep = data.rfind(b"\n", 0, max(0, done)) + 1  # whole lines of this chunk that went out
                if start >= 0:
                    try:
                        os.ftruncate(self._fd, start + keep)  # roll back a torn line: the file ends with a whole one
                    except OSError:
                        keep = 0
                if keep:
                    n = data.count(b"\n", 0, keep)
                    u, r = (units * n // lines, records * n // lines) if lines else (0, 0)
                    self._pend[0] = (data[keep:], lines - n, units - u, records - r)
                    self._pend_bytes -= keep
                    self.lines += n
                self._failed(e)
                return False
            self._pend.popleft()
            self._pend_bytes -= len(data)
            self.lines += lines
        if self._failing is not None:
            print(f"cptrace_otel: {self.path} is written again; {self._lost_in_outage} line(s) were dropped while "
                  f"it could not be ({self._failing})", file=sys.stderr, flush=True)
            self._failing = None
            self._lost_in_outage = 0
        return True

    def _failed(self, e: OSError) -> None:
        self.write_errors += 1
        lost = 0
        while self._pend and self._pend_bytes > self.MAX_PENDING:
            data, n, units, records = self._pend.popleft()
            self._pend_bytes -= len(data)
            self._drop(n, units, records)
            lost += n
        self._lost_in_outage += lost
        if self._failing is None:
            self._failing = f"{type(e).__name__}: {e.strerror or e}"
            print(f"cptrace_otel: cannot write {self.path} ({self._failing}); retrying, keeping up to "
                  f"{self.MAX_PENDING >> 20} MiB of lines meanwhile (older ones are dropped and counted)",
                  file=sys.stderr, flush=True)

    def _drop(self, lines: int, units: int, records: int | None = None) -> None:
        """Lines that could not be written or rendered: counted as dropped."""
        self.dropped_lines += lines
        self.dropped_units += units
        self.dropped_records += units if records is None else records

    def pending_records(self) -> int:
        """Records in lines not yet written (they are not safe until they are)."""
        return sum(r for _, _, _, r in self._pend)

    def flush(self, timeout_s: float = 0.0) -> bool:
        ok = self._write_out()
        return ok and self.dropped_lines == 0 and self.dropped_units == 0

    def close(self, timeout_s: float = 0.0) -> bool:
        ok = self.flush(timeout_s)
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                return False
        if self._pend:
            self._drop(sum(p[1] for p in self._pend), sum(p[2] for p in self._pend), self.pending_records())
            self._pend.clear()
            self._pend_bytes = 0
        return ok

    def _stats(self, unit: str) -> dict[str, Any]:
        p = self.STAT
        return {f"{p}_dropped_lines": self.dropped_lines, f"{p}_dropped_{unit}": self.dropped_units,
                f"{p}_dropped_records": self.dropped_records,
                f"{p}_pending_bytes": self._pend_bytes, f"{p}_write_errors": self.write_errors,
                f"{p}_repaired_values": self.repaired_values}


class OtlpJsonFileSink(_AppendFile):
    """Appends the spans of each :meth:`export` as requests of at most :attr:`SPANS_PER_LINE` spans, one per line:
    a reader parses one line at a time, so bounded lines keep its memory bounded (a JSON line costs about ten
    times its size once parsed), however many spans one export carries (``ingest`` exports tens of thousands)."""

    SPANS_PER_LINE = 512
    what = "OTLP file"

    def export(self, groups: Sequence[tuple[dict[str, Any], Sequence[Any]]]) -> None:
        n = self.SPANS_PER_LINE
        batch: list[tuple[dict[str, Any], Sequence[Any]]] = []
        room = n
        for resource, spans in groups:
            i = 0
            while i < len(spans):
                part = spans[i:i + room]
                batch.append((resource, part))
                i += len(part)
                room -= len(part)
                if room == 0:
                    self._write(batch)
                    batch, room = [], n
        self._write(batch)

    def _write(self, groups: list[tuple[dict[str, Any], Sequence[Any]]]) -> None:
        try:
            line = request_json(groups)
        except Exception:  # one unencodable span must not cost its neighbours: encode them one by one
            self._write_each(groups)
            return
        if not line:
            return
        self._add(line + "\n", 1, sum(len(sp) for _r, sp in groups),
                  sum(len(s.events) for _r, sp in groups for s in sp))

    def _write_each(self, groups: list[tuple[dict[str, Any], Sequence[Any]]]) -> None:
        """A line that did not encode: each span alone, its bad values repaired as the network sink repairs them
        (``(err:<ExceptionType>)``, :func:`~.sinks.repair_span`); a span that still fails is dropped and counted."""
        from .sinks import repair_span

        out = []
        records = 0
        for resource, spans in groups:
            for sp in spans:
                try:
                    out.append(request_json([(resource, [sp])]))
                    records += len(sp.events)
                    continue
                except Exception:
                    self.repaired_values += repair_span(sp)
                try:
                    out.append(request_json([(resource, [sp])]))
                    records += len(sp.events)
                except Exception:
                    self._drop(0, 1, len(sp.events))
        if out:
            self._add("".join(x + "\n" for x in out), len(out), len(out), records)

    def stats(self) -> dict[str, Any]:
        return {"file": self.path, "file_lines": self.lines, **self._stats("spans")}


def log_prefix(ts_ns: int, cp_rank: int, tp_rank: int) -> str:
    """SGLang's logger prefix for one record (local wall time, seconds resolution)."""
    t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts_ns / 1e9))
    cp = cp_rank if cp_rank >= 0 else 0
    tp = tp_rank if tp_rank >= 0 else cp
    return f"[{t} {LINE.rank_prefix}{cp} TP{tp}] "


_BREAKS = re.compile("[\r\n]")
_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r"})


def escape_breaks(line: str) -> str:
    """``line`` with every CR and LF written as the two characters ``\\r`` / ``\\n``: a key, tag or value that holds
    a line break must not start a second (forged) line. Readers take the escaped text as it is (one record)."""
    return line.translate(_ESCAPES) if _BREAKS.search(line) else line


class LogLinesSink(_AppendFile):
    """Upstream log lines, one per Record. A line break inside a key, tag or value is escaped
    (:func:`escape_breaks`); a record that cannot be rendered is dropped and counted (``log_dropped_records``)."""

    STAT = "log"
    what = "log file"

    def export(self, groups: Sequence[tuple[dict[str, Any], Sequence[Any]]]) -> None:
        """Spans are not written here: its lines come from the Records (:meth:`write`)."""

    def __init__(self, path: str, cp_rank: int, tp_rank: int) -> None:
        super().__init__(path)
        self.cp_rank = cp_rank
        self.tp_rank = tp_rank
        self._sec = -1
        self._prefix = ""

    def write(self, records: Iterable[tuple[int, int, int, str, tuple]]) -> None:
        """Write Records ``(seq, ts_ns, level, tag, fields)`` (fields already rendered) as upstream lines."""
        out = []
        search = _BREAKS.search
        for _seq, ts, _lvl, tag, fields in records:
            sec = ts // 1_000_000_000
            if sec != self._sec:
                self._sec = sec
                self._prefix = log_prefix(ts, self.cp_rank, self.tp_rank)
            try:
                line = render_line(tag, dict(fields))
            except Exception:
                self._drop(1, 1)
                continue
            if search(line):
                line = line.translate(_ESCAPES)
            out.append(self._prefix + line + "\n")
        if out:
            self._add("".join(out), len(out), len(out))

    def stats(self) -> dict[str, Any]:
        return {"log_file": self.path, "log_lines": self.lines, **self._stats("records")}
