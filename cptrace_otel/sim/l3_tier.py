"""A simulated L3 tier: host pages backed up to a storage backend and fetched back, on CP ranks in lockstep, with
the records of :mod:`cptrace_otel.model.l3` and faults of the bugs the L3 rules are for (rules L3a-L3d).

Mechanics follow SGLang's HiCache storage paths (``HiCacheController.write_storage`` / ``prefetch``, the ``file``
backend): a computed prompt's KV lands in host pages (``insert``, ``prepare``/``backup``/``ack dir=d2h``), then a
storage backup reads those pages **when it completes** (``l3_backup`` .. ``l3_ack dir=backup``; the host pages stay
locked until then) and writes one object per page under the page's key (the prefix-chained page hash plus the
backend's rank suffix ``_cp<r>_<R>`` in mode sharded, none in replicated); a key already stored is skipped, as the
``file`` backend does. Nodes past a budget leave device and host. A prompt seen again whose keys storage holds on
every rank (the hit count is reduced with MIN across ranks, as ``_sync_prefetch_hit_query``) is fetched:
``l3_query``, ``l3_prefetch`` into fresh host pages, the storage read when the transfer completes, ``l3_ack
dir=prefetch`` with the fingerprints of the filled pages, and ``l3_hit`` (a new node holds the pages). As on real
SGLang (``_handle_prefetch_result``, tests/sglang_real/test_l3_real.py), the tree may already hold the leading pages
of a fetch when it completes (another request brought them in meanwhile): those are freed right after the ack and
the ``l3_hit`` covers the rest, or there is no ``l3_hit`` at all when the tree held every page.

Faults (:data:`FAULTS`), each injected on one rank, with the codes the oracle expects: ``flip`` (a byte of a stored
page flips: L3a when that page comes back), ``free_prefetch`` (the host pages of a prefetch are freed before its
storage read completes: L3b), ``no_writer`` (mode sharded: one rank never writes its shard: L3c), ``same_keys``
(mode sharded: the ranks write without the rank suffix, so the first writer's shard is what every rank reads
back: L3d, and L3a where a rank fetches another's shard).

The backend is pluggable (``storage``: a factory ``(ranks, per_rank) -> store`` with the methods of
:class:`MemoryStorage`): the default keeps the pages in memory with the ``file`` backend's semantics; the tests
also run the simulator over SGLang's own ``HiCacheFile`` writing real files (tests/e2e/l3_file_main.py).

This module is separate from the HiRadix simulator (:mod:`.core`): it models only what the L3 rules read, with
whole prompts as nodes (no splits).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .kv import content, page_hashes, rng, runs
from .pool import PagedPool, PoolError
from .tracer import Clock, LogEmitter

FAULTS = {"flip": {"L3a"}, "free_prefetch": {"L3b"}, "no_writer": {"L3c"}, "same_keys": {"L3d"}}
MODES = ("none", "replicated", "sharded")
HELD = 0.25   # share of completed fetches whose leading pages the tree already holds


class L3Storage(Protocol):
    """What :class:`L3Sim` uses of its backend (:class:`MemoryStorage`, or a test's file-backed one)."""

    def key(self, r: int, page_hash: str) -> str: ...

    def exists(self, r: int, page_hash: str) -> bool: ...

    def set(self, r: int, page_hash: str, page: np.ndarray) -> None: ...

    def get(self, r: int, page_hash: str) -> np.ndarray: ...

    def corrupt(self, r: int, page_hash: str) -> None: ...


class MemoryStorage:
    """An L3 backend in memory with the ``file`` backend's semantics: one object per storage key, a key already
    stored is skipped (the first write stays); the storage key is the page hash plus ``_m`` (the model) and, when
    ``per_rank``, the rank suffix ``_cp<r>_<ranks>`` (what ``HiCacheFile`` adds under attention CP). Every method but
    :meth:`key` takes the page hash; :meth:`key` gives the storage key the records name."""

    def __init__(self, ranks: int, per_rank: bool) -> None:
        self.ranks, self.per_rank = ranks, per_rank
        self.objects: dict[str, np.ndarray] = {}

    def key(self, r: int, page_hash: str) -> str:
        return f"{page_hash}_m" + (f"_cp{r}_{self.ranks}" if self.per_rank else "")

    def exists(self, r: int, page_hash: str) -> bool:
        return self.key(r, page_hash) in self.objects

    def set(self, r: int, page_hash: str, page: np.ndarray) -> None:
        self.objects.setdefault(self.key(r, page_hash), page.copy())

    def get(self, r: int, page_hash: str) -> np.ndarray:
        return self.objects[self.key(r, page_hash)]

    def corrupt(self, r: int, page_hash: str) -> None:
        """Flip one bit of the stored page (a storage fault)."""
        self.objects[self.key(r, page_hash)][0, 0, 0] ^= 0x40


def _alloc(pool: PagedPool, n: int, owner: int) -> np.ndarray:
    """``n`` slots of ``pool`` for node ``owner`` (this simulator never evicts: a full pool is an error)."""
    idx = pool.alloc(n, owner)
    if idx is None:
        raise PoolError(f"{pool.name}: no room for {n} tokens (L3Sim never evicts: give it more pages)")
    return idx


class _Rank:
    def __init__(self, r: int, pages: int, ps: int, layers: int, width: int) -> None:
        self.r = r
        self.dev = PagedPool(pages, ps, layers, width, "dev")
        self.host = PagedPool(pages, ps, layers, width, "host")
        self.op = 0
        self.live: dict[int, dict] = {}         # node id -> {prompt, dev, host, keys, l3: None|"inflight"|"done"}
        self.backups: list[tuple] = []          # (complete tick, op, node id)
        self.prefetches: list[tuple] = []       # (complete tick, op, new node id, prompt, host, keys)


class L3Sim:
    """``L3Sim(mode, ranks, seed, fault=None).run(ticks)`` -> the expected codes; records in ``self.emitter``."""

    def __init__(self, mode: str = "none", ranks: int = 1, seed: int = 0, fault: str | None = None, *,
                 page_size: int = 4, layers: int = 2, width: int = 4, prompts: int = 4, budget: int = 2,
                 pages: int = 64, storage: Callable[[int, bool], L3Storage] = MemoryStorage) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (one of {MODES})")
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r} (one of {sorted(FAULTS)})")
        if mode == "none":
            ranks = 1
        self.mode, self.R, self.fault, self.ps = mode, ranks, fault, page_size
        self.layers, self.width, self.budget = layers, width, budget
        self.rnd = random.Random(seed)
        self.seed = seed
        self.prompts = [np.asarray([self.rnd.randrange(1, 30000) for _ in range(page_size * self.rnd.randint(1, 3))])
                        for _ in range(prompts)]
        self.ranks = [_Rank(r, pages, page_size, layers, width) for r in range(ranks)]
        # one backend for every rank: the rank suffix (sharded) tells their objects apart, unless the fault drops it
        self.store = storage(ranks, mode == "sharded" and fault != "same_keys")
        self.clock = Clock()
        self.emitter = LogEmitter(2, ranks)
        self.next_node = 1
        self.expected: set[str] = set()
        self.fault_rank = ranks - 1 if fault in ("no_writer", "same_keys") else 0
        self._flipped: set[str] = set()
        self._faulted = False

    # -- records ---------------------------------------------------------------------------------------------------
    def _emit(self, r: int, lv: int, tag: str, /, **f: object) -> None:
        f["rank"] = r
        f["ts"] = self.clock.ts()
        self.emitter.emit(r, lv, tag, **f)

    def _hashes(self, prompt: np.ndarray) -> list[str]:
        """SGLang's page hashes: each page's, chained over the prefix."""
        ps = self.ps
        return [hashlib.blake2b(prompt[:(j + 1) * ps].tobytes(), digest_size=6).hexdigest()
                for j in range(len(prompt) // ps)]

    def _keys(self, prompt: np.ndarray, r: int) -> list[str]:
        return [self.store.key(r, h) for h in self._hashes(prompt)]

    def _kv(self, prompt: np.ndarray, r: int) -> np.ndarray:
        shard = r if self.mode == "sharded" else 0
        return content(prompt, np.arange(len(prompt)), np.arange(self.layers), self.width, shard)

    # -- driving ---------------------------------------------------------------------------------------------------
    def run(self, ticks: int = 40) -> set[str]:
        for r in range(self.R):
            self._emit(r, 1, "config", cp_size=self.R, cp_rank=r, mode=self.mode, page_size=self.ps, policy="wt",
                       level=2)
        for _ in range(ticks):
            self.clock.advance()
            self._complete()
            if self.rnd.random() < 0.7:
                self._request(self.prompts[self.rnd.randrange(len(self.prompts))])
            self._evict()
        for _ in range(4):   # drain the transfers in flight
            self.clock.advance()
            self._complete()
        return self.expected

    def _request(self, prompt: np.ndarray) -> None:
        if any(np.array_equal(n["prompt"], prompt) for n in self.ranks[0].live.values()):
            return   # a prefix hit in the tree: nothing moves
        hashes = self._hashes(prompt)
        hits = min(sum(1 for h in hashes if self.store.exists(rk.r, h)) for rk in self.ranks)
        nid = self.next_node
        self.next_node += 1
        if hits == len(prompt) // self.ps:
            for rk in self.ranks:
                self._prefetch(rk, nid, prompt)
        else:
            for rk in self.ranks:
                self._compute(rk, nid, prompt)

    def _compute(self, rk: _Rank, nid: int, prompt: np.ndarray) -> None:
        r, n = rk.r, len(prompt)
        dev, host = _alloc(rk.dev, n, nid), _alloc(rk.host, n, nid)
        kv = self._kv(prompt, r)
        rk.dev.data[dev] = kv
        rk.host.data[host] = kv
        rk.op += 1
        op = rk.op
        self._emit(r, 1, "insert", node_id=nid, parent=0, len=n, dev=rng(dev), devx=runs(dev), kind="new")
        self._emit(r, 1, "prepare", node_id=nid, op=op, len=n, dev=rng(dev), host=rng(host), hostx=runs(host),
                   policy="wt")
        self._emit(r, 1, "backup", op=op, node_id=nid, dev=rng(dev), host=rng(host), io=1)
        self._emit(r, 2, "ack", dir="d2h", op=op, node_id=nid, blen=n, clen=n, pub=[nid])
        keys = self._keys(prompt, r)
        node: dict[str, Any] = {"prompt": prompt, "dev": dev, "host": host, "keys": keys, "l3": None}
        rk.live[nid] = node
        if self.fault == "no_writer" and r == self.fault_rank:
            self.expected.add("L3c")
            node["l3"] = "done"   # (it never writes: nothing to wait for)
            return
        rk.op += 1
        self._emit(r, 1, "l3_backup", node_id=nid, op=rk.op, keys=keys, hp=page_hashes(rk.host.data[host], self.ps),
                   host=rng(host), hostx=runs(host), io=1)
        node["l3"] = "inflight"
        rk.backups.append((self.clock.tick + self.rnd.randint(1, 2), rk.op, nid, self._hashes(prompt)))
        if self.fault == "same_keys" and self.R > 1:
            self.expected.add("L3d")

    def _prefetch(self, rk: _Rank, nid: int, prompt: np.ndarray) -> None:
        r, n = rk.r, len(prompt)
        keys = self._keys(prompt, r)
        host = _alloc(rk.host, n, nid)
        rk.op += 1
        self._emit(r, 1, "l3_query", op=rk.op, rid=f"req{nid}", keys=keys, hit=len(keys))
        self._emit(r, 1, "l3_prefetch", op=rk.op, rid=f"req{nid}", node_id=0, keys=keys, host=rng(host),
                   hostx=runs(host))
        if self.fault == "free_prefetch" and r == self.fault_rank and not self._faulted:
            # the bug: the pages are released while the storage read still targets them
            self._faulted = True
            self._emit(r, 2, "free", pool="host", idx=rng(host), idx_x=runs(host), node_id=-1, why="prefetch")
            self.expected.add("L3b")
        rk.prefetches.append((self.clock.tick + self.rnd.randint(1, 2), rk.op, nid, prompt, host, keys,
                              self._hashes(prompt)))

    def _complete(self) -> None:
        now = self.clock.tick
        for rk in self.ranks:
            r = rk.r
            for t in [b for b in rk.backups if b[0] <= now]:
                rk.backups.remove(t)
                _, op, nid, hashes = t
                node = rk.live[nid]
                for j, h in enumerate(hashes):   # the backup reads the host pages now
                    if not self.store.exists(r, h):   # (the file backend skips a key it holds)
                        self.store.set(r, h, rk.host.data[node["host"][j * self.ps:(j + 1) * self.ps]])
                        if self.fault == "flip" and r == self.fault_rank and not self._flipped and now > 3:
                            self.store.corrupt(r, h)   # a flipped byte in the stored page
                            self._flipped.add(node["keys"][j])
                self._emit(r, 2, "l3_ack", dir="backup", op=op, node_id=nid, done=len(node["keys"]))
                node["l3"] = "done"
            for t in [p for p in rk.prefetches if p[0] <= now]:
                rk.prefetches.remove(t)
                _, op, nid, prompt, host, keys, hashes = t
                for j, h in enumerate(hashes):   # the storage read fills the host pages now
                    rk.host.data[host[j * self.ps:(j + 1) * self.ps]] = self.store.get(r, h)
                hp = page_hashes(rk.host.data[host], self.ps)
                want = page_hashes(self._kv(prompt, r), self.ps)
                self._emit(r, 2, "l3_ack", dir="prefetch", op=op, node_id=0, done=len(keys), keys=keys, hp=hp)
                if hp != want and (self._flipped & set(keys) or self.fault == "same_keys"):
                    self.expected.add("L3a")
                held = self._held(nid, len(keys)) * self.ps
                if held:   # the tree's own copy wins: SGLang frees these fetched pages right after the ack
                    self._emit(r, 2, "free", pool="host", idx=rng(host[:held]), idx_x=runs(host[:held]), node_id=-1,
                               why="finish")
                    rk.host.free(host[:held])
                if held == len(host):
                    continue   # (no node takes any fetched page)
                rest = host[held:]
                self._emit(r, 1, "l3_hit", node_id=nid, op=op, keys=keys[held // self.ps:], host=rng(rest),
                           hostx=runs(rest))
                rk.live[nid] = {"prompt": prompt, "dev": None, "host": rest, "keys": keys, "l3": "done"}

    def _held(self, nid: int, pages: int) -> int:
        """How many leading pages of node ``nid``'s fetch the tree already holds at its completion (the same on
        every rank: the trees are in lockstep)."""
        r = random.Random(self.seed * 7919 + nid)
        return r.randint(1, pages) if r.random() < HELD else 0

    def _evict(self) -> None:
        """Nodes past the budget leave the device and the host (oldest first; not while a backup reads them)."""
        while len(self.ranks[0].live) > self.budget:
            nid = next((i for i in self.ranks[0].live if all(rk.live[i]["l3"] == "done" for rk in self.ranks)), None)
            if nid is None:
                return
            for rk in self.ranks:
                node = rk.live.pop(nid)
                r = rk.r
                if node["dev"] is not None:
                    self._emit(r, 1, "evict", tier="dev", node_id=nid, kind="backuped", dev=rng(node["dev"]),
                               devx=runs(node["dev"]))
                    self._emit(r, 2, "free", pool="dev", idx=rng(node["dev"]), idx_x=runs(node["dev"]), node_id=nid,
                               why="evict")
                    rk.dev.free(node["dev"])
                self._emit(r, 1, "evict", tier="host", node_id=nid, kind="host", host=rng(node["host"]),
                           hostx=runs(node["host"]))
                self._emit(r, 2, "free", pool="host", idx=rng(node["host"]), idx_x=runs(node["host"]), node_id=nid,
                           why="evict")
                rk.host.free(node["host"])
