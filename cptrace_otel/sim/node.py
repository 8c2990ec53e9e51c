"""The objects every part of a simulated rank reads and writes: a tree :class:`Node` and a copy :class:`Op`.

Plain state with a few checked accessors and no engine logic, in a leaf module: every part imports its types from
here, so no part imports another for a type.
"""

from __future__ import annotations

import numpy as np


class Node:
    """One radix tree node: its key (tokens), device slots (``value``) and host slots (``host_value``), locks, and
    the bookkeeping the engine and the oracle keep on it."""

    __slots__ = ("id", "key", "parent", "children", "value", "host_value", "lock_ref", "host_ref", "hit_count",
                 "gen", "last_access", "start", "bk", "bk_op", "bk_split", "bk_idx", "pend_ops", "loading",
                 "prev_host", "old_host", "noinval", "host_refused", "evicted_dev", "stale_dev", "base")

    def __init__(self, nid: int, key: np.ndarray, parent: Node | None, start: int) -> None:
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
        # mode sharded: the rotation base of the node's chain (SGLang's TreeNode.rotation_base): position-page P of
        # the prompt is owned by rank (base + P) % R; the same along every path from the root's child down
        self.base = 0

    def __len__(self) -> int:
        return int(self.key.size)

    def dev_slots(self) -> np.ndarray:
        """The node's device slots, where the caller reads or frees them (it must be device-resident)."""
        assert self.value is not None, f"node {self.id} has no device slots"
        return self.value

    def up(self) -> Node:
        """The node's parent (every node but the root has one)."""
        assert self.parent is not None, f"node {self.id} is the root"
        return self.parent


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

    def target(self) -> Node:
        """The node of a write part or a load (its last chain node); a merged transfer has none (see :meth:`writes`)."""
        assert self.node is not None, f"op {self.id} is a merged transfer: its nodes are its parts'"
        return self.node

    def writes(self) -> list[Op]:
        """The writes a d2h transfer carries: its parts when merged, else itself."""
        return self.parts or [self]
