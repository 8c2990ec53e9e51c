"""L3a and L3b: the L3 storage tier on one rank (records of :mod:`cptrace_otel.model.l3`; code ``L3``).

* **L3a, content survives the L3 round trip** (level 1). Every ``l3_backup`` with ``io=1`` and a fingerprint per
  page records, per key, the fingerprints the key was written with (the rank's key map: it outlives epochs, as
  storage outlives a cache reset). The fingerprints a prefetch brings back (``l3_ack dir=prefetch``, or the
  ``l3_hit`` that puts the pages into the tree, when the ack carried none) must each be one of its key's: a page
  whose bytes changed on the way (a flipped byte in a stored file, a read of the wrong object, a layout mismatch)
  is reported at that record. Several fingerprints per key are kept (a few) because the same tokens may be written
  twice with KV that differs in its last bits (another batch, non-deterministic kernels), and backends differ in
  whether the first or the last write stays. A key that this trace never saw written (storage filled by an earlier
  run) is judged by what its writer left (below: ``FOREIGN``), else counted as ``L3a-skipped(no backup)``; a backup
  that ended early (``l3_ack dir=backup done=N`` below its
  page count) takes back the fingerprints of the pages it did not write.
* **L3b, pages held through the L3 transfer** (level 2). From ``l3_backup`` to its ``l3_ack dir=backup`` the host
  pages being written to storage, and from ``l3_prefetch`` to its ``l3_ack dir=prefetch`` the host pages being read
  into, must not be freed (``free pool=host``), evicted (``evict tier=host``) or given to another copy
  (``prepare``, another ``l3_prefetch``, and for a prefetch also a ``reload`` reading them early). Reported at the
  transfer's ack (``L3b``), or at the end of the stream when the ack never came (``L3b-open``, WARN), as H4 does.
  An ``l3_prefetch``/``l3_hit`` taking host slots of an in-flight d2h copy or h2d load is reported by H4b/H2c.
  Only exact sets decide an overlap (DESIGN decision 10): a range summary that merely brackets the transfer's
  slots is counted as ``L3b-undecidable``, never reported.
* **FOREIGN, a fetched page was written by another configuration** (level 2; code ``FOREIGN``). A fetched key this
  trace never saw written is judged by its writer's claim: the metadata the instrumentation keeps beside the
  object (``l3_ack dir=prefetch`` ``wfp``/``wid``, :mod:`cptrace_otel.model.l3`), else the backups of an earlier
  run given to the same ``check`` (:class:`L3Prior`: only the key maps of finished runs, no other rule sees
  another run). The writer's storage identity (``model``, ``kv_dtype``, ``layout``, ``page_size``) must equal
  this rank's ``config`` (fields either side does not name are not compared): SGLang's keys name neither the KV
  dtype nor the layout, and the ``file`` backend's names the served model name, not the weights, so such a hit
  loads another model's or format's bytes as this one's KV (``FOREIGN``). Where the identity is the same, the
  fetched fingerprint must be one the key was written with (``L3a``, as for a key written in this trace); a key
  with no claim at all stays ``L3a-skipped(no backup)``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

from ..model.events import Event, int_field
from ..model.l3 import DIR_BACKUP, DIR_PREFETCH, IDENT_FIELDS, WFP, WID, ident_diff, ident_parse
from .findings import WARN, Finding
from .lineage import Bounded, L3Transfer, Node
from .ranges import EXACT, Slots, overlap, slots_of
from .rank_base import RankRuleBase

KEYS_KEPT = 1 << 15      # keys whose backup fingerprints a rank remembers (oldest forgotten first: a later
#                          fetch of a forgotten key counts as L3a-skipped(no backup), never as a finding)
FPS_PER_KEY = 4          # distinct fingerprints kept per key


class L3Prior:
    """The L3 backups of the runs a ``check`` finished before the one it is reading (in the order it reads them):
    per page key, the fingerprints it was written with and the writer's storage identity. Only this crosses from
    one run's analysis to the next (:class:`cptrace_otel.analyze.engine.Analysis`): a later run's fetch of a key
    it never wrote is judged against it (``FOREIGN``, ``L3a``); no other rule sees another run's records."""

    def __init__(self, cap: int = KEYS_KEPT * 4) -> None:
        self.keys = Bounded(cap)   # key -> ([fingerprint, ...], identity, run)

    def absorb(self, run: str, checkers: Iterable[L3Rules]) -> None:
        """A finished run's per-rank checkers: their key maps, with their ranks' identities."""
        for chk in checkers:
            ident = dict(chk._l3_ident)
            for k, lst in chk._l3_keys.items():
                self.keys.put(k, ([x[0] for x in lst], ident, run))

    def get(self, k: Hashable) -> tuple[list[int], dict, str] | None:
        return self.keys.get(k)


def _pages(f: dict) -> list[tuple[int, Any, int]] | None:
    """``(page index, key, fingerprint)`` per page of a record whose ``keys`` and ``hp`` are lists of one length
    (pages with a sentinel or non-int fingerprint left out); None when the record carries no such lists."""
    keys, hp = f.get("keys"), f.get("hp")
    if type(keys) is not list or type(hp) is not list or len(keys) != len(hp):
        return None
    return [(i, k, h) for i, (k, h) in enumerate(zip(keys, hp, strict=False)) if type(h) is int and h >= 0]


def _more(found: list, pages: int) -> str:
    return f" (and {len(found) - 1} more of {pages} pages)" if len(found) > 1 else f" (1 of {pages} pages)"


class L3Rules(RankRuleBase):
    _l3_keys: Bounded        # key -> [(fingerprint, ref of the backup), ...] (set by RankChecker)
    _l3_acked: Bounded       # prefetch ops whose ack carried the fingerprints (set by RankChecker)
    _l3_seen: bool
    _l3_ident: dict          # this rank's storage identity, from its config (set by RankChecker)
    l3_prior: L3Prior | None   # the backups of runs read before this one (set by the analysis, when it has any)
    nodes_total: int

    if TYPE_CHECKING:   # RankChecker's, and the H4 and H2c rules' (the slots an L3 prefetch takes are theirs too)
        @property
        def level(self) -> int: ...

        def _h4_breach(self, s: Slots | None, attr: str, exclude: int | None, ref: tuple, what: str,
                       side: str) -> None: ...

        def _h2c_breach(self, s: Slots | None, exclude: int | None, ref: tuple, what: str) -> None: ...

    # -- handlers --------------------------------------------------------------------------------------------------
    def _l3_config(self, f: dict) -> None:
        """``config``: the rank's storage identity (FOREIGN)."""
        self._l3_ident = {k: str(f[k]) for k in IDENT_FIELDS if f.get(k) not in (None, "", "?")}

    def _l3_backup(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
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

    def _l3_prefetch(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
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

    def _l3_ack(self, ev: Event, f: dict, nid: object, ref: tuple) -> list[Finding] | None:
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
            out.extend(self._l3_compare(ev, f, nid, ref, f"l3_ack dir=prefetch op {op}"))
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
        return self._l3_compare(ev, f, nid, ref, f"l3_hit of node {nid}") or None

    # -- L3a ---------------------------------------------------------------------------------------------------------
    def _l3_compare(self, ev: Event, f: dict, nid: object, ref: tuple, where: str) -> list[Finding]:
        """L3a (and FOREIGN, for keys this trace never saw written) on a record carrying the fingerprints a
        prefetch brought back."""
        pairs = _pages(f)
        if not pairs:
            return []
        km = self._l3_keys
        bad: list[tuple] = []
        foreign: list[tuple] = []
        unknown = 0
        for i, k, fp in pairs:
            lst = km.get(k)
            if lst is None:
                claim = self._l3_claim(f, i, k)
                if claim is None:
                    unknown += 1
                    continue
                fps, ident, src = claim
                diff = ident_diff(self._l3_ident, ident)
                if diff:
                    foreign.append((k, diff, src))
                elif fps and fp not in fps:
                    bad.append((k, fp, [(x, None) for x in fps], src))
            elif all(x[0] != fp for x in lst):
                bad.append((k, fp, lst, f"l3_backup seq {lst[-1][1][0]}"))
        node = nid if type(nid) is int else None
        op = int_field(f.get("op"))
        if unknown:
            self._skip("L3a-skipped(no backup)", "L3", node,
                       "a fetched key this trace never saw written (storage filled before the trace began), with no "
                       "metadata beside the object and no earlier run's trace naming it")
        out: list[Finding] = []
        n = len(pairs)
        if foreign:
            k, diff, src = foreign[0]
            what = ", ".join(f"{name} {theirs} (this run: {mine})" for name, mine, theirs in diff)
            out.append(self._finding("FOREIGN", "FOREIGN", node, op, EXACT, [ref],
                                     f"{where}: page key {k} was written by a run with {what} ({src})"
                                     f"{_more(foreign, n)}: the key does not name what differs, so this hit loads "
                                     "another configuration's bytes as this run's KV", ev))
        if bad:
            k, fp, lst, src = bad[0]
            out.append(self._finding("L3", "L3a", node, op, EXACT, [lst[-1][1], ref],
                                     f"{where}: page key {k} came back from L3 with fingerprint {fp}, but was written "
                                     f"with {', '.join(str(x[0]) for x in lst)} ({src}){_more(bad, n)}: the bytes "
                                     "changed between backup and prefetch", ev))
        return out

    def _l3_claim(self, f: dict, i: int, k: Hashable) -> tuple[list[int], dict, str] | None:
        """What the writer of page ``i`` (key ``k``, never written in this trace) left: ``(fingerprints, storage
        identity, where that was read)`` from the record's ``wfp``/``wid`` (the metadata beside the object), else
        from an earlier run's backups; None when neither names it."""
        wid, wfp = f.get(WID), f.get(WFP)
        if type(wid) is list and i < len(wid) and type(wid[i]) is str and wid[i]:
            fp = wfp[i] if type(wfp) is list and i < len(wfp) else None
            return ([fp] if type(fp) is int and fp >= 0 else []), ident_parse(wid[i]), "the metadata beside the object"
        prior = self.l3_prior
        got = prior.get(k) if prior is not None else None
        if got is None:
            return None
        return got[0], got[1], f"the backups of run {got[2]}"

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
