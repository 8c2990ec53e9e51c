"""Drive sglang 0.5.23's ``UnifiedRadixCache`` over whichever tree core SGLang selects, its Rust one
(``RustUnifiedTreeCore``, the default wherever its extension loads) included, with driver.py's scheduler steps and
KV content checks.

What differs from :class:`driver.Driver23` is only what the Rust core does not offer: its nodes are not Python
objects (``node_by_id`` and ``root_node`` raise ``NotImplementedError``), and its keys must be ``array('q')``, as the
scheduler holds its input ids. So the prompts are ``array('q')``, and the host audit reaches the nodes through the
core's Python boundary: every leaf an ``insert`` returned, and the nodes on its path (``collect_path_info``), with
their host slots (``build_storage_backup_spec``). The same driver runs the Python core unchanged (both cores answer
those calls), so one driver compares the two.

The Rust core loads only with torch 2.11-2.14 (SGLang falls back to its Python core otherwise): run this with
``runtime.sglang_env("0.5.23", rust=True)``. CLI (one JSON summary on stdout, with ``tree_core``, the class SGLang
built): ``python tests/sglang_real/rust_driver.py --out DIR [--requests N] [--no-instrument] [--sglang-selects]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from array import array
from collections.abc import Iterator
from typing import Any

from tests.sglang_real import driver, runtime


def request_stream(seed: int, n: int, page_size: int) -> list[array]:
    """:func:`driver.request_stream`'s prompts as ``array('q')`` (the scheduler's input ids; the Rust core asserts
    the type of every key)."""
    return [array("q", t) for t in driver.request_stream(seed, n, page_size)]


class BoundaryDriver23(driver.Driver23):
    """:class:`driver.Driver23` whose host audit reads the tree through the tree core's interface only (see the
    module doc); ``stats['tree_core']`` is the class of the core SGLang built, ``stats['host_audited']`` the host
    copies the audits compared."""

    def __init__(self, cache: Any, *a: Any) -> None:
        super().__init__(cache, *a)
        self.stats["tree_core"] = type(cache.tree_core).__name__
        self.stats["host_audited"] = 0
        self.known: dict[Any, Any] = {}   # node id -> tokens whose prefix is that node's path

    def finish(self, req: driver.Req) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        c = self.cache
        res = c.insert(InsertParams(key=RadixKey(req.tokens), value=req.all_idx, prev_prefix_len=len(req.prefix_idx)))
        self.known[res.last_device_node] = req.tokens
        c.dec_lock_ref(req.last_node, req.lock)

    def reset(self) -> None:
        super().reset()
        self.known.clear()   # the tree is empty: no id from before names a node

    def _nodes_of(self, tokens: Any, upto: int) -> list[tuple[int, int, int]]:
        """No node walk through the boundary: a device corruption is reported without its nodes."""
        return []

    def _paths(self) -> list[tuple[Any, int, int, Any]]:
        """``(node id, path start, path end, tokens)`` of every live node on a known node's path, each once."""
        tc = self.cache.tree_core
        out: dict[Any, tuple[Any, int, int, Any]] = {}
        for nid, toks in list(self.known.items()):
            try:
                (path,) = tc.collect_path_info([nid])
            except KeyError:   # both cores' answer for a node that left the tree (evicted from every tier)
                del self.known[nid]
                continue
            for info in path:
                out[info.node_id] = (info.node_id, info.path_start, info.path_end, toks)
                self.known.setdefault(info.node_id, toks)   # an ancestor that becomes a leaf stays known
        return sorted(out.values(), key=lambda x: x[0])

    def audit_host(self) -> None:
        """Every known node whose host copy is complete (no write pending): its host KV equals the expected KV."""
        c = self.cache
        hp = runtime.host_pool(c)
        pending = self.pending_ids()
        self.stats["host_audits"] += 1
        for nid, start, end, toks in self._paths():
            if nid in pending:
                continue
            spec = c.tree_core.build_storage_backup_spec(nid, False)
            if spec is None or not len(spec.host_value):
                continue
            self.stats["host_audited"] += 1
            if not self.host_ok(hp, spec.host_value, list(toks[:end]), start):
                self.corruption.append({"step": self.copies.step, "where": "host", "nodes": [nid]})


@contextlib.contextmanager
def core_selected_by_sglang(sglang_selects: bool = True) -> Iterator[None]:
    """driver.py's caches built meanwhile get SGLang's own selection of the tree core (the cache's parameters name
    none, as the scheduler's do: the Rust core under its torch) where ``sglang_selects``, else driver.py's (the
    variable, else the Python core)."""
    before = driver.POOL.pop("tree_core", None)
    if sglang_selects:
        driver.POOL["tree_core"] = ""
    try:
        yield
    finally:
        driver.POOL.pop("tree_core", None)
        if before is not None:
            driver.POOL["tree_core"] = before


def run(out: str, sglang_selects: bool = False, **kw: Any) -> dict:
    """:func:`driver.run` of 0.5.23 with :class:`BoundaryDriver23`; ``sglang_selects``: the tree core is SGLang's
    own selection (:func:`core_selected_by_sglang`)."""
    with core_selected_by_sglang(sglang_selects):
        return driver.run("0.5.23", out, stream=request_stream, make_driver=BoundaryDriver23, **kw)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="write_through")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--no-instrument", dest="instrument", action="store_false")
    p.add_argument("--sglang-selects", action="store_true",
                   help="the tree core SGLang selects (else driver.py's default, the Python core)")
    a = vars(p.parse_args(argv))
    runtime.use_sglang("0.5.23", rust=True)
    print(json.dumps(run(**a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
