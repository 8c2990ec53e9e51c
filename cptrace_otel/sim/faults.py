"""Fault plans (docs/domain.md §7.2) and the oracle of what an injected fault must make the checker find.

A :class:`FaultPlan` names one surgical deviation and hits exactly the ``nth`` eligible site on ``rank``. Faults that
model a code bug (every rank runs the same code) default to ``scope="all"``: the deviation happens on every rank in
lockstep, so the cross-rank rules stay quiet and only the per-rank codes fire. Faults that model an event on one rank
(a byte flip, a late store, an allocation failure) default to ``scope="rank"``.

The :class:`Oracle` records ``(code, rank, node_id, op)`` for each finding the injection causes, with the trace level
needed to observe it (``ack``/``free``/``compose``/``store`` records are level 2), as ground truth for the tests.

:class:`FaultHooks` holds every fault's site in the simulator: one hook per fault decides, tells the oracle, and
says what the engine does instead; its ``expect_*`` hooks derive the consequences the checker must find.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .emit import Recorder
from .node import Node, Op
from .rank_ctx import RankCtx

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
    _fs("H1_stale_dev", {"H1"}, set(), MODES, "all", "wt",
        "a split after a reload slices the node's device indices from before its eviction (a stale copy): the "
        "fragments' dev ranges are the old pages, not the reloaded ones"),
    _fs("H2_release", {"H2"}, {"HASH"}, MODES, "all", "wt",
        "the host pin is released at reload issue; the host pages are freed and reused before the load completes"),
    _fs("H2_stale", {"H2"}, {"HASH"}, MODES, "all", "wt",
        "a reload uses the node's previous host range (from before a split)"),
    _fs("H2_stale_clean", {"H2"}, set(), MODES, "all", "wt",
        "a reload uses the node's previous host range (from before a re-backup; its pages still hold the bytes)"),
    _fs("H3_noinval", {"H3"}, set(), MODES, "all", "wt",
        "the compose cache is not invalidated on evict or reload"),
    _fs("H4_nolock", {"H4"}, {"HASH"}, MODES, "all", "wt",
        "write_through skips inc_lock_ref: the node is evicted and its pages reused while its backup copy is "
        "in flight"),
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
    _fs("C2_round", {"C2"}, set(), ("replicated", "sharded", "dcp", "layersplit", "shared"), "rank", "wt",
        "one rank's check_events pops one d2h ack fewer than the MIN over the group (its all-reduce is skipped), "
        "so its round holds another op set; it pops the held-back ack in the next round"),
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
                "ZERO@reload": 2, "C1": 1, "C2": 2, "C3": 1, "C5": 2, "C5-fence": 2}


class Oracle:
    """Ground truth: one :class:`Expect` per finding an injected fault causes."""

    def __init__(self) -> None:
        self.entries: list[Expect] = []
        self.injected: list[tuple[str, int, int | None, int | None]] = []  # (fault, rank, node_id, op) per site

    def inject(self, fault: str, rank: int, node_id: int | None, op: int | None) -> None:
        self.injected.append((fault, rank, node_id, op))

    def expect(self, code: str, rule: str, rank: int, node_id: int | None, op: int | None, fault: str,
               note: str = "") -> None:
        level = LEVEL_NEEDED.get(rule, LEVEL_NEEDED.get(code, 1))
        e = Expect(code, rule, rank, node_id, op, level, fault, note or rule)
        if e not in self.entries:
            self.entries.append(e)

    def expected(self, level: int = 3) -> list[Expect]:
        return [e for e in self.entries if e.level <= level]

    def codes(self, level: int = 3) -> set[str]:
        return {e.code for e in self.expected(level)}


class FaultHooks:
    """One rank's fault sites: every deviation a :class:`FaultPlan` makes, and every finding the oracle derives.

    The engine calls one hook at each eligible site of a fault; the hook counts the site (:meth:`FaultPlan.hit`),
    tells the oracle what it injected and what the checker must find, and returns what the engine does instead
    (a swapped host range, a skipped lock, ...). The ``expect_*`` hooks are the oracle's ground truth about the
    consequences (a corrupt hash, a page freed under a copy), computed from the simulated bytes and bookkeeping.
    """

    def __init__(self, ctx: RankCtx, rec: Recorder, faults: list[FaultPlan], oracle: Oracle,
                 peer_nodes: list[dict[int, Node]]) -> None:
        """``faults``: the simulation's plans; ``peer_nodes``: every rank's tree nodes by id, in rank order (the
        group's list, filled as the ranks are built): in mode shared a late store's fence is the IO rank's backup."""
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.r = ctx.r
        self.rec = rec          # the rank's Recorder: its structural index places a divergence
        self.faults = faults
        self.oracle = oracle
        self.peer_nodes = peer_nodes

    def plan(self, kind: str) -> FaultPlan | None:
        """The armed plan of fault ``kind`` that applies to this rank (the site is not counted)."""
        for p in self.faults:
            if p.kind == kind and p.applies(self.r):
                return p
        return None

    def hit(self, kind: str) -> bool:
        """Count one eligible site of ``kind`` on this rank; True at the plan's nth site."""
        p = self.plan(kind)
        return p is not None and p.hit(self.r)

    def names(self) -> str:
        """The faults a derived finding is attributed to: the one plan, or all of them (comma-separated)."""
        kinds = [p.kind for p in self.faults]
        return kinds[0] if len(kinds) == 1 else ",".join(kinds)

    # -- the faults, in the order of FAULTS -------------------------------------------------------------------
    def h1_ack(self, op: Op) -> None:
        """Split of a node with the pending write ``op``: the fault leaves the entry listing only the kept (suffix)
        id (``op.stale``); the consequence is found at the ack (:meth:`expect_stale_ack`)."""
        if self.hit("H1_ack"):
            op.stale = True
            self.oracle.inject("H1_ack", self.r, op.target().id, op.id)

    def h1_swap(self, c: Node, pre_host: np.ndarray, s: int) -> tuple | None:
        """Split of backuped node ``c`` at ``s`` (host range ``pre_host``): under the fault, the (prefix, suffix)
        host slices in the wrong order (the prefix node gets the suffix's pages, same counts); else None."""
        if not self.hit("H1_swap"):
            return None
        n = len(c)
        pend0 = c.pend_ops[0].id if c.pend_ops else None
        self.oracle.inject("H1_swap", self.r, c.id, pend0)
        self.oracle.expect("H1", "H1a", self.r, c.id, pend0, "H1_swap")
        return pre_host[n - s:].copy(), pre_host[:n - s].copy()

    def h1_stale_dev(self, c: Node, cur: np.ndarray | None, s: int) -> tuple | None:
        """Split at ``s`` of node ``c`` (device slots ``cur``), reloaded since its last eviction: under the fault,
        the (prefix, suffix) device slices of its pre-eviction slots; else None. Eligible only where those differ
        from the reloaded ones at an end (H1a compares the fragments' first and last slots with the node's). The
        checker knows a chain node's reloaded slots when exact sets are on or the node was reloaded alone (without
        them the order of a chain's slots is unknown): only then is H1a expected."""
        if c.stale_dev is None or cur is None:
            return None
        old, alone = c.stale_dev
        if old.size != cur.size or cur.size == 0 or (old[0] == cur[0] and old[-1] == cur[-1]):
            return None
        if not self.hit("H1_stale_dev"):
            return None
        pend0 = c.pend_ops[0].id if c.pend_ops else None
        self.oracle.inject("H1_stale_dev", self.r, c.id, pend0)
        if self.cfg.exact or alone:
            self.oracle.expect("H1", "H1a", self.r, c.id, pend0, "H1_stale_dev")
        return old[:s].copy(), old[s:].copy()

    def h2_release(self, last: Node, op: Op) -> bool:
        """Reload ``op`` issued: True when the fault releases the host pin now, at issue (the engine frees the
        chain's host pages, which the next backup reuses before the load completes)."""
        if not self.hit("H2_release"):
            return False
        self.oracle.inject("H2_release", self.r, last.id, op.id)
        self.oracle.expect("H2", "H2c", self.r, last.id, op.id, "H2_release")
        return True

    def reload_sources(self, chain: list[Node]) -> tuple[list, list[str]]:
        """The host range a reload of ``chain`` reads for each node, and the faults that chose one: ``H2_stale``
        reads the range a node had before its split, ``H2_stale_clean`` the one it had before its re-backup
        (released, not yet reused). :meth:`stale_reload` reports them once the load op exists."""
        hosts, faults = [], []
        for n in chain:
            h = n.host_value
            if n.prev_host is not None and n.prev_host.size >= len(n) and self.hit("H2_stale"):
                h = n.prev_host[:len(n)].copy()
                faults.append("H2_stale")
            elif n.old_host is not None and n.old_host.size == len(n) and self.hit("H2_stale_clean"):
                h = n.old_host.copy()
                faults.append("H2_stale_clean")
            hosts.append(h)
        return hosts, faults

    def stale_reload(self, faults: list[str], last: Node, op: Op) -> None:
        """The oracle entries of the stale ranges :meth:`reload_sources` chose for reload ``op``. Under
        ``H2_stale_clean`` the bytes may well be right (the oracle adds HASH at the ack only if the old pages were
        reused), but the reload's host range is not the chain's current one."""
        for kind in ("H2_stale", "H2_stale_clean"):
            if kind in faults:
                self.oracle.inject(kind, self.r, last.id, op.id)
                self.oracle.expect("H2", "H2a", self.r, last.id, op.id, kind)

    def h3_noinval(self, n: Node, cache: dict) -> bool:
        """Device eviction of ``n`` with views in the compose ``cache``: True when the fault skips the
        invalidation; from here on the node's views are never invalidated (``n.noinval``)."""
        if cache and self.plan("H3_noinval") and any(k[0] == n.id for k in cache) and self.hit("H3_noinval"):
            n.noinval = True
            self.oracle.inject("H3_noinval", self.r, n.id, None)
            return True
        return False

    def h4_nolock(self, n: Node, op: Op) -> bool:
        """A write_through backup ``op`` of ``n``: True when the fault skips ``inc_lock_ref`` (the node can then be
        evicted, and its pages reused, while the copy is in flight: :meth:`expect_freed_in_flight`)."""
        if not self.hit("H4_nolock"):
            return False
        self.oracle.inject("H4_nolock", self.r, n.id, op.id)
        return True

    def h4_wb_noflush(self, written: list[tuple], start_writing: Callable[[], None]) -> bool:
        """A write_back eviction pass whose victims' writes are ``written`` ((node, op) pairs): True when the fault
        skips the synchronous flush; then ``start_writing`` starts the pass's writes, which are all still in
        flight when their device pages are freed."""
        noflush = False
        for v, op in written:
            if self.hit("H4_wb_noflush"):
                noflush = True
                self.oracle.inject("H4_wb_noflush", self.r, v.id, op.id)
        if not noflush:
            return False
        start_writing()
        for v, op in written:
            self.oracle.expect("H4", "H4", self.r, v.id, op.id, "H4_wb_noflush")
        return True

    def zero_nostore(self, n: Node) -> bool:
        """The forward's store to ``n``: True when the fault skips it (the pages hold zeros)."""
        if not self.hit("ZERO_nostore"):
            return False
        self.oracle.inject("ZERO_nostore", self.r, n.id, None)
        return True

    def zero_race(self, n: Node, owns: bool) -> bool:
        """The forward's store to ``n``: True when the fault makes it land after the backup copy of its pages
        completed (the engine writes zeros now and the bytes later). Eligible only where this rank stores rows of
        ``n`` (``owns``; modes shared and sharded: it owns one of its pages), so the fault delays a store."""
        if not (owns and self.hit("ZERO_race")):
            return False
        self.oracle.inject("ZERO_race", self.r, n.id, None)
        return True

    def hash_flip(self, last: Node, op: Op, owns: bool) -> None:
        """Reload ``op`` issued: the fault marks it (``op.flip``) so that its copy flips one byte
        (:func:`flip_one_byte`). Eligible only where this rank loads rows (``owns``; modes shared and sharded: it
        owns one of the load's pages), so the flip lands on a row it holds."""
        if owns and self.hit("HASH_flip"):
            op.flip = True
            self.oracle.inject("HASH_flip", self.r, last.id, op.id)

    def c1_div(self, n: Node) -> bool:
        """A backup of ``n`` about to allocate host pages: True when the fault makes the alloc fail on this rank
        only, so the backup is skipped here.

        The host pool stays full for the node on this rank (what made the alloc fail does not clear by the next
        hit), so the rank never backs it up while it is on the device (``n.host_refused``); a node that never was
        backuped is deleted when it leaves, so this rank never logs the prepare the other ranks logged: the
        structural streams diverge here, at this rank's structural index, wherever the site falls. (A retry at the
        next hit, as SGLang's _inc_hit_count would try, can land before any other structural record and leave no
        trace at all.)"""
        if not (self.cfg.ranks > 1 and self.hit("C1_div")):
            return False
        n.host_refused = True
        epoch = self.ctx.epoch
        if epoch.diverged_at is None:
            epoch.diverged_at = self.rec.n_struct
        # the op id the other ranks give this prepare: the ranks' op counters run in lockstep up to here, so it
        # is the id this rank would take now (whether or not a peer already took it, or merged ops since)
        op_id = self.ctx.next_op[self.r]
        self.oracle.inject("C1_div", self.r, n.id, op_id)
        self.oracle.expect("C1", "C1", self.r, n.id, op_id, "C1_div")
        self.oracle.expect("C3", "C3", self.r, n.id, op_id, "C1_div")
        return True

    def c3_writer(self, n: Node, op: Op, io: int) -> int:
        """The ``io`` flag of the backup record of write ``op`` (node ``n``): 0 under the fault (this rank does not
        count as a writer)."""
        if not self.hit("C3_writer"):
            return io
        self.oracle.inject("C3_writer", self.r, n.id, op.id)
        self.oracle.expect("C3", "C3", self.r, n.id, op.id, "C3_writer")
        return 0

    def c2_round(self, n: int, q: deque[Op], held_back: int, requests: dict[str, tuple[Node, int]],
                 path_of: Callable[[Node], list[Node]], open_: dict[str, int], tick: int) -> int:
        """How many of the group's ``n`` finished d2h transfers (after the ``held_back`` ones this rank held back,
        at the head of its queue ``q``) this rank pops in round ``tick``: ``n - 1`` under the fault (its round then
        holds another op set than the other ranks'; the last one is popped next round), else ``n``.

        Eligible only where the held-back transfer's nodes are held on the device anyway until the next round (by
        a request of this rank's ``requests`` (rid -> (its last node, its start round)) still open then,
        ``open_``: rid -> the round it finishes in; ``path_of``: the rank's tree's path to a node), so that its
        later unlock changes no eviction choice and the trees stay in step."""
        if n < 2 or self.cfg.ranks < 2 or self.plan("C2_round") is None:
            return n
        t = q[held_back + n - 1]
        nodes = [op.target() for op in t.writes()]
        held: set[int] = set()
        for rid, (node, _) in requests.items():
            if open_.get(rid, -1) > tick:
                held.update(id(x) for x in path_of(node))
        if not all(id(x) in held for x in nodes) or not self.hit("C2_round"):
            return n
        nid = min(x.id for x in nodes)
        self.oracle.inject("C2_round", self.r, nid, t.id)
        if self.ctx.epoch.judged(self.rec.n_struct):
            self.oracle.expect("C2", "C2", self.r, nid, None, "C2_round")
        return n - 1

    # -- consequences: what the checker must find, from the simulated bytes and bookkeeping ---------------------
    def expect_stale_ack(self, op: Op, clen: int) -> None:
        """The ack of a write whose entry was not rewritten at a split (H1_ack) publishes fewer tokens than it
        backed up."""
        if op.stale and clen < op.blen:
            self.oracle.expect("H1", "H1b", self.r, op.target().id, op.id, "H1_ack")

    def expect_freed_in_flight(self, n: Node) -> None:
        """Node ``n``'s device pages are freed: a write that holds no lock (H4_nolock) still reads them."""
        for op in n.pend_ops:   # only reachable under a fault: the copy still reads these pages
            if self.plan("H4_nolock") and not op.locked and op.dir == "d2h":
                self.oracle.expect("H4", "H4", self.r, op.target().id, op.id, "H4_nolock")

    def expect_stale_view(self, n: Node, gen: int) -> None:
        """A compose hit on a view of generation ``gen`` of node ``n``: stale unless the node is still at it."""
        if gen != n.gen:
            self.oracle.expect("H3", "H3", self.r, n.id, None, "H3_noinval")

    def expect_backup_bytes(self, op: Op, fp: dict) -> None:
        """The backup record of write ``op`` hashed all-zero bytes (a store that never ran or has not landed)."""
        if fp["nz"] == 0 and op.dev.size:
            self.oracle.expect("ZERO", "ZERO@backup", self.r, op.target().id, op.id, self.names(), "ZERO@backup")

    def expect_reload_bytes(self, n: Node, op: Op, b: np.ndarray, fp: dict) -> None:
        """Load ``op`` landed the bytes ``b`` of chain node ``n`` (hashes ``fp``): all zero, or not the bytes its
        backup record hashed (in mode shared also the cross-rank C5 relation, while the ranks are judged)."""
        if fp["nz"] == 0 and b.size:
            self.oracle.expect("ZERO", "ZERO@reload", self.r, n.id, op.id, self.names(), "ZERO@reload")
        if n.bk is not None and not np.array_equal(b, n.bk):
            self.oracle.expect("HASH", "HASH", self.r, n.id, op.id, self.names())
            if self.cfg.mode == "shared" and not n.bk_split and self.ctx.epoch.judged(self.rec.n_struct):
                # the same relation across ranks: the IO rank's hs[r] against this rank's reload hash
                self.oracle.expect("C5", "C5", self.r, n.id, None, self.names(), "C5 shared")

    def expect_late_store(self, nid: int) -> None:
        """A late store to node ``nid`` landed (ZERO_race): in mode shared the IO rank's backup of these pages was
        issued before it (the store fence), while the ranks are judged."""
        cfg = self.cfg
        io_node = self.peer_nodes[cfg.io_rank].get(nid) if cfg.mode == "shared" else None
        if io_node is not None and io_node.bk_op >= 0 and self.ctx.epoch.judged(max(self.rec.n_struct, io_node.bk_idx)):
            self.oracle.expect("C5", "C5-fence", cfg.io_rank, nid, io_node.bk_op, "ZERO_race", "store fence")


def flip_one_byte(data: np.ndarray, owned: np.ndarray) -> None:
    """HASH_flip's corruption of a host->device copy's ``data``: one byte of one layer, in the last slot this rank
    loads (``owned``: mask of those slots; in mode shared a rank loads only the pages it owns)."""
    m = np.nonzero(owned)[0]
    if m.size:
        data[m[-1], 0, 0] ^= 0xFF
