"""L3a and L3b: the L3 storage tier on one rank (records of :mod:`cptrace_otel.model.l3`; code ``L3``).

* **L3a, content survives the L3 round trip** (level 1). Every ``l3_backup`` with ``io=1`` and a fingerprint per
  page records, per key, the fingerprints the key was written with (the rank's key map: it outlives epochs, as
  storage outlives a cache reset). The fingerprints a prefetch brings back (``l3_ack dir=prefetch``, or the
  ``l3_hit`` that puts the pages into the tree, when the ack carried none) must each be one of its key's: a page
  whose bytes changed on the way (a flipped byte in a stored file, a read of the wrong object, a layout mismatch)
  is reported at that record. Several fingerprints per key are kept (a few) because the same tokens may be written
  twice with KV that differs in its last bits (another batch, non-deterministic kernels), and backends differ in
  whether the first or the last write stays. A key that this trace never saw written (storage filled by an earlier
  run) is counted as ``L3a-skipped(no backup)``; a backup that ended early (``l3_ack dir=backup done=N`` below its
  page count) takes back the fingerprints of the pages it did not write.
* **L3b, pages held through the L3 transfer** (level 2). From ``l3_backup`` to its ``l3_ack dir=backup`` the host
  pages being written to storage, and from ``l3_prefetch`` to its ``l3_ack dir=prefetch`` the host pages being read
  into, must not be freed (``free pool=host``), evicted (``evict tier=host``) or given to another copy
  (``prepare``, another ``l3_prefetch``, and for a prefetch also a ``reload`` reading them early). Reported at the
  transfer's ack (``L3b``), or at the end of the stream when the ack never came (``L3b-open``, WARN), as H4 does.
  An ``l3_prefetch``/``l3_hit`` taking host slots of an in-flight d2h copy or h2d load is reported by H4b/H2c.
  Only exact sets decide an overlap (DESIGN decision 10): a range summary that merely brackets the transfer's
  slots is counted as ``L3b-undecidable``, never reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model.events import Event, int_field
from ..model.l3 import DIR_BACKUP, DIR_PREFETCH
from .findings import WARN, Finding
from .ranges import EXACT, Slots, overlap, slots_of
from .rank_base import RankRuleBase
from .state import Bounded, L3Transfer, Node

KEYS_KEPT = 1 << 15      # keys whose backup fingerprints a rank remembers (oldest forgotten first: a later
#                          fetch of a forgotten key counts as L3a-skipped(no backup), never as a finding)
FPS_PER_KEY = 4          # distinct fingerprints kept per key


def _pages(f: dict) -> list[tuple[int, Any, int]] | None:
    """``(page index, key, fingerprint)`` per page of a record whose ``keys`` and ``hp`` are lists of one length
    (pages with a sentinel or non-int fingerprint left out); None when the record carries no such lists."""
    keys, hp = f.get("keys"), f.get("hp")
    if type(keys) is not list or type(hp) is not list or len(keys) != len(hp):
        return None
    return [(i, k, h) for i, (k, h) in enumerate(zip(keys, hp, strict=False)) if type(h) is int and h >= 0]


class L3Rules(RankRuleBase):
    _l3_keys: Bounded        # key -> [(fingerprint, ref of the backup), ...] (set by RankChecker)
    _l3_acked: Bounded       # prefetch ops whose ack carried the fingerprints (set by RankChecker)
    _l3_seen: bool
    nodes_total: int

    if TYPE_CHECKING:   # RankChecker's, and the H4 and H2c rules' (the slots an L3 prefetch takes are theirs too)
        @property
        def level(self) -> int: ...

        def _h4_breach(self, s: Slots | None, attr: str, exclude: int | None, ref: tuple, what: str,
                       side: str) -> None: ...

        def _h2c_breach(self, s: Slots | None, exclude: int | None, ref: tuple, what: str) -> None: ...

    # -- handlers --------------------------------------------------------------------------------------------------
    def _l3_backup(self, ev: Event, f: dict, nid: Any, ref: tuple) -> None:
        self._l3_seen = True
        st = self.st
        op = int_field(f.get("op"))
        h = slots_of(f.get("host"), f.get("hostx"))
        t = L3Transfer(DIR_BACKUP, op, nid, h, ref)
        if f.get("io", 1) != 0:
            pages = _pages(f)
            if pages:
                km = self._l3_keys
                for i, k, fp in pages:
                    lst = km.get(k)
                    if lst is None:
                        km.put(k, [(fp, ref)])
                        t.added.append((i, k, fp))
                    elif all(x[0] != fp for x in lst):
                        if len(lst) >= FPS_PER_KEY:
                            del lst[0]
                        lst.append((fp, ref))
                        t.added.append((i, k, fp))
        if h is not None and st.l3:
            self._l3_breach(h, ref, f"l3_backup of node {nid} (op {op}) read host slots being prefetched into",
                            (DIR_PREFETCH,))
        st.l3.pop((DIR_BACKUP, op), None)
        st.l3[(DIR_BACKUP, op)] = t
        return None

    def _l3_prefetch(self, ev: Event, f: dict, nid: Any, ref: tuple) -> None:
        self._l3_seen = True
        st = self.st
        op = int_field(f.get("op"))
        h = slots_of(f.get("host"), f.get("hostx"))
        if h is not None:
            what = f"l3_prefetch op {op} was given host slots"
            if st.l3:
                self._l3_breach(h, ref, what + " of this transfer", (DIR_BACKUP, DIR_PREFETCH))
            if st.writes:
                self._h4_breach(h, "host", None, ref, what + " of the copy", "b")
            if st.loads:
                self._h2c_breach(h, None, ref, what + " being loaded")
        st.l3.pop((DIR_PREFETCH, op), None)
        st.l3[(DIR_PREFETCH, op)] = L3Transfer(DIR_PREFETCH, op, nid, h, ref)
        return None

    def _l3_ack(self, ev: Event, f: dict, nid: Any, ref: tuple) -> list[Finding] | None:
        self._l3_seen = True
        d = f.get("dir")
        if d != DIR_BACKUP and d != DIR_PREFETCH:
            return None
        op = int_field(f.get("op"))
        t = self.st.l3.pop((d, op), None)
        out: list[Finding] = []
        if t is not None:
            if t.viol is not None and self.level >= 2:
                out.append(self._l3b(ev, ref, t))
            elif t.undecided:
                self._skip("L3b-undecidable", "L3", t.node_id if type(t.node_id) is int else None,
                           "a free or reuse whose range summary brackets the transfer's host slots without an exact "
                           "set to decide")
            done = int_field(f.get("done"))
            if d == DIR_BACKUP and done is not None and t.added:
                self._l3_unwrite(t, done)
        if d == DIR_PREFETCH and _pages(f):
            self._l3_acked.put(op, True)   # its pages are compared here, not again at their l3_hit
            fnd = self._l3_compare(ev, f, nid, ref, f"l3_ack dir=prefetch op {op}")
            if fnd is not None:
                out.append(fnd)
        return out or None

    def _l3_hit(self, ev: Event, f: dict, nid: int, ref: tuple) -> list[Finding] | None:
        """The fetched pages enter the tree as (part of) node ``nid``: it holds their host slots from now on."""
        self._l3_seen = True
        st = self.st
        h = slots_of(f.get("host"), f.get("hostx"))
        if h is not None:
            what = f"l3_hit of node {nid} took host slots"
            if st.writes:
                self._h4_breach(h, "host", nid, ref, what + " of the copy", "b")
            if st.loads:
                self._h2c_breach(h, nid, ref, what + " being loaded")
        node = st.nodes.get(nid)
        if node is None:
            node = Node(nid, h.cnt if h is not None else 0, None, h, ref)
            st.nodes[nid] = node
            st.dead.pop(nid, None)
            self.nodes_total += 1
        elif h is not None:
            node.host = h
            node.host_freed = None
        if int_field(f.get("op")) in self._l3_acked:
            return None   # (compared at the prefetch's ack)
        fnd = self._l3_compare(ev, f, nid, ref, f"l3_hit of node {nid}")
        return [fnd] if fnd is not None else None

    # -- L3a ---------------------------------------------------------------------------------------------------------
    def _l3_compare(self, ev: Event, f: dict, nid: Any, ref: tuple, where: str) -> Finding | None:
        """L3a on a record carrying the fingerprints a prefetch brought back."""
        pairs = _pages(f)
        if not pairs:
            return None
        km = self._l3_keys
        bad: list[tuple] = []
        unknown = 0
        for _, k, fp in pairs:
            lst = km.get(k)
            if lst is None:
                unknown += 1
            elif all(x[0] != fp for x in lst):
                bad.append((k, fp, lst))
        if unknown:
            self._skip("L3a-skipped(no backup)", "L3", nid if type(nid) is int else None,
                       "a fetched key this trace never saw written (storage filled before the trace began)")
        if not bad:
            return None
        k, fp, lst = bad[0]
        more = f" (and {len(bad) - 1} more of {len(pairs)} pages)" if len(bad) > 1 else f" (1 of {len(pairs)} pages)"
        return self._finding("L3", "L3a", nid if type(nid) is int else None, int_field(f.get("op")), EXACT,
                             [lst[-1][1], ref],
                             f"{where}: page key {k} came back from L3 with fingerprint {fp}, but was written with "
                             f"{', '.join(str(x[0]) for x in lst)} (l3_backup seq {lst[-1][1][0]}){more}: the bytes "
                             "changed between backup and prefetch", ev)

    def _l3_unwrite(self, t: L3Transfer, done: int) -> None:
        """A backup that completed ``done`` pages only: the fingerprints it added for later pages never reached
        storage."""
        km = self._l3_keys
        for i, k, fp in t.added:
            if i < done:
                continue
            lst = km.get(k)
            if lst is None:
                continue
            lst[:] = [x for x in lst if x[0] != fp]
            if not lst:
                del km[k]

    # -- L3b ---------------------------------------------------------------------------------------------------------
    def _l3_breach(self, s: Slots | None, ref: tuple, what: str, kinds: tuple[str, ...] = (DIR_BACKUP, DIR_PREFETCH),
                   node: int | None = None) -> None:
        """Mark the first breach of every in-flight L3 transfer of ``kinds`` whose host slots ⊓ ``s`` (or that backs
        up ``node``, when given: its host eviction)."""
        for t in self.st.l3.values():
            if t.kind not in kinds:
                continue
            c = EXACT if node is not None and t.node_id == node else overlap(s, t.host)
            if c == EXACT:
                if t.viol is None:
                    t.viol = (ref, c, what)
            elif c is not None:
                t.undecided = True   # range summaries only bracket each other: counted at the ack, never reported

    def _l3b(self, ev: Event, ref: tuple, t: L3Transfer) -> Finding:
        assert t.viol is not None   # (called for a breached transfer only)
        vref, cert, what = t.viol
        return self._finding("L3", "L3b", t.node_id if type(t.node_id) is int else None, t.op, cert,
                             [t.ref, vref, ref],
                             f"{what} while the L3 {t.kind} of op {t.op} was in flight (before its l3_ack): "
                             + ("storage may hold foreign bytes" if t.kind == DIR_BACKUP
                                else "the pages may be overwritten by the late storage read"), ev)

    def _l3_open(self, out: list[Finding]) -> None:
        """End of stream: breached transfers whose ack never came (L3b-open, WARN)."""
        for t in self.st.l3.values():
            if t.viol is None:
                continue
            vref, cert, what = t.viol
            out.append(self._finding("L3", "L3b-open", t.node_id if type(t.node_id) is int else None, t.op, cert,
                                     [t.ref, vref], f"{what} while the L3 {t.kind} of op {t.op} was in flight; its "
                                     "l3_ack never arrived", severity=WARN))
