"""The C fingerprints (``_speedups/fingerprint.c``) equal upstream's formula bit for bit: over sizes that cross the
kernel's 32-byte chunks and 32 KiB blocks, every byte dtype, strided and offset views, empty and odd lengths, any
logical start offset (the sums are exact mod 2**64 under any split), both kernels (AVX2 and portable), read through
the buffer protocol and through an address; and bad arguments get a clear error.

Skipped when the extension was not built (no compiler), unless ``CPTRACE_REQUIRE_SPEEDUPS=1`` (``.ci/run``), which
turns a missing build into a failure."""

from __future__ import annotations

import itertools
import os

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import cptrace_otel.fingerprint as fp  # noqa: E402
from cptrace_otel._speedups.fingerprint import load  # noqa: E402
from cptrace_otel.fingerprint import cpu, formula, reference  # noqa: E402

C = load()
if C is None:
    if os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1":
        pytest.fail("cptrace_otel._speedups._fingerprint was not built (CPTRACE_REQUIRE_SPEEDUPS=1)", pytrace=False)
    pytest.skip("cptrace_otel._speedups._fingerprint not built", allow_module_level=True)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
M64 = formula.MASK64

# Sizes around the kernel's boundaries: 32-byte chunks, 1024-chunk blocks (32 KiB), the portable 4 KiB rows, the
# AVX2 kernel's byte-lane zero counters (summed every 255 chunks).
EDGES = [0, 1, 2, 31, 32, 33, 63, 64, 4095, 4096, 4097, 255 * 32, 256 * 32 + 1, 32767, 32768, 32769, 65536 + 31,
         3 * 32768 + 100]


def closed_form(a: np.ndarray, start: int = 0) -> tuple[int, int, int]:
    """(S0, S1, nz) of the bytes with weights start + i + 1, in exact numpy uint64 (wraps mod 2**64 like the spec)."""
    b = a.reshape(-1).view(np.uint8).astype(np.uint64)
    w = np.arange(1, b.size + 1, dtype=np.uint64) + np.uint64(start & M64)
    with np.errstate(over="ignore"):
        return int(b.sum(dtype=np.uint64)), int((b * w).sum(dtype=np.uint64)), int(np.count_nonzero(b))


def _bytes(n: int, seed: int, mode: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    if mode == 0:
        return np.full(n, 255, np.uint8)
    if mode == 3:
        return np.zeros(n, np.uint8)   # every byte lane counts a zero in every chunk
    a = g.integers(0, 256, n, dtype=np.uint8)
    if mode == 1:
        a[g.random(n) < 0.8] = 0  # sparse: many zero bytes for knz
    return a


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n", EDGES)
def test_sums_at_kernel_boundaries(n: int, portable: bool) -> None:
    for mode in (0, 1, 2, 3):
        a = _bytes(n, n + mode, mode)
        want = closed_form(a)
        assert C.sums(a, portable=portable) == want
        assert C.sums(a.ctypes.data, a.size, portable=portable) == want  # the same bytes through an address
        s0, s1, nz = want
        assert C.khash_knz(a) == (formula.finish(s0, s1, n), nz)
        assert C.khash(a) == formula.finish(s0, s1, n) and C.knz(a) == nz


@settings(max_examples=200, **SETTINGS)
@given(n=st.integers(0, 70000), seed=st.integers(0, 2**32 - 1), mode=st.integers(0, 2),
       start=st.one_of(st.just(0), st.integers(0, 2**64 - 1), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1])),
       portable=st.booleans())
def test_sums_any_size_and_start(n: int, seed: int, mode: int, start: int, portable: bool) -> None:
    a = _bytes(n, seed, mode)
    assert C.sums(a, start=start, portable=portable) == closed_form(a, start)


@settings(max_examples=60, **SETTINGS)
@given(n=st.integers(1, 200000), cuts=st.lists(st.integers(0, 200000), max_size=5), seed=st.integers(0, 2**16))
def test_any_split_combines_to_the_whole(n: int, cuts: list, seed: int) -> None:
    # Hash the pieces with their logical offsets and add the sums mod 2**64: the whole buffer's value.
    a = _bytes(n, seed, 2)
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    s0 = s1 = nz = 0
    for lo, hi in itertools.pairwise(bounds):
        p0, p1, pz = C.sums(a[lo:hi], start=lo)
        s0, s1, nz = (s0 + p0) & M64, (s1 + p1) & M64, nz + pz
    assert (s0, s1, nz) == C.sums(a)


BYTE_DTYPES = [torch.uint8, torch.int8, torch.bool, torch.int16, torch.float16, torch.bfloat16, torch.int32,
               torch.float32, torch.int64, torch.float64, torch.complex64, torch.float8_e4m3fn]


@st.composite
def tensors(draw) -> torch.Tensor:
    """A CPU tensor of any byte dtype and shape, often a view: transposed, strided, or offset into its storage."""
    dtype = draw(st.sampled_from(BYTE_DTYPES))
    shape = draw(st.lists(st.integers(0, 40), min_size=0, max_size=3))
    numel = int(np.prod(shape)) if shape else 1
    item = torch.empty((), dtype=dtype).element_size()
    pad = draw(st.integers(0, 9))  # elements before the view's first one
    # one element more than needed: an empty byte tensor has stride 0 and would not view as a wider dtype
    raw = torch.from_numpy(_bytes((numel + pad + 1) * item, draw(st.integers(0, 2**16)), draw(st.integers(0, 2))))
    base = (raw & 1).bool() if dtype is torch.bool else raw.view(dtype)
    t = base[pad:pad + numel].reshape(shape)
    kind = draw(st.integers(0, 3))
    if kind == 1 and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif kind == 2 and t.dim() >= 1 and t.shape[0] > 2:
        t = t[1::2]
    elif kind == 3 and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]
    return t


@settings(max_examples=300, **SETTINGS)
@given(t=tensors())
def test_tensor_fingerprints_equal_the_reference(t: torch.Tensor) -> None:
    assert cpu.khash(t) == reference.khash(t), (t.dtype, t.shape, t.stride())
    assert cpu.knz(t) == reference.knz(t)
    assert cpu.khash_knz(t) == (reference.khash(t), reference.knz(t))
    assert fp.rng(t) == reference.rng(t)


@settings(max_examples=150, **SETTINGS)
@given(dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]),
       n=st.integers(1, 5000), seed=st.integers(0, 2**16), step=st.integers(1, 3))
def test_rng_integer_tensors(dtype, n: int, seed: int, step: int) -> None:
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(info.min, info.max, (n,), dtype=dtype, generator=g)[::step]  # step > 1: not contiguous
    assert cpu.rng(t) == reference.rng(t)


def test_rng_extremes_of_each_code() -> None:
    for dtype, code in [(np.int64, "q"), (np.int32, "i"), (np.int16, "h"), (np.int8, "b"), (np.uint8, "B")]:
        info = np.iinfo(dtype)
        a = np.array([3, info.max, info.min, 0, -1 if info.min < 0 else 7], dtype=dtype)
        assert C.minmax(a, code, 5) == (info.min, info.max, 3, a[-1])
        assert C.minmax(a.ctypes.data, code, 1) == (3, 3, 3, 3)


def test_contiguous_tensors_are_read_in_place() -> None:
    t = torch.arange(1000, dtype=torch.int32)
    addr, nbytes, owner = cpu._region(t)
    assert owner is t and addr == t.data_ptr() and nbytes == 4000  # no copy of a contiguous tensor
    s = t[::2]
    _, nbytes, owner = cpu._region(s)
    assert owner is not s and owner.is_contiguous() and nbytes == 2000  # upstream's contiguous() copy


def test_numpy_buffers_in_place_and_converted() -> None:
    a = _bytes(10000, 5, 2).reshape(100, 100)
    want = reference.khash(torch.from_numpy(a.copy()))
    assert cpu.khash_bytes(a) == want
    assert cpu.khash_bytes(np.asfortranarray(a)) == want  # C order of the values, whatever the layout
    assert cpu.khash_bytes(a[:0]) == 0


def test_without_the_c_module_the_numpy_path_agrees(monkeypatch) -> None:
    ts = [torch.from_numpy(_bytes(n, n, 2)).view(torch.uint8) for n in (1, 4097, 70001)]
    ts += [torch.randn(33, 7).t(), torch.arange(10, dtype=torch.int64)[::3]]
    want = [(cpu.khash_knz(t), cpu.rng(t)) for t in ts]
    want_b = cpu.khash_bytes(ts[2].numpy())
    monkeypatch.setattr(cpu, "_c", None)
    assert cpu.backend() == "numpy"
    assert [(cpu.khash_knz(t), cpu.rng(t)) for t in ts] == want
    assert cpu.khash_bytes(ts[2].numpy()) == want_b
    assert want == [((reference.khash(t), reference.knz(t)), reference.rng(t)) for t in ts]


def test_bad_arguments_get_clear_errors() -> None:
    a = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="nbytes >= 0"):
        C.sums(a.ctypes.data)
    with pytest.raises(ValueError, match="exceeds"):
        C.khash(a, 65)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        C.khash(a.reshape(8, 8)[:, ::2])  # not C-contiguous: never read with the wrong byte order
    with pytest.raises(TypeError):
        C.khash("text")
    with pytest.raises(ValueError, match="unsupported struct letter"):
        C.minmax(a, "f", 4)
    with pytest.raises(ValueError, match="count"):
        C.minmax(a, "q", 0)
    with pytest.raises(ValueError, match="shorter"):
        C.minmax(a, "q", 9)
    with pytest.raises(ValueError, match="null"):
        C.khash(0, 8)
    assert C.khash(0, 0) == 0 and C.sums(b"") == (0, 0, 0)


def test_kernel_is_named() -> None:
    assert C.kernel() in ("avx2", "portable")
    assert cpu.backend() == "c-" + C.kernel()
