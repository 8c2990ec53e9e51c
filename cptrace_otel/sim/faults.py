"""Fault plans (domain 7.2) and the oracle of what an injected fault must make the checker find.

A :class:`FaultPlan` names one surgical deviation and hits exactly the ``nth`` eligible site on ``rank``. Faults that
model a code bug (every rank runs the same code) default to ``scope="all"``: the deviation happens on every rank in
lockstep, so the cross-rank rules stay quiet and only the per-rank codes fire. Faults that model an event on one rank
(a byte flip, a late store, an allocation failure) default to ``scope="rank"``.

The :class:`Oracle` records ``(code, rank, node_id, op)`` for each finding the injection causes, with the trace level
needed to observe it (``ack``/``free``/``compose``/``store`` records are level 2), as ground truth for the tests.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

MODES = ("none", "replicated", "sharded", "dcp", "layersplit", "shared")
POLICIES = ("wt", "wts", "wb")


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    kind: str
    structural: frozenset[str]      # codes the injection itself causes
    content: frozenset[str]         # codes its content consequence causes (in the scripted scenario)
    modes: tuple[str, ...]          # CP modes where it applies
    scope: str                      # "all" ranks (a code bug) or one "rank" (an event)
    policy: str                     # the write policy its scenario runs under
    summary: str


def _fs(kind, structural, content, modes, scope, policy, summary):
    return FaultSpec(kind, frozenset(structural), frozenset(content), tuple(modes), scope, policy, summary)


FAULTS: dict[str, FaultSpec] = {f.kind: f for f in (
    _fs("H1_ack", {"H1"}, set(), MODES, "all", "wt",
        "a split does not rewrite the pending write entry: the ack publishes only the suffix id"),
    _fs("H1_swap", {"H1"}, {"HASH"}, MODES, "all", "wt",
        "a split gives the host slices in the wrong order (the suffix's pages to the new prefix node)"),
    _fs("H2_release", {"H2"}, {"HASH"}, MODES, "all", "wt",
        "the host pin is released at reload issue; the host pages are freed and reused before the load completes"),
    _fs("H2_stale", {"H2"}, {"HASH"}, MODES, "all", "wt",
        "a reload uses the node's previous host range (from before a split)"),
    _fs("H2_stale_clean", {"H2"}, set(), MODES, "all", "wt",
        "a reload uses the node's previous host range (from before a re-backup; its pages still hold the bytes)"),
    _fs("H3_noinval", {"H3"}, set(), MODES, "all", "wt",
        "the compose cache is not invalidated on evict or reload"),
    _fs("H4_nolock", {"H4"}, {"HASH"}, MODES, "all", "wt",
        "write_through skips inc_lock_ref: the node is evicted and its pages reused while its backup copy is in flight"),
    _fs("H4_wb_noflush", {"H4"}, {"HASH"}, MODES, "all", "wb",
        "write_back eviction frees the device pages without the synchronous flush (#24585)"),
    _fs("ZERO_nostore", set(), {"ZERO"}, MODES, "all", "wt",
        "the store for one node never runs: backup and reload read zeros"),
    _fs("ZERO_race", set(), {"ZERO", "HASH"}, MODES, "rank", "wt",
        "the store lands after the backup copy completed (shared mode: no pre-copy fence)"),
    _fs("HASH_flip", set(), {"HASH"}, MODES, "rank", "wt",
        "one byte flipped in one host->device copy"),
    _fs("C1_div", {"C1", "C3"}, set(), ("replicated", "sharded", "dcp", "layersplit", "shared"), "rank", "wt",
        "a host alloc fails on one rank only, so write_backup is skipped there (#28429); the pool stays full for "
        "that node there, so the rank never backs it up while it is on the device"),
    _fs("C3_writer", {"C3"}, set(), ("sharded",), "rank", "wt",
        "only rank 0 writes: another rank's backup carries io=0 (pre-#37149)"),
)}


@dataclasses.dataclass
class FaultPlan:
    """Inject ``kind`` at the ``nth`` eligible site (1-based) on ``rank``; ``scope`` None = the fault's default."""

    kind: str
    rank: int = 0
    nth: int = 1
    scope: str | None = None
    hits: dict[int, int] = dataclasses.field(default_factory=dict)   # rank -> eligible sites seen so far
    active: bool = True     # a driver may arm a plan only for the stretch of a run meant for it (the demo does)

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise ValueError(f"unknown fault {self.kind!r}; known: {', '.join(FAULTS)}")
        if self.scope is None:
            self.scope = FAULTS[self.kind].scope
        if self.scope not in ("all", "rank"):
            raise ValueError(f"fault scope must be 'all' or 'rank', not {self.scope!r}")

    def applies(self, rank: int) -> bool:
        return self.active and (self.scope == "all" or rank == self.rank)

    def hit(self, rank: int) -> bool:
        """Count one eligible site on ``rank``; True exactly at the nth one."""
        if not self.applies(rank):
            return False
        n = self.hits.get(rank, 0) + 1
        self.hits[rank] = n
        return n == self.nth


def parse_faults(spec: str | None, ranks: int = 1) -> list[FaultPlan]:
    """``"H1_ack,HASH_flip@1,ZERO_race@0#2"`` -> plans (``@rank``, ``#nth`` optional); ``none``/empty -> [].

    A one-rank fault without ``@rank`` goes to the last rank (``ranks - 1``): with two ranks a cross-rank rule cannot
    tell which side is odd and names the later rank, so the default keeps the report and the injection aligned."""
    if not spec or spec.strip().lower() == "none":
        return []
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        nth = 1
        if "#" in item:
            item, n = item.split("#", 1)
            nth = int(n)
        rank, scope = max(0, ranks - 1), None
        if "@" in item:
            item, r = item.split("@", 1)
            rank, scope = int(r), "rank"
        if item not in FAULTS:
            raise ValueError(f"unknown fault {item!r}; known: {', '.join(FAULTS)}")
        if not 0 <= rank < max(ranks, 1):
            raise ValueError(f"fault {item}@{rank}: rank out of range (ranks={ranks})")
        out.append(FaultPlan(item, rank=rank, nth=nth, scope=scope))
    return out


class Expect(NamedTuple):
    code: str
    rule: str
    rank: int
    node_id: int | None
    op: int | None
    level: int          # lowest trace level at which the finding is observable
    fault: str
    note: str


# Observability of each code: the records its evidence needs.
LEVEL_NEEDED = {"H1a": 1, "H1b": 2, "H2a": 1, "H2c": 2, "H3": 2, "H4": 2, "HASH": 2, "ZERO@backup": 1,
                "ZERO@reload": 2, "C1": 1, "C3": 1, "C5": 2, "C5-fence": 2}


class Oracle:
    """Ground truth: one :class:`Expect` per finding an injected fault causes."""

    def __init__(self) -> None:
        self.entries: list[Expect] = []
        self.injected: list[tuple[str, int, int | None, int | None]] = []  # (fault, rank, node_id, op) per site

    def inject(self, fault: str, rank: int, node_id: int | None, op: int | None) -> None:
        self.injected.append((fault, rank, node_id, op))

    def expect(self, code: str, rule: str, rank: int, node_id: int | None, op: int | None, fault: str, note: str = "") -> None:
        e = Expect(code, rule, rank, node_id, op, LEVEL_NEEDED.get(rule, LEVEL_NEEDED.get(code, 1)), fault, note or rule)
        if e not in self.entries:
            self.entries.append(e)

    def expected(self, level: int = 3) -> list[Expect]:
        return [e for e in self.entries if e.level <= level]

    def codes(self, level: int = 3) -> set[str]:
        return {e.code for e in self.expected(level)}
