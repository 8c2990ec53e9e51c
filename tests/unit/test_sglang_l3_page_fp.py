"""``page_fp`` (cptrace_otel/traced/sglang/_l3_sites.py): the per-page fingerprint of the L3 records over host pool
pages as SGLang's ``get_data_page(flat=False)`` returns them (strided for ``layer_first``, contiguous otherwise)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cptrace_otel.fingerprint import khash  # noqa: E402
from cptrace_otel.traced.sglang._l3_sites import page_fp  # noqa: E402


def _layer_first(size: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 3, size, 2, 4, generator=g)   # [K/V, layers, slots, heads, dim]


def test_a_contiguous_page_is_its_khash():
    kv = _layer_first().permute(2, 0, 1, 3, 4).contiguous()   # page_first: [slots, K/V, layers, heads, dim]
    page = kv[8:12]
    assert page.is_contiguous() and page_fp(page) == int(khash(page))


def test_a_strided_page_equal_bytes_equal_value_and_every_byte_counts():
    kv = _layer_first()
    page = kv[:, :, 8:12]
    assert not page.is_contiguous()
    same = kv.clone()[:, :, 8:12]
    assert page_fp(page) == page_fp(same)
    assert page_fp(page) != page_fp(kv[:, :, 12:16])
    seen = {page_fp(page)}
    for ix in [(0, 0, 0, 0, 0), (1, 2, 3, 1, 3), (0, 1, 2, 0, 1)]:   # a byte in the first, last and a middle block
        k = kv.clone()
        p = k[:, :, 8:12]
        p.view(torch.uint8)[ix[:4] + (ix[4] * 4,)] ^= 1
        v = page_fp(p)
        assert v not in seen
        seen.add(v)


def test_blocks_swapped_change_the_value():
    kv = _layer_first()
    a = kv[:, :, 8:12]
    b = kv.clone()
    b[0, [0, 1]] = b[0, [1, 0]]   # two layers' K blocks of every slot swapped: the same bytes, other order
    assert page_fp(a) != page_fp(b[:, :, 8:12])


def test_a_page_read_back_flat_has_the_fingerprint_of_the_pool_page_it_was_stored_from():
    """The L3 audit's read-back: the flat bytes the backend stored (``get_data_page(flat=True)``), viewed in the
    pool page's shape, fingerprinted in the pool page's block structure (``like``), give the backup's value."""
    kv = _layer_first()
    page = kv[:, :, 8:12]
    flat = page.flatten().clone()           # what the file backend writes and reads back
    back = flat.view(page.shape)
    assert back.is_contiguous() and page_fp(back) != page_fp(page)   # its own (contiguous) structure differs
    assert page_fp(back, like=page) == page_fp(page)
    flat.view(torch.uint8)[5] ^= 1
    assert page_fp(back, like=page) != page_fp(page)
    pf = kv.permute(2, 0, 1, 3, 4).contiguous()[8:12]   # a contiguous pool page: the plain khash either way
    assert page_fp(pf.flatten().clone().view(pf.shape), like=pf) == page_fp(pf)
