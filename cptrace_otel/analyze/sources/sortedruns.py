"""Sorted runs of records on disk: the external sort behind :class:`.tracedocs.TraceDocs`, which holds only a
bounded number of records in memory however long its input.

Contract:

* A record is ``(epoch, seq, ts, Event)``; runs are sorted by ``(epoch, seq, ts)``. On disk a record is the Event's
  values as a plain tuple (plain tuples pickle several times faster than dataclass instances), pickled in chunks
  of :data:`CHUNK`: reading a run holds one chunk of it.
* :class:`RunFile` is one unnamed temporary file (created on the first write, deleted when closed or collected)
  holding any number of runs; a run is :data:`Run`, its ``(offset, records)``. :meth:`RunFile.write` writes a
  sorted list as a run, :meth:`RunFile.writer` a run record by record, :meth:`RunFile.read` reads one back.
* :meth:`RunFile.compact` bounds how many runs one key's list holds: once :data:`FAN_IN` runs of one level (its
  newest) are there, they are merged (stably: ties keep the order of the runs) into one run of the next level. A key
  whose records arrive in R spills then holds at most ``(FAN_IN - 1) * log_FAN_IN(R)`` runs, so a merge of all of
  them holds that many chunks; each record is written once more per level (the file keeps the merged runs' bytes
  until it is closed).
* :class:`SeqBits` tells whether a key's records may hold two of one (epoch, seq), without merging its runs.
"""

from __future__ import annotations

import heapq
import operator
import pickle
import tempfile
from collections.abc import Iterator
from typing import IO

from ...model.events import Event

CHUNK = 256         # records per pickled chunk of a run: what each run's reader holds while merging
FAN_IN = 32         # runs of one level merged into one of the next (:meth:`RunFile.compact`)
SEQ_BITS_MAX = 1 << 28   # seqs a :class:`SeqBits` holds (32 MiB at most): past that, it reports a clash

Run = tuple[int, int]   # (offset in the file, records)


class RunFile:
    """Sorted runs in one temporary file (see the module doc)."""

    def __init__(self) -> None:
        self._fh: IO[bytes] | None = None
        self._level: dict[int, int] = {}   # a run's offset -> its level, when above 0

    def _file(self) -> IO[bytes]:
        if self._fh is None:
            self._fh = tempfile.TemporaryFile(prefix="cptrace-sort-")  # noqa: SIM115 - lives as long as the runs
        return self._fh

    def write(self, records: list[tuple]) -> Run:
        """``records`` (sorted) as one new run."""
        w = self.writer()
        w.extend(records)
        return w.close()

    def writer(self) -> RunWriter:
        """A new run written at the end of the file record by record (:meth:`RunWriter.close` gives it)."""
        return RunWriter(self._file())

    def read(self, off: int, n: int) -> Iterator[tuple]:
        """The records of one run as ``(epoch, seq, ts, Event)``, a chunk at a time."""
        for x in self._read_raw(off, n):
            yield x[4], x[2], x[3], Event(*x)

    def _read_raw(self, off: int, n: int) -> Iterator[tuple]:
        """The records of one run as written (the Events' values), a chunk at a time (the file is shared by the
        runs read at once: each read seeks to its place)."""
        fh = self._file()
        while n > 0:
            fh.seek(off)
            chunk = pickle.load(fh)
            off = fh.tell()
            n -= len(chunk)
            yield from chunk

    def level(self, run: Run) -> int:
        """How many merges ``run`` went through (0: written as one spill)."""
        return self._level.get(run[0], 0)

    def compact(self, runs: list[Run]) -> None:
        """Merge the newest runs of ``runs`` (one key's, oldest first) in place while :data:`FAN_IN` of them share
        a level (see the module doc)."""
        level = self._level
        while len(runs) >= FAN_IN:
            tail = runs[-FAN_IN:]
            lv = self.level(tail[-1])
            if any(self.level(r) != lv for r in tail):
                return
            w = self.writer()
            for x in heapq.merge(*(self._read_raw(o, n) for o, n in tail), key=_raw_key):
                w.append_raw(x)
            runs[-FAN_IN:] = [w.close()]
            for o, _n in tail:
                level.pop(o, None)
            level[runs[-1][0]] = lv + 1


class SeqBits:
    """The seqs of one key's records, one bit each (1 bit a record: 2 MiB for 16M records), to tell whether two of
    its records may share an (epoch, seq), the only way a record can be given twice: :attr:`clash` once a seq came
    twice, or one the bits cannot hold did (not an int in ``[0, SEQ_BITS_MAX)``)."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.clash = False

    def add(self, records: list[tuple]) -> None:
        """The seqs of ``records`` (``(epoch, seq, ts, Event)``)."""
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


# a record as written: its Event's values in the constructor's order (Event(*values) rebuilds it), as a plain tuple
_values = operator.attrgetter("tag", "rank", "seq", "ts", "epoch", "fields", "level", "src", "line_no")
# the sort key (epoch, seq, ts) of a record, and of a record as written; itemgetter builds it without a Python call
RECORD_KEY = operator.itemgetter(0, 1, 2)
_raw_key = operator.itemgetter(4, 2, 3)


class RunWriter:
    """One new run at the end of the file, written chunk by chunk (while other runs of the file are read: each
    write seeks to the run's end)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.fh.seek(0, 2)
        self.off, self.n = self.fh.tell(), 0
        self.buf: list[tuple] = []
        self.end = self.off

    def append(self, t: tuple) -> None:
        """A record ``(epoch, seq, ts, Event)``."""
        self.append_raw(_values(t[3]))

    def extend(self, records: list[tuple]) -> None:
        """Records ``(epoch, seq, ts, Event)``, converted a chunk at a time."""
        i = 0
        while i < len(records):
            take = CHUNK - len(self.buf)
            self.buf += [_values(t[3]) for t in records[i:i + take]]
            i += take
            if len(self.buf) >= CHUNK:
                self._flush()

    def append_raw(self, x: tuple) -> None:
        """A record as written (the Event's values)."""
        self.buf.append(x)
        if len(self.buf) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        self.fh.seek(self.end)
        pickle.dump(self.buf, self.fh, pickle.HIGHEST_PROTOCOL)
        self.end = self.fh.tell()
        self.n += len(self.buf)
        self.buf = []

    def close(self) -> Run:
        """The run written."""
        if self.buf:
            self._flush()
        return self.off, self.n
