"""H2, stale or wrong host ref on reload (docs/domain.md §4): a reload reads host pages that do not hold the node's
acknowledged backup.

* H2a (level 1), at the ``reload``: its host range is the concatenation of the chain's current host ranges (which
  follow prepare and split through the lineage), none of them freed; a reload of a split-created node that fails
  this is H1c, reported as H2a with the tag in its message.
* H2b (level 2), at the ``reload``: every chain node's backup was acknowledged (``ack dir=d2h``) before it.
* H2c (level 2), at the ``ack dir=h2d``: between the reload and its ack no free, host eviction, prepare or other
  reload touched its host slots. The handlers mark each open load's first proven breach
  (:meth:`H2Reload._h2c_breach`, :meth:`H2Reload._h2c_host_evict`); the op's first ack record ends the window and
  the ack of the reload's own node reports it (:meth:`H2Reload._h2c_at_ack`: the same record in the whole stream
  and in the node's trace alone, which holds the reload but not another chain node's ack), or, where that ack
  never comes, the end of the load (:meth:`H2Reload._h2c_late`) with the first ack as its evidence. An overlap the
  ``rng`` summaries cannot decide is no breach: the ack counts it as undecidable.
* :attr:`H2Reload.free_owner`: after a ``free`` without a node (SGLang frees some host and device slots by index),
  the node whose in-flight copy it newly breached (an h2d load's reload node, H2c; a d2h copy's prepare node,
  H4a/H4b), else None. The exporter puts such a free into that node's trace
  (:class:`~cptrace_otel.model.spans.SpanBuilder`), so a checker of that trace alone sees the breach.
"""

from __future__ import annotations

from ..model.events import Event
from .findings import Finding
from .lineage import UNKNOWN, PendingLoad
from .ranges import EXACT, Slots, concat, overlap
from .rank_base import RankRuleBase


class H2Reload(RankRuleBase):
    def _h2a(self, ev: Event, ref: tuple, nid: int, chain: list[int], H: Slots | None,
             op: int | None) -> Finding | None:
        """H2a (and H1c) for ``reload(node=nid, chain, host=H)``, before the reload changes any state."""
        st = self.st
        bad: list[str] = []
        evid: list = [ref]
        hosts: list | None = []   # None once a chain node's host is unknown
        total_len = 0
        split_made = False
        for cid in chain:
            n = st.nodes.get(cid)
            if n is None:
                d = st.dead.get(cid)
                if d is not None:
                    bad.append(f"chain node {cid} is gone ({d[1]})")
                    evid.append(d[0])
                hosts = None
                continue
            split_made |= n.from_split
            total_len += n.len
            if n.host is None:
                bad.append(f"chain node {cid} has no host copy (not backuped)")
                hosts = None
            elif n.host_freed is not None:
                bad.append(f"chain node {cid}'s host slots were freed")
                evid.append(n.host_freed)
                hosts = None
            elif n.host is UNKNOWN:
                hosts = None
            elif hosts is not None:
                hosts.append(n.host)
        if not bad and hosts and H is not None and len(hosts) == len(chain):
            exp = concat(hosts)
            if exp is not None:
                if (exp.cnt != H.cnt or exp.lo != H.lo or exp.hi != H.hi or exp.first != H.first
                        or exp.last != H.last):   # exp.summary() != H.summary(), without the two tuples
                    bad.append(f"host={H.summary()} but the chain's host is {exp.summary()} "
                               "(cnt,min,max,first,last)")
                elif exp.ordered and H.ordered and exp.runs != H.runs:
                    bad.append("host slots differ from the chain's host slots (exact sets)")
                if H.cnt != total_len:
                    bad.append(f"host.cnt={H.cnt} but the chain holds {total_len} tokens")
        if not bad:
            return None
        tag = " (split-created node: H1c)" if split_made else ""
        return self._finding("H2", "H2a", nid, op, EXACT, evid,
                             f"reload of node {nid} chain={chain}{tag}: " + "; ".join(bad), ev)

    def _h2b(self, ev: Event, ref: tuple, chain: list[int], op: int | None, out: list[Finding]) -> None:
        """H2b: one finding per chain node whose backup is still pending at the reload (appended to ``out``)."""
        nodes = self.st.nodes
        for cid in chain:
            n = nodes.get(cid)
            if n is not None and n.bk_state is not None and n.bk_state[0] == "pending":
                w = n.bk_state[1]
                out.append(self._finding("H2", "H2b", cid, op, EXACT, [w.p_ref, ref],
                                         f"reload op {op} of node {cid} before the d2h ack of its backup "
                                         f"(op {w.op()})", ev))

    def _h2c(self, ev: Event, ref: tuple, ld: PendingLoad) -> Finding:
        """H2c of load ``ld`` with the h2d ack ``ref`` as its last evidence (``ld.viol``: its breach, the exact one
        if any)."""
        vref, cert, what = ld.viol  # type: ignore[misc]
        return self._finding("H2", "H2c", ld.node_id, ld.op, cert, [ld.ref, vref, ref],
                             f"{what} before the h2d ack of op {ld.op}: the load read unpinned host pages", ev)

    def _h2c_at_ack(self, ev: Event, ref: tuple, nid: int, ld: PendingLoad, first: bool) -> Finding | None:
        """At the h2d ack ``ref`` of chain node ``nid`` of load ``ld`` (``first``: the op's first ack record, which
        ends the window): H2c when the window holds a breach and this is the reload node's ack; a first ack of
        another chain node (the reload was cut by a split, or a chain of several nodes) leaves it due, unless the
        reload's node is not in the chain (no ack of it will come)."""
        if first:
            if ld.viol is None:
                return None
            if nid != ld.node_id and ld.node_id in ld.chain:
                ld.due = (ev, ref)
                return None
        elif ld.due is None or nid != ld.node_id:
            return None
        ld.due = None
        return self._h2c(ev, ref, ld)

    def _h2c_late(self, ld: PendingLoad, out: list[Finding] | None) -> list[Finding] | None:
        """The end of load ``ld`` (stream, epoch, or forgotten) before its reload node's ack: a due H2c is reported
        with the first ack as its evidence (appended to ``out``, a new list when None), never dropped."""
        if ld.due is None:
            return out
        ev, ref = ld.due
        ld.due = None
        return [*(out or ()), self._h2c(ev, ref, ld)]

    def _h2c_breach(self, s: Slots | None, exclude: int | None, ref: tuple, what: str) -> None:
        """Mark H2c on every in-flight h2d copy (of another lineage than ``exclude``) whose host ⊓ ``s``: a proven
        overlap is a breach, one the summaries cannot decide is noted (counted as undecidable at the ack)."""
        if s is None or not self.st.loads:
            return
        for ld in self.st.loads.values():
            if exclude is not None and exclude in ld.chain:
                continue
            c = overlap(s, ld.host)
            if c is None:
                continue
            if c == EXACT:
                if ld.viol is None:
                    ld.viol = (ref, c, what)
                    if self.free_owner is None:
                        self.free_owner = ld.node_id
            elif ld.undec is None:
                ld.undec = what

    def _h2c_host_evict(self, nid: int, hs: Slots | None, ref: tuple) -> None:
        """A host eviction of node ``nid`` (freeing ``hs``) breaches the loads whose chain holds it, and those of
        other lineages whose host slots it freed."""
        for ld in self.st.loads.values():
            if nid in ld.chain and ld.viol is None:
                ld.viol = (ref, EXACT, f"host eviction of node {nid}")
        if hs is not None:
            self._h2c_breach(hs, nid, ref, f"host eviction of node {nid} freed host slots")
