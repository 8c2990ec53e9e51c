"""Loader of ``_jaegerin`` (``jaegerin.c``): the C reader of Jaeger search answers for
:mod:`cptrace_otel.analyze.jaeger_read` (``cptrace-otel watch``)."""

from __future__ import annotations

from typing import Any


def load(src: str) -> Any | None:
    """The configured ``_jaegerin`` module (``index(body, max_item)``, ``records(text)``; see jaegerin.c), with
    ``src`` as the records' ``Event.src``, or None when the extension was not built."""
    try:
        from . import _jaegerin  # type: ignore[attr-defined]
    except ImportError:
        return None
    from ..model.logline import parse_value
    from .event import reader_types, span_reader_keys

    _jaegerin.configure(*reader_types(), span_reader_keys(src), parse_value)
    return _jaegerin
