"""CUDA fingerprints: exact vs the reference, zero host syncs on the caller's path, stream order, graph capture.

Skipped without a CUDA device (CI has none; the interpreter tests in tests/unit cover the kernels there).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

import cptrace_otel.fingerprint as fp  # noqa: E402
from cptrace_otel.fingerprint import formula, gpu, reference  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float8_e4m3fn, torch.bool]


def _rand(rnd: random.Random):
    dtype = rnd.choice(DTYPES)
    shape = [rnd.choice([1, 2, 3, 7, 64, 129, 1000]) for _ in range(rnd.randint(0, 3))]
    if dtype is torch.bool:
        t = torch.randint(0, 2, shape, device="cuda").bool()
    elif dtype.is_floating_point:
        t = (torch.randn(shape, device="cuda") * 10).to(dtype)
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -1000), min(info.max, 1000), shape, device="cuda", dtype=dtype)
    if t.dim() >= 2 and rnd.random() < 0.3:
        t = t.transpose(0, 1)
    elif t.dim() >= 1 and t.shape[0] > 2 and rnd.random() < 0.3:
        t = t[1::2]
    return t


def test_warmup_compiles_and_probes() -> None:
    assert fp.cuda_warmup() is True
    assert gpu.UVA in (True, False)  # the delivery mode was decided by the probe
    x = torch.randint(0, 256, (1 << 20,), device="cuda", dtype=torch.uint8)
    assert int(fp.khash(x)) == reference.khash(x)


def test_parity_random_cuda_tensors() -> None:
    rnd = random.Random(99)
    for _ in range(300):
        t = _rand(rnd)
        h, nz, r = fp.khash(t), fp.knz(t), fp.rng(t)
        assert int(h) == reference.khash(t), (t.dtype, t.shape)
        assert int(nz) == reference.knz(t)
        assert str(r) == reference.rng(t)
    assert gpu.backend() == "triton"


def test_no_host_sync_on_the_callers_path() -> None:
    x = torch.randn(4096, 576, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 4096, (64,), device="cuda")
    pages = [x[i * 64:(i + 1) * 64] for i in range(32)]
    # Warm up: compile kernels, allocate the ring, the event pool and pinned blocks.
    warm = [fp.khash(x), fp.knz(x), fp.rng(idx), *fp.forward_fingerprint(x)[:2], *fp.gather_fingerprint(x, idx)]
    warm += [v for pair in fp.fingerprint_many(pages) for v in pair]
    for v in warm:
        fp.resolve(v)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [fp.khash(x), fp.knz(x), fp.rng(idx)]
        got += list(fp.forward_fingerprint(x)[:2])
        got += list(fp.gather_fingerprint(x, idx))
        many = fp.fingerprint_many(pages)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(fp.is_deferred(v) for v in got)
    assert int(got[0]) == reference.khash(x) and int(got[1]) == reference.knz(x)
    assert str(got[2]) == reference.rng(idx)
    assert (int(got[3]), int(got[4])) == (reference.khash(x), reference.knz(x))
    assert (int(got[5]), int(got[6])) == (reference.khash(x[idx]), reference.knz(x[idx]))
    assert [(int(a), int(b)) for a, b in many] == [(reference.khash(p), reference.knz(p)) for p in pages]


def test_results_follow_the_producers_stream_order() -> None:
    side = torch.cuda.Stream()
    src = torch.randint(0, 256, (1 << 24,), device="cuda", dtype=torch.uint8)
    dst = torch.zeros_like(src)
    want = reference.khash(src)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # keep the stream busy so an unordered hash would see zeros
        dst.copy_(src)
        h = fp.khash(dst)
        dst.zero_()  # enqueued after the hash: must not affect it
    assert int(h) == want


def test_graph_capture_launches_nothing() -> None:
    x = torch.ones(128, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.add_(1)  # warm up on the side stream, as capture requires
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        y = x * 2
        inside = (fp.khash(y), fp.knz(y), fp.rng(y), fp.forward_fingerprint(y))
    assert inside[:2] == (-1, -1)
    assert inside[2] == gpu.CAPTURE_ERROR
    assert inside[3] == (-1, -1, 128)


def test_weighted_sum_wraps_past_2_63_on_device() -> None:
    n = 300_000_000  # 0xFF bytes: S1 = 255 n (n + 1) / 2 > 2**63
    x = torch.full((n,), 255, dtype=torch.uint8, device="cuda")
    assert int(fp.khash(x)) == formula.finish(255 * n, 255 * n * (n + 1) // 2, n)
    assert int(fp.knz(x)) == n


@pytest.mark.parametrize("uva", [False, True])
def test_both_delivery_modes_are_exact(monkeypatch, uva) -> None:
    fp.cuda_warmup()
    if uva and not gpu._probe_uva(torch.device("cuda"), gpu._kernels()):
        pytest.skip("kernels cannot write pinned host memory here")
    monkeypatch.setattr(gpu, "UVA", uva)
    x = torch.randn(3000, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(-3000, 3000, (257,), device="cuda")
    assert (int(fp.khash(x)), int(fp.knz(x))) == (reference.khash(x), reference.knz(x))
    assert tuple(int(v) for v in fp.gather_fingerprint(x, idx)) == (reference.khash(x[idx]), reference.knz(x[idx]))
    assert str(fp.rng(idx)) == reference.rng(idx)


def test_torch_fallback_path_is_exact(monkeypatch) -> None:
    monkeypatch.setattr(gpu, "_triton_state", "off")
    for n in (1, 4097, (1 << 22) + 13):
        x = torch.randint(0, 256, (n,), device="cuda", dtype=torch.uint8)
        h, nz = fp.khash_knz(x)
        assert (int(h), int(nz)) == (reference.khash(x), reference.knz(x))


def test_ring_memory_is_bounded() -> None:
    x = torch.randn(1 << 20, device="cuda")
    vals = [fp.khash(x) for _ in range(200)]
    assert all(int(v) == int(vals[0]) for v in vals)
    assert gpu.ring_device_bytes() <= 1 << 20
