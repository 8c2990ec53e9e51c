"""Loader of ``_otlp`` (``otlp.c``): the C encoder of spans and span events for :mod:`cptrace_otel.export.otlp_proto`,
and the span builder's size estimate."""

from __future__ import annotations

from collections.abc import Callable


def load() -> tuple[Callable[..., bytes], Callable[..., list[bytes]], Callable[[dict], int]] | None:
    """``(span_events, span_fields, approx_bytes)``, or None when the extension was not built: ``span_events(events,
    fallback) -> bytes`` (the bytes of ``export.otlp_proto._event_field`` for each event), ``span_fields(spans,
    span_fallback, event_fallback) -> list[bytes]`` (the bytes of ``export.otlp_proto._span_field`` for each span)
    and ``approx_bytes(fields) -> int`` (the number of ``model.attrs.approx_bytes``, a span builder's ``sizer``)."""
    try:
        from . import _otlp  # type: ignore[attr-defined]
    except ImportError:
        return None
    from ..model import semconv as sc
    from ..model.attrs import RNG_SUFFIXES, EventAttrs
    from ..model.logline import Rng

    # the key layout of attrs.fields_to_attributes, and the keys EventAttrs puts after the fields
    _otlp.init(EventAttrs, Rng, sc.FIELD_PREFIX, RNG_SUFFIXES, (sc.SEQ, sc.EPOCH, sc.LEVEL))
    return _otlp.span_events, _otlp.span_fields, _otlp.approx_bytes

