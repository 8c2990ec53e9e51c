"""The record ring, the traced process's side (``CPTRACE_RING=1`` with the exporter process; docs/performance.md).

Contract:

* :func:`create` returns a :class:`Ring` when the ring applies (switch on, ``CPTRACE_EXPORTER=process``, the C
  speedups built, ``os.memfd_create`` available), else None: the pipeline then keeps its deque path. Thread exporter
  mode keeps the deque: its worker shares this process's GIL, so encoding and decoding records in one process would
  add work, not move it.
* :meth:`Ring.submit` attaches the ring (with the pipeline's deque as the side deque) and returns the submit function
  api installs, ``_hot.ring_put``; while it is installed the C gate puts records into the ring from its argument
  arrays (``_speedups/ring.c``: a record of the common shapes is encoded on the caller's thread; any other goes to the
  side deque with a placeholder in the ring, so order is kept; a full ring or deque drops the record and counts it in
  the ring header). The side deque is bounded like the deque path's buffer: by a count and by an estimate of its
  bytes. Nothing of a ring record is left for the drainer thread.
* The exporter process maps the same memfd (passed to it by :class:`~.channels.ProcessChannel`; :meth:`info` goes
  in its INIT), reads records in order, splices in the SIDE items the drainer ships at their placeholders
  (:mod:`cptrace_otel.export.ringread`), and publishes its read position and the count of records it took: records
  it had not read when it died are read by the worker that replaces it (same memfd), those it had read are counted
  as in flight by the channel's books (:meth:`consumed`). One reader at a time: the channel kills and reaps a worker
  before it starts the next one, and each worker claims the ring (a token in its header), so one that lingers reads
  nothing more. The worker gives the pages it has consumed back (``_speedups/ring.c``), so a ring that has wrapped
  does not keep ``CPTRACE_RING_BYTES`` of shared memory resident (a page given back is faulted in anew when the
  producer next writes it: 7-8 µs on a VM, about 0.3 µs a record; keeping a window of pages mapped was tried and
  dropped, docs/performance.md).
* A forked child forgets the parent's ring (:meth:`close_in_child`); its pipeline makes its own on its next record.
"""

from __future__ import annotations

import mmap
import os
import sys
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import collections
    from collections.abc import Callable

    from ..model.config import Config

from ..model.grammar import RING

HEADER = RING.header_bytes   # ring.c's header bytes
_said_failure = False   # the ring's set-up failure was named on stderr
CONFIG_TAG = "config"   # records of this tag take the side path: the drainer's RankHold reads the rank there


class RingStats(TypedDict):
    """:meth:`Ring.stats`: the ring's size and use in bytes, and its record counts."""

    bytes: int        # the ring's capacity
    used_bytes: int   # written and not yet read
    written: int      # records encoded into the ring (side records not counted)
    taken: int        # of those, the records the exporter processes took
    side: int         # side records put in the deque (with a placeholder in the ring)
    dropped: int      # records dropped because the ring or the side deque was full


def create(cfg: Config) -> Ring | None:
    """The ring for ``cfg``, or None when it does not apply (see the module doc; a failure is said once)."""
    if not getattr(cfg, "ring", False) or cfg.exporter != "process":
        return None
    global _said_failure
    try:
        return Ring(int(cfg.ring_bytes))
    except Exception as e:
        if not _said_failure:   # once a process: a pipeline whose start is retried must not say it again each time
            _said_failure = True
            print(f"cptrace_otel: CPTRACE_RING: the record ring cannot be set up ({e!r}); records take the deque",
                  file=sys.stderr, flush=True)
        return None


def stamp_clock(fn: Callable[[], int] | None) -> None:
    """Stamp the records the ring encodes with ``fn()`` (ns) instead of the real-time clock the C gate reads (None:
    that clock again). For benchmarks that compare two trees' bytes: the buffer path stamps ``time.time_ns()``,
    which they replace; this gives the ring the same clock. Raises ImportError without the C gate."""
    from .._speedups import _hot  # type: ignore[attr-defined]

    _hot.ring_clock(fn)


def detach(ring: Ring | None) -> None:
    """Stop producing into ``ring`` (None: nothing to do)."""
    if ring is not None:
        ring.detach()


def close(ring: Ring | None) -> None:
    """Release ``ring`` once its pipeline is closed (None: nothing to do)."""
    if ring is not None:
        ring.close()


class Ring:
    """One shared-memory ring (a memfd) and this process's counters of it."""

    def __init__(self, nbytes: int) -> None:
        """A ring of the largest power of two of data bytes within ``nbytes`` (at least the grammar's minimum)."""
        from .._speedups import _hot  # type: ignore[attr-defined]

        self._hot = _hot
        data = 1 << (max(RING.min_bytes, nbytes).bit_length() - 1)
        fd = os.memfd_create("cptrace-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, HEADER + data)
            self.mm = mmap.mmap(fd, HEADER + data)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._final = (0, 0, 0, 0, 0, 0, 0)   # the counters at close()
        self.size = HEADER + data
        self.cap = _hot.ring_init(self.mm)
        self.side_shipped = 0   # SIDE items shipped to any worker (a replacement worker is told where they go on)

    def submit(self, side: collections.deque, cap: int, max_bytes: int,
               wake: Callable[[], None] | None = None) -> Callable[[int, str, dict], None]:
        """Attach the ring (side records go to ``side`` while it holds fewer than ``cap`` records and an estimated
        ``max_bytes`` bytes, as the deque path's bounds; ``wake``, a C callable that runs no Python code, is called
        when a record lands in the empty ``side``, so the drainer waits for side records rather than polling) and
        return the submit function to install."""
        self._hot.ring_attach(self.mm, side, cap, CONFIG_TAG, max_bytes, wake)
        return self._hot.ring_put

    def detach(self) -> None:
        """Stop producing into this ring (a no-op when another one is attached)."""
        try:
            self._hot.ring_detach(self.mm)
        except Exception:
            pass

    def close(self) -> None:
        """Detach and release this process's memfd and mapping (the worker keeps its own until it exits). Counters
        read afterwards are those at the close."""
        self.detach()
        if self.fd >= 0:
            self._final = self.counters()
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
            try:
                self.mm.close()
            except (BufferError, ValueError):
                pass

    def counters(self) -> tuple[int, int, int, int, int, int, int]:
        """``(write_pos, read_pos, dropped, side_next, written, consumed, cap)`` from the ring header."""
        if self.fd < 0:
            return self._final
        return self._hot.ring_counters(self.mm)

    def dropped(self) -> int:
        """Records dropped because the ring (or the side deque) was full."""
        return self.counters()[2]

    def consumed(self) -> int:
        """Records (not placeholders) that the exporter processes have taken from the ring so far."""
        return self.counters()[5]

    def pending(self) -> int:
        """Records in the ring that no exporter has taken yet."""
        c = self.counters()
        return max(0, c[4] - c[5])

    def info(self) -> dict[str, int]:
        """What the worker needs to map the ring (in its INIT / PREINIT message)."""
        return {"fd": self.fd, "size": self.size}

    def stats(self) -> RingStats:
        w, r, dropped, side, written, consumed, cap = self.counters()
        return {"bytes": cap, "used_bytes": w - r, "written": written, "taken": consumed, "side": side,
                "dropped": dropped}

    def close_in_child(self) -> None:
        """After fork, in the child: forget the parent's ring (never write into it) and close its memfd."""
        try:
            self._hot.ring_forget()
            os.close(self.fd)
        except Exception:
            pass
        self._final, self.fd = (0, 0, 0, 0, 0, 0, 0), -1
