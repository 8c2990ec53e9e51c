"""Loader of ``_sortedruns`` (``sortedruns.c``): records packed to bytes and back, and sorted runs merged, for the
sorted runs on disk of :mod:`cptrace_otel.analyze.sources.sortedruns` (its Python twins: pickle of the Events'
values, ``heapq.merge``)."""

from __future__ import annotations

from types import ModuleType


def load() -> ModuleType | None:
    """The configured ``_sortedruns`` module (``pack(records) -> bytes | None``, ``unpack(data) -> records``,
    ``merge(runs) -> iterator``), or None when the extension was not built."""
    try:
        from . import _sortedruns  # type: ignore[attr-defined]
    except ImportError:
        return None
    from .event import reader_types

    _sortedruns.configure(*reader_types())
    return _sortedruns
