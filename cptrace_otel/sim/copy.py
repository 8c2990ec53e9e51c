"""One rank's copy engine: device->host writes (prepare, merged start, copy, ack) and host->device loads (reload,
copy, ack), each copy reading its source **when it completes**, so a recycled page becomes corruption.

SGLang's rules (docs/domain.md §2, stages S4-S6 and S9-S11): the writes prepared within one scheduler round are queued
and
started together by ``start_writing`` (several are merged into one op with a new id from the rank's op counter,
SGLang's ``merge_ops``: one ``backup`` and one ``ack dir=d2h`` record per node, one copy; a lone write stays its own
op); write_through locks the node until its ack; a load pins the chain's host pages until its ack and locks the
chain's last node. The acks are popped in FIFO order, as many per round as every rank has ready
(:class:`~cptrace_otel.sim.core.Simulation` takes the minimum over the ranks).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from . import kv
from .faults import flip_one_byte

if TYPE_CHECKING:
    from .rank import RankSim
    from .tree import Node


class Op:
    """One CacheOperation. A device->host write is first a queued *part* (its ``prepare``: one node, its own op id);
    ``start_writing`` turns the queue into one *transfer*: the part itself when it is alone, else a merged op with a
    new id whose ``parts`` are the queued writes (SGLang's ``merge_ops``). The tree's bookkeeping (``pend_ops``,
    fragments, locks) stays on the parts; the copy, its completion and its place in ``write_q`` are the transfer's."""

    __slots__ = ("id", "dir", "node", "frags", "blen", "dev", "host", "complete_at", "done", "locked", "chain",
                 "flip", "stale", "released", "old_host", "fwd", "parts", "ack_id")

    def __init__(self, oid: int, direction: str, dev: np.ndarray, host: np.ndarray, complete_at: int) -> None:
        self.id = oid
        self.dir = direction
        self.node: Node | None = None
        self.frags: list[Node] = []
        self.blen = 0
        self.dev = dev
        self.host = host
        self.complete_at = complete_at
        self.done = False
        self.locked = False
        self.chain: list[Node] = []
        self.flip = False
        self.stale = False
        self.released = False
        self.old_host: np.ndarray | None = None   # a re-backup's previous host range, released at the ack
        self.fwd: tuple | None = None   # a load's forward (fwd_hash arguments): it runs once the load has landed
        self.parts: list[Op] = []       # a merged write transfer: the queued writes it carries (prepare order)
        self.ack_id = oid   # a load: the id its ack carries (a merged op's, SGLang's start_loading merge_ops)

    def writes(self) -> list["Op"]:
        """The writes a d2h transfer carries: its parts when merged, else itself."""
        return self.parts or [self]


class CopyEngine:
    """The write queue (``write_new``: prepared, not started; ``write_q``: started transfers, the ack order) and
    the load queue (``load_q``) of rank ``rk``."""

    def __init__(self, rk: "RankSim") -> None:
        self.rk = rk
        self.write_q: deque[Op] = deque()
        self.write_new: list[Op] = []
        self.load_q: deque[Op] = deque()
        self.load_new: list[Op] = []   # loads issued since the last round's start_loading
        self.held = 0   # finished transfers at the head of write_q this rank did not pop with the group (C2_round)

    def _new_op(self, direction: str, dev: np.ndarray, host: np.ndarray, delay: int) -> Op:
        sim, r = self.rk.sim, self.rk.r
        oid = sim.next_op[r]
        sim.next_op[r] += 1
        return Op(oid, direction, dev, host, sim.clock.tick + delay)

    # -- device -> host ----------------------------------------------------------------------------------------
    def write_backup(self, n: Node, write_back: bool = False) -> Op | None:
        """``write_backup``: allocate host pages for ``n`` and queue its write (None when there is nothing to do,
        the write-through guard refuses it, or the host has no room)."""
        rk = self.rk
        sim = rk.sim
        if n.host_value is not None or n.value is None or n.parent is None or n.loading:
            return None   # nothing to do, or its device copy is still being loaded
        parent = n.parent
        if not write_back and parent is not rk.tree.root and parent.host_value is None:
            return None  # write-through contiguity guard: the parent must already be backuped
        if n.host_refused:
            return None   # C1_div: this rank's host pool keeps refusing the node while it is on the device
        if rk.hooks.c1_div(n):
            return None
        host = rk.evictor.alloc_host(len(n), n.id)
        if host is None:
            return None
        op = self._new_op("d2h", n.value.copy(), host, sim.d_w)
        op.node, op.frags, op.blen = n, [n], len(n)
        n.host_value = host.copy()
        if not write_back and not rk.hooks.h4_nolock(n, op):
            rk.tree.inc_lock(n)
            op.locked = True
        n.pend_ops.append(op)
        rk.rec.prepare(n, op, parent, int(parent is rk.tree.root or parent.host_value is not None))
        self.write_new.append(op)
        if not sim.merge:
            self.start_writing()   # one op per write, started right after its prepare
        return op

    def rebackup(self, n: Node) -> Op | None:
        """Re-back up a device-resident, already backuped node to a fresh host range (a host-pool compaction).

        The new range is allocated while the old one is still held, so the two differ; the old range is released
        only at the new copy's d2h ack, and its pages keep the node's bytes until some later allocation reuses
        them. Skips a node that is loading, pinned by a load, or has a write in flight."""
        old = n.host_value
        if old is None or n.value is None or n.loading or n.host_ref or n.pend_ops:
            return None
        n.host_value = None
        op = self.write_backup(n)
        if op is None:
            n.host_value = old   # no backup issued (guard or no host room): the node keeps its old copy
            return None
        op.old_host = old
        return op

    def start_writing(self) -> None:
        """``start_writing``: start the queued writes as one transfer. A lone write is its own op; several are merged
        into one op with a new id from the rank's op counter (``merge_ops``), which carries one ``backup`` record
        per node (op = the merged id) and one copy of all their pages. Every rank queues the same writes in the
        same order (lockstep), so every rank makes the same merge."""
        rk = self.rk
        sim = rk.sim
        parts, self.write_new = self.write_new, []
        if not parts:
            return
        if len(parts) == 1:
            t = parts[0]
        else:
            t = self._new_op("d2h", np.concatenate([op.dev for op in parts]),
                             np.concatenate([op.host for op in parts]), sim.d_w)
            t.parts = parts
        io = 1
        if sim.mode == "shared" and rk.r != sim.io_rank:
            io = 0
        for op in parts:
            self._backup_record(t, op, io)
        self.write_q.append(t)

    def _backup_record(self, t: Op, op: Op, io: int) -> None:
        """The ``backup`` record of write ``op`` (node ``op.node``) in transfer ``t``: the node's KV as the copy's
        start event sees it (post-store), hashed in token order. Findings about the write name its prepare's op
        (the checker reports the lowest op id it knows for a write); the backup witness keeps the transfer's id."""
        rk = self.rk
        sim = rk.sim
        n = op.node
        io = rk.hooks.c3_writer(n, op, io)
        b = rk.mem.gather(op.dev, post_store=True)
        n.bk = b.copy()
        n.bk_op = t.id
        n.bk_split = False
        n.bk_idx = rk.rec.n_struct
        fp = kv.fingerprint(b, sim.page_size)
        rk.hooks.expect_backup_bytes(op, fp)
        if sim.mode == "shared":
            # every rank reads the node through the shared view after the post-copy fence, so the hash each rank's
            # reload must reproduce is the view's hash
            fp["hs"] = [fp["h"]] * sim.ranks
        rk.rec.backup(t, op, io, fp)

    def _copy_d2h(self, op: Op) -> None:
        """The device->host copy, executed when it completes: it reads the device pages *now*."""
        rk = self.rk
        sim = rk.sim
        if sim.mode == "shared" and rk.r != sim.io_rank:
            op.done = True    # followers skip the payload (the IO rank copies every page through the view)
            return
        rk.host.data[op.host] = rk.mem.gather(op.dev)
        op.done = True

    def complete_writes(self, tick: int) -> None:
        """Run the started device->host copies that complete by ``tick``."""
        for op in self.write_q:
            if not op.done and op.complete_at <= tick:
                self._copy_d2h(op)

    def flush_writes(self) -> None:
        """write_back's ``writing_check(write_back=True)``: finish and acknowledge every queued write now."""
        self.start_writing()
        for op in self.write_q:
            if not op.done:
                self._copy_d2h(op)
        self.ack_writes(len(self.write_q))

    def ack_writes(self, count: int) -> None:
        """Pop ``count`` finished transfers: one ``ack dir=d2h`` record per write they carry (op = the transfer's
        id, blen/clen/pub = that write's), then each write's unlock and re-backup release."""
        for _ in range(count):
            t = self.write_q.popleft()
            for op in t.writes():
                self._ack_write(t, op)

    def _ack_write(self, t: Op, op: Op) -> None:
        rk = self.rk
        n = op.node
        frags = [n] if op.stale else op.frags
        clen = len(n)
        rk.hooks.expect_stale_ack(op, clen)
        rk.rec.ack_d2h(t, op, clen, [f.id for f in frags])
        for f in op.frags + [n]:
            if op in f.pend_ops:
                f.pend_ops.remove(op)
        if op.locked:
            rk.tree.dec_lock(n)
        if op.old_host is not None:
            # a re-backup: the old host range is released now that the new copy is complete
            rk.rec.free("host", op.old_host, n.id, "rebackup")
            rk.host.free(op.old_host)
            n.old_host = op.old_host

    # -- host -> device ----------------------------------------------------------------------------------------
    def load_back(self, chain: list[Node], ancestor: Node) -> Op | None:
        """``load_back`` of the evicted ``chain`` below the device-resident ``ancestor``: new device slots, the
        chain's host pages pinned until the ack (None under the threshold or without device room)."""
        rk = self.rk
        sim = rk.sim
        tree = rk.tree
        total = sum(len(n) for n in chain)
        if total < sim.lb_threshold:
            return None
        tree.inc_lock(ancestor)
        for n in chain:
            n.host_ref += 1
        dev = rk.evictor.alloc_dev(total)
        tree.dec_lock(ancestor)
        if dev is None:
            for n in chain:
                n.host_ref -= 1
            return None
        hosts, stale = rk.hooks.reload_sources(chain)
        host = np.concatenate(hosts)
        op = self._new_op("h2d", dev, host, sim.d_l)
        op.chain = list(chain)
        op.node = chain[-1]
        off = 0
        for n in chain:
            n.value = dev[off:off + len(n)].copy()
            n.stale_dev = None if n.evicted_dev is None else (n.evicted_dev, len(chain) == 1)
            n.loading = True
            off += len(n)
        last = chain[-1]
        tree.inc_lock(last)
        op.locked = True
        rk.hooks.stale_reload(stale, last, op)
        rk.rec.reload(op)
        self.load_q.append(op)
        self.load_new.append(op)
        rk.hooks.hash_flip(last, op)
        if rk.hooks.h2_release(last, op):
            # the fault: the host pin goes at issue; the pages are freed now and reused by the next backup
            for n in chain:
                n.host_ref -= 1
            op.released = True
            for n in chain:
                rk.rec.evict_host(n, "host")
                rk.evictor.free_host(n)
        return op

    def _copy_h2d(self, op: Op) -> None:
        """The host->device copy, executed when it completes: it reads the host pages *now*."""
        rk = self.rk
        data = rk.host.data[op.host].copy()
        if op.flip:
            flip_one_byte(data, rk.mem.owned(op.dev))
        rk.mem.write_dev(op.dev, data)
        op.done = True

    def complete_loads(self, tick: int) -> None:
        """Run the host->device copies that complete by ``tick``."""
        for op in self.load_q:
            if not op.done and op.complete_at <= tick:
                self._copy_h2d(op)

    def start_loading(self) -> None:
        """SGLang's ``start_loading``: the loads queued in this round go as one op (``merge_ops``): when there are
        several, their acks carry a new id from the rank's op counter, not their reloads' ids."""
        new, self.load_new = self.load_new, []
        if len(new) > 1:
            sim, r = self.rk.sim, self.rk.r
            mid = sim.next_op[r]
            sim.next_op[r] += 1
            for op in new:
                op.ack_id = mid

    def ack_loads(self, count: int) -> None:
        """Pop ``count`` finished loads: the ack records as an instrumentation of SGLang writes them (its
        ``HiCacheAck`` names the load's last node; one ``ack dir=h2d`` per chain node, the last node first, each with
        the bytes it landed; ``Simulation(ack_chain=False)``: the last node's only), then the forward that waited
        for the load, the unlock and the host unpin. The chain includes fragments of nodes split while the load
        was in flight."""
        rk = self.rk
        sim = rk.sim
        for _ in range(count):
            op = self.load_q.popleft()
            last = op.chain[-1]
            for n in [last] + op.chain[:-1]:
                if n is last or sim.ack_chain:
                    b = rk.mem.gather(n.value)
                    fp = kv.fingerprint(b, sim.page_size)
                    rk.hooks.expect_reload_bytes(n, op, b, fp)
                    rk.rec.ack_h2d(op, n, fp)
                n.loading = False
                n.gen += 1
                rk.cache.invalidate(n)
            if op.fwd is not None:
                rid, tokens, final, hit, pfp, dlen = op.fwd
                rk.fwd_hash(rid, tokens, final, hit, pfp, loaded=(dlen, op.chain))
            rk.tree.dec_lock(op.node)
            if not op.released:
                for n in op.chain:
                    n.host_ref -= 1

    @staticmethod
    def ready(q: deque[Op]) -> int:
        """How many ops at the head of ``q`` have finished their copy (what this rank can ack now)."""
        n = 0
        for op in q:
            if not op.done:
                break
            n += 1
        return n
