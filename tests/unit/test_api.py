"""The drop-in API surface: gate parsing (CPTRACE_LEVEL, upstream fallback, bad values), reload, sentinels, and that
a below-level call computes nothing."""

from __future__ import annotations

import warnings

import pytest

import cptrace_otel
from cptrace_otel.model import config
from cptrace_otel.traced import api

pytestmark = pytest.mark.usefixtures("fresh_pipeline")


def test_public_names_match_upstream() -> None:
    for name in ("cptrace", "trace_level", "trace_enabled", "rng", "khash", "knz", "fwd_hash", "flush", "shutdown"):
        assert callable(getattr(cptrace_otel, name))


@pytest.mark.parametrize("env,level", [
    ({}, 0),
    ({"CPTRACE_LEVEL": "2"}, 2),
    ({"SGLANG_CP_HICACHE_KV_TRACE": "3"}, 3),
    ({"CPTRACE_LEVEL": "1", "SGLANG_CP_HICACHE_KV_TRACE": "3"}, 1),   # ours wins
    ({"CPTRACE_LEVEL": "", "SGLANG_CP_HICACHE_KV_TRACE": "2"}, 2),    # empty means unset
    ({"CPTRACE_LEVEL": " 2 "}, 2),
])
def test_gate_sources(monkeypatch: pytest.MonkeyPatch, env: dict, level: int) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    api.reload_config()
    assert api.trace_level() == level
    assert api.trace_enabled(1) is (level >= 1)
    assert api.trace_enabled(3) is (level >= 3)
    assert api.trace_enabled() is (level >= 1)


def test_gate_is_read_once_until_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPTRACE_LEVEL", "1")
    api.reload_config()
    monkeypatch.setenv("CPTRACE_LEVEL", "3")
    assert api.trace_level() == 1  # not re-read per call (upstream re-reads the environment every time)
    api.reload_config()
    assert api.trace_level() == 3
    api.reload_config(level=0)  # explicit override wins over the environment
    assert api.trace_level() == 0


@pytest.mark.parametrize("bad", ["abc", "1.5", "-1", "0x2"])
def test_bad_gate_value_warns_once_and_means_off(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    config.forget_warnings()
    monkeypatch.setenv("SGLANG_CP_HICACHE_KV_TRACE", bad)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        api.reload_config()
        api.reload_config()
        api.reload_config()
    assert api.trace_level() == 0
    msgs = [x for x in w if "trace level" in str(x.message)]
    assert len(msgs) == 1 and bad in str(msgs[0].message)


def test_below_level_computes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    api.reload_config(level=1)

    class Explodes:
        def __str__(self):
            raise AssertionError("rendered although below the level")

    started = []
    monkeypatch.setattr(api._STATE, "submit", lambda *a: started.append(a))
    api.cptrace(2, "ack", v=Explodes())
    api.fwd_hash(object(), 0, "attn", object())  # level 3 > 1: returns before touching anything
    assert started == []
    api.cptrace(1, "evict", node_id=1)
    assert started == [(1, "evict", {"node_id": 1})]


def test_sentinels_without_tensors() -> None:
    # upstream: rng(None) "(none)", non-tensors give the error sentinels; nothing raises
    assert api.rng(None) == "(none)"
    r = api.rng(object())
    assert isinstance(r, str) and (r.startswith("(err:") or r in ("(none)", "(0)"))
    for f in (api.khash, api.knz):
        v = f(None)
        assert int(v) in (0, -1, -2)
        v = f("not a tensor")
        assert int(v) in (-1, -2)


def test_cptrace_never_raises_even_if_the_pipeline_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from cptrace_otel.traced import pipeline

    api.reload_config(level=1)

    def boom(cfg):
        raise RuntimeError("no pipeline")

    monkeypatch.setattr(pipeline, "start", boom)
    api.cptrace(1, "evict", node_id=1)  # swallowed
    assert api._STATE.submit is api._submit_unstarted


def test_configure_restarts_with_new_settings(tmp_path) -> None:
    cfg = api.configure(level=2, run_id="cfg-test", file=str(tmp_path / "o.jsonl"), exporter="thread")
    assert cfg.level == 2 and api.get_config() is cfg and api.trace_level() == 2
    with pytest.raises(TypeError):
        api.configure(nonsense=1)


def test_a_switch_watcher_is_told_when_tracing_turns_on_and_off() -> None:
    """``watch_switch``: ``fn(True)`` when the level goes from 0 to 1 or more, while the old level is still in force
    (what it sets up is there for the first record), ``fn(False)`` when it goes back to 0, once level 0 is; changes
    between levels that trace, or between 0 and 0, call nothing; a watcher added while tracing is on is called at
    once; one that raises never fails the level change; an unwatched one is not called again."""
    seen: list[tuple[bool, int]] = []

    def fn(on: bool) -> None:
        seen.append((on, api.trace_level()))

    def bad(on: bool) -> None:
        raise RuntimeError("a watcher's own failure")

    api.reload_config(level=0)
    api.watch_switch(fn)
    api.watch_switch(bad)
    try:
        api.watch_switch(fn)   # (once)
        for lv in (0, 2, 3, 1, 0, 0, 1):
            api.reload_config(level=lv)
        assert seen == [(True, 0), (False, 0), (True, 0)]
        assert api.trace_level() == 1
        api.unwatch_switch(fn)
        api.reload_config(level=0)
        assert seen == [(True, 0), (False, 0), (True, 0)]
        api.reload_config(level=2)
        api.watch_switch(fn)   # tracing on now: told at once
        assert seen[-1] == (True, 2)
    finally:
        api.unwatch_switch(fn)
        api.unwatch_switch(bad)
        api.reload_config(level=0)
