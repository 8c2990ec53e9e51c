"""The audit of host copies at rest: an opt-in thread that re-fingerprints the KV host copies of complete backups
and writes one level-2 ``audit`` record per copy it read, so that a host copy corrupted while it sits in the host
pool is found (rule REST-hash, :mod:`cptrace_otel.checks.rules_rest`) before, or without, its reload.

Contract:

* Off by default: no thread and no work; nor for a cache built while the trace level is below 2 (the level the
  ``audit`` record needs); a level lowered later pauses the thread's work. ``CPTRACE_AUDIT_MBPS`` (or
  ``instrument(audit_mbps=...)``) > 0 turns it on: the bytes of host KV per second (in MB, 10**6 bytes) it may
  read and hash; it sleeps after each copy for the time that copy's bytes (at least :data:`FLOOR`: the fixed cost
  of a sample) are worth at that rate, so its cost is bounded by the rate whatever the cache holds.
* Which copies: a node's host copy joins the audit set when the ``ack dir=d2h`` that publishes it is recorded (the
  copy is complete) and leaves it at its host eviction, at the free of its host slots or at a reset, all on the
  scheduler's thread (:class:`~._state.State`). The thread walks the set in a random order, one pass after
  another (``sampled``: a pass sees the nodes present when it began).
* The record: ``audit node_id=<id> host=<rng of its host slots> h nz hp``: the host KV of the node in the same row
  layout as the ``backup`` fingerprint of the device KV (token order, every layer's K then V;
  :func:`host_rows`), so an intact copy has its backup's ``h``. Host pool layouts it does not know (anything but
  ``layer_first`` and ``page_first`` of SGLang's plain MHA and MLA host pools) are not read: such a cache leaves the
  audit at its first sample (one warning; :data:`STATS` ``refused``).
* Never a false finding from concurrent reuse: a sample is dropped (``STATS['raced']``) when, while it was read, any
  host slot of the cache was freed (the State's ``host_gen``; SGLang frees host slots before it reuses them) or the
  node's host value object changed (a split, an eviction).
* Never blocks or breaks the scheduler: the thread holds the GIL only to pick a node and gather its rows (torch
  releases it while it copies, the fingerprint while it hashes); an error costs that sample (``STATS['errors']``).
  The ring's producer holds the GIL, so a record from this thread is safe (``_speedups/ring.c``).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ._state import State
    from ._types import HostKVCache

logger = logging.getLogger("cptrace_otel.sglang")

ENV = "CPTRACE_AUDIT_MBPS"
FLOOR = 256 << 10   # bytes a sample is charged at least: a small node's fixed (Python) cost bounds the samples/s too
# what the audit did in this process (busy_s: seconds spent reading and hashing, the waits left out)
STATS: dict[str, float] = {"audited": 0, "bytes": 0, "raced": 0, "refused": 0, "errors": 0, "passes": 0, "busy_s": 0.0,
                           # the L3 objects' audit (._audit_l3): records written, objects gone, reads failed, caches
                           # whose backend it cannot read
                           "l3_audited": 0, "l3_gone": 0, "l3_unreadable": 0, "l3_refused": 0}
_KNOWN = {"MHATokenToKVPoolHost", "MLATokenToKVPoolHost"}   # exact classes: their subclasses lay pages out otherwise


def rate_setting(value: Any = None) -> float:   # (Any: a caller's value, checked here)
    """The audit rate in MB/s: ``value`` when given (``instrument(audit_mbps=)``), else ``CPTRACE_AUDIT_MBPS``;
    0 (off) when unset, not a number or not positive (a bad value is named once in a warning)."""
    raw = value if value is not None else os.environ.get(ENV, "")
    if isinstance(raw, str) and raw.strip() == "":
        return 0.0
    try:
        v = float(raw)
    except (TypeError, ValueError):
        logger.warning("cptrace-otel: %s=%r is not a number; the host-copy audit stays off", ENV, raw)
        return 0.0
    return v if v > 0 and v == v else 0.0


def host_rows(pool: HostKVCache, idx: Tensor) -> Tensor | None:
    """``[tokens, rows, ...]``: the host KV of host slots ``idx`` in the row order of
    :func:`._state.kv_rows` over the device pool (token order; MHA: every layer's K, then every layer's V; MLA:
    every layer's latent KV), or None for a pool or layout this does not know. SGLang's host buffers
    (``init_kv_buffer``): MHA ``layer_first`` ``[2, layers, size, heads, dim]``, ``page_first`` ``[2, size, layers,
    heads, dim]`` (``k_buffer``/``v_buffer`` are index 0/1); MLA ``layer_first`` ``[layers, size, 1, dim]``,
    ``page_first`` ``[size, layers, 1, dim]``."""
    import torch

    kind, layout = type(pool).__name__, getattr(pool, "layout", None)
    if kind not in _KNOWN or getattr(pool, "kv_buffer", None) is None:
        return None
    if kind == "MHATokenToKVPoolHost":
        k, v = pool.k_buffer, pool.v_buffer
        if layout == "layer_first":
            return torch.stack([b[idx] for b in (*k, *v)], dim=1)
        if layout == "page_first":
            return torch.cat([k[idx], v[idx]], dim=1)
        return None
    kv = pool.kv_buffer
    if layout == "layer_first":
        return torch.stack([b[idx] for b in kv], dim=1)
    if layout == "page_first":
        return kv[idx].contiguous()
    return None


class Auditor:
    """The audit thread of this process (one, for every traced cache): see the module doc."""

    def __init__(self, mbps: float) -> None:
        self.bps = mbps * 1e6
        self.states: weakref.WeakSet = weakref.WeakSet()
        self.stop_evt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cptrace-audit", daemon=True)
        self.pass_done = threading.Condition()

    def _run(self) -> None:
        while not self.stop_evt.is_set():
            try:
                busy = self.one_pass()
            except Exception as e:  # the audit never takes anything down; the next pass starts afresh
                STATS["errors"] += 1
                logger.debug("cptrace-otel: audit pass failed (%s: %s)", type(e).__name__, e)
                busy = False
            with self.pass_done:
                STATS["passes"] += 1
                self.pass_done.notify_all()
            if not busy:
                self.stop_evt.wait(0.05)

    def one_pass(self) -> bool:
        """Audit each node (host copy) and each L3 backup present in an audit set when the pass begins, in a random
        order; True when any was."""
        from ..api import trace_level

        if trace_level() < 2:
            return False   # the records would be dropped at the gate: no work
        work: list[tuple[State, int, bool]] = [(st, nid, False) for st in list(self.states) for nid in list(st.rest)]
        for st in list(self.states):
            ra = l3_rest(st)
            if ra is not None and not ra.refused:
                work.extend((st, op, True) for op in list(ra.rest))
        random.shuffle(work)
        for st, key, l3 in work:
            if self.stop_evt.is_set():
                break
            if st not in self.states:
                continue   # refused earlier in this pass
            t0 = time.perf_counter()
            n = self.audit_l3(st, key) if l3 else self.audit_one(st, key)
            STATS["busy_s"] += time.perf_counter() - t0
            if n is None and l3:   # a backend this cannot read without a side effect: its L3 copies leave the audit
                continue
            if n is None:   # a host pool this does not know: its cache leaves the audit (one warning)
                self.states.discard(st)
                STATS["refused"] += 1
                logger.warning("cptrace-otel: the host-copy audit cannot read this host pool (%s, layout %s); "
                               "its cache is not audited", type(st.host_pool()).__name__,
                               getattr(st.host_pool(), "layout", "?"))
                continue
            # the rate bound: every sample that got as far as the pool (read, raced or failed) waits its bytes' time
            self.stop_evt.wait(max(n, FLOOR) / self.bps)
        return bool(work)

    @staticmethod
    def audit_one(st: State, nid: int) -> int | None:
        """Re-fingerprint node ``nid``'s host copy and record it; the bytes read (0 when skipped), None when the
        cache's host pool is one :func:`host_rows` does not know."""
        from ..api import cptrace, rng

        node = st.rest.get(nid)
        if node is None:
            return 0
        gen = st.host_gen
        try:
            hv = st.host(node)
            pool = st.host_pool()
            if hv is None or len(hv) == 0 or pool is None:
                return 0
            rows = host_rows(pool, hv)
            if rows is None:
                return None
            f = st.fp_rows(rows)
            where = rng(hv)
            # checked last, right before the record: a free, split or eviction after it is recorded after the audit
            # (a record in between makes the checker count the audit as not comparable, never as a finding)
            if st.host_gen != gen or st.host(node) is not hv or st.rest.get(nid) is not node:
                STATS["raced"] += 1   # its slots may have been freed and rewritten while they were read
                return 0
            cptrace(2, "audit", node_id=nid, host=where, **f)
        except Exception as e:  # a pool that changed under the read: this sample only
            STATS["errors"] += 1
            logger.debug("cptrace-otel: audit of node %s failed (%s: %s)", nid, type(e).__name__, e)
            return 0
        n = int(rows.numel() * rows.element_size())
        STATS["audited"] += 1
        STATS["bytes"] += n
        return n

    @staticmethod
    def audit_l3(st: State, op: int) -> int | None:
        """Audit the stored objects of backup ``op`` of ``st``'s cache (:func:`._audit_l3.audit_op`): the bytes it is
        charged (those read, and :data:`FLOOR` per page at least: each page is an object of its own to open, read
        and hash, a fixed cost that tiny pages would otherwise let run far past the rate); None when its backend
        cannot be audited (the cache's L3 copies leave the audit, one warning)."""
        from . import _audit_l3

        ra = l3_rest(st)
        if ra is None:
            return 0
        try:
            got = _audit_l3.audit_op(ra, op, STATS)
        except Exception as e:  # a backend or pool that changed under the read: this sample only
            STATS["errors"] += 1
            logger.debug("cptrace-otel: L3 audit of op %s failed (%s: %s)", op, type(e).__name__, e)
            return 0
        if got is None:
            ra.refused = True
            ra.rest.clear()
            ra.pending.clear()
            STATS["l3_refused"] += 1
            logger.warning("cptrace-otel: the L3 audit cannot read this cache's storage without a side effect (%s); "
                           "its L3 copies are not audited", _audit_l3.refusal(ra))
            return None
        STATS["bytes"] += got[0]
        return max(got[0], got[1] * FLOOR)

    def wait_passes(self, n: int, timeout: float) -> bool:
        """Block until ``n`` more passes completed (tests, benches); False on timeout."""
        with self.pass_done:
            target = STATS["passes"] + n
            return self.pass_done.wait_for(lambda: STATS["passes"] >= target, timeout)


_AUDITOR: Auditor | None = None
_AT_EXIT: list[bool] = []
_lock = threading.Lock()


def auditor() -> Auditor | None:
    """The running audit thread, None when the audit is off."""
    return _AUDITOR


def enrolled(st: State) -> bool:
    """Whether ``st``'s cache is under audit (the L3 sites keep their audit set only then)."""
    a = _AUDITOR
    return a is not None and st in a.states


def l3_rest(st: State) -> Any:
    """The L3 audit set of ``st``'s cache (:class:`._audit_l3.L3Rest`), None when it has none."""
    return getattr(getattr(st, "l3", None), "audit", None)


def enroll(st: State) -> None:
    """Put a new cache's state under audit when the audit is on and the trace level is 2 or more when the cache is
    built (starts the thread on the first one; none while tracing is off)."""
    from ..api import trace_level
    from ._state import Recorder

    if Recorder.audit_mbps <= 0 or trace_level() < 2:
        return
    global _AUDITOR
    with _lock:
        if _AUDITOR is None or _AUDITOR.stop_evt.is_set():
            _AUDITOR = Auditor(Recorder.audit_mbps)
            _AUDITOR.thread.start()
            if not _AT_EXIT:
                # stopped (and joined) before the interpreter finalizes: a daemon thread inside a torch op at
                # finalization aborts the process
                atexit.register(stop)
                _AT_EXIT.append(True)
        _AUDITOR.states.add(st)


def stop(timeout: float = 5.0) -> None:
    """Stop the audit thread (``uninstrument()``); the next enrolled cache starts a new one if it is on."""
    global _AUDITOR
    with _lock:
        a, _AUDITOR = _AUDITOR, None
    if a is not None:
        a.stop_evt.set()
        if a.thread is not threading.current_thread():
            a.thread.join(timeout)

