"""Simulator building blocks: paged pools (allocator discipline) and KV bytes/fingerprints/exact-set text."""

from __future__ import annotations

import numpy as np
import pytest

from cptrace_otel.fingerprint.cpu import khash_bytes
from cptrace_otel.model.logline import parse_value
from cptrace_otel.sim import kv
from cptrace_otel.sim.pool import PagedPool, PoolError


def test_pool_alloc_is_page_granular_and_asserts_double_free():
    p = PagedPool(4, 4, 2, 3)
    a = p.alloc(8)
    assert a.tolist() == list(range(8))
    with pytest.raises(PoolError):
        p.alloc(6)                      # not page-aligned
    assert p.alloc(12) is None          # only 2 pages left
    p.free(a)
    with pytest.raises(PoolError):
        p.free(a)                       # double free
    with pytest.raises(PoolError):
        p.free(np.arange(1, 5))         # not whole pages


def test_pool_reuses_freed_pages_first_in_order():
    p = PagedPool(6, 2, 1, 1)
    a = p.alloc(4)
    b = p.alloc(4)
    p.free(a)
    c = p.alloc(4)
    assert c.tolist() == a.tolist()     # prompt reuse makes recycle races visible
    assert not set(c.tolist()) & set(b.tolist())


def test_pool_double_alloc_is_caught():
    p = PagedPool(2, 2, 1, 1)
    p.alloc(2)
    p._free.appendleft(0)               # corrupt the free list: page 0 is in use
    with pytest.raises(PoolError):
        p.alloc(2)


def _khash_spec(b: np.ndarray) -> int:
    v = [int(x) for x in b.reshape(-1)]
    n = len(v)
    if n == 0:
        return 0
    s1 = sum(x * (i + 1) for i, x in enumerate(v))
    s0 = sum(v)
    m64 = (1 << 64) - 1
    return ((s1 & m64) ^ ((s0 * 1000003) & m64) ^ n) & ((1 << 63) - 1)


@pytest.mark.parametrize("n", [0, 1, 7, 256, 5000])
def test_khash_matches_the_upstream_formula(n):
    b = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert khash_bytes(b) == _khash_spec(b)
    assert kv.knz(b) == int(np.count_nonzero(b))


def test_khash_agrees_with_the_project_fingerprint_cpu_path():
    from cptrace_otel.fingerprint import cpu, formula

    b = np.random.default_rng(3).integers(0, 256, 3000, dtype=np.uint8)
    s0, s1 = cpu.array_sums(b)
    assert khash_bytes(b) == formula.finish(s0, s1, b.size)


def test_khash_agrees_with_the_torch_reference():
    torch = pytest.importorskip("torch")
    from cptrace_otel.fingerprint import reference

    b = np.random.default_rng(4).integers(0, 256, (8, 2, 4), dtype=np.uint8)
    assert khash_bytes(b) == reference.khash(torch.from_numpy(b.copy()))
    assert kv.knz(b) == reference.knz(torch.from_numpy(b.copy()))


def test_khash_is_position_sensitive():
    b = np.arange(1, 17, dtype=np.uint8)
    assert khash_bytes(b) != khash_bytes(b[::-1].copy())


def test_content_is_nonzero_deterministic_and_shard_dependent():
    t, pos, lay = np.arange(8), np.arange(8), np.arange(2)
    a = kv.content(t, pos, lay, 4, 0)
    assert a.shape == (8, 2, 4) and a.dtype == np.uint8 and np.count_nonzero(a) == a.size
    assert np.array_equal(a, kv.content(t, pos, lay, 4, 0))
    assert not np.array_equal(a, kv.content(t, pos, lay, 4, 1))
    assert not np.array_equal(a, kv.content(t, pos + 1, lay, 4, 0))


def test_runs_and_rng_render_the_spec_forms():
    idx = np.array([8, 9, 10, 11, 0, 1, 2, 3, 20])
    assert kv.runs(idx) == "8-11:0-3:20-20"
    assert kv.runs(np.array([], dtype=np.int64)) == "(0)"
    assert kv.rng(idx) == "(cnt=9,min=0,max=20,first=8,last=20)"
    assert kv.rng(None) == "(none)" and kv.rng(np.zeros(0)) == "(0)"
    r = parse_value(kv.rng(idx))
    assert (r.cnt, r.min, r.max, r.first, r.last) == (9, 0, 20, 8, 20)
    assert parse_value(kv.runs(idx)) == "8-11:0-3:20-20"   # stays a string; the checker decodes it
