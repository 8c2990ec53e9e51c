"""What the SGLang instrumentation costs per scheduler step: the real-SGLang driver (tests/sglang_real/driver.py)
with the instrumentation off and on, in one process, same request stream, printing the ratio.

    python3 -m bench.sglang_step_cost [--version 0.5.20|0.5.23] [--reps 3] [--requests 150] [--policy write_through]
        [--exporter thread|process] [--no-ring] [--layerwise] [--cpu] [--audit-mbps 100] [--l3]
    python3 -m bench.sglang_step_cost --tree-core rust|python [--reps 5] [--cpu] ...
    python3 -m bench.sglang_step_cost --reads [--n 20000] [--reps 7]

(from the repository root; the process runs again with the version's SGLang folder on ``PYTHONPATH``)

Modes, alternated ``--reps`` times (median per mode):

* ``off``: stock SGLang, not instrumented;
* ``gate0``: instrumented, trace level 0 (the cache constructors wrapped; the hot sites, wrapped only while tracing
  is on, are SGLang's own methods);
* ``on``: level 2, range summaries (every record, the ``h``/``nz``/``hp`` fingerprints of every backup and of
  every loaded node);
* ``exact``: level 2 plus the exact sets (``CPTRACE_SGLANG_EXACT=1``);
* ``audit`` (with ``--audit-mbps`` > 0): ``on`` plus the audit of host copies at rest at that rate (its thread
  competes with the scheduler's for the GIL; the time it takes after the last step is not counted). With ``--l3``
  the cache has the ``file`` storage tier on (tests/sglang_real/l3_driver.py: a fresh store per run, the
  scheduler's storage calls) in every mode, and the audit reads its stored objects back too (``audit tier=l3``).

A step is the driver's scheduler step (copies polled, acks checked, a batch matched, loaded, stored, finished,
eviction under pressure). It includes the driver's own per-request content check of the matched prefix (the same
in every mode), and runs on CPU with tiny KV (2 layers x 4 floats per token), so the fingerprints are cheap here
and the ratio is mostly the Python work of the wrappers and records. Records go to a file sink, exported from a
thread (``--exporter thread``, the default here) or from the exporter process with the record ring (``--exporter
process``, the package's default) or without it (``--exporter process --no-ring``: the buffer and drainer path).
``--cpu``: per step the process's CPU time (its threads, the exporter thread included) instead of wall time: on a
machine other processes load, far less noisy (wall time counts the waits for a core).
``--layerwise`` (0.5.23): a DSA pool (MLA KV and the indexer, 64-token pages) whose load-backs complete layer by
layer under a forward that reads every layer through SGLang's getters (tests/sglang_real/dsa_driver.py,
``LayerwiseDsaDriver``): the step then includes the reads and waits, and at level 2 the use-before-load records.

``--tree-core rust|python`` (0.5.23): the cache is built on that tree core (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``
set for every run; the default, without the option, is the driver's Python core), and the mode ``off-python`` or
``off-rust`` adds stock SGLang on the other core, alternated with the rest, so the two cores' stock step costs are
compared in one run (the last line prints their ratio). The Rust core loads only with torch 2.11-2.14: the bench
re-runs itself with the torch deploy/sglang/install puts in ``.sglang/torch-2.14`` first on ``PYTHONPATH``, and both
cores then run on that torch. Prompts are ``array('q')`` (the scheduler's input ids; the Rust core asserts the type)
and the driver reads the tree through the core's interface only (tests/sglang_real/rust_driver.py), for both cores.
With ``rust`` the instrumented modes trace the Rust core at its Python boundary (the instrumentation's default).

``--reads`` (0.5.23): what a layer's reads cost with no load-back in flight (the use-before-load sites hook them only
while one is): SGLang's DSA pool built by the driver, one layer's reads as a DSA forward makes them (the indexer's
``get_index_k_with_scale_buffer``, attention's ``get_key_buffer`` and ``get_value_buffer``, a ``LayerDoneCounter``
registered, no consumer), timed ``off`` (stock), ``gate0`` (instrumented, level 0) and ``on`` (level 2); best of
``--reps`` runs of ``--n`` reads (the least disturbed by other processes).

Needs deploy/sglang/install.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from tests.sglang_real import runtime

CORE_CLASS = {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}   # what SGLang builds for each name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--version", default="0.5.20", choices=runtime.VERSIONS)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--policy", default="write_through")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--exporter", default="thread", choices=["thread", "process"])
    p.add_argument("--no-ring", action="store_true", help="with --exporter process: the buffer path (CPTRACE_RING=0)")
    p.add_argument("--layerwise", action="store_true",
                   help="0.5.23: a DSA pool read layer by layer under layer-wise load-backs (dsa_driver.py)")
    p.add_argument("--cpu", action="store_true", help="CPU time per step instead of wall time")
    p.add_argument("--reads", action="store_true", help="0.5.23: a layer's reads with no load-back in flight")
    p.add_argument("--n", type=int, default=20000, help="with --reads: reads per timing")
    p.add_argument("--audit-mbps", type=float, default=0.0, help="add the mode `audit`: `on` with the audit of host "
                   "copies at rest at this rate (MB/s)")
    p.add_argument("--l3", action="store_true", help="every mode with the file storage tier on (l3_driver.py); "
                   "the audit also reads the stored objects back")
    p.add_argument("--tree-core", choices=("rust", "python"),
                   help="0.5.23: the tree core the cache is built on, with stock SGLang on the other one beside it "
                        "(runs under the torch the Rust core loads with)")
    a = p.parse_args(argv)
    if a.tree_core:
        a.version = "0.5.23"
        why = runtime.missing_reason(a.version, rust=True)
        if why:
            print(why, file=sys.stderr)
            return 2
        if runtime.rust_torch_dir() not in sys.path:   # this interpreter's torch: SGLang would fall back to Python
            return subprocess.call([sys.executable, "-m", "bench.sglang_step_cost",
                                    *(sys.argv[1:] if argv is None else argv)],
                                   env=runtime.sglang_env(a.version, rust=True), cwd=runtime.ROOT)
    if a.reads:
        a.version = "0.5.23"
    if a.layerwise and a.version != "0.5.23":
        p.error("--layerwise needs --version 0.5.23")
    why = runtime.missing_reason(a.version)
    if why:
        print(why, file=sys.stderr)
        return 2
    runtime.use_sglang(a.version)
    if a.reads:
        return read_cost(a)
    from cptrace_otel.traced.sglang import SGLangInstrumentor
    from tests.sglang_real import driver

    inst = SGLangInstrumentor()
    pool: dict = dict(policy=a.policy, page_size=a.page_size, dev_tokens=256)
    run = driver.run
    if a.l3:
        from tests.sglang_real import l3_driver

        run = l3_driver.run_l3
    if a.layerwise:
        from tests.sglang_real import dsa_driver

        pool = dict(policy=a.policy, page_size=dsa_driver.PAGE, dev_tokens=dsa_driver.PAGE * 16,
                    builder=dsa_driver.build_dsa, stream=dsa_driver.dsa_stream,
                    make_driver=lambda cache, *x: dsa_driver.LayerwiseDsaDriver(cache, *x))
    modes: dict[str, dict] = {"off": dict(instrument=False)}
    core: dict[str, str | None] = {}   # the tree core of each mode's cache (None: the driver's default)
    if a.tree_core:
        from tests.sglang_real import rust_driver

        other = "python" if a.tree_core == "rust" else "rust"
        modes["off-" + other] = dict(instrument=False)
        core["off-" + other] = other
        pool.update(stream=rust_driver.request_stream, make_driver=rust_driver.BoundaryDriver23)
    modes.update(gate0=dict(level=0), on=dict(), exact=dict(exact=True))
    if a.audit_mbps > 0:
        modes["audit"] = dict(audit_mbps=a.audit_mbps)
    for m in modes:
        core.setdefault(m, a.tree_core)
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    steps = 0
    audit: dict = {}
    with tempfile.TemporaryDirectory(prefix="sglang-step-cost-") as out:
        for rep in range(a.reps):
            for m, kw in modes.items():
                if m.startswith("off") and inst.is_instrumented_by_opentelemetry:
                    inst.uninstrument()
                if core[m]:
                    os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core[m]
                if m in ("exact", "audit") and inst.is_instrumented_by_opentelemetry:
                    inst.uninstrument()   # exact and audit_mbps are instrument() options
                r = run(a.version, os.path.join(out, f"{m}-{rep}"), seed=5, requests=a.requests,
                               audit_every=0, reset=False, exporter=a.exporter, ring=not a.no_ring, **pool, **kw)
                steps = r["stats"]["steps"]
                built = r["stats"].get("tree_core")
                if core[m] and built != CORE_CLASS[core[m]]:   # SGLang fell back: the figure would be of another core
                    raise RuntimeError(f"mode {m}: SGLang built {built}, not the {core[m]} tree core")
                per_step[m].append(r["stats"]["loop_cpu_s" if a.cpu else "loop_s"] / steps)
                if r.get("audit"):
                    audit = r["audit"]
    med = {m: statistics.median(v) for m, v in per_step.items()}
    how = a.exporter + (" ring" if a.exporter == "process" and not a.no_ring else "")
    cores = f" {a.tree_core} tree core (torch {torch_version()})" if a.tree_core else ""
    print(f"sglang {a.version}{cores} {a.policy} page_size={pool['page_size']}"
          f"{' layerwise DSA' if a.layerwise else ''}: "
          f"{a.requests} requests, {steps} steps, "
          f"median of {a.reps}; exporter {how}; {'CPU' if a.cpu else 'wall'} time")
    stock = {c: med["off" if c == a.tree_core else "off-" + c] for c in ("rust", "python")} if a.tree_core else {}
    for m in modes:
        print(f"  {m:10s} {med[m] * 1e3:8.3f} ms/step   x{med[m] / med['off']:.2f} of off"
              + (f"   x{med[m] / stock['rust']:.2f} of stock rust" if stock else ""))
    if stock:
        print(f"  stock python core / stock rust core: x{stock['python'] / stock['rust']:.2f}")
    if audit:
        n = audit["audited"] + audit["l3_audited"]   # host copies and L3 backups read back
        print(f"  audit at {a.audit_mbps:g} MB/s (last run, loop and final passes): {n:.0f} samples, "
              f"{audit['bytes'] / 1e6:.2f} MB, {audit['busy_s'] * 1e3:.0f} ms busy "
              f"({audit['busy_s'] * 1e6 / max(n, 1):.0f} us a sample), {audit['raced']:.0f} raced"
              + (f"; of them {audit['l3_audited']:.0f} L3 backups ({audit['l3_gone']:.0f} objects gone)"
                 if a.l3 else ""))
    return 0


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def read_cost(a: argparse.Namespace) -> int:
    """``--reads``: one layer's reads of the DSA pool, per mode (see the module doc)."""
    import timeit

    import cptrace_otel
    from cptrace_otel.traced.sglang import SGLangInstrumentor
    from tests.sglang_real import driver, dsa_driver

    cp, tp = driver._init_group(1, 0, tempfile.mktemp(prefix="cptrace-gloo-"))
    inst = SGLangInstrumentor()
    out = tempfile.mkdtemp(prefix="sglang-read-cost-")
    res: dict[str, float] = {}
    for mode, level in (("off", None), ("gate0", 0), ("on", 2)):
        if level is not None and not inst.is_instrumented_by_opentelemetry:
            inst.instrument(exact=False)
        cptrace_otel.configure(level=level or 0, file=os.path.join(out, f"{mode}.otlp.jsonl"),
                               log_file=os.path.join(out, f"{mode}.log"), exporter="thread")
        _, pool, _ = dsa_driver.build_dsa("write_through", dsa_driver.PAGE, dsa_driver.PAGE * 16, 3.0, cp, tp)
        assert pool.layer_transfer_counter is not None

        def read(pool=pool) -> None:
            pool.get_index_k_with_scale_buffer(layer_id=1)
            pool.get_key_buffer(1)
            pool.get_value_buffer(1)

        res[mode] = min(timeit.repeat(read, number=a.n, repeat=a.reps)) / a.n
        cptrace_otel.shutdown(10)
    print(f"sglang 0.5.23 DSA pool, one layer's reads (indexer + K + V), no load-back in flight, best of {a.reps}:")
    for m, t in res.items():
        print(f"  {m:6s} {t * 1e6:7.3f} us   {(t - res['off']) * 1e6:+7.3f} us   x{t / res['off']:.2f} of off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
