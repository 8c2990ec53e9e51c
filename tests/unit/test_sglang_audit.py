"""The host-copy audit's pieces without SGLang: the host rows in each host layout SGLang defines equal the device
rows the backup fingerprint reads, unknown layouts are refused, the rate setting, and no thread while it is off.
The audit on real SGLang is tests/sglang_real/test_rest_real.py."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")

from cptrace_otel.traced.sglang import _audit  # noqa: E402
from cptrace_otel.traced.sglang._state import Recorder, kv_rows  # noqa: E402

LAYERS, SIZE, HEADS, DIM = 3, 16, 2, 4


class _Dev:
    def __init__(self, k, v):
        self.k_buffer, self.v_buffer = k, v


def _mha(layout: str, kv: torch.Tensor):
    """An object laid out as SGLang's ``MHATokenToKVPoolHost.init_kv_buffer`` makes it (k/v: index 0/1)."""
    cls = type("MHATokenToKVPoolHost", (), {})
    p = cls()
    p.layout = layout
    p.kv_buffer = kv if layout == "layer_first" else kv.permute(0, 2, 1, 3, 4).contiguous()
    p.k_buffer, p.v_buffer = p.kv_buffer[0], p.kv_buffer[1]
    return p


def _mla(layout: str, kv: torch.Tensor):
    cls = type("MLATokenToKVPoolHost", (), {})
    p = cls()
    p.layout = layout
    p.kv_buffer = kv if layout == "layer_first" else kv.permute(1, 0, 2, 3).contiguous()
    return p


def test_host_rows_equal_the_device_rows_in_both_layouts():
    kv = torch.randn(2, LAYERS, SIZE, HEADS, DIM)   # layer_first: [2, layers, size, heads, dim]
    dev = _Dev(list(kv[0]), list(kv[1]))             # the device pool: one [size, heads, dim] buffer per layer
    idx = torch.tensor([5, 2, 9, 3])
    want = kv_rows(dev, idx)
    for layout in ("layer_first", "page_first"):
        got = _audit.host_rows(_mha(layout, kv), idx)
        assert torch.equal(got.contiguous(), want), layout
    lat = torch.randn(LAYERS, SIZE, 1, DIM)
    mla_dev = type("D", (), {"kv_buffer": list(lat)})()
    for layout in ("layer_first", "page_first"):
        assert torch.equal(_audit.host_rows(_mla(layout, lat), idx).contiguous(), kv_rows(mla_dev, idx)), layout


def test_layouts_and_pools_it_does_not_know_are_refused():
    kv = torch.randn(2, LAYERS, SIZE, HEADS, DIM)
    idx = torch.tensor([1])
    for layout in ("page_head", "page_first_direct", "page_unified"):
        assert _audit.host_rows(_mha(layout, kv), idx) is None
    other = type("AsymmetricMHATokenToKVPoolHost", (), {"layout": "layer_first", "kv_buffer": kv})()
    assert _audit.host_rows(other, idx) is None


@pytest.mark.parametrize("raw,want", [("", 0.0), ("0", 0.0), ("-3", 0.0), ("nan", 0.0), ("12.5", 12.5),
                                      ("x", 0.0)])
def test_rate_setting(monkeypatch, raw, want):
    monkeypatch.setenv(_audit.ENV, raw)
    assert _audit.rate_setting() == want
    assert _audit.rate_setting(7) == 7.0   # instrument(audit_mbps=) wins


def test_off_starts_no_thread_and_on_starts_one(monkeypatch):
    class St:
        rest: ClassVar[dict] = {}

    monkeypatch.setattr(Recorder, "audit_mbps", 0.0)
    before = {t.name for t in threading.enumerate()}
    _audit.enroll(St())
    assert _audit.auditor() is None and "cptrace-audit" not in before | {t.name for t in threading.enumerate()}
    from cptrace_otel.traced import api

    monkeypatch.setattr(Recorder, "audit_mbps", 5.0)
    monkeypatch.setattr(api, "trace_level", lambda: 0)   # tracing off: no thread either
    _audit.enroll(St())
    assert _audit.auditor() is None
    monkeypatch.setattr(api, "trace_level", lambda: 2)
    st = St()
    try:
        _audit.enroll(st)
        a = _audit.auditor()
        assert a is not None and a.thread.is_alive() and st in a.states
    finally:
        _audit.stop()
    assert _audit.auditor() is None and not a.thread.is_alive()


def test_a_pool_it_cannot_read_leaves_the_audit_after_one_sample(monkeypatch):
    """No busy loop over a pool it refuses: the cache leaves the audit set at its first sample, nothing recorded."""
    from cptrace_otel.traced import api

    class St:
        host_gen = 0
        page_size = 1
        rest: ClassVar[dict] = {1: object(), 2: object()}

        @staticmethod
        def host(n):
            return torch.tensor([0, 1])

        @staticmethod
        def host_pool():
            return type("HiSparseMHATokenToKVPoolHost", (), {"layout": "layer_first"})()

    recs = []
    monkeypatch.setattr(api, "trace_level", lambda: 2)
    monkeypatch.setattr(api, "cptrace", lambda *a, **k: recs.append(a))
    a = _audit.Auditor(1000.0)
    st = St()
    a.states.add(st)
    before = _audit.STATS["refused"]
    assert a.one_pass() is True
    assert st not in a.states and _audit.STATS["refused"] == before + 1 and recs == []
    assert a.one_pass() is False   # nothing left to audit


def test_the_rate_bounds_the_samples_and_every_sample_is_recorded_with_its_backup_layout(monkeypatch):
    """At 1 MB/s a sample is charged 256 KiB at least: about 4 samples a second, whatever the cache holds; each
    record carries the fingerprint of the host rows in the backup's layout."""
    import time

    from cptrace_otel.traced import api
    from cptrace_otel.traced.sglang._state import _fp

    kv = torch.randn(2, LAYERS, SIZE, HEADS, DIM)
    pool = _mha("layer_first", kv)
    nodes = {i: torch.tensor([i, i + 1]) for i in range(0, 14, 2)}

    class St:
        host_gen = 0
        page_size = 1
        rest: ClassVar[dict] = {i: i for i in nodes}

        @staticmethod
        def host(n):
            return nodes[n]

        @staticmethod
        def host_pool():
            return pool

        @staticmethod
        def fp_rows(rows):
            return _fp(rows, 1)

    recs: list = []
    monkeypatch.setattr(api, "trace_level", lambda: 2)
    monkeypatch.setattr(api, "cptrace", lambda lv, tag, **f: recs.append((lv, tag, f)))
    a = _audit.Auditor(1.0)
    st = St()   # (the audit holds its caches' states weakly)
    a.states.add(st)
    a.thread.start()
    try:
        time.sleep(1.0)
    finally:
        a.stop_evt.set()
        a.thread.join(5)
    assert 2 <= len(recs) <= 6, len(recs)   # 1e6 / 262144 = 3.8 a second
    want = {i: _fp(kv_rows(_Dev(list(kv[0]), list(kv[1])), t), 1)["h"] for i, t in nodes.items()}
    for lv, tag, f in recs:
        assert (lv, tag) == (2, "audit") and f["h"] == want[f["node_id"]]
