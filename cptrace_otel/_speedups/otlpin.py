"""Loader of ``_otlpin`` (``otlpin.c``): the C reader of OTLP protobuf requests for
:mod:`cptrace_otel.analyze.otlp_intake` (``cptrace-otel serve``'s intake)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def load(src: str, watch_service: str) -> Callable[[bytes], Any] | None:
    """``decode(body) -> (spans_seen, spans) | None`` (see otlpin.c; None: the Python decoder decides), with ``src``
    as the records' ``Event.src`` and ``watch_service`` the service name of the checker's own spans (skipped), or
    None when the extension was not built."""
    try:
        from . import _otlpin  # type: ignore[attr-defined]
    except ImportError:
        return None
    from ..model import semconv as sc
    from ..model.logline import parse_value
    from .event import reader_types, span_reader_keys

    conf = span_reader_keys(src)
    conf.update(service=sc.SERVICE_NAME.encode(), stamp_prefix=sc.CONFIG_STAMP.encode(), watch_service=watch_service)
    _otlpin.configure(*reader_types(), conf, parse_value)
    return _otlpin.decode

