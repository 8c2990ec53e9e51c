"""Epoch boundaries of one rank's stream (docs/domain.md §3.1): a ``reset`` record ends an epoch, and so does a node id
going backwards (a restarted process or a reset that was not logged). Node ids are unique only per (rank, epoch).

The same tracker runs in the sources (which stamp ``Event.epoch``) and in :class:`~.rank_checker.RankChecker` (for
streams whose producer did not), so both agree: once a source has started a new epoch, the checker's fresh state
sees no backwards id.
"""

from __future__ import annotations

from typing import Any

# The only tags whose records can move a tracker (reset, and the records that create node ids, see created_id):
# for any other record :meth:`EpochTracker.step` returns ``epoch`` unchanged unless ``pending`` is set, so the hot
# loops (log reader, exporter intake, rank checker, the C speedups, which get this set when they are loaded) skip
# the call with ``ep = t.step(tag, f) if tag in EPOCH_TAGS or t.pending else t.epoch``.
EPOCH_TAGS = frozenset(("reset", "split", "insert"))


class EpochTracker:
    """Feed ``(tag, fields)`` in stream order; :meth:`step` returns the epoch of that record.

    Public state, read by the hot loops: ``epoch`` (the current epoch) and ``pending`` (True when the next record
    starts a new epoch whatever its tag: it follows a reset). Both are plain slots, so reading them costs no call.
    """

    __slots__ = ("epoch", "pending", "_max_new")

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.pending = False
        self._max_new = -1

    def step(self, tag: str, fields: dict[str, Any], hint: int = 0) -> int:
        """Epoch of this record. ``hint`` is the epoch its source stamped: the tracker never runs behind it."""
        if self.pending:
            self.pending = False
            self._new_epoch()
        if hint > self.epoch:
            self.epoch = hint
            self._max_new = -1
        if tag == "insert":   # created_id(tag, fields), inlined for the commonest tag that creates ids
            new_id = fields.get("node_id") if fields.get("kind") == "new" else None
            if type(new_id) is not int:
                new_id = None
        else:
            new_id = created_id(tag, fields)
        if new_id is not None:
            if new_id <= self._max_new:
                self._new_epoch()
            self._max_new = new_id
        if tag == "reset":
            self.pending = True  # the reset record itself belongs to the epoch it closes
        return self.epoch

    def state(self) -> tuple[int, bool, int]:
        """``(epoch, pending, largest id created this epoch)``: all a tracker carries, for :meth:`from_state` (a
        replacement exporter worker goes on from its predecessor's trackers)."""
        return (self.epoch, self.pending, self._max_new)

    @classmethod
    def from_state(cls, state: tuple[int, bool, int]) -> EpochTracker:
        """A tracker that goes on from ``state`` (:meth:`state`)."""
        epoch, pending, max_new = state
        t = cls(int(epoch))
        t.pending = bool(pending)
        t._max_new = int(max_new)
        return t

    def _new_epoch(self) -> None:
        self.epoch += 1
        self._max_new = -1


def created_id(tag: str, fields: dict[str, Any]) -> int | None:
    """The id a record creates (``split new_id``, ``insert kind=new``), which must grow within an epoch. A split
    inferred after the fact (``inf=1``: the Rust tree core splits inside Rust, and the instrumentation finds the new
    id only when a record next names the node) creates none: its order says nothing about the ids."""
    if tag == "split":
        if fields.get("inf") == 1:
            return None
        v = fields.get("new_id")
    elif tag == "insert" and fields.get("kind") == "new":
        v = fields.get("node_id")
    else:
        return None
    return v if type(v) is int else None
