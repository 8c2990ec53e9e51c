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

import numpy as np

from .compose import ComposeCache
from .emit import Recorder
from .evict import Evictor
from .faults import FaultHooks, flip_one_byte
from .memory import Memory
from .node import Node, Op
from .pool import PagedPool
from .rank_ctx import RankCtx
from .tree import Tree


class CopyEngine:
    """The write queue (``write_new``: prepared, not started; ``write_q``: started transfers, the ack order) and
    the load queue (``load_q``) of rank ``ctx.r``, over the rank's ``tree``, ``evictor`` (allocation), ``mem`` (the
    device KV), ``host`` pool, compose ``cache``, records ``rec`` and fault sites ``hooks``."""

    def __init__(self, ctx: RankCtx, tree: Tree, evictor: Evictor, mem: Memory, host: PagedPool,
                 cache: ComposeCache, rec: Recorder, hooks: FaultHooks) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.r = ctx.r
        self.tree = tree
        self.evictor = evictor
        self.mem = mem
        self.host = host
        self.cache = cache
        self.rec = rec
        self.hooks = hooks
        self.write_q: deque[Op] = deque()
        self.write_new: list[Op] = []
        self.load_q: deque[Op] = deque()
        self.load_new: list[Op] = []   # loads issued since the last round's start_loading
        self.held = 0   # finished transfers at the head of write_q this rank did not pop with the group (C2_round)

    def _new_op(self, direction: str, dev: np.ndarray, host: np.ndarray, delay: int) -> Op:
        oid = self.ctx.new_op_id()
        return Op(oid, direction, dev, host, self.ctx.clock.tick + delay)

    # -- device -> host ----------------------------------------------------------------------------------------
    def write_backup(self, n: Node, write_back: bool = False) -> Op | None:
        """``write_backup``: allocate host pages for ``n`` and queue its write (None when there is nothing to do,
        the write-through guard refuses it, or the host has no room)."""
        tree = self.tree
        if n.host_value is not None or n.value is None or n.parent is None or n.loading:
            return None   # nothing to do, or its device copy is still being loaded
        parent = n.parent
        if not write_back and parent is not tree.root and parent.host_value is None:
            return None  # write-through contiguity guard: the parent must already be backuped
        if n.host_refused:
            return None   # C1_div: this rank's host pool keeps refusing the node while it is on the device
        if self.hooks.c1_div(n):
            return None
        host = self.evictor.alloc_host(len(n), n.id, tree.first_class(n))   # its pages' owners (mode sharded)
        if host is None:
            return None
        op = self._new_op("d2h", n.dev_slots().copy(), host, self.cfg.d_w)
        op.node, op.frags, op.blen = n, [n], len(n)
        n.host_value = host.copy()
        if not write_back and not self.hooks.h4_nolock(n, op):
            tree.inc_lock(n)
            op.locked = True
        n.pend_ops.append(op)
        self.rec.prepare(n, op, parent, int(parent is tree.root or parent.host_value is not None))
        self.write_new.append(op)
        if not self.cfg.merge:
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
        cfg = self.cfg
        parts, self.write_new = self.write_new, []
        if not parts:
            return
        if len(parts) == 1:
            t = parts[0]
        else:
            t = self._new_op("d2h", np.concatenate([op.dev for op in parts]),
                             np.concatenate([op.host for op in parts]), cfg.d_w)
            t.parts = parts
        io = 1
        if cfg.mode == "shared" and self.r != cfg.io_rank:
            io = 0
        for op in parts:
            self._backup_record(t, op, io)
        self.write_q.append(t)

    def _backup_record(self, t: Op, op: Op, io: int) -> None:
        """The ``backup`` record of write ``op`` (node ``op.node``) in transfer ``t``: the node's KV as the copy's
        start event sees it (post-store), hashed in token order. Findings about the write name its prepare's op
        (the checker reports the lowest op id it knows for a write); the backup witness keeps the transfer's id."""
        cfg = self.cfg
        n = op.target()
        io = self.hooks.c3_writer(n, op, io)
        b = self.mem.gather(op.dev, post_store=True)
        n.bk = b.copy()
        n.bk_op = t.id
        n.bk_split = False
        n.bk_idx = self.rec.n_struct
        fp = self.mem.fingerprint(op.dev, b)
        self.hooks.expect_backup_bytes(op, fp)
        if cfg.mode == "shared":
            # every rank reads the node through the shared view after the post-copy fence, so the hash each rank's
            # reload must reproduce is the view's hash
            fp["hs"] = [fp["h"]] * cfg.ranks
        self.rec.backup(t, op, io, fp)

    def _copy_d2h(self, op: Op) -> None:
        """The device->host copy, executed when it completes: it reads the device pages *now*."""
        cfg = self.cfg
        if cfg.mode == "shared" and self.r != cfg.io_rank:
            op.done = True    # followers skip the payload (the IO rank copies every page through the view)
            return
        self.host.data[op.host] = self.mem.gather(op.dev)
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
        n = op.target()
        frags = [n] if op.stale else op.frags
        clen = len(n)
        self.hooks.expect_stale_ack(op, clen)
        self.rec.ack_d2h(t, op, clen, [f.id for f in frags])
        for f in [*op.frags, n]:
            if op in f.pend_ops:
                f.pend_ops.remove(op)
        if op.locked:
            self.tree.dec_lock(n)
        if op.old_host is not None:
            # a re-backup: the old host range is released now that the new copy is complete
            self.rec.free("host", op.old_host, n.id, "rebackup")
            self.host.free(op.old_host)
            n.old_host = op.old_host

    # -- host -> device ----------------------------------------------------------------------------------------
    def load_back(self, chain: list[Node], ancestor: Node) -> Op | None:
        """``load_back`` of the evicted ``chain`` below the device-resident ``ancestor``: new device slots, the
        chain's host pages pinned until the ack (None under the threshold or without device room)."""
        cfg = self.cfg
        tree = self.tree
        total = sum(len(n) for n in chain)
        if total < cfg.lb_threshold:
            return None
        tree.inc_lock(ancestor)
        for n in chain:
            n.host_ref += 1
        dev = self.evictor.alloc_dev(total, start=tree.first_class(chain[0]))   # the host copies' owners
        tree.dec_lock(ancestor)
        if dev is None:
            for n in chain:
                n.host_ref -= 1
            return None
        hosts, stale = self.hooks.reload_sources(chain)
        host = np.concatenate(hosts)
        op = self._new_op("h2d", dev, host, cfg.d_l)
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
        self.hooks.stale_reload(stale, last, op)
        self.rec.reload(op)
        self.load_q.append(op)
        self.load_new.append(op)
        self.hooks.hash_flip(last, op, bool(self.mem.owned(dev).any()))
        if self.hooks.h2_release(last, op):
            # the fault: the host pin goes at issue; the pages are freed now and reused by the next backup
            for n in chain:
                n.host_ref -= 1
            op.released = True
            for n in chain:
                self.rec.evict_host(n, "host")
                self.evictor.free_host(n)
        return op

    def _copy_h2d(self, op: Op) -> None:
        """The host->device copy, executed when it completes: it reads the host pages *now*."""
        data = self.host.data[op.host].copy()
        if op.flip:
            flip_one_byte(data, self.mem.owned(op.dev))
        self.mem.write_dev(op.dev, data)
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
            mid = self.ctx.new_op_id()
            for op in new:
                op.ack_id = mid

    def ack_loads(self, count: int) -> None:
        """Pop ``count`` finished loads: the ack records as an instrumentation of SGLang writes them (its
        ``HiCacheAck`` names the load's last node; one ``ack dir=h2d`` per chain node, the last node first, each with
        the bytes it landed; ``Simulation(ack_chain=False)``: the last node's only), then the forward that waited
        for the load, the unlock and the host unpin. The chain includes fragments of nodes split while the load
        was in flight."""
        cfg = self.cfg
        for _ in range(count):
            op = self.load_q.popleft()
            last = op.chain[-1]
            for n in [last, *op.chain[:-1]]:
                if n is last or cfg.ack_chain:
                    b = self.mem.gather(n.dev_slots())
                    fp = self.mem.fingerprint(n.dev_slots(), b)
                    self.hooks.expect_reload_bytes(n, op, b, fp)
                    self.rec.ack_h2d(op, n, fp)
                n.loading = False
                n.gen += 1
                self.cache.invalidate(n)
            if op.fwd is not None:
                rid, tokens, final, hit, pfp, dlen = op.fwd
                self.mem.fwd_hash(rid, tokens, final, hit, pfp, loaded=(dlen, op.chain))
            self.tree.dec_lock(op.target())
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
