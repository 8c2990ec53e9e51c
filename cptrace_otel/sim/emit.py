"""One rank's records: the level gate, the ``rank``/``ts`` stamp, the structural count, and the field layout of
every record the simulator writes (one method per record, fields in the order upstream's tracer writes them).

The engine modules compute the values (slot ranges, hashes, node ids); only this module decides which fields a
record carries and in which order, so a record's shape is changed in one place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The tags of cross-rank C1's projection: the checker joins the ranks' records by their index among these.
from ..checks.registry import STRUCTURAL
from ..fingerprint.cpu import khash_bytes
from . import kv
from .node import Node, Op
from .rank_ctx import RankCtx
from .tracer import TS_BASE, WALL_BASE_NS, Emitter


class Recorder:
    """Records of rank ``ctx.r`` to ``emitter``, gated by the settings' ``level``.

    ``n_struct`` counts the structural records (:data:`STRUCTURAL`) emitted in this epoch: the index the checker
    joins the ranks' records by, and the one :meth:`Simulation.judged` compares with the first divergence."""

    def __init__(self, ctx: RankCtx, emitter: Emitter) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.r = ctx.r
        self.emitter = emitter
        self.n_struct = 0

    def emit(self, level: int, tag: str, /, **f: object) -> None:
        cfg = self.cfg
        if level <= cfg.level:
            f["rank"] = self.r
            f["ts"] = self.ctx.clock.ts() - (cfg.lag_ns if self.r != cfg.io_rank else 0)
            self.emitter.emit(self.r, level, tag, **f)
            if tag in STRUCTURAL:
                self.n_struct += 1

    def on(self, level: int) -> bool:
        """Whether records of ``level`` are written (the simulated tracer's gate)."""
        return level <= self.cfg.level

    def xs(self, key: str, idx: np.ndarray | None) -> dict[str, str]:
        """The exact-set field ``key`` of ``idx`` (run-length text) when exact sets are on, else nothing."""
        if not self.cfg.exact or idx is None:
            return {}
        return {key: kv.runs(idx)}

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def config(self, layer_ids: np.ndarray) -> None:
        cfg = self.cfg
        extra: dict[str, Any] = {}
        if cfg.mode == "dcp":
            extra["dcp_size"] = cfg.ranks
        if cfg.mode == "shared":
            extra["io_rank"] = cfg.io_rank
        if cfg.mode == "layersplit":
            lo, hi = int(layer_ids[0]), int(layer_ids[-1]) + 1
            extra["layers"] = f"[{lo},{hi})"
        self.emit(1, "config", cp_size=cfg.ranks, cp_rank=self.r, mode=cfg.mode, page_size=cfg.page_size,
                  policy=cfg.policy, level=cfg.level, **extra, mono=TS_BASE, wall=WALL_BASE_NS)

    def reset(self) -> None:
        self.emit(1, "reset", reason="flush")

    # -- the tree ----------------------------------------------------------------------------------------------
    def rid_map(self, rid: str, node: Node, hit: str, dlen: int, hlen: int, plen: int, pfp: int) -> None:
        self.emit(1, "rid_map", rid=rid, node_id=node.id, hit=hit, dlen=dlen, hlen=hlen, plen=plen, pfp=pfp)

    def insert(self, n: Node, parent: Node, slots: np.ndarray, kind: str) -> None:
        self.emit(1, "insert", node_id=n.id, parent=parent.id, len=len(n), dev=kv.rng(slots), kind=kind,
                  **self.xs("devx", slots))

    def split(self, c: Node, p: Node, parent: Node, pre_len: int, split_len: int, dev_p: np.ndarray | None,
              dev_c: np.ndarray | None, host_p: np.ndarray | None, host_c: np.ndarray | None, pend: int) -> None:
        """Node ``c`` of ``pre_len`` tokens cut at ``split_len``: the new node ``p`` took the prefix."""
        self.emit(1, "split", node_id=c.id, new_id=p.id, parent=parent.id, pre_len=pre_len, split_len=split_len,
                  dev_p=kv.rng(dev_p), dev_c=kv.rng(dev_c), host_p=kv.rng(host_p), host_c=kv.rng(host_c),
                  pend=pend, lock=c.lock_ref)

    def evict_dev(self, v: Node, kind: str) -> None:
        """Device eviction of ``v`` (``kind`` backuped: the node stays on the host; regular: it is deleted)."""
        slots = v.value
        self.emit(1, "evict", tier="dev", node_id=v.id, kind=kind, dev=kv.rng(slots), lock=v.lock_ref,
                  href=v.host_ref, **self.xs("devx", slots))

    def evict_host(self, n: Node, kind: str) -> None:
        """Host eviction of ``n`` (``kind`` host: an evictable host leaf; drop: it lost its device parent)."""
        self.emit(1, "evict", tier="host", node_id=n.id, kind=kind, host=kv.rng(n.host_value), href=n.host_ref,
                  **self.xs("hostx", n.host_value))

    def free(self, pool: str, idx: np.ndarray, node_id: int, why: str) -> None:
        self.emit(2, "free", pool=pool, idx=kv.rng(idx), node_id=node_id, why=why, **self.xs("idx_x", idx))

    # -- copies ------------------------------------------------------------------------------------------------
    def prepare(self, n: Node, op: Op, parent: Node, pbk: int) -> None:
        host = op.host
        self.emit(1, "prepare", node_id=n.id, op=op.id, len=len(n), dev=kv.rng(op.dev), host=kv.rng(host),
                  policy=self.cfg.policy, parent=parent.id, pbk=pbk, **self.xs("hostx", host),
                  **self.xs("devx", op.dev))

    def backup(self, t: Op, op: Op, io: int, fp: dict[str, Any]) -> None:
        """The backup record of write ``op`` (node ``op.node``) carried by transfer ``t``; ``fp``: its hashes."""
        self.emit(1, "backup", op=t.id, node_id=op.target().id, dev=kv.rng(op.dev), host=kv.rng(op.host), io=io, **fp,
                  **self.xs("devx", op.dev), **self.xs("hostx", op.host))

    def ack_d2h(self, t: Op, op: Op, clen: int, pub: list[int]) -> None:
        self.emit(2, "ack", dir="d2h", op=t.id, node_id=op.target().id, blen=op.blen, clen=clen, pub=pub,
                  round=self.ctx.clock.tick)

    def reload(self, op: Op) -> None:
        """The load ``op`` of chain ``op.chain`` (last node ``op.node``)."""
        self.emit(1, "reload", node_id=op.target().id, chain=[n.id for n in op.chain], op=op.id, host=kv.rng(op.host),
                  dev=kv.rng(op.dev), **self.xs("hostx", op.host), **self.xs("devx", op.dev))

    def ack_h2d(self, op: Op, n: Node, fp: dict[str, Any]) -> None:
        self.emit(2, "ack", dir="h2d", op=op.ack_id, node_id=n.id, round=self.ctx.clock.tick, **fp)

    # -- the forward -------------------------------------------------------------------------------------------
    def compose(self, n: Node, layer: int, src: str, gen: int, hit: int) -> None:
        self.emit(2, "compose", key=f"L{layer}:n{n.id}", node_id=n.id, layer=layer, src=src, gen=gen, hit=hit)

    def store(self, rid: str, slots: np.ndarray) -> None:
        self.emit(2, "store", rid=rid, dev=kv.rng(slots), layer="all",
                  **({"owner": self.r} if self.cfg.mode == "shared" else {}), **self.xs("devx", slots))

    def fwd_hash(self, rid: str, layer: int, b: np.ndarray, rows: int, cprank: int, pfp: int, src: str) -> None:
        """The forward's hash of one layer's KV ``b`` of a prompt of ``rows`` tokens."""
        self.emit(3, "fwd_hash", rid=rid, nreq=1, layer=layer, stage="attn_kv", h=khash_bytes(b), nz=kv.knz(b),
                  rows=rows, cprank=cprank, pfp=pfp, src=src, plen=rows)
