"""``_keys`` (cptrace_otel/traced/sglang/_l3_sites.py): the L3 records name each page by the object name its
backend stores it under, which carries the rank scope (the real backends: tests/sglang_real/test_l3_real.py for
``file``, test_l3_seaweedfs_real.py for ``seaweedfs``). Stand-in backends here, with the two naming methods."""

from __future__ import annotations

from types import SimpleNamespace

from cptrace_otel.traced.sglang._l3_sites import _keys


class Suffixed:   # HiCacheFile's naming
    def _get_suffixed_key(self, h: str) -> str:
        return f"{h}_m_0_1"


class Objects:    # SeaweedFSStore's naming
    def _object_key(self, h: str) -> str:
        return f"p/m/tp0of1/{h}"


class Both(Suffixed, Objects):
    pass


def _cc(backend: object) -> SimpleNamespace:
    return SimpleNamespace(storage_backend=backend)


def test_each_backend_names_its_objects():
    assert _keys(_cc(Suffixed()), ["a", "b"]) == ["a_m_0_1", "b_m_0_1"]
    assert _keys(_cc(Objects()), ["a", "b"]) == ["p/m/tp0of1/a", "p/m/tp0of1/b"]


def test_the_file_suffix_wins_and_a_backend_without_either_keeps_the_hash():
    assert _keys(_cc(Both()), ["a"]) == ["a_m_0_1"]
    assert _keys(_cc(object()), ["a"]) == ["a"]
    assert _keys(_cc(Objects()), None) == []
