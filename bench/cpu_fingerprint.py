"""CPU fingerprints: upstream's formula vs ours on the same 64 MiB tensor (khash, knz, rng).

Upstream-style baseline = ``cptrace_otel.fingerprint.reference`` (the seed's formulas: int64 copies, torch ops).
Ours = ``cptrace_otel.fingerprint`` dispatch (numba blocked kernel, or the numpy fallback with ``--numpy``).

    python bench/cpu_fingerprint.py [--mib 64] [--reps 3] [--numpy]

Prints GB/s for both and the ratio ours/upstream; exits 1 if any result differs from the baseline.
"""

from __future__ import annotations

import argparse
import sys
import time


def _best(fn, reps: int) -> tuple[float, object]:
    best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, best time kept (default 3)")
    ap.add_argument("--baseline-reps", type=int, default=2, help="repetitions of the slow baseline (default 2)")
    ap.add_argument("--numpy", action="store_true", help="measure the numpy fallback instead of numba")
    args = ap.parse_args(argv)

    import torch

    import cptrace_otel.fingerprint as fp
    from cptrace_otel.fingerprint import cpu, reference

    torch.set_num_threads(1)  # one core for both sides, as the anchors are stated
    nbytes = args.mib << 20
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).view(torch.bfloat16).reshape(-1, 512)
    index = torch.randint(0, 1 << 30, (nbytes // 8,), dtype=torch.int64, generator=g)
    if args.numpy:
        cpu._get_kernel()
        cpu._kernel = cpu.numpy_sums  # route array_sums to the fallback
        cpu._kernel_state = "numpy"
    fp.khash(data[:4])  # compile (or load the numba cache) outside the timing

    rows = []
    ok = True
    cases = [
        ("khash", data, reference.khash, fp.khash, args.baseline_reps),
        ("knz", data, reference.knz, fp.knz, args.reps),
        ("rng", index, reference.rng, fp.rng, args.reps),
    ]
    for name, t, base_fn, our_fn, breps in cases:
        tb, vb = _best(lambda: base_fn(t), breps)
        to, vo = _best(lambda: our_fn(t), args.reps)
        same = vb == vo
        ok &= same
        gb = t.numel() * t.element_size() / 1e9
        rows.append((name, gb / tb, gb / to, tb / to, same))
    print(f"CPU fingerprints on a {args.mib} MiB tensor (1 thread; backend: {cpu.backend()})")
    print(f"{'op':6} {'upstream GB/s':>14} {'ours GB/s':>10} {'ratio':>8}  exact")
    for name, bu, bo, ratio, same in rows:
        print(f"{name:6} {bu:14.3f} {bo:10.3f} {ratio:7.1f}x  {'yes' if same else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
