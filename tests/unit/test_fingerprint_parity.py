"""CPU fingerprints and sentinels equal the upstream formula (reference.py, our transcription of it) bit for bit."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import cptrace_otel.fingerprint as fp  # noqa: E402
from cptrace_otel.fingerprint import cpu, formula, reference  # noqa: E402

BYTE_DTYPES = [
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
    torch.float64, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
]


def _random_tensor(rng: random.Random) -> torch.Tensor:
    dtype = rng.choice(BYTE_DTYPES + [torch.bool])
    ndim = rng.choice([0, 1, 1, 1, 2, 2, 3])
    big = rng.random() < 0.1
    shape = [rng.choice([0, 1, 2, 3, 5, 7, 16, 33]) if not big else rng.randint(100, 700) for _ in range(ndim)]
    if big and ndim > 1:
        shape = shape[:1] + [rng.randint(1, 9) for _ in shape[1:]]
    numel = 1
    for s in shape:
        numel *= s
    if dtype is torch.bool:
        t = torch.randint(0, 2, shape, dtype=torch.uint8).bool()
    else:
        item = torch.empty((), dtype=dtype).element_size()
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        # Mostly random bytes; sometimes sparse (many zero bytes) or all 0xFF.
        mode = rng.random()
        if mode < 0.15:
            raw = torch.full((numel * item,), 255, dtype=torch.uint8)
        else:
            raw = torch.randint(0, 256, (numel * item,), dtype=torch.uint8, generator=g)
            if mode < 0.35:
                raw[torch.rand(raw.shape, generator=g) < 0.8] = 0
        t = raw.view(dtype).reshape(shape) if ndim else raw.view(dtype).reshape(())
    # Views: transposes, strided slices, offsets into a larger storage.
    kind = rng.random()
    if kind < 0.15 and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif kind < 0.3 and t.dim() >= 1 and t.shape[0] > 2:
        t = t[1::2]
    elif kind < 0.4 and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]
    return t


def test_randomized_parity_600_tensors() -> None:
    rng = random.Random(1234)
    checked = 0
    for _ in range(600):
        t = _random_tensor(rng)
        assert fp.khash(t) == reference.khash(t), (t.dtype, t.shape, t.stride())
        assert fp.knz(t) == reference.knz(t), (t.dtype, t.shape)
        assert fp.rng(t) == reference.rng(t), (t.dtype, t.shape)
        h, nz = fp.khash_knz(t)
        assert (h, nz) == (reference.khash(t), reference.knz(t))
        checked += 1
    assert checked == 600


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(0),
        lambda: torch.empty(0, 5, dtype=torch.bfloat16),
        lambda: torch.tensor(7, dtype=torch.uint8),
        lambda: torch.tensor(1.5),  # 0-dim, multi-byte: upstream's byte view fails -> -1
        lambda: torch.tensor(True),
        lambda: torch.tensor([0], dtype=torch.uint8),
        lambda: torch.tensor([255], dtype=torch.uint8),
        lambda: torch.zeros(1001, dtype=torch.float16),
        lambda: torch.full((3, 4097), 255, dtype=torch.uint8),
        lambda: torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).permute(2, 0, 1),
        lambda: torch.arange(10, dtype=torch.int64).expand(3, 10),
        lambda: torch.arange(8, dtype=torch.float32).view(torch.complex64).conj(),
        lambda: torch.randn(5, 3).requires_grad_(),
        lambda: torch.tensor([float("nan"), 1.0]),
        lambda: torch.tensor([float("inf"), 1.0]),
        lambda: torch.tensor([-5, 3, 2**40], dtype=torch.int64),
        lambda: torch.tensor([[3, 1], [4, 1]], dtype=torch.int32),
        lambda: torch.randn(3, 4, dtype=torch.complex64),
        lambda: torch.randint(0, 256, (12345,), dtype=torch.uint8)[::3],
    ],
)
def test_named_edge_cases(make) -> None:
    t = make()
    assert fp.khash(t) == reference.khash(t)
    assert fp.knz(t) == reference.knz(t)
    assert fp.rng(t) == reference.rng(t)
    want_rows = int(t.shape[0]) if t.dim() else 0
    assert fp.forward_fingerprint(t) == (reference.khash(t), reference.knz(t), want_rows)


class _RaisesOnStr:
    def __str__(self) -> str:
        raise RuntimeError("no str")


class _NumelRaises:
    def numel(self) -> int:
        raise ValueError("numel exploded")


@pytest.mark.parametrize(
    "value",
    [None, [], [3, 1, 2], (5,), "abc", 17, 2.5, b"\x00\x01", [[1], [2]], _RaisesOnStr(), _NumelRaises(), {"a": 1},
     np.arange(4)],
)
def test_non_tensor_sentinels(value) -> None:
    assert fp.khash(value) == reference.khash(value)
    assert fp.knz(value) == reference.knz(value)
    assert fp.rng(value) == reference.rng(value)


def test_sentinel_values_are_upstreams() -> None:
    assert fp.khash(None) == 0 and fp.knz(None) == 0
    assert fp.khash([1, 2]) == -1 and fp.knz("x") == -1
    assert fp.rng(None) == "(none)" and fp.rng([]) == "(0)" and fp.rng(torch.empty(0)) == "(0)"
    assert fp.rng([3, 1, 2]) == "(cnt=3,min=1,max=3,first=3,last=2)"
    assert fp.rng(5).startswith("(err:")
    assert fp.forward_fingerprint(None) == (0, 0, 0)
    assert fp.forward_fingerprint((torch.ones(2), torch.ones(2))) == (-2, -2, -2)


def test_known_value_small() -> None:
    # bytes 1,2,3: S1 = 1*1 + 2*2 + 3*3 = 14, S0 = 6, n = 3 -> (14 ^ 6000018 ^ 3)
    t = torch.tensor([1, 2, 3], dtype=torch.uint8)
    assert fp.khash(t) == (14 ^ 6000018 ^ 3) == reference.khash(t)
    assert fp.knz(torch.tensor([0, 2, 0, 3], dtype=torch.uint8)) == 2


@pytest.mark.parametrize("start", [0, 1, (1 << 63) - 5000, (1 << 63) + 12345, (1 << 64) - 3])
def test_tile_combination_wraps_mod_2_64(start: int) -> None:
    # S1 with weights start + i + 1 crosses 2**63 (and 2**64) with a small input; closed form in Python ints.
    g = np.random.default_rng(start % 1000)
    a = g.integers(0, 256, 20011, dtype=np.uint8)
    want_s1 = sum(int(v) * (start + i + 1) for i, v in enumerate(a.tolist())) & formula.MASK64
    want_s0 = int(a.sum(dtype=np.uint64))
    assert cpu.array_sums(a, start) == (want_s0, want_s1)
    assert cpu.numpy_sums(a, start) == (want_s0, want_s1)


def test_all_ff_closed_form() -> None:
    # 8 MiB of 0xFF: S0 = 255 n, S1 = 255 n (n + 1) / 2 (the int64 sums the reference would form).
    n = 8 << 20
    t = torch.full((n,), 255, dtype=torch.uint8)
    assert fp.khash(t) == formula.finish(255 * n, 255 * n * (n + 1) // 2, n)
    assert fp.knz(t) == n


@pytest.mark.parametrize("n", [1, 5, 4095, 4096, 4097, (1 << 22) + 4096 * 3 + 11])
def test_torch_chunked_path_is_exact(n: int) -> None:
    # The no-Triton device path, run on CPU tensors: same sums as the reference, without int64 copies of the input.
    from cptrace_otel.fingerprint import torch_path

    b = torch.randint(0, 256, (n,), dtype=torch.uint8)
    s0, s1, nz, bad = torch_path.sums(b).tolist()
    assert bad == 0
    assert formula.finish(s0, s1, n) == reference.khash(b)
    assert nz == reference.knz(b)


def test_numpy_fallback_matches_the_default_backend_on_random_sizes() -> None:
    g = np.random.default_rng(7)
    for n in [1, 255, 256, 257, 4095, 4096, 4097, 4096 * 256 + 17, (1 << 22) + 4096 * 2 + 3]:
        a = g.integers(0, 256, n, dtype=np.uint8)
        assert cpu.numpy_sums(a) == cpu.array_sums(a)
    assert cpu.backend() in ("c-avx2", "c-portable", "numpy")


def test_import_loads_no_heavy_modules() -> None:
    code = (
        "import sys, cptrace_otel.fingerprint as f\n"
        "heavy = [m for m in ('torch', 'numpy', 'numba', 'triton') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert f.khash(None) in (0, -1) and f.rng([2, 1]) == '(cnt=2,min=1,max=2,first=2,last=1)'\n"
        "assert f.khash('x') == -1 and f.forward_fingerprint('x') == (-2, -2, -2)\n"
        "heavy = [m for m in ('torch', 'numba', 'triton') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_api_functions_delegate_here() -> None:
    from cptrace_otel.traced import api

    t = torch.randint(0, 256, (999,), dtype=torch.uint8).view(torch.int8)
    assert api.khash(t) == reference.khash(t)
    assert api.knz(t) == reference.knz(t)
    assert api.rng(t) == reference.rng(t)


def test_batched_and_gathered_forms_on_cpu() -> None:
    g = torch.Generator().manual_seed(5)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (0, 1, 4097)]
    ts += [torch.randn(7, 3).t(), torch.tensor(2.0), None, "x"]
    got = fp.fingerprint_many(ts)
    assert got == [(reference.khash(t), reference.knz(t)) for t in ts]
    pool = torch.randn(50, 4, 6).to(torch.bfloat16)
    idx = torch.tensor([3, -1, 3, 49, 0])
    assert fp.gather_fingerprint(pool, idx) == (reference.khash(pool[idx]), reference.knz(pool[idx]))
    assert fp.gather_fingerprint(pool, torch.tensor([50])) == (-1, -1)  # upstream's indexing raises


def test_khash_bytes_matches_reference() -> None:
    a = np.random.default_rng(3).integers(0, 256, (37, 1152), dtype=np.uint8)
    assert cpu.khash_bytes(a) == reference.khash(torch.from_numpy(a))
    assert cpu.khash_bytes(a[:0]) == 0
