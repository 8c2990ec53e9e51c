"""Slot sets as the trace shows them: an ``rng`` summary, optionally with an exact run-length set.

The emitter logs index tensors as ``(cnt=N,min=a,max=b,first=c,last=d)`` and, when exact sets are on, as
``a-b:c-d`` runs (fields ``devx``, ``hostx``, ``idx_x``). :class:`Slots` keeps both. A summary whose ``cnt``
equals ``max-min+1`` is a dense block: its set is known exactly (slot indices in one allocation are distinct), so
it takes part in exact overlap tests like an explicit run list.

:func:`overlap` answers with a certainty (docs/domain.md §3.1): ``"exact"`` when the sets surely intersect (both
known, or what the summaries prove: a shared member, or more slots in the hulls' intersection than it holds),
``None`` when they surely do not, ``"interval"`` when the summaries cannot decide. Rules never report an
``"interval"`` overlap as a finding: they count it as undecidable (``Unchecked`` of kind ``"undecidable"``).
"""

from __future__ import annotations

from ..model.logline import Rng

EXACT, INTERVAL = "exact", "interval"


def parse_runs(v: object) -> tuple[tuple[int, int], ...] | None:
    """``a-b:c-d:e`` (inclusive) -> ((a,b),(c,d),(e,e)); a bare int is one slot; None when malformed."""
    if type(v) is int:
        return ((v, v),)
    if not isinstance(v, str) or not v:
        return None
    out = []
    try:
        for part in v.split(":"):
            a, dash, b = part.partition("-")
            if not a:  # no negative slots; "-3" is malformed
                return None
            lo = int(a)
            hi = int(b) if dash else lo
            if hi < lo:
                return None
            out.append((lo, hi))
    except ValueError:
        return None
    return tuple(out)


class Slots:
    """One slot set: summary parts plus exact runs when known (``runs`` is None otherwise)."""

    __slots__ = ("cnt", "lo", "hi", "first", "last", "runs", "ordered")

    def __init__(self, cnt: int, lo: int, hi: int, first: int, last: int, runs: tuple | None,
                 ordered: bool = False) -> None:
        self.cnt, self.lo, self.hi, self.first, self.last, self.runs = cnt, lo, hi, first, last, runs
        self.ordered = ordered  # runs list the slots in token order (explicit exact set), not just membership

    @property
    def exact(self) -> bool:
        return self.runs is not None

    def summary(self) -> tuple:
        return (self.cnt, self.lo, self.hi, self.first, self.last)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Slots(cnt={self.cnt},min={self.lo},max={self.hi},first={self.first},last={self.last},runs={self.runs})"


_MEMO: dict[tuple, Slots | None] = {}
_MEMO_MAX = 8192


def slots_of(v: object, x: object = None) -> Slots | None:
    """A :class:`Slots` from a field value (an :class:`Rng`) and an optional exact-set field; None for ``(none)``,
    ``(err:...)`` and anything that is not a summary. ``(0)`` is the empty set.

    Memoized: the same range shows up on several records of a lifecycle (prepare, backup, evict, free), and a
    :class:`Slots` is never mutated."""
    if type(v) is Rng and (x is None or type(x) is str or type(x) is int):
        # key: the summary alone when there is no exact-set field (most records), else (summary, field); a 5-field
        # Rng never equals a 2-tuple, so the two kinds of keys cannot collide
        key = v if x is None else (v, x)
        s = _MEMO.get(key)
        if s is None:
            s = _slots_of(v, x)
            if len(_MEMO) >= _MEMO_MAX:
                _MEMO.clear()
            _MEMO[key] = s
        return s
    return _slots_of(v, x)


def _slots_of(v: object, x: object) -> Slots | None:
    if type(v) is Rng:
        cnt, lo, hi, first, last = v
        if not (type(cnt) is int and type(lo) is int and type(hi) is int and type(first) is int
                and type(last) is int):
            return None
        runs = parse_runs(x) if x is not None else None
        ordered = runs is not None
        if runs is None and cnt == hi - lo + 1 and cnt > 0:
            runs = ((lo, hi),)  # dense block: the set is known (its order is not)
        return Slots(cnt, lo, hi, first, last, runs, ordered)
    if v == "(0)":
        return Slots(0, 0, -1, 0, -1, ())
    if v is None and x is not None:
        runs = parse_runs(x)
        if runs:
            n = sum(b - a + 1 for a, b in runs)
            return Slots(n, min(a for a, _ in runs), max(b for _, b in runs), runs[0][0], runs[-1][1], runs, True)
    return None


def is_none_range(v: object) -> bool:
    """True for the ``(none)`` sentinel: the tensor was None (e.g. a node that is not backuped)."""
    return v == "(none)"


def _runs_intersect(a: tuple, b: tuple) -> bool:
    # one run against a list: the merge below would stop at the first run of the list (by start) that ends beyond
    # the one run without meeting it, and every later run starts beyond it too, so it answers exactly "any run of
    # the list meets it": the same answer without sorting (the usual case: a dense block against scattered slots)
    if len(b) == 1:
        a, b = b, a   # (intersection is symmetric)
    if len(a) == 1:
        a0, a1 = a[0]
        for b0, b1 in b:   # noqa: SIM110  (any() over a generator, without the generator)
            if a0 <= b1 and b0 <= a1:
                return True
        return False
    sa, sb = sorted(a), sorted(b)
    na, nb = len(sa), len(sb)
    if not na or not nb:
        return False
    i = j = 0
    a0, a1 = sa[0]
    b0, b1 = sb[0]
    while True:   # (only the side that advances is unpacked again)
        if a0 <= b1 and b0 <= a1:
            return True
        if a1 < b1:
            i += 1
            if i == na:
                return False
            a0, a1 = sa[i]
        else:
            j += 1
            if j == nb:
                return False
            b0, b1 = sb[j]


def _known_in(x: int, s: Slots) -> bool:
    """Whether slot ``x`` is surely in ``s``: a member of its exact runs, else one of the members a summary names
    (its min, max, first and last are slots of the set)."""
    if s.runs is not None:
        return any(a <= x <= b for a, b in s.runs)
    return x == s.lo or x == s.hi or x == s.first or x == s.last


def overlap(a: Slots | None, b: Slots | None) -> str | None:
    """``"exact"`` if the sets surely intersect, None if they surely do not, ``"interval"`` if the summaries cannot
    decide (their ``[min, max]`` hulls intersect, and neither a shared member nor counting proves an overlap).

    What a summary proves (slot indices of one tensor are distinct): its min, max, first and last are members; a
    dense summary (cnt = max-min+1) is the whole block; and by counting, at least ``cnt - (hull - I)`` of its slots
    lie in the intersection ``I`` of the two hulls, so two sets with more slots in ``I`` together than ``I`` holds
    intersect. The real allocator hands out scattered slots after frees, so unrelated nodes' hulls overlap all the
    time: an ``"interval"`` answer is not evidence of anything (the rules count it as undecidable)."""
    if a is None or b is None or a.cnt <= 0 or b.cnt <= 0:
        return None
    if a.hi < b.lo or b.hi < a.lo:
        return None
    if a.runs is not None and b.runs is not None:
        return EXACT if _runs_intersect(a.runs, b.runs) else None
    for x in (b.lo, b.hi, b.first, b.last):
        if _known_in(x, a):
            return EXACT
    for x in (a.lo, a.hi, a.first, a.last):
        if _known_in(x, b):
            return EXACT
    lo = a.lo if a.lo > b.lo else b.lo
    hi = a.hi if a.hi < b.hi else b.hi
    width = hi - lo + 1
    a_in = a.cnt - (a.hi - a.lo + 1 - width)
    b_in = b.cnt - (b.hi - b.lo + 1 - width)
    if a_in > 0 and b_in > 0 and a_in + b_in > width:
        return EXACT   # pigeonhole: the two sets do not fit into I side by side
    return INTERVAL


def concat(parts: list[Slots | None]) -> Slots | None:
    """Summary (and runs, when all parts are exact) of the parts concatenated in order; None if a part is unknown."""
    if len(parts) == 1:
        # one part (a single-node reload chain): the part itself (a Slots is never mutated, and its runs are tuples:
        # the copy this made had the same fields), when it has no runs or one
        p = parts[0]
        if p is None:
            return None
        if p.cnt > 0:
            runs = p.runs
            if runs is None:
                if not p.ordered:
                    return p
            elif len(runs) == 1:
                return p if type(runs) is tuple and type(runs[0]) is tuple else Slots(
                    p.cnt, p.lo, p.hi, p.first, p.last, (tuple(runs[0]),), p.ordered)
    if not parts or any(p is None for p in parts):
        return None
    nonempty = [p for p in parts if p is not None and p.cnt > 0]   # (no None left: the check above)
    if not nonempty:
        return Slots(0, 0, -1, 0, -1, ())
    runs = None
    ordered = all(p.ordered for p in nonempty)
    if ordered or all(p.runs is not None for p in nonempty):
        runs = tuple(r for p in nonempty for r in p.runs)  # type: ignore[union-attr]  # (ordered: runs known)
        # adjacent runs of consecutive parts form one run (as a single exact set of the whole would render it)
        merged: list = []
        for r in runs:
            if merged and merged[-1][1] + 1 == r[0]:
                merged[-1] = (merged[-1][0], r[1])
            else:
                merged.append(tuple(r))
        runs = tuple(merged)
    return Slots(sum(p.cnt for p in nonempty), min(p.lo for p in nonempty), max(p.hi for p in nonempty),
                 nonempty[0].first, nonempty[-1].last, runs, ordered)


def ordered_slots(s: Slots) -> list[int] | None:
    """The slots in order when the runs give the order (explicit runs, or a dense ascending block)."""
    if s.runs is None or not s.ordered:
        return None  # membership may be known (dense block), the token order is not
    out: list[int] = []
    for a, b in s.runs:
        out.extend(range(a, b + 1))
    return out


def slice_slots(s: Slots, start: int, n: int) -> Slots | None:
    """Slots ``[start, start+n)`` of an ordered set; None when the order is unknown."""
    if n <= 0:
        return Slots(0, 0, -1, 0, -1, ())
    seq = ordered_slots(s)
    if seq is None or start + n > len(seq):
        return None
    part = seq[start:start + n]
    runs: list[tuple[int, int]] = []
    for x in part:
        if runs and runs[-1][1] + 1 == x:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return Slots(n, min(part), max(part), part[0], part[-1], tuple(runs), True)
