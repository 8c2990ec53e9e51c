"""Stock SGLang 0.5.23 prefill context parallelism on CPU: every rank process of a gloo group runs its own
``UnifiedRadixCache`` with the ``file`` storage backend (l3_driver.py's scheduler calls), built under SGLang's own
server arguments for prefill CP (``--attn-cp-size N --enable-prefill-cp --cp-strategy interleave``, ``--tp-size N``:
each attention CP rank is a TP rank of its own), so the instrumentation derives the ``config`` record's mode from them
(``cp_mode`` is not set: mode ``prefill_cp``).

What stock prefill CP does to the KV is what the ranks do here: each rank holds the whole stream's KV (SGLang
all-gathers the CP ranks' parts and writes it whole on every rank), backs its copy up to its own host pool, and
writes to storage under keys of its own CP rank (the ``file`` backend's ``_cp<r>_<N>`` suffix, from the attention CP
group SGLang's controller reads).

Options of :func:`run_cp` (one matrix entry each):

* ``kv``: ``mha`` (a GQA model's pool, every TP rank a storage writer) or ``dsa`` (dsa_driver.py's DSA pool: MLA KV
  plus the indexer, which SGLang's storage config treats as rank-replicated, ``is_mla_model``).
* ``writer``: how the storage writer is elected. The storage config is always built by SGLang's controller from
  the parallel state of a stock prefill CP deployment (SGLang's own layout check forces it: ``tp_size`` is
  ``attn_cp_size * attn_tp_size`` and rank r of the attention CP group is global TP rank r). ``global_tp``: stock
  0.5.23, which elects the MLA writer by that global rank (``HiCacheStorageConfig.is_storage_writer``:
  ``tp_rank == dcp_rank``), so only CP rank 0 writes and the other ranks' lookups of their own keys miss (SGLang
  #37149). ``attn_tp`` (default): the election made within the attention TP group instead (the storage config's
  ``tp_rank`` replaced by the attention TP rank, 0 here, after SGLang built it; the backend keeps its own keys), so
  every CP rank writes its own keys, which is what the election has to do for them to be written.
* ``fault="cp_unequal"`` (on the fault rank only, as ``driver.run_ranks`` passes it): the forward's KV write of the
  ``nth`` request on this rank leaves one position's first-layer KV different from the other ranks' (what a CP
  all-gather that took a stale part would leave); the copies are no longer equal.

CLI, from the repository root: ``python -m tests.sglang_real.cp_driver --version 0.5.23 --out DIR --matrix JSON
--world N --rank R --store S`` (a list of :func:`run_cp` keyword sets; one JSON summary list on stdout), as
``driver.run_ranks(module="cp_driver")`` starts it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import sys
from typing import Any

from tests.sglang_real import driver, dsa_driver, l3_driver

CP_FAULTS = ("cp_unequal",)
WRITERS = ("attn_tp", "global_tp")


class _Unequal:
    """The ``cp_unequal`` fault over a driver's forward write (``store``): at the ``unequal_nth`` write, one more
    than expected is added to the first layer's KV of the last position written. ``unequal_hits`` says where."""

    kv: Any
    unequal_nth = 0
    unequal_seen = 0
    unequal_hits: list[dict]

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        super().store(idx, tokens, start)  # type: ignore[misc]
        if not self.unequal_nth or len(idx) == 0 or self.unequal_hits:
            return
        self.unequal_seen += 1
        if self.unequal_seen < self.unequal_nth:
            return
        buf = (self.kv.kv_buffer if hasattr(self.kv, "kv_buffer") else self.kv.k_buffer)[0]
        slot = int(idx[-1])
        buf[slot] += 1
        self.unequal_hits.append({"kind": "cp_unequal", "dev_slot": slot, "tokens": len(tokens)})


class CpMhaDriver(_Unequal, l3_driver.StorageDriver23):
    """A GQA model's pool under prefill CP with storage."""


class CpDsaDriver(_Unequal, dsa_driver.StorageDsaDriver):
    """The DSA pool (MLA KV and indexer) under prefill CP with storage."""


def server_args(world: int) -> dict:
    """The ``ServerArgs`` fields of stock prefill CP over ``world`` ranks (attention TP of one per CP rank)."""
    return {"attn_cp_size": world, "enable_prefill_cp": True, "cp_strategy": "interleave", "tp_size": world}


def run_cp(version: str, out: str, kv: str = "mha", writer: str = "attn_tp", fault: str | None = None, nth: int = 3,
           world: int = 2, rank: int = 0, store: str | None = None, l3_store: str | None = None,
           env_mode: str | None = None, **kw: Any) -> dict:
    """One rank's run of :func:`driver.run` under prefill CP (see the module doc); ``l3_store`` the storage folder
    the ranks share; ``env_mode``: ``CPTRACE_CP_MODE`` for this run (read by a fresh ``instrument()``, as on the
    one-switch path). The summary adds ``cp_fault_hits``, ``l3_files``, ``warnings`` (the instrumentation's),
    ``elected_by_sglang`` (whether stock SGLang's election made this rank a storage writer) and ``writer`` (whether
    it wrote, after ``writer``'s election)."""
    if kv not in ("mha", "dsa") or writer not in WRITERS or (fault is not None and fault not in CP_FAULTS):
        raise ValueError(f"run_cp: kv={kv!r} writer={writer!r} fault={fault!r}")
    root = l3_store or os.path.join(out, "l3store")
    if l3_store is None:
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = root
    # SGLang's layout: tp_rank == (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank
    parallel = {"tp_rank": rank, "tp_size": world, "attn_cp_rank": rank}
    box: dict = {}

    def make_driver(cache: Any, *a: Any) -> Any:
        drv = (CpDsaDriver if kv == "dsa" else CpMhaDriver)(cache, *a, faults=l3_driver.L3Faults(None),
                                                             parallel=parallel)
        cc = cache.cache_controller
        box["elected"] = not cc.backup_skip   # SGLang's own election
        if writer == "attn_tp":
            cc.storage_config = dataclasses.replace(cc.storage_config, tp_rank=0)
        drv.unequal_hits = []
        drv.unequal_nth = nth if fault == "cp_unequal" else 0
        box["drv"] = drv
        return drv

    sa = server_args(world)
    if kv == "dsa":
        kw.setdefault("dev_tokens", dsa_driver.PAGE * 16)
        kw.update(page_size=dsa_driver.PAGE, stream=dsa_driver.dsa_stream,
                  builder=functools.partial(driver.build23, make_kv=dsa_driver.make_dsa_pool, server_args=sa))
        kw.setdefault("requests", 48)
    else:
        kw.update(builder=functools.partial(driver.build23, server_args=sa))
        kw.setdefault("requests", 60)
        kw.setdefault("dev_tokens", 160)
        kw.setdefault("host_ratio", 1.5)
    warned: list[str] = []

    class Warned(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            if rec.levelno >= logging.WARNING:
                warned.append(rec.getMessage())

    lg, h = logging.getLogger("cptrace_otel.sglang"), Warned()
    lg.addHandler(h)
    if env_mode is not None:
        from cptrace_otel.traced.sglang import SGLangInstrumentor

        os.environ["CPTRACE_CP_MODE"] = env_mode
        inst = SGLangInstrumentor()
        if inst.is_instrumented_by_opentelemetry:
            inst.uninstrument()   # instrument() reads the environment again
    try:
        res = driver.run(version, out, world=world, rank=rank, store=store, cp_mode=None, make_driver=make_driver,
                         **kw)
    finally:
        os.environ.pop("CPTRACE_CP_MODE", None)
        lg.removeHandler(h)
    res["warnings"] = warned
    drv = box["drv"]
    res["cp_fault_hits"] = drv.unequal_hits
    res["writer"] = not drv.cache.cache_controller.backup_skip
    res["elected_by_sglang"] = box["elected"]
    res["l3_files"] = len([f for f in os.listdir(root) if f.endswith(".bin")])
    return res


def main(argv: list[str] | None = None) -> int:
    return l3_driver.main(argv, run=run_cp, versions=("0.5.23",), doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
