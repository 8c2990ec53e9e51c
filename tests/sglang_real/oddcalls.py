"""Odd calls into SGLang's real HiCache methods, with or without the instrumentation: the instrumentation must not
change what SGLang does.

Each case builds a fresh cache (0.5.20 ``HiRadixCache`` or 0.5.23 ``UnifiedRadixCache``), populates it with the
driver's request stream (write-through: nodes on device, on host, evicted), then makes one direct call that stock
SGLang never makes (an argument of the wrong shape, a node missing attributes, a leaf whose ``host_value`` raises)
and records its outcome (the return value's type, or the exception's type and message) and the tree's state
afterwards. The test runs this once with ``--instrument`` and once without, and compares.

Also ``--evict-host N``: N host leaves, then ``evict_host`` of all of them, counting how many tree nodes the
instrumentation's wrappers visit (each ``host_value`` read of a node): O(evicted), never O(leaves) per evicted node.

CLI, from the repository root: ``python -m tests.sglang_real.oddcalls --version V [--instrument] [--evict-host N
[--level L] [--no-count]]``; one JSON line out. ``bench/sglang_evict_host.py`` times the ``--evict-host`` mode side by
side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tests.sglang_real import driver, runtime


class _CpuOnly:
    """Has ``.cpu()`` but no ``.numel()``."""

    def cpu(self) -> _CpuOnly:
        return self


class _IndexOnly:
    """``__index__`` works, ``int()`` raises."""

    def __index__(self) -> int:
        return 1

    def __int__(self) -> int:
        raise ValueError("no int for you")


class _Bare:
    """A node with a value and nothing else (no ``lock_ref``, no ``host_ref_counter``)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _NoId:
    """A queued operation without ``.id``."""

    def __init__(self, op: Any) -> None:
        self.host_indices, self.device_indices = op.host_indices, op.device_indices


def _populated(version: str, host_ratio: float = 3.0, level: int = 2) -> tuple[Any, Any]:
    import cptrace_otel

    out = tempfile.mkdtemp(prefix="cptrace-odd-")
    cptrace_otel.configure(level=level, file=os.path.join(out, "r.otlp.jsonl"), exporter="thread", checks=False)
    cp, tp = driver._init_group(1, 0, tempfile.mktemp(prefix="cptrace-gloo-"))
    if version == "0.5.23":
        cache, kv, alloc = driver.build23("write_through", 1, 384, host_ratio, cp, tp)
        make = driver.Driver23
    else:
        cache, kv, alloc = driver.build(version, "write_through", 1, 384, host_ratio, cp, tp)
        make = driver.Driver
    copies = runtime.Copies(1, 2)
    copies.install()
    drv = make(cache, kv, alloc, copies, 0, 1)
    drv.run(driver.request_stream(0, 60, 1), 4, reset_at=None, audit_every=0)
    return cache, drv


def _root(cache: Any) -> Any:
    tc = getattr(cache, "tree_core", None)
    return tc.root_node if tc is not None else cache.root_node


def _vals(n: Any) -> tuple[Any, Any]:
    d = n.component_data[0] if hasattr(n, "component_data") else n
    return d.value, d.host_value


def tree_state(cache: Any) -> list:
    """The tree as comparable data: per node (id, key length, on device, on host), depth first by id."""
    out, stack = [], [_root(cache)]
    while stack:
        n = stack.pop()
        try:
            v, h = _vals(n)
            out.append([int(n.id), len(n.key) if n.key is not None else -1, v is not None, h is not None])
        except Exception as e:   # a node the case broke on purpose
            out.append([int(getattr(n, "id", -1)), type(e).__name__])
        stack.extend(sorted(n.children.values(), key=lambda c: c.id))
    return sorted(out)


def _host_leaf(cache: Any) -> Any:
    leaves = getattr(cache, "evictable_host_leaves", None)
    if leaves:
        return next(iter(leaves))
    return None


def _some_node(cache: Any, pred: Callable[[Any], bool]) -> Any:
    stack = [_root(cache)]
    while stack:
        n = stack.pop()
        if n is not _root(cache) and pred(n):
            return n
        stack.extend(n.children.values())
    raise LookupError("no such node in the populated tree")


def _raise_host_value(cache: Any) -> None:
    """Make every evictable host leaf's ``host_value`` raise (a property on a subclass shadows the instance value)
    but the one ``evict_host(1)`` evicts first (the lowest priority): SGLang itself reads only that one."""
    leaves = sorted(cache.evictable_host_leaves, key=cache.eviction_strategy.get_priority)
    if len(leaves) < 2:
        raise LookupError("the populated tree has fewer than 2 host leaves")

    class Raising(type(leaves[0])):  # type: ignore[misc]
        @property
        def host_value(self) -> Any:
            raise RuntimeError("host_value unreadable")

    for victim in leaves[1:]:
        victim.__class__ = Raising


def cases(version: str) -> dict[str, Callable[[Any], Any]]:
    hp = runtime.host_pool
    common: dict[str, Callable[[Any], Any]] = {
        "host_free_cpu_only": lambda c: hp(c).free(_CpuOnly()),
        "host_free_list": lambda c: hp(c).free([1, 2]),
        "dev_free_list": lambda c: c.token_to_kv_pool_allocator.free([1, 2]),
    }
    if version == "0.5.23":
        tc = lambda c: c.tree_core  # noqa: E731
        common.update({
            "split_index_only": lambda c: _split(c, tc(c)._split_node),
            "evict_component_odd_comp": lambda c: tc(c)._evict_component_and_detach_lru(
                _some_node(c, lambda n: True), object(), {}, {}, [], 1, None),
            "free_segment_list": lambda c: c.token_to_kv_pool_allocator.free_segment([1, 2]),
        })
        return common
    common.update({
        "split_index_only": lambda c: _split(c, c._split_node),
        "detach_backuped_bare": lambda c: c._detach_backuped(_Bare(_some_node(c, lambda n: n.value is not None)
                                                                   .value)),
        "start_writing_no_id": lambda c: (c.cache_controller.write_queue.append(
            _NoId(_queued_op(c))), c.cache_controller.start_writing()),
        "evict_host_raising_leaf": lambda c: (_raise_host_value(c), c.evict_host(1)),
        "evict_regular_none": lambda c: c._evict_regular(None),
        "evict_backuped_none": lambda c: c._evict_backuped(None),
    })
    return common


def _split(cache: Any, split: Callable[..., Any]) -> Any:
    """A split whose length works as an index (SGLang slices with it) but not as ``int()``."""
    child = _some_node(cache, lambda n: len(n.key) > 1)
    return split(child.key, child, _IndexOnly())


def _queued_op(cache: Any) -> Any:
    """A plausible queued write: the indices of some node that is on device and on host."""
    n = _some_node(cache, lambda n: n.value is not None and n.host_value is not None)

    class Op:
        host_indices, device_indices = n.host_value, n.value
    return Op()


def _outcome(fn: Callable[[], Any]) -> list:
    try:
        r = fn()
        return ["ok", type(r).__name__]
    except BaseException as e:  # noqa: BLE001 - the outcome is what is compared
        return ["raise", type(e).__name__, str(e)[:200]]


def run_cases(version: str, instrument: bool) -> dict:
    if instrument:
        from cptrace_otel.traced.sglang import SGLangInstrumentor

        SGLangInstrumentor().instrument()
    out = {}
    for name, case in cases(version).items():
        cache, _drv = _populated(version)
        res = _outcome(lambda case=case, cache=cache: case(cache))
        out[name] = {"outcome": res, "tree": tree_state(cache)}
    return out


def evict_host_visits(version: str, n_leaves: int, instrument: bool, level: int = 2, count: bool = True) -> dict:
    """``evict_host`` of every host leaf of a tree with ``n_leaves`` of them (0.5.20), counting every read of a
    leaf's ``host_value`` (SGLang's and the wrappers': each a node visited) unless ``count`` is off (for timing),
    at trace ``level`` (0: the wrappers in place, tracing off)."""
    import time

    if instrument:
        from cptrace_otel.traced.sglang import SGLangInstrumentor

        SGLangInstrumentor().instrument()
    cache, _drv = _populated(version, host_ratio=4.0 + n_leaves / 384, level=level)
    from sglang.srt.mem_cache.radix_cache import TreeNode

    # n_leaves evicted host leaves under the root, each one token on host (hand-made: the request stream would take
    # minutes to make 20,000 of them)
    host = runtime.host_pool(cache)
    cache.evictable_host_leaves.clear()
    made = []
    for i in range(n_leaves):
        idx = host.alloc(1)
        if idx is None:
            break
        n = TreeNode()
        n.key = _key([10_000_000 + i])
        n.value = None
        n.host_value = idx
        n.parent = cache.root_node
        cache.root_node.children[n.key.child_key(1)] = n
        cache.evictable_host_leaves.add(n)
        made.append(n)
    visits = [0]

    class Counting(TreeNode):  # type: ignore[misc,valid-type]
        @property
        def host_value(self) -> Any:
            visits[0] += 1
            return self.__dict__["_hv"]

        @host_value.setter
        def host_value(self, v: Any) -> None:
            self.__dict__["_hv"] = v

    for n in made if count else ():
        hv = n.host_value
        n.__class__ = Counting
        n.host_value = hv
    t0 = time.perf_counter()
    cache.evict_host(2 * len(made))
    secs = time.perf_counter() - t0
    return {"leaves": len(made), "visits": visits[0], "seconds": round(secs, 4),
            "left": sum(1 for n in made if n.parent.children.get(n.key.child_key(1)) is n)}


def late_instrument(version: str) -> dict:
    """A cache built and used before ``instrument()``, then used after it: how many warnings say it is not traced,
    and how many records it produced (a cache built after, for contrast, produces records)."""
    import logging

    import cptrace_otel

    said: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logging.getLogger("cptrace_otel.sglang").addHandler(Grab())
    _cache, drv = _populated(version)
    from cptrace_otel.traced.sglang import SGLangInstrumentor

    SGLangInstrumentor().instrument()
    log = os.path.join(tempfile.mkdtemp(prefix="cptrace-late-"), "r.log")
    cptrace_otel.configure(level=2, log_file=log, exporter="thread", checks=False)
    drv.run(driver.request_stream(1, 30, 1), 4, reset_at=None, audit_every=0)
    cptrace_otel.flush(30)
    before = sum(1 for _ in open(log)) if os.path.exists(log) else 0
    _after_cache, after_drv = _populated(version)   # (configures its own file sink; the log goes on)
    cptrace_otel.configure(level=2, log_file=log, exporter="thread", checks=False)
    after_drv.run(driver.request_stream(2, 30, 1), 4, reset_at=None, audit_every=0)
    cptrace_otel.flush(30)
    total = sum(1 for _ in open(log)) if os.path.exists(log) else 0
    return {"warnings": [m for m in said if "built before" in m], "records_late": before,
            "records_after": total - before}


def _key(tokens: list[int]) -> Any:
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(tokens)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--instrument", action="store_true")
    ap.add_argument("--evict-host", type=int, default=0)
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--late", action="store_true", help="a cache built before instrument(), used after it")
    ap.add_argument("--no-count", action="store_true", help="time evict_host without counting host_value reads")
    a = ap.parse_args()
    runtime.use_sglang(a.version)
    if a.late:
        res = late_instrument(a.version)
    elif a.evict_host:
        res = evict_host_visits(a.version, a.evict_host, a.instrument, a.level, not a.no_count)
    else:
        res = run_cases(a.version, a.instrument)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
