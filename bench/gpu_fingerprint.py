"""GPU fingerprints on one device: ours (fused Triton kernels, deferred results) vs upstream's formula.

    python bench/gpu_fingerprint.py [--gib 1] [--pages 1024] [--reps 10]
    python bench/gpu_fingerprint.py --smoke      # no GPU needed: tiny sizes under TRITON_INTERPRET on CPU tensors

Figures printed:
  1. khash+knz over a --gib GiB tensor: TB/s (CUDA-event timed, input > L2), ratio vs the upstream formula in the same
     run, host syncs per call (torch.cuda.set_sync_debug_mode("warn") warnings counted), extra device memory.
  2. host cost of enqueueing one fingerprint of a 64-token page slice (MLA bf16: 64 x 576 x 2 B = 72 KiB).
  3. batched form: --pages page slices scattered over a pool, one launch: aggregate TB/s and host ms per batch;
     gather form: pool[indices] hashed in token order without the gathered copy.
Every result is checked against the reference bit for bit; the script exits 1 on a mismatch. Without a CUDA device
(and without --smoke) it prints "no CUDA device" and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="large-tensor size in GiB (default 1)")
    ap.add_argument("--pages", type=int, default=1024, help="page slices in the batched launch (default 1024)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10)")
    ap.add_argument("--enqueue-calls", type=int, default=2000, help="calls timed for the host enqueue cost")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU tensors under TRITON_INTERPRET")
    return ap.parse_args(argv)


class _CpuEvent:
    """Stand-in for torch.cuda.Event in --smoke runs (wall clock; results are ready at once)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False):
        self.t = 0.0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (run with --smoke for an interpreter check of this script)")
        return 0

    import cptrace_otel.fingerprint as fp
    from cptrace_otel.fingerprint import gpu, reference

    if args.smoke:
        dev = torch.device("cpu")
        Event = _CpuEvent
        gpu._new_event = _CpuEvent
        gpu._capturing = lambda: False
        nbytes = 3 * 4096 + 5
        page_tokens, row_elems, pages, reps, calls = 4, 8, 6, 1, 3

        def sync() -> None:
            pass

        # On CPU tensors the public dispatch goes to the CPU path; drive the CUDA module directly instead.
        khash_knz, many, gather = gpu.khash_knz, gpu.many, gpu.gather
    else:
        dev = torch.device("cuda")
        Event = torch.cuda.Event
        nbytes = int(args.gib * (1 << 30))
        page_tokens, row_elems, pages, reps, calls = 64, 576, args.pages, args.reps, args.enqueue_calls
        sync = torch.cuda.synchronize
        khash_knz, many, gather = fp.khash_knz, fp.fingerprint_many, fp.gather_fingerprint
        t0 = time.perf_counter()
        fp.cuda_warmup()
        print(f"device: {torch.cuda.get_device_name()}  backend: {gpu.backend()}  results via "
              f"{'UVA host ring' if gpu.UVA else 'device ring + copy'}  (warm-up {time.perf_counter() - t0:.1f} s)")

    failures: list[str] = []

    def check(name: str, got, want) -> None:
        if got != want:
            failures.append(f"{name}: got {got} want {want}")

    def timed(fn, n: int) -> float:
        """Device milliseconds per call of fn (events around n calls)."""
        a, b = Event(enable_timing=True), Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n

    # 1. Large tensor ------------------------------------------------------------------------------------------------
    g = torch.Generator(device=dev).manual_seed(0)
    big = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev, generator=g)
    h, nz = khash_knz(big)  # warm-up: compile, ring, events
    want = (reference.khash(big), reference.knz(big))
    check("khash/knz large", (int(h), int(nz)), want)
    sync()
    ours_ms = timed(lambda: khash_knz(big), reps)
    base_reps = max(1, min(reps, 3))
    base_ms = timed(lambda: (reference.khash(big), reference.knz(big)), base_reps)
    tbps = nbytes / (ours_ms * 1e-3) / 1e12
    base_tbps = nbytes / (base_ms * 1e-3) / 1e12

    # Host syncs per call: the sync checker warns on every synchronizing CUDA call.
    syncs_ours = syncs_base = -1
    extra_mem = -1
    if not args.smoke:
        pending = [khash_knz(big) for _ in range(4)]
        for p in pending:
            int(p[0])
        sync()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                kept = [khash_knz(big) for _ in range(10)]
            syncs_ours = sum("synchroniz" in str(x.message) for x in w) / 10
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for _ in range(2):
                    reference.khash(big), reference.knz(big)
            syncs_base = sum("synchroniz" in str(x.message) for x in w) / 2
        finally:
            torch.cuda.set_sync_debug_mode(0)
        for a, b in kept:
            check("khash/knz repeat", (int(a), int(b)), want)
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        kept = [khash_knz(big) for _ in range(10)]
        sync()
        extra_mem = torch.cuda.max_memory_allocated() - before
        for a, _b in kept:
            int(a)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        reference.khash(big)
        base_mem = torch.cuda.max_memory_allocated() - before
    big = kept = pending = None  # release the large tensor before the small-slice figures

    # 2. Host cost of one small-slice fingerprint --------------------------------------------------------------------
    row_bytes = row_elems * 2
    pool_tokens = max(page_tokens * pages * 4, 1 << 10 if args.smoke else 1 << 17)
    pool = torch.randn(pool_tokens, row_elems, device=dev).to(torch.bfloat16)
    page = pool[page_tokens:2 * page_tokens]
    khash_knz(page)
    sync()
    results = []
    t0 = time.perf_counter()
    for _ in range(calls):
        results.append(khash_knz(page))
    host_us = (time.perf_counter() - t0) / calls * 1e6
    want_page = (reference.khash(page), reference.knz(page))
    for a, b in results[:: max(1, calls // 50)]:
        check("page", (int(a), int(b)), want_page)
    for a, _ in results:
        fp.resolve(a)
    t0 = time.perf_counter()
    for _ in range(min(calls, 200)):
        reference.khash(page), reference.knz(page)
    base_host_us = (time.perf_counter() - t0) / min(calls, 200) * 1e6

    # 3. Batched and gathered forms ----------------------------------------------------------------------------------
    import random

    rnd = random.Random(1)
    starts = [rnd.randrange(0, pool_tokens // page_tokens) * page_tokens for _ in range(pages)]
    slices = [pool[s:s + page_tokens] for s in starts]
    res = many(slices)  # warm-up
    for (a, b), s in list(zip(res, slices, strict=False))[:: max(1, pages // 20)]:
        check("batched", (int(a), int(b)), (reference.khash(s), reference.knz(s)))
    sync()
    t0 = time.perf_counter()
    batch_ms = timed(lambda: many(slices), reps)
    batch_host_ms = (time.perf_counter() - t0) / reps * 1e3
    batch_bytes = pages * page_tokens * row_bytes
    batch_tbps = batch_bytes / (batch_ms * 1e-3) / 1e12

    idx = torch.tensor([rnd.randrange(pool_tokens) for _ in range(pages * page_tokens)], device=dev)
    a, b = gather(pool, idx)
    check("gather", (int(a), int(b)), (reference.khash(pool[idx]), reference.knz(pool[idx])))
    gather_ms = timed(lambda: gather(pool, idx), reps)
    gather_tbps = idx.numel() * row_bytes / (gather_ms * 1e-3) / 1e12

    # Report ---------------------------------------------------------------------------------------------------------
    mode = "SMOKE (TRITON_INTERPRET on CPU tensors; figures are meaningless)" if args.smoke else "device"
    print(f"[{mode}]")
    print(f"khash+knz over {nbytes / (1 << 30):.3f} GiB: ours {tbps:.3f} TB/s ({ours_ms:.3f} ms), upstream formula "
          f"{base_tbps:.4f} TB/s ({base_ms:.2f} ms) -> {base_ms / ours_ms:.1f}x")
    if not args.smoke:
        print(f"host syncs per call: ours {syncs_ours:g}, upstream {syncs_base:g}")
        print(f"extra device memory: ours {extra_mem} B for 10 in-flight calls (ring {gpu.ring_device_bytes()} B), "
              f"upstream {base_mem / (1 << 30):.1f} GiB per call")
    print(f"enqueue one {page_tokens}-token page ({page.numel() * 2} B): ours {host_us:.1f} us host/call, "
          f"upstream (with sync) {base_host_us:.1f} us/call")
    print(f"batched: {pages} page slices in one launch: {batch_tbps:.3f} TB/s aggregate ({batch_ms:.3f} ms device, "
          f"{batch_host_ms:.3f} ms host per batch)")
    print(f"gather: pool[{idx.numel()} indices] without the copy: {gather_tbps:.3f} TB/s ({gather_ms:.3f} ms)")
    if failures:
        print("MISMATCH:\n  " + "\n  ".join(failures))
        return 1
    print("all results exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
