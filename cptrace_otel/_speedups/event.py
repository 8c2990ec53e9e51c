"""What the C readers' shared part needs from Python (``event.c``, the Event builder, and ``value.c``'s configured
state, both part of ``_logreader``, ``_intake``, ``_otlpin`` and ``_jaegerin``): the layout of
:class:`cptrace_otel.model.events.Event`, and the arguments of ``configure`` that every reader (or every span reader)
takes alike."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..model.events import Event


def event_slots() -> tuple[str, ...] | None:
    """Event's field names in constructor order when its __init__ does nothing but assign them (a slots dataclass
    without __post_init__ or init=False fields): the C code may then fill the slots itself. None otherwise."""
    fs = dataclasses.fields(Event)
    if hasattr(Event, "__post_init__") or "__dict__" in dir(Event) or not all(f.init for f in fs):
        return None
    return tuple(f.name for f in fs)


def reader_types() -> tuple[Any, ...]:
    """The first five arguments of every C reader's ``configure`` (value.h: reader_configure): the Rng type, Event,
    EpochTracker, the epoch tags and :func:`event_slots`."""
    from ..checks.epochs import EPOCH_TAGS, EpochTracker
    from ..model.logline import Rng

    return Rng, Event, EpochTracker, EPOCH_TAGS, event_slots()


def span_reader_keys(src: str) -> dict[str, Any]:
    """The ``keys`` every span reader's ``configure`` reads (``_otlpin``, ``_jaegerin``; value.h:
    reader_configure_spans): the shared attribute keys as bytes, ``rng_suffixes`` and ``src`` (the records'
    ``Event.src``). A reader adds its own keys to it."""
    from ..model import semconv as sc
    from ..model.attrs import RNG_SUFFIXES

    keys = {"prefix": sc.FIELD_PREFIX, "seq": sc.SEQ, "epoch": sc.EPOCH, "level": sc.LEVEL, "rank": sc.RANK,
            "violation": sc.VIOLATION, "event_violation": sc.EVENT_VIOLATION, "run_id": sc.RUN_ID,
            "cp_rank": sc.CP_RANK, "trace_level": sc.TRACE_LEVEL}
    conf: dict[str, Any] = {k: v.encode() for k, v in keys.items()}
    conf.update(rng_suffixes=tuple(s.encode() for s in RNG_SUFFIXES), src=src)
    return conf
