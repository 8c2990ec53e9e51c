"""The bars and densities the HTML report draws, built one record at a time.

The stage bars (:class:`Stages`: d2h, h2d, l3b, l3p) and a node's holds (:class:`Holds`: dev, host) are fed the
records of one rank of one epoch in order; what they build is described in :mod:`.report_model`. Fed one record at a
time, a report of one node (``report --node``) keeps only what it draws, so its memory follows the node's structure,
not the number of its records: :class:`Kept` keeps the first and the last bars of a lane past a bound, and
:class:`Hist` counts record times in buckets that widen as the times spread.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

from ..model.events import Event
from ..model.l3 import ACK as L3_ACK, BACKUP as L3_BACKUP, DIR_BACKUP, DIR_PREFETCH, PREFETCH as L3_PREFETCH

BUCKETS = 240            # density buckets per lane
FINE = BUCKETS * 16      # buckets a streaming histogram keeps (its error: at most 1/16 of a drawn bucket)
RELOADS_HELD = 4096      # reload ops whose h2d bar a later ack may still extend (the oldest is let go past this)


class BarSink(Protocol):
    """Where :class:`Holds` puts its bars: a list, or a :class:`Kept`."""

    def append(self, b: Bar, /) -> None: ...


_Sink = TypeVar("_Sink", bound=BarSink)


def rec_ts(ev: Event) -> int:
    """The time a record is drawn at: its ``ts`` field when it is an int, else the event's time."""
    t = ev.fields.get("ts")
    return t if type(t) is int else ev.ts


def nodes_of(ev: Event) -> set[int]:
    """Node ids a record is about: ``node_id``, ``new_id`` (split), the ``chain`` of a reload, ``pub`` of an ack."""
    f = ev.fields
    out = set()
    for k in ("node_id", "new_id"):
        v = f.get(k)
        if type(v) is int and v >= 0:
            out.add(v)
    for k in ("chain", "pub"):
        v = f.get(k)
        if isinstance(v, list):
            out.update(x for x in v if type(x) is int and x >= 0)
    return out


@dataclasses.dataclass
class Bar:
    kind: str                  # d2h, h2d, l3b, l3p, dev, host
    start: int                 # ts
    end: int | None            # ts of the closing record; None: open
    op: int | None = None
    nodes: set[int] = dataclasses.field(default_factory=set)
    seqs: list[int] = dataclasses.field(default_factory=list)


_L3_OPEN: dict[str, str] = {L3_BACKUP: "l3b", L3_PREFETCH: "l3p"}   # the record opening an L3 bar -> its kind
_L3_DIR: dict[Any, str] = {DIR_BACKUP: "l3b", DIR_PREFETCH: "l3p"}   # the dir of the l3_ack closing it


class Stages:
    """The d2h, h2d and L3 stage instances of one rank's records of one epoch, fed in order (:meth:`add`); ``out``
    holds them in start order.

    A d2h instance is one node's write: its ``prepare`` (op P), the ``backup`` of that node (op P, or the merged op
    M that carried it: SGLang's ``merge_ops`` gives a merged write a new id) and the ``ack dir=d2h`` of that node
    with op P or M. An h2d instance is one ``reload`` op: the ``ack dir=h2d`` records of the op (one per node)
    close it, the last one ending the bar. ``Bar.op`` is the prepare's (reload's) op. The L3 tier's
    (:mod:`cptrace_otel.model.l3`): ``l3b`` from an ``l3_backup`` to the ``l3_ack dir=backup`` of its op, ``l3p``
    from an ``l3_prefetch`` to the ``l3_ack dir=prefetch`` of its op."""

    def __init__(self) -> None:
        self.d2h: dict[Any, Bar] = {}            # node -> its open write
        self.d2h_ops: dict[Any, set] = {}        # node -> the ops its open write is known by
        self.h2d: dict[Any, Bar] = {}            # op -> its reload
        self.l3: dict[tuple, Bar] = {}           # (kind, op) -> its open L3 transfer
        self.out: list[Bar] = []

    def add(self, ev: Event) -> None:
        tag, f = ev.tag, ev.fields
        if tag in _L3_OPEN or tag == L3_ACK:
            kind = _L3_OPEN.get(tag) or _L3_DIR.get(f.get("dir"))
            op = f.get("op")
            if kind is None:
                return
            if tag != L3_ACK:
                lb = self.l3[(kind, op)] = Bar(kind, rec_ts(ev), None, op if type(op) is int else None,
                                               nodes_of(ev), [ev.seq])
                self.out.append(lb)
            else:
                ob = self.l3.pop((kind, op), None)
                if ob is not None:
                    ob.seqs.append(ev.seq)
                    ob.end = rec_ts(ev)
            return
        if tag == "prepare" or tag == "backup":
            n, op = f.get("node_id"), f.get("op")
            b = self.d2h.get(n)
            if b is None or tag == "prepare":
                b = self.d2h[n] = Bar("d2h", rec_ts(ev), None, op if type(op) is int else None)
                self.d2h_ops[n] = set()
                self.out.append(b)
            self.d2h_ops[n].add(op)
            b.nodes |= nodes_of(ev)
            b.seqs.append(ev.seq)
        elif tag == "reload":
            op = f.get("op")
            b = self.h2d[op] = Bar("h2d", rec_ts(ev), None, op if type(op) is int else None, nodes_of(ev), [ev.seq])
            self.out.append(b)
            if len(self.h2d) > RELOADS_HELD:   # every ack of a reload op comes soon after it: keep the last ones
                del self.h2d[next(iter(self.h2d))]
        elif tag == "ack":
            op, n = f.get("op"), f.get("node_id")
            if f.get("dir") == "d2h":
                b = self.d2h.get(n)
                if b is None or op not in self.d2h_ops[n]:
                    return
                del self.d2h[n]
            elif f.get("dir") == "h2d":
                b = self.h2d.get(op)
                if b is None:
                    return
            else:
                return
            b.nodes |= nodes_of(ev)
            b.seqs.append(ev.seq)
            b.end = rec_ts(ev)

    def settle(self, node: int, into: Kept) -> None:
        """Move the bars of ``out`` that can no longer change (closed, or open but replaced) into ``into`` when
        they are ``node``'s, dropping the others: what a one-node report keeps of a lane is then its node's bars."""
        live = {id(b) for b in (*self.d2h.values(), *self.h2d.values(), *self.l3.values()) if b.end is None}
        rest = []
        for b in self.out:
            if id(b) in live:
                rest.append(b)
            elif node in b.nodes:
                into.add(b)
        self.out = rest


def stage_bars(events: Iterable[Event]) -> list[Bar]:
    """The stage instances (:class:`Stages`) of one rank's records of one epoch, in start order."""
    st = Stages()
    for ev in events:
        st.add(ev)
    return st.out


class Holds(Generic[_Sink]):
    """The device and host holds of ``node`` in one rank's records of one epoch (see :mod:`.report_model`), fed in
    order (:meth:`add`) into ``out`` (a list, or a :class:`Kept`)."""

    def __init__(self, node: int, out: _Sink) -> None:
        self.node = node
        self.cur: dict[str, Bar | None] = {"dev": None, "host": None}
        self.out = out

    def _start(self, kind: str, ev: Event) -> None:
        b = self.cur[kind]
        if b is None:
            b = self.cur[kind] = Bar(kind, rec_ts(ev), None, None, {self.node})
            self.out.append(b)
        b.seqs.append(ev.seq)

    def _end(self, kind: str, ev: Event) -> None:
        b = self.cur[kind]
        if b is not None:
            b.end = rec_ts(ev)
            b.seqs.append(ev.seq)
            self.cur[kind] = None

    def add(self, ev: Event) -> None:
        tag, f, node = ev.tag, ev.fields, self.node
        nid = f.get("node_id")
        in_chain = tag == "reload" and isinstance(f.get("chain"), list) and node in f["chain"]
        if (tag == "insert" and nid == node) or in_chain:
            self._start("dev", ev)
        elif tag == "split" and f.get("new_id") == node:
            self._start("dev", ev)
            if not isinstance(f.get("host_p"), str):   # "(none)": the prefix was not backed up
                self._start("host", ev)
        elif tag == "prepare" and nid == node:
            self._start("host", ev)
        elif tag == "evict" and nid == node:
            self._end("dev" if f.get("tier") == "dev" else "host", ev)


def holds(events: Iterable[Event], node: int) -> list[Bar]:
    """The device and host holds (:class:`Holds`) of ``node`` in one rank's records of one epoch."""
    h: Holds[list[Bar]] = Holds(node, [])
    for ev in events:
        h.add(ev)
    return h.out


class Kept:
    """Bars of one lane, at most ``limit``: the first ``limit // 2`` and the last ``limit - limit // 2`` (the
    middle ones are counted in ``dropped``, and the page says so). A bar may still change after it is kept."""

    def __init__(self, limit: int) -> None:
        self.head: list[Bar] = []
        self.tail: collections.deque[Bar] = collections.deque(maxlen=limit - limit // 2)
        self.half = limit // 2
        self.dropped = 0

    def add(self, b: Bar) -> None:
        if len(self.head) < self.half:
            self.head.append(b)
            return
        if len(self.tail) == self.tail.maxlen:
            self.dropped += 1
        self.tail.append(b)

    append = add

    def bars(self) -> list[Bar]:
        return self.head + list(self.tail)


def density(times: Iterable[int], t0: int, t1: int) -> list[tuple[int, int]]:
    """``(bucket, count)`` of the non-empty ones of :data:`BUCKETS` equal buckets over ``[t0, t1]``."""
    width = max(1, t1 - t0)
    counts: dict[int, int] = {}
    for t in times:
        b = min(BUCKETS - 1, max(0, (t - t0) * BUCKETS // width))
        counts[b] = counts.get(b, 0) + 1
    return sorted(counts.items())


class Hist:
    """Record times counted in :data:`FINE` equal buckets whose width doubles whenever a time falls outside them:
    bounded memory for any number of records. :meth:`density` draws them as :func:`density` would, each bucket at
    its middle; exact while the times span fewer than :data:`FINE` ns, else off by at most one fine bucket."""

    def __init__(self) -> None:
        self.base: int | None = None
        self.width = 1
        self.counts = [0] * FINE
        self.n = 0

    def add(self, t: int) -> None:
        if self.base is None:
            self.base = t
        i = (t - self.base) // self.width
        while not 0 <= i < FINE:
            if not self._shift(i):
                self._widen(left=i < 0)
            i = (t - self.base) // self.width
        self.counts[i] += 1
        self.n += 1

    def _shift(self, i: int) -> bool:
        """Move the buckets (whole ones: ``base`` by a multiple of the width) so that bucket ``i`` and every
        non-empty one fit, the span centred; False, nothing moved, where they do not fit at this width. A time
        before the first one would otherwise double the width however close it is, and the counts stop being
        exact while the times still span fewer than :data:`FINE` buckets of width 1."""
        used = [j for j, c in enumerate(self.counts) if c]
        lo, hi = min(used[0], i), max(used[-1], i)
        if hi - lo >= FINE:
            return False
        off = lo - (FINE - (hi - lo + 1)) // 2   # the old index that becomes index 0
        new = [0] * FINE
        for j in used:
            new[j - off] = self.counts[j]
        assert self.base is not None
        self.base += off * self.width
        self.counts = new
        return True

    def _widen(self, left: bool) -> None:
        """Double the bucket width: to the right of ``base``, or (``left``) with the old range as the upper half."""
        old, w = self.counts, self.width
        new = [0] * FINE
        off = FINE // 2 if left else 0
        for j, c in enumerate(old):
            if c:
                new[off + j // 2] += c
        if left:
            assert self.base is not None
            self.base -= FINE * w
        self.counts, self.width = new, 2 * w

    def density(self, t0: int, t1: int) -> list[tuple[int, int]]:
        if self.base is None:
            return []
        width, w, base = max(1, t1 - t0), self.width, self.base
        counts: dict[int, int] = {}
        for j, c in enumerate(self.counts):
            if c:
                t = base + j * w + w // 2 if w > 1 else base + j
                b = min(BUCKETS - 1, max(0, (t - t0) * BUCKETS // width))
                counts[b] = counts.get(b, 0) + c
        return sorted(counts.items())
