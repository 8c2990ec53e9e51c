"""The L3 half of the audit without SGLang: which backups join the audit set and when, the read-back's fingerprint
(the ``l3_backup``'s for the same bytes), an object gone or unreadable (recorded, never raised), and the backends
it refuses. A stand-in backend with SGLang's ``HiCacheFile.get`` contract stands for the real one here; the audit
on real SGLang's file backend is tests/sglang_real/test_rest_l3_real.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")

from cptrace_otel.model.l3 import AUDIT_GONE, AUDIT_UNREADABLE, TIER_L3  # noqa: E402
from cptrace_otel.traced.sglang import _audit, _audit_l3  # noqa: E402
from cptrace_otel.traced.sglang._l3_sites import page_fp  # noqa: E402

PS = 4


class _Pool:
    """A ``layer_first`` MHA host pool's pages as SGLang's ``get_data_page`` gives them ([K/V, layers, page, ...])."""

    def __init__(self) -> None:
        self.kv = torch.randn(2, 3, 32, 2, 4, generator=torch.Generator().manual_seed(5))

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        p = self.kv[:, :, index:index + PS]
        return p.flatten() if flat else p


def _backend(evict: bool = False):
    """``HiCacheFile.get(key, target)``: fills ``target`` from the stored bytes; None when the object is not found."""
    class HiCacheFile:
        def __init__(self) -> None:
            self.objs: dict[str, torch.Tensor] = {}
            self.broken: set[str] = set()
            self._evictor = SimpleNamespace(enabled=evict)

        def get(self, key, target):
            if key in self.broken:
                raise OSError(f"Short read for {key}")
            if key not in self.objs:
                return None
            target.copy_(self.objs[key])
            return target
    return HiCacheFile()


def _cache(backend, pool):
    ra = _audit_l3.L3Rest()
    cc = SimpleNamespace(storage_backend=backend, storage_host_pool=pool)
    for op, (nid, idx) in enumerate([(7, 0), (8, 4)]):
        h = f"h{op}"
        backend.objs[h] = pool.get_data_page(idx, flat=True).clone()   # what the file backend stores
        _audit_l3.on_backup(ra, cc, op, nid, [h], [h + "_sfx"])
    return ra


class _St:
    host_gen = 0
    rest: ClassVar[dict] = {}

    def __init__(self, ra) -> None:
        self.l3 = SimpleNamespace(audit=ra)


def _pass(monkeypatch, ra, mbps: float = 1e6) -> list:
    from cptrace_otel.traced import api

    recs: list = []
    monkeypatch.setattr(api, "trace_level", lambda: 2)
    monkeypatch.setattr(api, "cptrace", lambda lv, tag, **f: recs.append((lv, tag, f)))
    a = _audit.Auditor(mbps)
    st = _St(ra)
    a.states.add(st)
    a.one_pass()
    return sorted(recs, key=lambda r: r[2]["op"])


def test_a_backup_joins_the_audit_at_its_ack_with_the_pages_it_completed():
    ra = _audit_l3.L3Rest()
    cc = SimpleNamespace(storage_backend=_backend(), storage_host_pool=_Pool())
    _audit_l3.on_backup(ra, cc, 1, 7, ["a", "b", "c"], ["a_s", "b_s", "c_s"])
    _audit_l3.on_backup(ra, cc, 2, 8, ["d"], ["d_s"])
    assert not ra.rest   # still being written
    _audit_l3.on_ack(ra, 1, 2)   # the backup thread completed 2 of its 3 pages
    _audit_l3.on_ack(ra, 2, 0)   # none
    _audit_l3.on_ack(ra, 9, None)   # an op this cache never recorded
    assert dict(ra.rest) == {1: (7, ["a", "b"], ["a_s", "b_s"])} and not ra.pending


def test_an_intact_object_reads_back_with_its_backups_fingerprint_and_a_changed_byte_changes_it(monkeypatch):
    pool, be = _Pool(), _backend()
    ra = _cache(be, pool)
    for op in (0, 1):
        _audit_l3.on_ack(ra, op, None)
    want = [page_fp(pool.get_data_page(i, flat=False)) for i in (0, 4)]   # l3_backup's hp (_l3_sites._page_fps)
    recs = _pass(monkeypatch, ra)
    assert [(lv, tag, f["tier"], f["node_id"], f["keys"], f["hp"]) for lv, tag, f in recs] == \
        [(2, "audit", TIER_L3, 7, ["h0_sfx"], [want[0]]), (2, "audit", TIER_L3, 8, ["h1_sfx"], [want[1]])]
    be.objs["h1"].view(torch.uint8)[3] ^= 1   # a byte of the stored object flipped at rest
    again = [f["hp"][0] for _, _, f in _pass(monkeypatch, ra)]
    assert again[0] == want[0] and again[1] != want[1] and again[1] >= 0


def test_an_object_gone_or_unreadable_is_recorded_as_such_and_never_raises(monkeypatch):
    pool, be = _Pool(), _backend()
    ra = _cache(be, pool)
    for op in (0, 1):
        _audit_l3.on_ack(ra, op, None)
    del be.objs["h0"]          # evicted or removed
    be.broken.add("h1")        # a short read
    before = dict(_audit.STATS)
    recs = _pass(monkeypatch, ra)
    assert [f["hp"] for _, _, f in recs] == [[AUDIT_GONE], [AUDIT_UNREADABLE]]
    assert _audit.STATS["l3_gone"] == before["l3_gone"] + 1
    assert _audit.STATS["l3_unreadable"] == before["l3_unreadable"] + 1
    assert list(ra.rest) == [1]   # the gone one left the set (recorded once); the unreadable one is read again


@pytest.mark.parametrize("evict,name", [(True, "HiCacheFile"), (False, "MooncakeStore")])
def test_a_backend_whose_read_has_a_side_effect_is_refused_once(monkeypatch, evict, name):
    """The file backend with its LRU eviction on (its get() refreshes the object), or another backend: the cache's
    L3 copies leave the audit after one sample, nothing recorded, nothing read."""
    pool, be = _Pool(), _backend(evict)
    be.__class__.__name__ = name
    ra = _cache(be, pool)
    for op in (0, 1):
        _audit_l3.on_ack(ra, op, None)
    calls: list = []
    monkeypatch.setattr(be, "get", lambda *a: calls.append(a))
    before = _audit.STATS["l3_refused"]
    assert _pass(monkeypatch, ra) == [] and calls == []
    assert ra.refused and not ra.rest and _audit.STATS["l3_refused"] == before + 1
    assert _audit_l3.refusal(ra) is not None


def test_each_page_is_charged_the_floor_at_least(monkeypatch):
    """The rate bound counts a page's fixed cost (an object to open, read and hash): a backup of 3 tiny pages is
    charged 3 x FLOOR, so at R MB/s at most R / FLOOR pages a second are read."""
    pool, be = _Pool(), _backend()
    ra = _audit_l3.L3Rest()
    cc = SimpleNamespace(storage_backend=be, storage_host_pool=pool)
    for h, idx in (("a", 0), ("b", 4), ("c", 8)):
        be.objs[h] = pool.get_data_page(idx, flat=True).clone()
    _audit_l3.on_backup(ra, cc, 5, 7, ["a", "b", "c"], ["a_s", "b_s", "c_s"])
    _audit_l3.on_ack(ra, 5, None)
    page_bytes = pool.get_data_page(0, flat=True).numel() * 4
    assert page_bytes < _audit.FLOOR
    from cptrace_otel.traced import api

    monkeypatch.setattr(api, "cptrace", lambda *a, **k: None)
    assert _audit.Auditor.audit_l3(_St(ra), 5) == 3 * _audit.FLOOR
