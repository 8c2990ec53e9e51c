"""Loader of ``_otlpjson`` (``otlpjson.c``): the C reader of OTLP JSON lines for
:mod:`cptrace_otel.analyze.sources.otlpfile` (``cptrace-otel check`` and ``report`` over the file sink's output)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def load() -> Callable[[str, str], Any] | None:
    """``read(line, src) -> [(resource, spans, ranks, records), ...] | None`` (see otlpjson.c; None: the Python
    reader decides), or None when the extension was not built."""
    try:
        from . import _otlpjson  # type: ignore[attr-defined]
    except ImportError:
        return None
    from ..model.logline import parse_value
    from .event import reader_types, span_reader_keys

    _otlpjson.configure(*reader_types(), span_reader_keys(""), parse_value)
    return _otlpjson.read
