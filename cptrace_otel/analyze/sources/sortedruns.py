"""Sorted runs of records on disk: the external sort behind :class:`.tracedocs.TraceDocs`, which holds only a
bounded number of records in memory however long its input.

Contract:

* A record is ``(epoch, seq, ts, Event)``; runs are sorted by ``(epoch, seq, ts)``. On disk a run is chunks of
  :data:`CHUNK` records (reading a run holds one chunk of it), each chunk its kind, record count and length
  (:data:`CHUNK_HEAD`) and its bytes: packed by ``_speedups/sortedruns.c`` where it is built and the chunk's values
  are of the types it holds (:data:`C_RUNS`), else the Events' values as plain tuples, pickled (plain tuples pickle
  several times faster than dataclass instances): the Python twin, the same records back. Runs merge in the same C
  module (:func:`merge`; twin: ``heapq.merge``), and runs of packed chunks merge a level up from bytes to bytes
  (:meth:`RunFile.compact`). ``twin_off(vars(sortedruns), "C_RUNS")`` runs the twins.
* :class:`RunFile` is one unnamed temporary file (created on the first write, deleted when closed or collected)
  holding any number of runs; a run is :data:`Run`, its ``(offset, records)``. :meth:`RunFile.write` writes a
  sorted list as a run, :meth:`RunFile.writer` a run record by record, :meth:`RunFile.read` reads one back.
* :meth:`RunFile.compact` bounds how many runs one key's list holds: once :data:`FAN_IN` runs of one level (its
  newest) are there, they are merged (stably: ties keep the order of the runs) into one run of the next level. A key
  whose records arrive in R spills then holds at most ``(FAN_IN - 1) * log_FAN_IN(R)`` runs, so a merge of all of
  them holds that many chunks; each record is written once more per level. The merged runs' disk blocks are given
  back as they are merged (:func:`punch_hole`, where the system can), so the disk holds about the live runs' bytes.
* :class:`SeqBits` tells whether a key's records may hold two of one (epoch, seq), without merging its runs.
"""

from __future__ import annotations

import heapq
import itertools
import operator
import pickle
import struct
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from ...model.events import Event

CHUNK = 256         # records per chunk of a run: what each run's reader holds while merging
FAN_IN = 32         # runs of one level merged into one of the next (:meth:`RunFile.compact`)
SEQ_BITS_MAX = 1 << 28   # seqs a :class:`SeqBits` holds (32 MiB at most): past that, it reports a clash

Run = tuple[int, int]   # (offset in the file, records)

_UNLOADED: Any = object()
C_RUNS: Any = _UNLOADED   # sortedruns.c's module once loaded; None when not built (or switched off: twin_off)
PACKED, PICKLED = 1, 2    # a chunk's kind
CHUNK_HEAD = struct.Struct("<BIQ")   # a chunk's kind, its records and its length in bytes


def c_runs() -> Any:
    """The C half of the sorted runs (loaded on first use), or None: every chunk is pickled, runs merge in Python."""
    global C_RUNS
    if C_RUNS is _UNLOADED:
        from ..._speedups.sortedruns import load

        C_RUNS = load()
    return C_RUNS


class RunFile:
    """Sorted runs in one temporary file (see the module doc)."""

    def __init__(self) -> None:
        self._fh: IO[bytes] | None = None
        self._level: dict[int, int] = {}   # a run's offset -> its level, when above 0
        self._pack: Any = None             # set with the file: its own (a later twin_off strands no packed chunk)
        self._mixed: set[int] = set()      # offsets of the runs holding a pickled chunk
        # a run's offset -> the offset past its last chunk; runs of no record are left out: one starts where the next
        # run written does, and its end would be taken for that run's
        self._ends: dict[int, int] = {}

    def _file(self) -> IO[bytes]:
        if self._fh is None:
            self._pack = c_runs()
            self._fh = tempfile.TemporaryFile(prefix="cptrace-sort-")  # noqa: SIM115 - lives as long as the runs
        return self._fh

    def write(self, records: list[tuple]) -> Run:
        """``records`` (sorted) as one new run."""
        w = self.writer()
        w.extend(records)
        return w.close()

    def writer(self) -> RunWriter:
        """A new run written at the end of the file record by record (:meth:`RunWriter.close` gives it)."""
        fh = self._file()
        return RunWriter(fh, self._pack, self._mixed, self._ends)

    def read(self, off: int, n: int) -> Iterator[tuple]:
        """The records of one run as ``(epoch, seq, ts, Event)``, a chunk at a time (read when the iterator comes to
        it). Each chunk's list is chained in C: no Python frame is resumed per record, only per chunk."""
        pack = self._pack
        return itertools.chain.from_iterable(pack.unpack(data) if kind == PACKED else unpickle_chunk(data)
                                             for kind, data in self._chunks(off, n))

    def _chunks(self, off: int, n: int) -> Iterator[tuple[int, bytes]]:
        """The chunks of one run as written, ``(kind, bytes)`` (the file is shared by the runs read at once: each
        read seeks to its place)."""
        fh = self._file()
        head = CHUNK_HEAD.size
        while n > 0:
            fh.seek(off)
            kind, count, size = CHUNK_HEAD.unpack(fh.read(head))
            off += head + size
            n -= count
            yield kind, fh.read(size)

    def level(self, run: Run) -> int:
        """How many merges ``run`` went through (0: written as one spill, or a run of no record)."""
        return self._level.get(run[0], 0) if run[1] else 0

    def compact(self, runs: list[Run]) -> None:
        """Merge the newest runs of ``runs`` (one key's, oldest first) in place while :data:`FAN_IN` of them share
        a level (see the module doc). Runs of no record are dropped from ``runs`` first: one starts where the next
        run written does, so the marks kept by offset (level, pickled chunks, end) are that run's, never its own."""
        if not all(n for _o, n in runs):
            runs[:] = [r for r in runs if r[1]]
        level = self._level
        while len(runs) >= FAN_IN:
            tail = runs[-FAN_IN:]
            lv = self.level(tail[-1])
            if any(self.level(r) != lv for r in tail):
                return
            w = self.writer()
            if not self._merge_packed(tail, w):
                punch_hole(self._fh, w.off, w.end - w.off)   # (declined: what it wrote is never read)
                w = self.writer()
                self._merge_records(tail, w)
            runs[-FAN_IN:] = [w.close()]
            for o, _n in tail:   # (never read again: their records are in the new run)
                level.pop(o, None)
                self._mixed.discard(o)
                punch_hole(self._fh, o, self._ends.pop(o) - o)
            level[runs[-1][0]] = lv + 1

    def _merge_records(self, tail: list[Run], w: RunWriter) -> None:
        """The records of the runs ``tail`` merged (stably) into ``w``: sortedruns.c's ``merge_packed``'s twin."""
        for t in merge([self.read(o, n) for o, n in tail]):
            w.append(t)

    def _merge_packed(self, tail: list[Run], w: RunWriter) -> bool:
        """:meth:`_merge_records` from bytes to bytes in C, where every chunk of ``tail`` is packed (no Python
        object a record: the same chunks ``w`` would pack); False when it cannot (then nothing in ``w`` counts)."""
        if self._pack is None or any(o in self._mixed for o, _n in tail):
            return False
        return bool(self._pack.merge_packed([self._packed(o, n) for o, n in tail], CHUNK, w.append_packed))

    def _packed(self, off: int, n: int) -> Iterator[bytes]:
        """The packed chunks of one run, as written (the run holds no pickled chunk)."""
        return (data for _kind, data in self._chunks(off, n))


_FALLOC_PUNCH = 0x01 | 0x02   # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (linux/falloc.h)
_fallocate: Any = _UNLOADED


def punch_hole(fh: Any, off: int, length: int) -> bool:
    """Give the disk blocks of bytes ``[off, off + length)`` of the open file ``fh`` back to the file system (Linux's
    ``fallocate`` with ``FALLOC_FL_PUNCH_HOLE``: the file keeps its size and reads zeros there). True when done;
    False where the system has no such call or the file system refuses it (then the blocks stay used until the file
    is closed, as before). Why ctypes: Python's ``os`` has ``posix_fallocate``, which only allocates."""
    global _fallocate
    if _fallocate is _UNLOADED:
        _fallocate = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                f = getattr(libc, "fallocate64", None) or libc.fallocate
                f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
                f.restype = ctypes.c_int
                _fallocate = f
            except (OSError, AttributeError):
                pass
    if _fallocate is None or length <= 0:
        return False
    return _fallocate(fh.fileno(), _FALLOC_PUNCH, off, length) == 0


class SeqBits:
    """The seqs of one key's records, one bit each (1 bit a record: 2 MiB for 16M records), to tell whether two of
    its records may share an (epoch, seq), the only way a record can be given twice: :attr:`clash` once a seq came
    twice, or one the bits cannot hold did (not an int in ``[0, SEQ_BITS_MAX)``)."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.clash = False

    def add(self, records: list[tuple]) -> None:
        """The seqs of ``records`` (``(epoch, seq, ts, Event)``): in C where it is built (``mark_seqs``)."""
        c = c_runs()
        if c is None:
            self._add_py(records)
        elif not self.clash:
            self.clash = c.mark_seqs(self.bits, records, SEQ_BITS_MAX)

    def _add_py(self, records: list[tuple]) -> None:
        """:meth:`add` in Python: sortedruns.c's ``mark_seqs``'s twin."""
        bits = self.bits
        for t in records:
            if self.clash:
                return
            q = t[1]
            if type(q) is not int or not 0 <= q < SEQ_BITS_MAX:
                self.clash = True
                return
            i, b = q >> 3, 1 << (q & 7)
            if i >= len(bits):
                bits.extend(bytes(max(i + 1 - len(bits), len(bits))))   # (doubled: amortised growth)
            self.clash = bool(bits[i] & b)
            bits[i] |= b


# a record as pickled: its Event's values in the constructor's order (Event(*values) rebuilds it), as a plain tuple
_values = operator.attrgetter("tag", "rank", "seq", "ts", "epoch", "fields", "level", "src", "line_no")


def pickle_chunk(records: list[tuple]) -> bytes:
    """A chunk of records ``(epoch, seq, ts, Event)`` as bytes: sortedruns.c's ``pack``'s Python twin (it holds every
    value pickle holds)."""
    return pickle.dumps([_values(t[3]) for t in records], pickle.HIGHEST_PROTOCOL)


def unpickle_chunk(data: bytes) -> list[tuple]:
    """The records :func:`pickle_chunk` was given, rebuilt: sortedruns.c's ``unpack``'s Python twin."""
    return [(x[4], x[2], x[3], Event(*x)) for x in pickle.loads(data)]


def merge(runs: list[Iterator[tuple]]) -> Iterator[tuple]:
    """The records of sorted ``runs`` merged by (epoch, seq, ts), stably (ties in the order of the runs), lazily:
    sortedruns.c's ``merge`` where it is built, else its twin ``heapq.merge``."""
    pack = c_runs()
    if pack is None:
        return heapq.merge(*runs, key=RECORD_KEY)
    return pack.merge(runs)


# the sort key (epoch, seq, ts) of a record; itemgetter builds it without a Python call
RECORD_KEY = operator.itemgetter(0, 1, 2)


class RunWriter:
    """One new run at the end of the file, written chunk by chunk (while other runs of the file are read: each
    write seeks to the run's end)."""

    def __init__(self, fh: IO[bytes], pack: Any, mixed: set[int], ends: dict[int, int]) -> None:
        self.fh = fh
        self.fh.seek(0, 2)
        self.off, self.n = self.fh.tell(), 0
        self.buf: list[tuple] = []
        self.end = self.off
        self.pack = pack     # sortedruns.c's module, or None: pickled
        self.mixed = mixed   # (the file's: this run's offset joins it once it holds a pickled chunk)
        self.ends = ends     # (the file's: this run's end, once closed)

    def append(self, t: tuple) -> None:
        """A record ``(epoch, seq, ts, Event)``."""
        self.buf.append(t)
        if len(self.buf) >= CHUNK:
            self._flush()

    def extend(self, records: list[tuple]) -> None:
        """Records ``(epoch, seq, ts, Event)``, written a chunk at a time."""
        i = 0
        while i < len(records):
            take = CHUNK - len(self.buf)
            self.buf += records[i:i + take]
            i += take
            if len(self.buf) >= CHUNK:
                self._flush()

    def append_packed(self, count: int, data: bytes) -> None:
        """A chunk of ``count`` records as sortedruns.c packed them (``merge_packed`` writes through this)."""
        self._write(PACKED, data, count)

    def _flush(self) -> None:
        """The buffered records as one chunk: packed where sortedruns.c is built and holds every value in it,
        else pickled."""
        data = None if self.pack is None else self.pack.pack(self.buf)
        if data is None:   # (not built, switched off, or a value of a type sortedruns.c does not hold)
            self._write(PICKLED, pickle_chunk(self.buf), len(self.buf))
        else:
            self._write(PACKED, data, len(self.buf))
        self.buf = []

    def _write(self, kind: int, data: bytes, count: int) -> None:
        if kind == PICKLED:
            self.mixed.add(self.off)
        self.fh.seek(self.end)
        self.fh.write(CHUNK_HEAD.pack(kind, count, len(data)))
        self.fh.write(data)
        self.end = self.fh.tell()
        self.n += count

    def close(self) -> Run:
        """The run written."""
        if self.buf:
            self._flush()
        if self.n:
            self.ends[self.off] = self.end
        return self.off, self.n
