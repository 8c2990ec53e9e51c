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
    from ..checks.epochs import EPOCH_TAGS, EpochTracker
    from ..model import semconv as sc
    from ..model.attrs import RNG_SUFFIXES
    from ..model.events import Event
    from ..model.logline import Rng, parse_value
    from .event import event_slots

    keys = {"prefix": sc.FIELD_PREFIX, "seq": sc.SEQ, "epoch": sc.EPOCH, "level": sc.LEVEL, "rank": sc.RANK,
            "violation": sc.VIOLATION, "event_violation": sc.EVENT_VIOLATION, "run_id": sc.RUN_ID,
            "cp_rank": sc.CP_RANK, "trace_level": sc.TRACE_LEVEL, "service": sc.SERVICE_NAME,
            "stamp_prefix": sc.CONFIG_STAMP}
    conf: dict[str, Any] = {k: v.encode() for k, v in keys.items()}
    conf.update(rng_suffixes=tuple(s.encode() for s in RNG_SUFFIXES), watch_service=watch_service, src=src)
    _otlpin.configure(Rng, Event, EpochTracker, EPOCH_TAGS, event_slots(), conf, parse_value)
    return _otlpin.decode

