"""What the cross-rank rule classes (``rules_c1``, ``rules_c2``, ``rules_joins``) share with
:class:`~.crossrank.CrossRank`, which mixes them in: its state, and the two questions every rule after C1 asks of C1
(the pitfall of docs/domain.md §5: node ids line up across ranks only up to an epoch's first C1 divergence).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from types import ModuleType

from .._speedups import lockstep
from ..model.events import Event
from .fence import StoreFence
from .findings import ERROR, Finding

# CP modes whose ranks hold equal copies of every node's KV (C5 compares their backup hashes; L3c asks that every
# rank's L3 keys be written by some rank): ``replicated``, and ``prefill_cp`` (stock SGLang prefill CP: replicated KV
# under per-rank L3 keys)
REPLICA_MODES = frozenset(("replicated", "prefill_cp"))

# what a C1 tuple is built from (EpochC1.push): the fields it reads, then the two tags whose records read them
# otherwise (a split's length is its pre_len; only an evict has a tier). Handed to the C twin when it loads
C1_NAMES = ("node_id", "len", "pre_len", "split_len", "tier", "split", "evict")
_NODE, _LEN, _PRE_LEN, _SPLIT_LEN, _TIER, _SPLIT, _EVICT = C1_NAMES

# the C twin of EpochC1 (None: not built; python_lockstep() switches it off)
_LOCKSTEP = lockstep.load(C1_NAMES)


def agree(qs: list[deque]) -> int:
    """Pop the queues' heads while every queue has one and all of them are the same C1 tuple; returns how many
    steps were popped (the structural index moves by that). Then some queue is empty, or the heads disagree."""
    n = 0
    while all(qs):
        h0 = qs[0][0][0]
        for q in qs:   # (no list of heads to build: one comparison per rank)
            if q[0][0] != h0:
                return n
        for q in qs:
            q.popleft()
        n += 1
    return n


class EpochC1:
    """Per-epoch C1 state, also read by the rules that stop at its divergence; :meth:`push` is C1's step for one
    record. The Python twin of ``_speedups/lockstep.c``'s ``EpochC1`` (:func:`new_epoch_c1` picks one)."""

    __slots__ = ("queues", "index", "diverged", "counts", "qs", "qs_ranks", "wait", "late")

    def __init__(self) -> None:
        self.queues: dict[int, deque] = {}
        self.counts: dict[int, int] = {}    # rank -> structural records of this epoch so far (the join index)
        self.qs: list[deque] = []           # queues[r] for r in qs_ranks (the comparison's view)
        self.qs_ranks: list[int] | None = None   # the CrossRank._ranks_sorted list qs was built for
        self.index = 0              # tuples compared so far
        self.diverged: int | None = None
        self.wait: set = set()      # join keys waiting for C1 to compare up to their records (JoinRules._decide)
        self.late: list[tuple[Finding, int]] = []   # C2 findings with the structural index they are judged at

    def push(self, ev: Event, ranks: list[int], ready: bool) -> int:
        """Count the structural record ``ev`` of this epoch, queue its C1 tuple on its rank, and pop the heads all
        ranks agree on where that is all there is to do. ``ranks`` is CrossRank's ``_ranks_sorted`` (compared by
        identity with ``qs_ranks``), ``ready`` its ``_is_ready``. Returns what the caller still does
        (:meth:`~.rules_c1.C1Lockstep._c1_add`): 0 nothing; 1 a full comparison, then release the waiting joins; 2
        release the waiting joins only (when :attr:`wait` holds any).

        The C1 tuple (built here, the one place that defines it): (tag, node id, length: ``pre_len`` of a split, else
        ``len``; ``split_len``; an evict's ``tier``), each int or str as the field is, else None; queued as (tuple,
        record): the record gives seq, line, src and op if this tuple is ever reported."""
        r = ev.rank
        counts = self.counts
        counts[r] = counts.get(r, 0) + 1   # this rank's structural index in the epoch (counted after a divergence too)
        if self.diverged is not None:
            return 0
        q = self.queues.get(r)
        if q is None:
            q = self.queues[r] = deque()
        n = len(q)
        f = ev.fields
        tag = ev.tag
        nid = f.get(_NODE)
        ln = f.get(_PRE_LEN if tag == _SPLIT else _LEN)
        sl = f.get(_SPLIT_LEN)
        tier = f.get(_TIER) if tag == _EVICT else None
        q.append(((tag, nid if type(nid) is int else None, ln if type(ln) is int else None,
                   sl if type(sl) is int else None, tier if type(tier) is str else None), ev))
        if n >= 2:
            # this rank was already two or more tuples ahead: the last comparison stopped on another rank's empty
            # queue, readiness, or a tie-break wait that needs the other ranks' second tuples, none of which a
            # tuple appended here changes (heads are untouched), so comparing again would return at once
            return 0
        if self.qs_ranks is ranks:   # (then two ranks or more: _c1_compare builds qs only for those)
            qs = self.qs
            if not all(qs):
                return 0   # another rank has no tuple yet: a comparison would stop at once (its queues are all built)
            if ready:
                # the common case, without _c1_compare's checks: the heads agree (one step, as the tuple that
                # completes them arrives); a disagreement is left to _c1_compare, from the same state
                self.index += agree(qs)
                return 1 if all(qs) else 2
        return 1


def new_epoch_c1() -> EpochC1:
    """A fresh per-epoch C1 state: the C twin when it was built (``_speedups/lockstep.c``), else :class:`EpochC1`."""
    return EpochC1() if _LOCKSTEP is None else _LOCKSTEP.EpochC1()


def lockstep_c() -> ModuleType | None:
    """The C twin's module (its ``EpochC1``), or None when it was not built."""
    return _LOCKSTEP


@contextlib.contextmanager
def python_lockstep() -> Iterator[None]:
    """Inside the block, C1 states made from then on are the Python twin's (for tests and benchmarks; the whole
    module is switched, see :func:`cptrace_otel._speedups.twin_off`)."""
    from .._speedups import twin_off

    with twin_off(globals(), "_LOCKSTEP"):
        yield


class CrossRuleBase:
    mode: str | None
    io_rank: int
    findings: list[Finding]
    _c1: dict[int, EpochC1]           # (or the C twin: the same attributes and push)
    _ranks_sorted: list[int]          # sorted(ranks), rebuilt (a new list) when a rank appears
    _is_ready: bool                   # _ready()'s answer once True (reset when the group may have grown)
    _joins: dict[tuple, dict[int, dict]]
    _occ: dict[tuple, int]
    _split_since: set[tuple]
    _io_hs: dict[tuple, dict]
    _reload_hashes: list[tuple]
    _saw_hash: bool = False            # set on the instance by the first h (C5)
    _fence: StoreFence
    _ready: Callable[[], bool]         # all ranks of the group have shown up
    _decide: Callable[[tuple, bool], None]   # (JoinRules: decide a join, or wait for C1)

    def _index(self, rank: int, epoch: int) -> int:
        """Structural records of ``rank`` in ``epoch`` so far."""
        st = self._c1.get(epoch)
        return st.counts.get(rank, 0) if st is not None else 0

    def _diverged_before(self, epoch: int, index: int) -> bool:
        """Whether a record at structural ``index`` of ``epoch`` lies past the epoch's first C1 divergence."""
        st = self._c1.get(epoch)
        return st is not None and st.diverged is not None and index > st.diverged

    def _add(self, code: str, rule: str, rank: int, epoch: int, nid: int | None, op: int | None, seqs: list, msg: str,
             facts: dict) -> None:
        """An exact finding at the record described by ``facts`` (its ``src`` and ``line``)."""
        f = Finding(code, rule, rank, epoch, nid, op, "exact", sorted(seqs), msg, ERROR, facts.get("src", ""),
                    facts.get("line", 0))
        self.findings.append(f)
