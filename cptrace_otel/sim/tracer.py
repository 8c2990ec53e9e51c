"""Where simulated records go: a pluggable emitter ``emit(rank, level, tag, **fields)``.

* :class:`LogEmitter` renders upstream log lines per rank (SGLang prefix ``[YYYY-mm-dd HH:MM:SS ATTN_CP<r> TP<r>] ``
  + ``[CPTRACE tag] k=v ...``), gated by the trace level as the upstream gate does (docs/domain.md §3.2). For tests and
  for
  log-file fixtures.
* :class:`ApiEmitter` sends one rank's records through the public API (``cptrace_otel.cptrace``), so the real
  pipeline (resources, exporter process, sinks) is exercised; records of other ranks are dropped. Used by the demo,
  where one process per rank runs the whole deterministic simulation.

:class:`Clock` stamps records: ``ts`` (int ns, monotonic, shared by all ranks of the simulated host) advances by
``TICK_NS`` per simulated tick plus one per record, so the global order of records is also their ``ts`` order.
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from ..model.events import LEVEL_OF_TAG, Event
from ..model.logline import parse_line, render_line

TICK_NS = 100_000
TS_BASE = 1_000_000_000          # monotonic origin of a simulated run (ns)
WALL_BASE_NS = 1_790_000_000 * 10**9  # wall clock at TS_BASE (2026-09-21), fixed so logs are reproducible


class Emitter(Protocol):
    level: int

    def emit(self, rank: int, level: int, tag: str, /, **fields: Any) -> None: ...


class Clock:
    """Simulated time: an integer tick and a sub-order inside it (shared by all ranks)."""

    def __init__(self) -> None:
        self.tick = 0
        self._sub = 0

    def advance(self) -> None:
        self.tick += 1
        self._sub = 0

    def ts(self) -> int:
        self._sub += 1
        return TS_BASE + self.tick * TICK_NS + self._sub


_PREFIXES: dict[tuple[int, int], str] = {}   # (rank, wall second) -> prefix: records come many per second


def log_prefix(rank: int, ts: int) -> str:
    wall_s = (WALL_BASE_NS + (ts - TS_BASE)) // 10**9
    key = (rank, wall_s)
    p = _PREFIXES.get(key)
    if p is None:
        if len(_PREFIXES) > 4096:
            _PREFIXES.clear()
        p = _PREFIXES[key] = f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(wall_s))} ATTN_CP{rank} TP{rank}] "
    return p


class LogEmitter:
    """Upstream log lines per rank, in memory (``lines[rank]``); :meth:`write` puts them in ``rank<r>.log`` files."""

    def __init__(self, level: int, ranks: int, prefix: bool = True) -> None:
        self.level = level
        self.prefix = prefix
        self.lines: list[list[str]] = [[] for _ in range(ranks)]

    def emit(self, rank: int, level: int, tag: str, /, **fields: Any) -> None:
        if level > self.level:
            return
        line = render_line(tag, fields)
        if self.prefix:
            line = log_prefix(rank, int(fields.get("ts", TS_BASE))) + line
        self.lines[rank].append(line)

    def write(self, folder: str) -> list[str]:
        os.makedirs(folder, exist_ok=True)
        paths = []
        for r, lines in enumerate(self.lines):
            path = os.path.join(folder, f"rank{r}.log")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
            paths.append(path)
        return paths

    def events(self) -> list[Event]:
        """All ranks' records as :class:`Event` objects, as the log reader yields them: parsed from the rendered
        lines, per rank in line order (``seq``), ranks merged by ``ts``, epochs from
        :class:`~cptrace_otel.checks.epochs.EpochTracker` (a ``reset`` belongs to the epoch it closes)."""
        import heapq

        from ..checks.epochs import EpochTracker

        try:  # the log reader's fast path (identical results to logline.parse_line, checked by its tests)
            from ..analyze.sources.logs import parse_trace_line as parse
        except ImportError:  # pragma: no cover
            def parse(line: str):  # type: ignore[misc]
                pl = parse_line(line)
                return None if pl is None else (pl.prefix, pl.tag, pl.fields, pl.bad_tokens)

        def one(r: int):
            for i, line in enumerate(self.lines[r]):
                p = parse(line)
                assert p is not None, line
                _, tag, f, _ = p
                yield Event(tag, r, i, int(f.get("ts", i)), 0, f, LEVEL_OF_TAG.get(tag, 1), f"rank{r}.log", i + 1)

        streams = [one(r) for r in range(len(self.lines))]
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda e: e.ts)
        trackers: dict[int, EpochTracker] = {}
        out = []
        for ev in merged:
            t = trackers.get(ev.rank)
            if t is None:
                t = trackers[ev.rank] = EpochTracker()
            ev.epoch = t.step(ev.tag, ev.fields)
            out.append(ev)
        return out


class ApiEmitter:
    """One rank's records through ``cptrace_otel.cptrace`` (the gate in force there does the level gating)."""

    def __init__(self, rank: int, level: int) -> None:
        from ..traced import api

        self.rank = rank
        self.level = level
        self._cptrace = api.cptrace

    def emit(self, rank: int, level: int, tag: str, /, **fields: Any) -> None:
        if rank == self.rank and level <= self.level:
            if "level" in fields or "tag" in fields:
                # upstream's signature cptrace(level, tag, **fields) cannot carry a field named like its parameters
                # (config's optional ``level=``): drop it; the exporter records the level as a resource attribute
                fields = {k: v for k, v in fields.items() if k not in ("level", "tag")}
            self._cptrace(level, tag, **fields)
