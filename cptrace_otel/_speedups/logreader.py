"""Loader of ``_logreader`` (``logreader.c``): the C fast path of :mod:`cptrace_otel.analyze.sources.logs`."""

from __future__ import annotations

from types import ModuleType


def load() -> ModuleType | None:
    """The configured C line reader (``parse_line``, ``fill_chunk``: the same results as the Python reader), or None
    when it was not built."""
    try:
        from . import _logreader  # type: ignore[attr-defined]
    except ImportError:
        return None
    from ..model.canary import MARKER as CANARY_MARKER
    from .event import reader_types

    # lines holding SGLang's kv-canary marker (and no [CPTRACE) go to the Python reader, which reads them
    _logreader.configure(*reader_types(), (CANARY_MARKER,))
    return _logreader
