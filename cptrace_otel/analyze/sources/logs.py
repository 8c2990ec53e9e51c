"""Upstream log files (``[CPTRACE tag] k=v ...`` lines, with or without SGLang's prefix) -> :class:`Event` stream.

* SGLang's kv-canary violation lines (``kv_canary violation: launch_tag=... slot_idx=...``,
  :mod:`cptrace_otel.model.canary`) in the same files become ``kv_canary`` records (ts: that of the record before
  them in the file; rank: ``ATTN_CP<n>`` of their prefix, else that record's); the ``CANARY`` rule attaches each to
  the node whose device slots held the slot.
* Other lines without the ``[CPTRACE`` marker are ignored. A line with the marker whose shape is broken, or with tokens
  lacking ``=``, is reported (file, line number, reason) through ``on_malformed`` and counted; a line whose body
  still parses is kept (bad tokens dropped), the rest of the file is processed either way. A line holding a value
  that cannot be turned into a Python value (an int of more than 4,300 digits, Python's int-string limit) is
  reported and skipped; so is a line longer than :data:`.files.MAX_LINE` bytes, which is never held whole.
* Rank: the ``rank=`` field (``-1`` means unknown), else ``ATTN_CP<n>`` in the prefix, else the file's default
  (``rank<n>``/``cp<n>`` in the file name, else the file's position on the command line).
* ``seq`` is the line order within a rank; ``ts`` the ``ts=`` field, else the line number; ``epoch`` counts
  ``reset`` records and node ids going backwards (:class:`~cptrace_otel.checks.epochs.EpochTracker`).
* Several files are merged lazily by ``ts`` (``heapq.merge``), so memory does not grow with the files' length.

The field parser is a fast path of :func:`cptrace_otel.model.logline.parse_line` with identical results (a unit test
compares them): values go through :func:`cptrace_otel.model.logline.fast_value` (the grammar's one fast path) and
repeated scalar tokens are memoized here.

When the optional C line reader (:mod:`cptrace_otel._speedups.logreader`) was built (``setup.py``), a file is read
as bytes in blocks and the C code splits, decodes and parses the lines and builds the events (the same events,
unit-tested against both the reference parser and the Python reader); the lines it does not know (non-ASCII text,
floats, odd shapes, malformed lines) take the Python parser above.
"""

from __future__ import annotations

import heapq
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from ..._speedups import twin_off
from ..._speedups.logreader import load as _load_logreader
from ...checks.epochs import EPOCH_TAGS, EpochTracker
from ...model.canary import MARKER as CANARY_MARK, TAG as CANARY_TAG, parse_canary_line
from ...model.events import Event
from ...model.exits import CptraceError
from ...model.grammar import LINE
from ...model.logline import fast_value
from . import inputs as files
from .inputs import consumed, open_text, truncated

MARKER = LINE.marker
_OPEN = LINE.opening                # where a well-formed record's tag starts ...
_TAG_AT = len(_OPEN)                # ... this many characters after the marker's place
_TS, _RANK = LINE.ts_field, LINE.rank_field
_TS_TOKEN = f" {_TS}="              # the ts field as a token of its own (the usual last one)
_RANK_PREFIX = LINE.rank_prefix
_TAG_RE = re.compile(r"\w+")
_GOOD_TAGS: set[str] = set()   # tags already validated against _TAG_RE
_FILE_RANK = re.compile(r"(?:rank|cp)[_-]?(\d+)", re.IGNORECASE)


class LogReadError(CptraceError):
    """A log source that cannot be opened or read (the ``check`` command exits 3)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read {path}: {reason}")
        self.path, self.reason = path, reason


class Malformed(NamedTuple):
    path: str
    line_no: int
    reason: str
    text: str


DISORDER_MIN, DISORDER_SHARE = 50, 20   # check warns about concatenated ranks from 50 records and 1 in 20 behind


class LogStats:
    """Counters of one read: lines seen, events produced, malformed lines (the first few kept verbatim)."""

    KEEP = 100

    def __init__(self) -> None:
        self.lines = self.events = self.malformed = 0
        self.examples: list[Malformed] = []
        # records of a file holding several ranks that come after a record with a later ts (see _renumber), and
        # those files: many means the ranks are concatenated, not interleaved in time
        self.behind = 0
        self.behind_src: set[str] = set()

    def disordered(self) -> bool:
        """True when the ranks sharing a file are far from time order: at least :data:`DISORDER_MIN` records and
        one in :data:`DISORDER_SHARE` behind (concatenated ranks put about half of them behind; one process's log
        of several ranks only a few swapped lines). The cross-rank rules assume ranks within a few hundred records
        of each other."""
        return self.behind >= DISORDER_MIN and self.behind * DISORDER_SHARE >= self.events

    def add(self, m: Malformed) -> None:
        self.malformed += 1
        if len(self.examples) < self.KEEP:
            self.examples.append(m)


# -- fast field parser -------------------------------------------------------------------------------------------

_TOKCACHE_MAX = 16384


_NOCACHE_KEYS = frozenset(("ts", "seq", "h", "hh", "wall", "mono"))  # unique per record: caching them only churns


class _BadToken(Exception):
    pass


class _TokenCache(dict):
    """token -> (key, typed value). Looked up through ``map(cache.__getitem__, tokens)`` so that a line whose tokens
    are all known is parsed entirely in C; a miss computes the pair in :meth:`__missing__` (and keeps it when the
    value is immutable and likely to repeat)."""

    def __missing__(self, tok: str) -> tuple[str, Any]:
        k, eq, v = tok.partition("=")
        if not eq or not k:
            raise _BadToken(tok)
        if v.isdigit() and v.isascii() and (v[0] != "0" or len(v) == 1):
            val: Any = int(v)   # the commonest miss (node_id, op, h, ...): fast_value's first case, without the call
            if k in _NOCACHE_KEYS:
                return (k, val)
        else:
            val = fast_value(v)
        if k not in _NOCACHE_KEYS and type(val) is not list and len(tok) < 100:
            if len(self) >= _TOKCACHE_MAX:
                self.clear()
            self[tok] = (k, val)
        return (k, val)


_TOKCACHE = _TokenCache()
_pair = _TOKCACHE.__getitem__


def parse_trace_line(line: str) -> tuple[str, str, dict[str, Any], list[str]] | None:
    """``(prefix, tag, fields, bad_tokens)`` exactly as :func:`cptrace_otel.model.logline.parse_line`, or None."""
    if _logc is not None:
        p = _logc.parse_line(line)   # None: not a shape the C parser knows, the code below decides
        if p is not None:
            return p
    idx = line.find(_OPEN)
    if idx < 0:
        return None
    end = line.find("]", idx + _TAG_AT)
    if end < 0:
        return None
    tag = line[idx + _TAG_AT:end]
    if tag not in _GOOD_TAGS:
        if not tag or not _TAG_RE.fullmatch(tag):
            return None
        if len(_GOOD_TAGS) < 4096:
            _GOOD_TAGS.add(tag)
    rest = line[end + 1:].rstrip("\r\n")
    if rest and rest[0] != " ":
        return None
    if "\n" in rest or "\r" in rest:  # "." of the line regex does not cross a newline
        return None
    j = rest.rfind(_TS_TOKEN)
    if j >= 0 and rest.find(" ", j + 1) < 0:
        # the usual shape: ``ts=`` is the last token and unique per line; keep it out of the token cache
        tsv = rest[j + len(_TS_TOKEN):]
        if tsv.isdigit() and tsv.isascii() and (tsv[0] != "0" or len(tsv) == 1):
            try:
                fields = dict(map(_pair, rest[:j].split()))
            except _BadToken:
                pass
            else:
                fields[_TS] = int(tsv)   # an earlier duplicate keeps its position, the last value wins: as logline
                return line[:idx], tag, fields, []
    try:
        return line[:idx], tag, dict(map(_pair, rest.split())), []
    except _BadToken:
        pass
    fields: dict[str, Any] = {}  # type: ignore[no-redef]
    bad: list[str] = []
    for tok in rest.split():
        try:
            k, v = _pair(tok)
        except _BadToken:
            bad.append(tok)
            continue
        fields[k] = v
    return line[:idx], tag, fields, bad


def _prefix_rank(prefix: str) -> int | None:
    i = prefix.find(_RANK_PREFIX)
    if i < 0:
        return None
    j = i + len(_RANK_PREFIX)
    k = j
    while k < len(prefix) and prefix[k].isdigit():
        k += 1
    return int(prefix[j:k]) if k > j else None


def default_rank(path: str, position: int) -> int:
    """Rank of lines that carry neither ``rank=`` nor ``ATTN_CP``: from the file name, else its position."""
    m = _FILE_RANK.search(os.path.basename(path))
    return int(m.group(1)) if m else position


# -- readers -----------------------------------------------------------------------------------------------------

def _open(path: str):
    try:
        return open_text(path)
    except OSError as e:
        raise LogReadError(path, e.strerror or str(e)) from None


def _report_truncation(fh, path: str, line_no: int, on_bad: Callable[[Malformed], None]) -> None:
    """A compressed log whose stream broke after ``line_no`` lines: reported like a malformed line after them."""
    why = truncated(fh)
    if why:
        on_bad(Malformed(path, line_no + 1, why, ""))


_CHUNK = 512  # events pulled from one file at a time: the merge works on chunks, not events
_BLOCK = 1 << 18  # bytes handed to the C parser at a time

_logc = _load_logreader()   # the C line reader (_speedups.logreader: this module's Python reader's events), or None


def c_reader() -> Any:
    """The C line reader this module reads with, or None (not built, or off: :func:`python_reader`)."""
    return _logc


def python_reader() -> AbstractContextManager[None]:
    """A block in which this module reads with the Python reader alone, the C reader's twin (tests read one input
    with each; :func:`cptrace_otel._speedups.twin_off`)."""
    return twin_off(globals(), "_logc")


def _file_chunks(fh, path: str, drank: int, on_bad: Callable[[Malformed], None], stats: LogStats,
                 state: dict[int, list]) -> Iterator[list[Event]]:
    """Lists of events of one file with rank, ts, seq and epoch set. ``state`` (rank -> [next seq, EpochTracker])
    is shared by all files: when every rank lives in one file, these numbers are final; otherwise the merge
    renumbers in merge order (:func:`_renumber`). Uses the C parser when it was built: the same events.

    Both readers count the lines they consumed in ``seen[0]``; here, once for both: a broken gzip stream is
    reported after them, an I/O error becomes :class:`LogReadError`, and the file is counted and closed (also when
    the consumer stops early)."""
    read = _file_chunks_c if _logc is not None and hasattr(fh, "buffer") else _file_chunks_py
    seen = [0]
    try:
        yield from read(fh, path, drank, on_bad, stats, state, seen)
        _report_truncation(fh, path, seen[0], on_bad)
    except OSError as e:
        raise LogReadError(path, e.strerror or str(e)) from None
    finally:
        stats.lines += seen[0]
        fh.close()


def _canary_line(line: str, path: str, line_no: int, drank: int, on_bad: Callable[[Malformed], None],
                 prev: Event | None) -> tuple[str, dict[str, Any], Any, int] | None:
    """``(tag, fields, ts, rank)`` of SGLang's kv-canary violation line (:mod:`cptrace_otel.model.canary`), None for a
    line without the marker. The line carries no ``ts=``: it takes the ts of ``prev``, the record before it in the
    file (so the merge keeps it where the process printed it), else its line number like any line without one. Its
    rank: ``ATTN_CP<n>`` of its prefix; a line without one (raise mode: the violations are the text of a
    ``RuntimeError`` in a traceback, after the prefixed line of the error report) is the rank of ``prev``, the
    process that logged last in this file, else the file's. A line with the marker whose fields do not parse is
    reported: a violation is never dropped in silence."""
    if CANARY_MARK not in line:
        return None
    try:
        p = parse_canary_line(line)
    except ValueError as e:   # an int over Python's int-string limit
        p = None
        why = f"a kv_canary violation line with a value that does not parse ({e})"
    else:
        why = "a kv_canary violation line without launch_tag, fail_reason and int slot_idx and position"
    if p is None:
        on_bad(Malformed(path, line_no, why, line.rstrip("\r\n")[:200]))
        return None
    prefix, fields = p
    r = _prefix_rank(prefix) if prefix else None
    if r is None:
        r = prev.rank if prev is not None else drank
    return CANARY_TAG, fields, (prev.ts if prev is not None and type(prev.ts) is int else line_no), r


def _slow_line(line: str, path: str, line_no: int, drank: int, on_bad: Callable[[Malformed], None],
               prev: Event | None = None) -> tuple[str, dict[str, Any], Any, int] | None:
    """``(tag, fields, ts, rank)`` of a line the C parser left to Python (the full parser), None when it yields
    no event; malformed lines are reported (also a value Python cannot hold: the line is skipped). A line without
    a ``[CPTRACE`` marker is SGLang's kv-canary line (:func:`_canary_line`; ``prev``: the file's record before it)."""
    if MARKER not in line:
        return _canary_line(line, path, line_no, drank, on_bad, prev)
    try:
        p = parse_trace_line(line)
    except ValueError as e:   # int("9" * 5000): Python's int-string limit (sys.get_int_max_str_digits)
        why = (f"an integer of more than {sys.get_int_max_str_digits()} digits" if "digits" in str(e)
               else f"a value that does not parse ({e})")
        on_bad(Malformed(path, line_no, why, line.rstrip("\r\n")[:200]))
        return None
    if p is None:
        on_bad(Malformed(path, line_no, f"broken {_OPEN}tag] marker", line.rstrip("\r\n")))
        return None
    prefix, tag, fields, bad = p
    if bad:
        on_bad(Malformed(path, line_no, f"tokens without '=': {' '.join(bad)}", line.rstrip("\r\n")))
    ts = fields.get(_TS)
    if type(ts) is not int:
        ts = line_no
    r = fields.get(_RANK)
    if type(r) is not int or r < 0:
        r = _prefix_rank(prefix) if prefix else None
        if r is None:
            r = drank
    return tag, fields, ts, r


def _too_long(path: str, line_no: int, max_line: int, head: str) -> Malformed:
    return Malformed(path, line_no, f"a line longer than {max_line} bytes (not read; CPTRACE_MAX_LINE raises the "
                                    "cap)", head)


def _file_chunks_c(fh, path: str, drank: int, on_bad: Callable[[Malformed], None], stats: LogStats,
                   state: dict[int, list], seen: list[int]) -> Iterator[list[Event]]:
    """:func:`_file_chunks` over the file's bytes, read in blocks: ``_logc.fill_chunk`` splits and parses the lines
    and builds the events (rank, ts, seq, epoch as the Python loop does) in C; a line it cannot parse is decoded
    as the text reader would and takes :func:`_slow_line`. An incomplete line longer than ``files.MAX_LINE`` is
    reported and its bytes are dropped up to the next newline."""
    fill = _logc.fill_chunk  # type: ignore[union-attr]
    prev: list[Any] = [None]   # the file's last event before the current chunk (a canary line takes its ts)

    def slow(line: str, ln: int):
        return _slow_line(line, path, ln, drank, on_bad, chunk[-1] if chunk else prev[0])

    read = fh.buffer.read   # the text layer of fh is never used: no text is buffered there
    line_no = 0   # lines consumed (as the per-line reader counts them when the consumer stops early)
    chunk: list[Event] = []
    rest = b""    # an incomplete last line, completed by the next block
    max_line = files.MAX_LINE
    skipping = False   # inside a line over max_line: its bytes are dropped up to the next newline
    try:
        while True:
            more = read(_BLOCK)
            if skipping:
                if not more:
                    break
                i = more.find(b"\n")
                if i < 0:
                    continue
                skipping = False
                more = more[i + 1:]
                if not more:
                    continue
            data = rest + more if rest else more
            final = not more
            pos = 0
            while True:
                pos, nxt = fill(chunk, _CHUNK, data, pos, final, line_no + 1, drank, state, path, slow)
                line_no = nxt - 1
                if len(chunk) < _CHUNK:
                    break
                stats.events += len(chunk)
                prev[0] = chunk[-1]
                yield chunk
                chunk = []
            if final:
                break
            rest = data[pos:]
            if len(rest) > max_line:
                line_no += 1
                on_bad(_too_long(path, line_no, max_line, rest[:120].decode("utf-8", "replace")))
                rest = b""
                skipping = True
        if chunk:
            stats.events += len(chunk)
            yield chunk
    finally:
        seen[0] = line_no


def _file_chunks_py(fh, path: str, drank: int, on_bad: Callable[[Malformed], None], stats: LogStats,
                    state: dict[int, list], seen: list[int]) -> Iterator[list[Event]]:
    """:func:`_file_chunks` line by line in Python (no C parser built)."""
    line_no = 0
    chunk: list[Event] = []
    append = chunk.append
    last_r, rs = None, None
    prev: Any = None   # the last event of the previous chunk (a canary line takes the ts before it)
    epoch_tags = EPOCH_TAGS
    good_tags = _GOOD_TAGS
    pair = _pair
    bad_token = _BadToken
    max_line = files.MAX_LINE
    readline = fh.readline
    try:
        while True:
            line = readline(max_line)   # bounded: a line over max_line characters is cut, reported, skipped
            if not line:
                break
            line_no += 1
            if len(line) >= max_line and line[-1] not in "\r\n":
                on_bad(_too_long(path, line_no, max_line, line[:120]))
                while line and line[-1] not in "\r\n":
                    line = readline(max_line)
                continue
            # Fast path, the same result as parse_trace_line for the usual shape: a known tag, " k=v" tokens that
            # all carry "=", ``ts=`` last and canonical. _open reads with newline="", so a line holds no "\r"/"\n"
            # before its ending (the check parse_trace_line makes). Anything else takes the full parser.
            idx = line.find(_OPEN)
            if idx < 0:
                if MARKER not in line and CANARY_MARK not in line:
                    continue
                fields = None
            else:
                end = line.find("]", idx + _TAG_AT)
                tag = line[idx + _TAG_AT:end] if end >= 0 else ""
                j = line.rfind(_TS_TOKEN)
                fields = None
                if j > end >= 0 and tag in good_tags and line[end + 1] == " ":
                    tsv = line[j + len(_TS_TOKEN):].rstrip("\r\n")
                    if tsv.isdigit() and tsv.isascii() and (tsv[0] != "0" or len(tsv) == 1):
                        try:
                            fields = dict(map(pair, line[end + 1:j].split()))
                        except (bad_token, ValueError):   # ValueError: an int over the int-string limit
                            fields = None
                        else:
                            fields[_TS] = ts = int(tsv)
            if fields is None:
                slow = _slow_line(line, path, line_no, drank, on_bad, chunk[-1] if chunk else prev)
                if slow is None:
                    continue
                tag, fields, ts, r = slow
            else:
                r = fields.get(_RANK)  # type: ignore[assignment]
                if type(r) is not int or r < 0:
                    r = _prefix_rank(line[:idx]) if idx > 0 else None  # type: ignore[assignment]
                    if r is None:
                        r = drank
            if r != last_r:
                rs = state.get(r)
                if rs is None:
                    rs = state[r] = [0, EpochTracker()]
                last_r = r
            seq = rs[0]  # type: ignore[index]
            rs[0] = seq + 1  # type: ignore[index]
            t = rs[1]  # type: ignore[index]
            ep = t.step(tag, fields) if (tag in epoch_tags or t.pending) else t.epoch
            append(Event(tag, r, seq, ts, ep, fields, 1, path, line_no))
            if len(chunk) >= _CHUNK:
                stats.events += len(chunk)
                prev = chunk[-1]
                yield chunk
                chunk = []
                append = chunk.append
        if chunk:
            stats.events += len(chunk)
            yield chunk
    finally:
        seen[0] = line_no


def _merge_chunks(firsts: list[list[Event]], streams: list[Iterator[list[Event]]]) -> Iterator[list[Event]]:
    """Chunks of all files, always the one whose first ts is lowest next: each file's order is kept and ranks
    stay within about one chunk of each other in time (the cross-rank rules only need bounded lag)."""
    heads = [(c[0].ts, i, c) for i, c in enumerate(firsts) if c]
    heapq.heapify(heads)
    while heads:
        _, i, c = heads[0]
        yield c
        n = next(streams[i], None)
        if n:
            heapq.heapreplace(heads, (n[0].ts, i, n))
        else:
            heapq.heappop(heads)


class LogEvents:
    """The iterator :func:`read_log_events` returns; ``ranks`` are the ranks seen in each file's first chunk (a
    hint for the cross-rank rules, known before the first event is consumed)."""

    def __init__(self, it: Iterator[Event], ranks: set[int], per_file: list[set[int]] | None = None) -> None:
        self._it = it
        self.ranks = ranks
        self.per_file = per_file if per_file is not None else []   # the ranks of each file's first chunk, in order

    def __iter__(self) -> Iterator[Event]:
        return self._it   # the generator itself: no Python-level __next__ per event

    def __next__(self) -> Event:
        return next(self._it)


def read_log_events(paths: Iterable[str], on_malformed: Callable[[Malformed], None] | None = None,
                    stats: LogStats | None = None,
                    progress: Callable[[int, int], None] | None = None) -> LogEvents:
    """Events of all ``paths`` (any mix of ranks), per rank in line order, ranks merged by ``ts`` (in chunks).

    Opens every file and reads its first chunk here, so an unreadable one raises :class:`LogReadError` before any
    event is returned. ``progress(done, total)``, when given, is called once per chunk of events (not per event:
    the hot loop stays as it is) with the bytes of the files read so far and their size on disk (compressed bytes
    for gzip files)."""
    paths = list(paths)
    st = stats if stats is not None else LogStats()

    def bad(m: Malformed) -> None:
        st.add(m)
        if on_malformed is not None:
            on_malformed(m)

    state: dict[int, list] = {}
    opened = [file_chunks(p, i, bad, st, state) for i, p in enumerate(paths)]   # all opened before any is read
    handles, streams = [fh for fh, _c in opened], [c for _fh, c in opened]
    firsts = [next(s, None) or [] for s in streams]  # type: ignore[arg-type]
    per_file = [{ev.rank for ev in c} for c in firsts]
    ranks = set().union(*per_file) if per_file else set()
    if len(streams) == 1:
        merged: Iterator[list[Event]] = _chain_first(firsts[0], streams[0])
    else:
        merged = _merge_chunks(firsts, streams)
    if progress is not None:
        merged = _reporting(merged, handles, paths, progress)
    # one rank per file, no rank in two files (the usual layout): the readers' numbers are final
    if sum(len(x) for x in per_file) == len(ranks) and all(len(x) <= 1 for x in per_file):
        return LogEvents(itertools.chain.from_iterable(merged), ranks, per_file)
    return LogEvents(_renumber(merged, st), ranks, per_file)


def file_chunks(path: str, position: int, on_malformed: Callable[[Malformed], None], stats: LogStats,
                state: dict[int, list]) -> tuple[Any, Iterator[list[Event]]]:
    """One file of :func:`read_log_events` (``position``: its place among the paths given), opened and read in the
    same chunks: ``(its handle, for .inputs.consumed; its chunks)``, the rank, seq and epoch numbers set as
    :func:`read_log_events` sets them when every rank lives in one file (``state`` shared by the files read
    together). Raises :class:`LogReadError` when it cannot be opened. For ``check -j``, whose workers read the
    files apart and replay the merge."""
    fh = _open(path)
    return fh, _file_chunks(fh, path, default_rank(path, position), on_malformed, stats, state)


def _reporting(chunks: Iterator[list[Event]], handles: list, paths: list[str],
               progress: Callable[[int, int], None]) -> Iterator[list[Event]]:
    """``chunks`` unchanged, calling ``progress(done, total)`` in bytes before each one and at the end."""
    sizes = []
    for p in paths:
        try:
            sizes.append(os.path.getsize(p))
        except OSError:
            sizes.append(0)
    total = sum(sizes)

    def done() -> int:
        n = 0
        for fh, size in zip(handles, sizes, strict=False):
            pos = consumed(fh)
            n += size if pos is None else min(pos, size)
        return n

    for chunk in chunks:
        progress(done(), total)
        yield chunk
    progress(total, total)


def _chain_first(first: list[Event], rest: Iterator[list[Event]]) -> Iterator[list[Event]]:
    if first:
        yield first
    yield from rest


def _renumber(chunks: Iterator[list[Event]], stats: LogStats) -> Iterator[Event]:
    """seq/epoch per rank in merge order: for ranks spread over several files (rotated or combined logs). Counts the
    records whose ts is below the latest ts read before them (``stats.behind``): one process's log of several ranks
    is in time order up to a few swapped lines, ranks concatenated one after another are not."""
    state: dict[int, list] = {}   # rank -> [next seq, EpochTracker]
    hi = None
    for chunk in chunks:
        for ev in chunk:
            if hi is None or ev.ts >= hi:
                hi = ev.ts
            else:
                stats.behind += 1
                if len(stats.behind_src) < 8:
                    stats.behind_src.add(ev.src)
            rs = state.get(ev.rank)
            if rs is None:
                rs = state[ev.rank] = [0, EpochTracker()]
            ev.seq = rs[0]
            rs[0] += 1
            t = rs[1]
            if ev.tag in EPOCH_TAGS or t.pending:
                ev.epoch = t.step(ev.tag, ev.fields)
            else:
                ev.epoch = t.epoch
            yield ev
