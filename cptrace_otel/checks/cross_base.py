"""What the cross-rank rule classes (``rules_c1``, ``rules_c2``, ``rules_joins``) share with
:class:`~.crossrank.CrossRank`, which mixes them in: its state, and the two questions every rule after C1 asks of C1
(the pitfall of docs/domain.md §5: node ids line up across ranks only up to an epoch's first C1 divergence).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .fence import StoreFence
from .findings import ERROR, Finding

# CP modes whose ranks hold equal copies of every node's KV (C5 compares their backup hashes; L3c asks that every
# rank's L3 keys be written by some rank): ``replicated``, and ``prefill_cp`` (stock SGLang prefill CP: replicated KV
# under per-rank L3 keys)
REPLICA_MODES = frozenset(("replicated", "prefill_cp"))


class EpochC1:
    """Per-epoch C1 state, also read by the rules that stop at its divergence."""

    __slots__ = ("queues", "index", "diverged", "pending", "counts", "qs", "qs_ranks", "wait", "late")

    def __init__(self) -> None:
        self.queues: dict[int, deque] = {}
        self.counts: dict[int, int] = {}    # rank -> structural records of this epoch so far (the join index)
        self.qs: list[deque] = []           # queues[r] for r in qs_ranks (the comparison's view)
        self.qs_ranks: list[int] | None = None   # the CrossRank._ranks_sorted list qs was built for
        self.index = 0              # tuples compared so far
        self.diverged: int | None = None
        self.pending: tuple | None = None   # a divergence waiting for one more tuple per rank (tie-break)
        self.wait: set = set()      # join keys waiting for C1 to compare up to their records (JoinRules._decide)
        self.late: list[tuple[Finding, int]] = []   # C2 findings with the structural index they are judged at


class CrossRuleBase:
    mode: str | None
    io_rank: int
    findings: list[Finding]
    _c1: dict[int, EpochC1]
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
