"""The CP mode the SGLang instrumentation states, from SGLang's server arguments (unit level: stand-in argument objects
and pools; tests/sglang_real/test_cpmode_real.py reads SGLang's own ``ServerArgs`` in a real run)."""

from __future__ import annotations

import logging
import types

import pytest

from cptrace_otel.model import config
from cptrace_otel.traced.sglang import _cpmode, _state


def _sa(**kw):
    base = dict(attn_cp_size=1, dcp_size=1, enable_prefill_cp=False, cp_strategy=None, enable_kv_cache_sharding=False,
                enable_dsa_cache_layer_split=False)
    return types.SimpleNamespace(**{**base, **kw})


class MLATokenToKVPool:   # the name SGLang's storage config tests (is_mla_model)
    pass


class DeepSeekPool(MLATokenToKVPool):
    pass


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _state._warned.clear()
    yield
    _state._warned.clear()


def test_the_mode_follows_the_server_arguments():
    assert _cpmode.derive(_sa(attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag"), 2, 1)[0] == "prefill_cp"
    assert _cpmode.derive(_sa(attn_cp_size=4), 4, 0)[0] == "prefill_cp"   # the DSA models' prefill CP: no flag
    assert _cpmode.derive(_sa(attn_cp_size=2, enable_kv_cache_sharding=True), 2, 1)[0] == "sharded"
    assert _cpmode.derive(_sa(attn_cp_size=2, enable_dsa_cache_layer_split=True), 2, 1)[0] == "layersplit"
    assert _cpmode.derive(_sa(dcp_size=2), 1, 1)[0] == "dcp"
    assert _cpmode.derive(_sa(), 1, 0)[0] == "none"
    _mode, why = _cpmode.derive(_sa(attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag"), 2, 1)
    assert why == ["cp_group:2", "mla:1", "attn_cp_size:2", "prefill_cp:1", "cp_strategy:zigzag",
                   "kv_cache_sharding:0", "layer_split:0", "dcp_size:1", "tp_size:1", "attn_tp_size:1"]
    # a CP group the arguments do not explain, or no arguments at all: unknown, never a guess
    assert _cpmode.derive(_sa(), 2, 0)[0] == ""
    assert _cpmode.derive(None, 2, 0) == ("", ["cp_group:2", "mla:0", "server_args:none"])


def test_mla_is_read_from_the_device_pool_class():
    assert _cpmode.is_mla(DeepSeekPool()) == 1 and _cpmode.is_mla(object()) == 0 and _cpmode.is_mla(None) == -1


def test_resolve_an_explicit_mode_wins_with_a_warning_where_it_disagrees(caplog):
    caplog.set_level(logging.INFO, "cptrace_otel.sglang")
    sa = _sa(attn_cp_size=2, enable_prefill_cp=True)
    m = _cpmode.resolve("", "", 2, MLATokenToKVPool(), sa)
    assert (m.mode, m.src) == ("prefill_cp", "server_args") and "mla:1" in m.why
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    m = _cpmode.resolve("sharded", "CPTRACE_CP_MODE", 2, None, sa, warn_once=_state.warn_once)
    assert _cpmode.resolve("sharded", "CPTRACE_CP_MODE", 2, None, sa, warn_once=_state.warn_once).mode == "sharded"
    assert (m.mode, m.src) == ("sharded", "CPTRACE_CP_MODE")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "sharded" in warned[0] and "prefill_cp" in warned[0]
    caplog.clear()
    assert _cpmode.resolve("prefill_cp", "instrument", 2, None, sa).mode == "prefill_cp"   # agrees: silent
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # one rank: none, whatever was set
    assert _cpmode.resolve("sharded", "instrument", 1, None, sa)[:2] == ("none", "cp_group")
    # nothing explains a group of several ranks: unknown, one warning naming the variable
    m = _cpmode.resolve("", "", 4, None, _sa())
    assert (m.mode, m.src) == ("", "unknown")
    assert any("CPTRACE_CP_MODE" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_resolve_reads_sglangs_published_arguments(monkeypatch):
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_server_args = lambda: _sa(attn_cp_size=2, enable_kv_cache_sharding=True)   # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "sglang.srt.runtime_context", rc)
    assert _cpmode.resolve("", "", 2, None).mode == "sharded"

    def unpublished():
        raise RuntimeError("server args not published")

    rc.get_server_args = unpublished   # type: ignore[attr-defined]
    assert _cpmode.resolve("", "", 2, None)[:2] == ("", "unknown")


def test_cptrace_cp_mode_is_read_and_a_bad_value_is_ignored_with_a_warning():
    assert config.from_env({"CPTRACE_CP_MODE": " Prefill_CP "}).cp_mode == "prefill_cp"
    assert config.from_env({}).cp_mode == ""
    with pytest.warns(RuntimeWarning, match="CPTRACE_CP_MODE='zigzag' is not a CP mode"):
        assert config.from_env({"CPTRACE_CP_MODE": "zigzag"}).cp_mode == ""
