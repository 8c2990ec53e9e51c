"""What the C Event builder (``event.c``, part of ``_logreader`` and ``_intake``) needs to know of
:class:`cptrace_otel.model.events.Event`."""

from __future__ import annotations

import dataclasses

from ..model.events import Event


def event_slots() -> tuple[str, ...] | None:
    """Event's field names in constructor order when its __init__ does nothing but assign them (a slots dataclass
    without __post_init__ or init=False fields): the C code may then fill the slots itself. None otherwise."""
    fs = dataclasses.fields(Event)
    if hasattr(Event, "__post_init__") or "__dict__" in dir(Event) or not all(f.init for f in fs):
        return None
    return tuple(f.name for f in fs)
