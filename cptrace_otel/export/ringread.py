"""The exporter worker's intake of the record ring (``CPTRACE_RING=1``; the producer is
:mod:`cptrace_otel.traced.ring` and ``_speedups/ring.c``).

:class:`RingIntake` maps the ring named in the INIT (or PREINIT) message and turns it into batches of compact items
``(ts, level, tag, fields)``: the same items the drainer ships on the deque path (ints, strs, floats; bools as
``"True"``/``"False"``; a short list of ints as its ``[a,b]`` text), so the worker builds the same Events and
Records from them (:meth:`cptrace_otel.export.worker.Exporter.add_items`, the C intake). Records that went to the
side deque arrive as SIDE messages, in order; each is put at its placeholder. The side id of the first SIDE item
this worker gets is ``resume["side_next"]`` (0 for the first worker): a placeholder below it belongs to an item a
dead worker had received (counted as lost by the traced process), and is skipped. A ``None`` side item is a record
the traced process gave up (a value whose rendering blocked; counted there): skipped, and reported safe
(:attr:`skipped`) so it is not counted twice.

The intake claims the ring with its own token (its pid and a count): from then on a worker that read the ring
before reads nothing (its ``ring_read`` returns None), so two workers never take the same records. It gives
consumed pages back in spans of :data:`PUNCH_BYTES` (``ring.c``; a ring under :data:`PUNCH_FROM` keeps them).
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import sys
from typing import Any

from ..model.grammar import RING

BATCH = 4096            # records per read
PUNCH_BYTES = 1 << 20   # consumed bytes given back to the system at a time (at most an eighth of the ring)
PUNCH_FROM = 256 << 10  # smaller rings keep their pages (they are small, and the span held back would cost room)
ALL = (1 << 64) - 1     # side_avail at end of input: nothing more will come, no placeholder waits
_intakes = itertools.count(1)


def _reader() -> Any:
    from .._speedups import _hot  # type: ignore[attr-defined]

    return _hot.ring_read


def _claim() -> Any:
    from .._speedups import _hot  # type: ignore[attr-defined]

    return _hot.ring_claim


class RingIntake:
    """One worker's reader of the ring described by ``info`` (``{"fd", "size"}``,
    :meth:`cptrace_otel.traced.ring.Ring.info`)."""

    def __init__(self, info: dict[str, int], side_next: int = 0) -> None:
        self._read = _reader()
        self.mm = mmap.mmap(int(info["fd"]), int(info["size"]))
        self.token = (os.getpid() << 20) + next(_intakes)   # never 0 (an unclaimed ring's reader)
        _claim()(self.mm, self.token)
        cap = int(info["size"]) - RING.header_bytes
        # (a span is held back until it is whole pages; in a ring under PUNCH_FROM that would cost too much room)
        self.punch = min(PUNCH_BYTES, cap // 8) if cap >= PUNCH_FROM else 0
        self.superseded = False       # another worker claimed the ring: this one reads nothing more
        self.side: collections.deque = collections.deque()
        self.first = int(side_next)   # the side id of self.side[0]
        self.skipped = 0              # side items given up by the traced process (None)

    def add_side(self, items: list) -> None:
        """A SIDE message's items, the next side ids in order."""
        self.side.extend(items)

    def _place(self, sid: int, out: list) -> None:
        side = self.side
        if sid < self.first:
            return   # its item went to a worker that died (counted lost by the traced process)
        while self.first < sid and side:   # never on a sound stream: items whose placeholders were skipped
            side.popleft()
            self.first += 1
        if self.first == sid and side:
            it = side.popleft()
            self.first += 1
            if it is None:
                self.skipped += 1
            else:
                out.append(it)

    def take(self, final: bool = False) -> list:
        """The records now readable, in order, as compact items. It stops before a placeholder whose side item has
        not arrived, unless ``final`` (end of input: such an item never comes; it was counted as lost where it was
        given up). Raises ValueError on a malformed ring (its records up to the write position are skipped)."""
        out: list = []
        while True:
            avail = ALL if final else self.first + len(self.side)
            got = self._read(self.mm, BATCH, avail, self.token, self.punch)
            if got is None:
                if not self.superseded:
                    self.superseded = True
                    print("cptrace_otel: another exporter worker has taken over the record ring; this one reads no "
                          "more of it", file=sys.stderr, flush=True)
                return out
            for e in got:
                if type(e) is int:
                    self._place(e, out)
                else:
                    out.append(e)
            if len(got) < BATCH:
                break
        if final:
            while self.side:   # shipped after the last placeholder (never on a sound stream)
                it = self.side.popleft()
                if it is None:
                    self.skipped += 1
                else:
                    out.append(it)
        return out
