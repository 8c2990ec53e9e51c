"""Triton kernels run by the Triton CPU interpreter on CPU tensors, bit for bit against the reference.

``TRITON_INTERPRET`` must be set before triton is first imported (triton decorates its own standard library at import
time), so the kernel tests run in a child pytest process started by :func:`test_interpreter_suite_in_subprocess`;
in the parent process they are skipped. The child inherits nothing else from the parent's triton state.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest

_INNER = os.environ.get("FP_INTERPRETER_INNER") == "1"
if _INNER:
    os.environ["TRITON_INTERPRET"] = "1"

torch = pytest.importorskip("torch")

from cptrace_otel.fingerprint import formula, reference  # noqa: E402

pytestmark = pytest.mark.interpreter


def test_interpreter_suite_in_subprocess() -> None:
    if _INNER:
        pytest.skip("this is the child run")
    pytest.importorskip("triton")
    env = dict(os.environ, FP_INTERPRETER_INNER="1", TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, timeout=900,
    )
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    m = re.search(r"(\d+) passed", proc.stdout)
    assert m and int(m.group(1)) >= 40, tail


@pytest.fixture(scope="module")
def tk():
    if not _INNER:
        pytest.skip("runs in the interpreter child process")
    pytest.importorskip("triton")
    from cptrace_otel.fingerprint import triton_kernels

    assert type(triton_kernels._hash_nz_kernel).__name__ == "InterpretedFunction"
    return triton_kernels


@pytest.fixture()
def bufs(tk):
    return tk.new_state(32, "cpu"), torch.zeros((32, 4), dtype=torch.int64)


def _check_hash(row, t_or_bytes) -> None:
    s0, s1, nz, bad = row
    n = t_or_bytes.numel() * t_or_bytes.element_size()
    assert bad == 0
    assert formula.finish(s0, s1, n) == reference.khash(t_or_bytes)
    assert nz == reference.knz(t_or_bytes)


@pytest.mark.parametrize("n", [1, 7, 255, 4097, 16384, 16384 + 15, 3 * 16384 + 4097, 5 * 16384 + 16 * 7])
@pytest.mark.parametrize("programs", [1, 2, 5])
@pytest.mark.parametrize("words", [None, False])
def test_hash_nz_sizes_and_grids(tk, bufs, n, programs, words) -> None:
    # words=None: the SWAR word path (aligned input): full 16 KiB steps, several per program (local iteration
    # index > 0), the partial last step and the sub-16-byte tail. words=False: the int32-per-byte path.
    state, out = bufs
    g = torch.Generator().manual_seed(n * 7 + programs)
    x = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if n % 3 == 0:
        x[::2] = 0
    slot = (n + programs) % 32
    tk.hash_nz(x, state, out, slot, max_programs=programs, words=words)
    _check_hash(out[slot].tolist(), x)
    # The last program leaves the slot's state at rest for its next use.
    assert state[slot].tolist()[:4] == [0, 0, 0, 0] and state[slot, tk.S_BAD] == 0


def test_misaligned_views_take_the_byte_path(tk, bufs) -> None:
    state, out = bufs
    buf = torch.randint(0, 256, (3 * 16384 + 40,), dtype=torch.uint8)
    for k, shift in enumerate((1, 3, 8, 15)):
        x = buf[shift:]
        assert x.data_ptr() % 16 != 0
        tk.hash_nz(x, state, out, k, max_programs=2)
        _check_hash(out[k].tolist(), x)


def test_iteration_cap_keeps_word_accumulators_exact(tk) -> None:
    for steps in (1, 100, 2048, 2049, 10**6, 10**8):
        progs = tk.programs_for(steps)
        assert progs <= max(steps, 1) and -(-steps // progs) <= tk.MAX_ITERS
    # the uint32 bound behind MAX_ITERS: sum_i i * 1020 over 2048 iterations
    assert 1020 * tk.MAX_ITERS * (tk.MAX_ITERS - 1) // 2 < 2**32


def test_random_dtypes_through_byte_view(tk, bufs) -> None:
    state, out = bufs
    rnd = random.Random(5)
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.float8_e4m3fn, torch.complex64]
    for i in range(12):
        dt = rnd.choice(dtypes)
        shape = (rnd.randint(1, 40), rnd.randint(1, 70))
        t = torch.randn(shape).to(dt) if not dt.is_complex else torch.randn(shape, dtype=dt)
        if i % 3 == 0:
            t = t.t()
        b = t.contiguous().view(torch.uint8).reshape(-1)
        tk.hash_nz(b, state, out, i, max_programs=rnd.randint(1, 4))
        s0, s1, nz, _ = out[i].tolist()
        assert formula.finish(s0, s1, b.numel()) == reference.khash(t)
        assert nz == reference.knz(t)


@pytest.mark.parametrize("start", [(1 << 63) - 3000, (1 << 63) + 77, (1 << 64) - 5])
@pytest.mark.parametrize("words", [None, False])
def test_weighted_sum_wraps_past_2_63(tk, bufs, start, words) -> None:
    # A logical offset near 2**63 pushes S1 through 2**63 / 2**64 with 10 KB of input; the closed form in Python ints
    # is the oracle. (int64 kernel args are two's complement: pass the signed reading.)
    state, out = bufs
    x = torch.randint(0, 256, (2 * 16384 + 10007,), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(start % 997))
    tk.hash_nz(x, state, out, 1, max_programs=1, start=formula.to_signed64(start), words=words)
    s0, s1, _nz, _ = out[1].tolist()
    want = sum(int(v) * (start + i + 1) for i, v in enumerate(x.tolist())) & formula.MASK64
    assert s1 & formula.MASK64 == want
    assert s0 == int(x.sum())


@pytest.mark.parametrize("words", [None, False])
def test_gather_matches_materialized_copy(tk, bufs, words) -> None:
    state, out = bufs
    g = torch.Generator().manual_seed(3)
    cases = [
        (torch.randint(0, 256, (50, 3, 7), dtype=torch.uint8, generator=g)[:, 1:], [3, 1, -1, 3, 49, 0]),
        (torch.randn(64, 4, 8).to(torch.bfloat16), [5, 5, 6, 63, -64, 0, 17]),  # 64-byte rows, aligned
        (torch.randint(0, 256, (9, 5000), dtype=torch.uint8, generator=g), [8, 0, 4]),  # rows span several chunks
        (torch.arange(30, dtype=torch.int16), [29, 0, 1, 1]),  # 1-D pool: 2-byte rows
        (torch.randn(20, 576).to(torch.bfloat16), [19, 3, 3, 0, -2]),  # MLA-like 1152-byte rows (word path)
        (torch.randint(0, 256, (12, 6000), dtype=torch.uint8, generator=g)[:, :4800], [11, 1, 0]),  # strided rows
    ]
    for slot, (pool, idx_list) in enumerate(cases):
        idx = torch.tensor(idx_list)
        p2 = pool.view(torch.uint8).reshape(pool.shape[0], -1)
        tk.hash_nz_gather(p2, idx, state, out, slot, max_programs=2, words=words)
        _check_hash(out[slot].tolist(), pool[idx].contiguous())


def test_gather_out_of_range_is_flagged(tk, bufs) -> None:
    state, out = bufs
    pool = torch.randint(0, 256, (10, 16), dtype=torch.uint8)
    tk.hash_nz_gather(pool, torch.tensor([0, 10, -11, 2], dtype=torch.int32), state, out, 4)
    assert out[4, 3] == 2
    assert state[4].tolist()[:4] == [0, 0, 0, 0] and state[4, tk.S_BAD] == 0


def test_batched_segments_from_separate_tensors(tk, bufs) -> None:
    state, out = bufs
    g = torch.Generator().manual_seed(11)
    segs = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (5, 4097, 40000, 1, 4096, 64)]
    base = segs[0]
    offs = torch.tensor([s.data_ptr() - base.data_ptr() for s in segs])
    lens = torch.tensor([s.numel() for s in segs])
    slots = torch.tensor([10, 11, 12, 13, 14, 15])
    tk.hash_nz_batch(base, offs, lens, slots, 40000, state, out, aligned=False, max_programs_per_segment=2)
    for s, slot in zip(segs, slots.tolist(), strict=False):
        _check_hash(out[slot].tolist(), s)


def test_batched_page_slices_of_one_pool(tk, bufs) -> None:
    # Many page slices of one KV pool (the batched form's use): pages of 64 tokens x 24 bytes.
    state, out = bufs
    pool = torch.randint(0, 256, (40 * 64, 400), dtype=torch.uint8)  # 25,600-byte pages: a full step and a partial
    pages = [7, 0, 39, 12, 12]
    views = [pool[p * 64:(p + 1) * 64] for p in pages]
    base = pool
    byte_offs = [v.data_ptr() - base.data_ptr() for v in views]
    assert all(o % 16 == 0 for o in byte_offs) and base.data_ptr() % 16 == 0
    offs = torch.tensor([o // 16 for o in byte_offs])  # aligned form: offsets in 16-byte units
    lens = torch.tensor([v.numel() for v in views])
    slots = torch.arange(20, 25)
    tk.hash_nz_batch(base, offs, lens, slots, 64 * 400, state, out, aligned=True, max_programs_per_segment=1)
    for v, slot in zip(views, slots.tolist(), strict=False):
        _check_hash(out[slot].tolist(), v)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_rng_kernel(tk, bufs, dtype) -> None:
    state, out = bufs
    info = torch.iinfo(dtype)
    v = torch.randint(info.min, info.max, (3001,), dtype=dtype)
    v[100] = info.min
    tk.rng_summary(v, state, out, 6, max_programs=3)
    lo, hi, first, last = out[6].tolist()
    n = v.numel()
    assert f"(cnt={n},min={lo},max={hi},first={first},last={last})" == reference.rng(v)
    assert state[6, tk.S_MIN] == tk.INT64_MAX and state[6, tk.S_MAX] == tk.INT64_MIN and state[6, tk.S_CNT] == 0
    tk.rng_summary(v[:1], state, out, 6)
    assert out[6].tolist() == [int(v[0])] * 4


class _Ev:
    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@pytest.fixture(params=[False, True], ids=["copy", "uva"])
def gpu_on_cpu(tk, monkeypatch, request):
    """Drive the CUDA dispatch module end to end on CPU tensors (interpreted kernels, fake events), in both result
    delivery modes: device ring + copy, and kernels writing the host ring directly (UVA)."""
    from cptrace_otel.fingerprint import gpu

    monkeypatch.setattr(gpu, "UVA", request.param)
    monkeypatch.setattr(gpu, "_tk", tk)
    monkeypatch.setattr(gpu, "_triton_state", "ok")
    monkeypatch.setattr(gpu, "_new_event", _Ev)
    monkeypatch.setattr(gpu, "_capturing", lambda: False)
    monkeypatch.setattr(gpu, "_rings", {})
    yield gpu


def test_dispatch_module_end_to_end(gpu_on_cpu) -> None:
    gpu = gpu_on_cpu
    from cptrace_otel.fingerprint import is_deferred, resolve

    t = torch.randn(33, 17).to(torch.bfloat16).t()
    h, nz = gpu.khash(t), gpu.knz(t)
    assert is_deferred(h) and is_deferred(nz)
    assert h._pending is nz._pending  # khash then knz on the same tensor: one launch
    assert resolve(h, 1.0) == reference.khash(t) and int(nz) == reference.knz(t)
    h2 = gpu.khash(t)
    want_h2 = reference.khash(t)
    t.zero_()  # modified in place between khash and knz: knz must see the new bytes (a second launch)
    nz2 = gpu.knz(t)
    assert nz2._pending is not h2._pending
    assert int(nz2) == 0 and int(h2) == want_h2
    assert gpu.khash(torch.empty(0)) == 0 and gpu.khash(torch.tensor(2.0)) == -1
    for v in (torch.tensor([5, -3, 9, 2]), torch.tensor([1.5, float("nan")]), torch.tensor([True, False]),
              torch.arange(12, dtype=torch.int16).reshape(3, 4).t()):
        assert str(gpu.rng(v)) == reference.rng(v)
    assert gpu.rng(torch.empty(0, dtype=torch.int64)) == "(0)"
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (3, 0, 5000, 1)] + [torch.tensor(1.0)]
    res = gpu.many(ts)
    assert [(resolve(a), resolve(b)) for a, b in res] == [(reference.khash(x), reference.knz(x)) for x in ts]
    # A non-contiguous first segment (its copy becomes the base), bf16 pages of one pool, a 1-byte 0-dim tensor.
    pool = torch.randn(16 * 8, 24).to(torch.bfloat16)
    ts = [torch.randn(9, 5).t(), *[pool[p * 8:(p + 1) * 8] for p in (3, 0, 15)], torch.tensor(7, dtype=torch.uint8)]
    res = gpu.many(ts)
    assert [(int(a), int(b)) for a, b in res] == [(reference.khash(x), reference.knz(x)) for x in ts]
    pool = torch.randn(40, 2, 3)
    idx = torch.tensor([0, 5, -1, 5])
    a, b = gpu.gather(pool, idx)
    assert (int(a), int(b)) == (reference.khash(pool[idx]), reference.knz(pool[idx]))
    assert tuple(int(x) for x in gpu.gather(pool, torch.tensor([0, 40]))) == (-1, -1)
    # Every slot went back to the ring once its result was read.
    ring = gpu._rings[0]
    assert len(ring.free) == gpu.SLOTS_PER_CHUNK * len(ring.chunks)


def test_dropped_results_do_not_leak_slots(gpu_on_cpu, monkeypatch) -> None:
    import gc

    gpu = gpu_on_cpu
    monkeypatch.setattr(gpu, "SLOTS_PER_CHUNK", 8)
    x = torch.randint(0, 256, (300,), dtype=torch.uint8)
    for _ in range(gpu.SLOTS_PER_CHUNK + 5):
        gpu.khash_knz(x)  # discarded unread, as when a cptrace call below the level evaluates its arguments
    gc.collect()
    ring = gpu._rings[0]
    assert len(ring.chunks) == 1  # quarantined slots were reclaimed (their events completed) instead of growing
    assert int(gpu.khash(x)) == reference.khash(x)


def test_capture_gives_sentinels_and_launches_nothing(gpu_on_cpu, monkeypatch) -> None:
    gpu = gpu_on_cpu
    import cptrace_otel.fingerprint as fp

    monkeypatch.setattr(gpu, "_capturing", lambda: True)

    def boom(*a, **k):
        raise AssertionError("launched under capture")

    monkeypatch.setattr(gpu, "_launch_hash", boom)
    t = torch.ones(10)
    assert gpu.khash(t) == -1 and gpu.knz(t) == -1
    assert gpu.rng(torch.arange(3)) == gpu.CAPTURE_ERROR
    assert gpu.many([t]) == [(-1, -1)]
    assert gpu.gather(torch.ones(4, 2), torch.tensor([1])) == (-1, -1)
    assert fp.forward_fingerprint  # the public wrapper routes CUDA tensors here (checked on GPU)
