"""One rank's HiRadix tree: nodes, page-aligned match, splits, and ``lock_ref`` propagated to the root.

SGLang's rules (docs/domain.md §1 and §2, stages S1-S3): a partial match splits a node; the **new id takes the prefix**
and
the old id keeps the suffix, and a pending device->host write of the node is rewritten to list the fragments
prefix first. A node whose host->device copy is in flight is cut too (SGLang's match_prefix and insert do it within
a batch): the prefix joins the load's chain, and each fragment gets its own ack record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .copy import Op
    from .rank import RankSim


class Node:
    __slots__ = ("id", "key", "parent", "children", "value", "host_value", "lock_ref", "host_ref", "hit_count",
                 "gen", "last_access", "start", "bk", "bk_op", "bk_split", "bk_idx", "pend_ops", "loading",
                 "prev_host", "old_host", "noinval", "host_refused", "evicted_dev", "stale_dev")

    def __init__(self, nid: int, key: np.ndarray, parent: "Node | None", start: int) -> None:
        self.id = nid
        self.key = key
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.value: np.ndarray | None = None
        self.host_value: np.ndarray | None = None
        self.lock_ref = 0
        self.host_ref = 0
        self.hit_count = 0
        self.gen = 0
        self.last_access = 0
        self.start = start
        self.bk: np.ndarray | None = None        # bytes hashed by this node's latest backup record (token order)
        self.bk_op = -1
        self.bk_split = False                    # split since its backup (whole-node hashes not comparable)
        self.bk_idx = 0                          # the rank's structural index at that backup record
        self.pend_ops: list[Op] = []             # pending device->host writes whose fragments include this node
        self.loading = False
        self.prev_host: np.ndarray | None = None  # host range before the latest split (for H2_stale)
        self.old_host: np.ndarray | None = None   # range released by the latest re-backup (for H2_stale_clean)
        self.noinval = False
        self.host_refused = False                 # C1_div: this rank's host pool refused the node (no retry)
        self.evicted_dev: np.ndarray | None = None  # device slots the node had when it was last evicted
        self.stale_dev: tuple | None = None   # since a reload: (those pre-eviction slots, reloaded alone), H1_stale_dev

    def __len__(self) -> int:
        return int(self.key.size)


class Tree:
    """The tree of rank ``rk``: ``root`` (id 0, empty key) and ``nodes``, every other node by id.

    A split starts the rank's queued writes first when one of them is the node's (so the queue's merged op
    carries the whole node), and invalidates the node's compose views."""

    def __init__(self, rk: "RankSim") -> None:
        self.rk = rk
        self.next_id = 0
        self.root = self.new_node(np.zeros(0, dtype=np.int64), None, 0)
        self.root.value = np.zeros(0, dtype=np.int64)
        self.root.host_value = np.zeros(0, dtype=np.int64)
        self.nodes: dict[int, Node] = {}

    def new_node(self, key: np.ndarray, parent: Node | None, start: int) -> Node:
        n = Node(self.next_id, key, parent, start)
        self.next_id += 1
        if parent is not None:
            self.nodes[n.id] = n
        return n

    def edge(self, key: np.ndarray) -> tuple:
        """The children key of a node whose key starts with ``key``: its first page of tokens."""
        return tuple(key[:self.rk.sim.page_size].tolist())

    def path_of(self, n: Node) -> list[Node]:
        """The nodes from below the root down to ``n``."""
        out = []
        while n is not self.root and n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def inc_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref += 1
            n = n.parent

    def dec_lock(self, n: Node) -> None:
        while n is not self.root:
            n.lock_ref -= 1
            assert n.lock_ref >= 0, f"rank {self.rk.r}: lock_ref of node {n.id} below zero"
            n = n.parent

    def match(self, tokens: np.ndarray) -> tuple[list[Node], int]:
        """The matched path and the number of tokens it covers (page-aligned); a partial match splits the node."""
        ps = self.rk.sim.page_size
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
                if child.loading and not self.rk.sim.split_loading:
                    break   # (the simulator's first reading: never cut a node whose host->device copy is in flight)
                child = self.split(child, common)
                path.append(child)
                pos += common
                break
            path.append(child)
            pos += common
            node = child
        for n in path:
            n.last_access = self.rk.sim.clock.tick
        return path, pos

    def split(self, c: Node, s: int) -> Node:
        """Cut ``c`` after ``s`` tokens; returns the new prefix node (``c`` keeps its id and the suffix)."""
        rk = self.rk
        copy = rk.copy
        parent = c.parent
        assert parent is not None
        if copy.write_new and any(op in copy.write_new for op in c.pend_ops):
            copy.start_writing()   # a queued write of c starts (with the rest of the queue) before c is cut
        L = len(c)
        p = self.new_node(c.key[:s].copy(), parent, c.start)
        pre_dev, pre_host = c.value, c.host_value
        if pre_dev is not None:
            p.value, c.value = pre_dev[:s].copy(), pre_dev[s:].copy()
        dev_p, dev_c = p.value, c.value
        stale = rk.hooks.h1_stale_dev(c, pre_dev, s)
        if stale is not None:
            dev_p, dev_c = stale
        c.stale_dev = None   # the fragments' lengths no longer match the old slots
        hp_ = hc_ = None
        if pre_host is not None:
            hp_, hc_ = pre_host[:s].copy(), pre_host[s:].copy()
            swapped = rk.hooks.h1_swap(c, pre_host, s)
            if swapped is not None:
                hp_, hc_ = swapped
            p.host_value, c.host_value = hp_, hc_
            c.prev_host = pre_host
        c.old_host = None    # a re-backup's released range no longer matches the (shorter) node
        if c.bk is not None:
            p.bk, c.bk = c.bk[:s].copy(), c.bk[s:].copy()
            p.bk_op, p.bk_split, c.bk_split = c.bk_op, True, True
        p.lock_ref, p.hit_count, p.host_ref = c.lock_ref, c.hit_count, c.host_ref
        if c.loading:   # SGLang splits a node whose load is in flight: the prefix is part of the load from now on
            p.loading = True
            for op in rk.copy.load_q:
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
            rk.hooks.h1_ack(op)
            if not op.stale:
                i = op.frags.index(c)
                op.frags[i:i + 1] = [p, c]
            p.pend_ops.append(op)
        rk.cache.invalidate(c)
        rk.rec.split(c, p, parent, L, s, dev_p, dev_c, hp_, hc_, pend)
        return p

    def detach(self, v: Node) -> None:
        """Remove leaf ``v`` from the tree (its pages are already freed)."""
        parent = v.parent
        assert parent is not None
        del parent.children[self.edge(v.key)]
        del self.nodes[v.id]
        self.rk.cache.invalidate(v, force=True)
