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
    from ..checks.epochs import EPOCH_TAGS, EpochTracker
    from ..model import semconv as sc
    from ..model.attrs import RNG_SUFFIXES
    from ..model.events import Event
    from ..model.logline import Rng, parse_value
    from .event import event_slots

    keys = {"prefix": sc.FIELD_PREFIX, "seq": sc.SEQ, "epoch": sc.EPOCH, "level": sc.LEVEL, "rank": sc.RANK,
            "violation": sc.VIOLATION, "event_violation": sc.EVENT_VIOLATION, "run_id": sc.RUN_ID,
            "cp_rank": sc.CP_RANK, "trace_level": sc.TRACE_LEVEL}
    conf: dict[str, Any] = {k: v.encode() for k, v in keys.items()}
    conf.update(rng_suffixes=tuple(s.encode() for s in RNG_SUFFIXES), src=src)
    _jaegerin.configure(Rng, Event, EpochTracker, EPOCH_TAGS, event_slots(), conf, parse_value)
    return _jaegerin
