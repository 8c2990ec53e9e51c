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

import os
import time
from typing import Any, Iterable, Sequence

from ..logline import render_line
from .otlp_json import request_json


class _AppendFile:
    """A line-oriented file opened for append (parents created), with the sink interface's flush/close."""

    def __init__(self, path: str) -> None:
        self.path = path
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8", errors="replace", buffering=1 << 20)
        self.lines = 0

    def flush(self, timeout_s: float = 0.0) -> bool:
        self._f.flush()
        return True

    def close(self, timeout_s: float = 0.0) -> bool:
        try:
            self._f.close()
        except OSError:
            return False
        return True


class OtlpJsonFileSink(_AppendFile):
    """Appends the spans of each :meth:`export` as requests of at most :attr:`SPANS_PER_LINE` spans, one per line:
    a reader parses one line at a time, so bounded lines keep its memory bounded (a JSON line costs about ten
    times its size once parsed), however many spans one export carries (``ingest`` exports tens of thousands)."""

    SPANS_PER_LINE = 512

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
        line = request_json(groups)
        if not line:
            return
        self._f.write(line + "\n")
        self.lines += 1

    def stats(self) -> dict[str, Any]:
        return {"file": self.path, "file_lines": self.lines}


def log_prefix(ts_ns: int, cp_rank: int, tp_rank: int) -> str:
    """SGLang's logger prefix for one record (local wall time, seconds resolution)."""
    t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts_ns / 1e9))
    cp = cp_rank if cp_rank >= 0 else 0
    tp = tp_rank if tp_rank >= 0 else cp
    return f"[{t} ATTN_CP{cp} TP{tp}] "


class LogLinesSink(_AppendFile):
    def __init__(self, path: str, cp_rank: int, tp_rank: int) -> None:
        super().__init__(path)
        self.cp_rank = cp_rank
        self.tp_rank = tp_rank
        self._sec = -1
        self._prefix = ""

    def write(self, records: Iterable[tuple[int, int, int, str, tuple]]) -> None:
        """Write Records ``(seq, ts_ns, level, tag, fields)`` (fields already rendered) as upstream lines."""
        out = []
        for _seq, ts, _lvl, tag, fields in records:
            sec = ts // 1_000_000_000
            if sec != self._sec:
                self._sec = sec
                self._prefix = log_prefix(ts, self.cp_rank, self.tp_rank)
            out.append(self._prefix + render_line(tag, dict(fields)) + "\n")
        self._f.write("".join(out))
        self.lines += len(out)

    def stats(self) -> dict[str, Any]:
        return {"log_file": self.path, "log_lines": self.lines}
