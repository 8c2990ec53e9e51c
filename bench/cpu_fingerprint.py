"""CPU fingerprints: upstream's formula vs ours on the same 64 MiB tensor (khash, knz, rng).

Seed baseline = ``cptrace_otel.fingerprint.reference`` (the seed's formulas: int64 copies, torch ops).
Ours = ``cptrace_otel.fingerprint`` dispatch (the C speedups' kernel on the default install, or the numpy fallback
of an install without a compiler with ``--numpy``). Both in this process, on the same tensor, one thread.

    python bench/cpu_fingerprint.py [--mib 64] [--reps 5] [--numpy]

Prints the median GB/s of both (and of the numpy fallback, the default before the C kernel) and the ratio
ours/seed; exits 1 if any result differs from the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time


def _median(fn, reps: int) -> tuple[float, object]:
    times = []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions, median kept (default 5)")
    ap.add_argument("--baseline-reps", type=int, default=2, help="repetitions of the slow baseline (default 2)")
    ap.add_argument("--numpy", action="store_true", help="measure the numpy fallback (an install without a compiler)")
    args = ap.parse_args(argv)

    import torch

    import cptrace_otel.fingerprint as fp
    from cptrace_otel.fingerprint import cpu, reference

    torch.set_num_threads(1)  # one core for both sides, as the anchors are stated
    nbytes = args.mib << 20
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).view(torch.bfloat16).reshape(-1, 512)
    index = torch.randint(0, 1 << 30, (nbytes // 8,), dtype=torch.int64, generator=g)
    fp.khash(data[:4])  # first-call imports outside the timing

    def ours(fn, fallback: bool):
        """Run ``fn`` with the C module (the default install) or without it (the numpy fallback)."""
        def call():
            with cpu.numpy_fallback() if fallback else contextlib.nullcontext():
                return fn()
        return call

    rows = []
    ok = True
    cases = [
        ("khash", data, reference.khash, fp.khash, args.baseline_reps),
        ("knz", data, reference.knz, fp.knz, args.reps),
        ("rng", index, reference.rng, fp.rng, args.reps),
    ]
    for name, t, base_fn, our_fn, breps in cases:
        tb, vb = _median(lambda base_fn=base_fn, t=t: base_fn(t), breps)
        tn, vn = _median(ours(lambda our_fn=our_fn, t=t: our_fn(t), True), args.reps)
        to, vo = ((tn, vn) if args.numpy or cpu.backend() == "numpy"
                  else _median(ours(lambda our_fn=our_fn, t=t: our_fn(t), False), args.reps))
        same = vb == vo == vn
        ok &= same
        gb = t.numel() * t.element_size() / 1e9
        rows.append((name, gb / tb, gb / tn, gb / to, tb / to, same))
    backend = "numpy (--numpy)" if args.numpy or cpu.backend() == "numpy" else cpu.backend()
    print(f"CPU fingerprints on a {args.mib} MiB tensor (1 thread; medians; ours = {backend})")
    print(f"{'op':6} {'seed GB/s':>10} {'numpy fallback':>15} {'ours GB/s':>10} {'ours/seed':>10}  exact")
    for name, bu, bn, bo, ratio, same in rows:
        print(f"{name:6} {bu:10.3f} {bn:15.3f} {bo:10.3f} {ratio:9.1f}x  {'yes' if same else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
