"""One rank's HiRadix tree: nodes, page-aligned match, splits, and ``lock_ref`` propagated to the root.

SGLang's rules (docs/domain.md §1 and §2, stages S1-S3): a partial match splits a node; the **new id takes the prefix**
and
the old id keeps the suffix, and a pending device->host write of the node is rewritten to list the fragments
prefix first. A node whose host->device copy is in flight is cut too (SGLang's match_prefix and insert do it within
a batch): the prefix joins the load's chain, and each fragment gets its own ack record.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from .compose import ComposeCache
from .emit import Recorder
from .faults import FaultHooks
from .node import Node, Op
from .rank_ctx import RankCtx


class Transfers(Protocol):
    """What a split needs of the rank's copy engine (:class:`~cptrace_otel.sim.copy_engine.CopyEngine`): the queued
    writes (started before a node of theirs is cut) and the loads in flight (whose chains take the prefix)."""

    write_new: list[Op]
    load_q: deque[Op]

    def start_writing(self) -> None: ...


class Tree:
    """The tree of rank ``ctx.r``: ``root`` (id 0, empty key) and ``nodes``, every other node by id.

    A split starts the rank's queued writes first when one of them is the node's (so the queue's merged op
    carries the whole node), and invalidates the node's compose views (``cache``); ``hooks``, ``rec``: the rank's
    fault sites and records. The copy engine, which is built on the tree, is given by :meth:`bind`."""

    transfers: Transfers

    def __init__(self, ctx: RankCtx, hooks: FaultHooks, cache: ComposeCache, rec: Recorder) -> None:
        self.ctx = ctx
        self.page_size = ctx.cfg.page_size
        self.hooks = hooks
        self.cache = cache
        self.rec = rec
        self.next_id = 0
        self.root = self.new_node(np.zeros(0, dtype=np.int64), None, 0)
        self.root.value = np.zeros(0, dtype=np.int64)
        self.root.host_value = np.zeros(0, dtype=np.int64)
        self.nodes: dict[int, Node] = {}

    def bind(self, transfers: Transfers) -> None:
        """Give the tree the rank's copy engine (built after the tree, which it uses)."""
        self.transfers = transfers

    def new_node(self, key: np.ndarray, parent: Node | None, start: int) -> Node:
        n = Node(self.next_id, key, parent, start)
        self.next_id += 1
        if parent is not None:
            self.nodes[n.id] = n
        return n

    def edge(self, key: np.ndarray) -> tuple:
        """The children key of a node whose key starts with ``key``: its first page of tokens."""
        return tuple(key[:self.page_size].tolist())

    def first_class(self, n: Node) -> int:
        """The owner class of node ``n``'s first page (mode sharded: its chain's rotation base plus its first
        position-page, SGLang's ``rotation_phase_of``; 0 in the other modes, whose pools have one class): where
        its device and host pages start, on every device or host allocation for it."""
        cfg = self.ctx.cfg
        if cfg.mode != "sharded":
            return 0
        return (n.base + n.start // cfg.page_size) % cfg.ranks

    def path_of(self, n: Node) -> list[Node]:
        """The nodes from below the root down to ``n``."""
        out = []
        cur: Node | None = n
        while cur is not self.root and cur is not None:
            out.append(cur)
            cur = cur.parent
        return out[::-1]

    def inc_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref += 1
            n = n.up()

    def dec_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref -= 1
            assert n.lock_ref >= 0, f"rank {self.ctx.r}: lock_ref of node {n.id} below zero"
            n = n.up()

    def match(self, tokens: np.ndarray) -> tuple[list[Node], int]:
        """The matched path and the number of tokens it covers (page-aligned); a partial match splits the node."""
        ps = self.page_size
        node, pos, path = self.root, 0, []
        while pos < tokens.size:
            child = node.children.get(self.edge(tokens[pos:]))
            if child is None:
                break
            rest = tokens[pos:]
            m = min(child.key.size, rest.size)
            diff = np.nonzero(child.key[:m] != rest[:m])[0]
            common = (int(diff[0]) if diff.size else m) // ps * ps
            if common == 0:
                break
            if common < child.key.size:
                if child.loading and not self.ctx.cfg.split_loading:
                    break   # (the simulator's first reading: never cut a node whose host->device copy is in flight)
                child = self.split(child, common)
                path.append(child)
                pos += common
                break
            path.append(child)
            pos += common
            node = child
        for n in path:
            n.last_access = self.ctx.clock.tick
        return path, pos

    def split(self, c: Node, s: int) -> Node:
        """Cut ``c`` after ``s`` tokens; returns the new prefix node (``c`` keeps its id and the suffix)."""
        copy = self.transfers
        parent = c.up()
        if copy.write_new and any(op in copy.write_new for op in c.pend_ops):
            copy.start_writing()   # a queued write of c starts (with the rest of the queue) before c is cut
        L = len(c)
        p = self.new_node(c.key[:s].copy(), parent, c.start)
        pre_dev, pre_host = c.value, c.host_value
        if pre_dev is not None:
            p.value, c.value = pre_dev[:s].copy(), pre_dev[s:].copy()
        dev_p, dev_c = p.value, c.value
        stale = self.hooks.h1_stale_dev(c, pre_dev, s)
        if stale is not None:
            dev_p, dev_c = stale
        c.stale_dev = None   # the fragments' lengths no longer match the old slots
        hp_ = hc_ = None
        if pre_host is not None:
            hp_, hc_ = pre_host[:s].copy(), pre_host[s:].copy()
            swapped = self.hooks.h1_swap(c, pre_host, s)
            if swapped is not None:
                hp_, hc_ = swapped
            p.host_value, c.host_value = hp_, hc_
            c.prev_host = pre_host
        c.old_host = None    # a re-backup's released range no longer matches the (shorter) node
        if c.bk is not None:
            p.bk, c.bk = c.bk[:s].copy(), c.bk[s:].copy()
            p.bk_op, p.bk_split, c.bk_split = c.bk_op, True, True
        p.lock_ref, p.hit_count, p.host_ref = c.lock_ref, c.hit_count, c.host_ref
        p.base = c.base   # the chain's rotation: both fragments keep their pages' owners
        if c.loading:   # SGLang splits a node whose load is in flight: the prefix is part of the load from now on
            p.loading = True
            for op in copy.load_q:
                if c in op.chain:
                    i = op.chain.index(c)
                    op.chain[i:i + 1] = [p, c]
        p.gen = c.gen + 1
        c.gen += 1
        p.last_access = c.last_access
        c.key = c.key[s:].copy()
        c.start += s
        parent.children[self.edge(p.key)] = p
        p.children = {self.edge(c.key): c}
        c.parent = p
        pend = c.pend_ops[0].id if c.pend_ops else -1
        for op in c.pend_ops:
            self.hooks.h1_ack(op)
            if not op.stale:
                i = op.frags.index(c)
                op.frags[i:i + 1] = [p, c]
            p.pend_ops.append(op)
        self.cache.invalidate(c)
        self.rec.split(c, p, parent, L, s, dev_p, dev_c, hp_, hc_, pend)
        return p

    def detach(self, v: Node) -> None:
        """Remove leaf ``v`` from the tree (its pages are already freed)."""
        del v.up().children[self.edge(v.key)]
        del self.nodes[v.id]
        self.cache.invalidate(v, force=True)
