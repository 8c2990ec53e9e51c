"""Loader of ``_intake`` (``intake.c``): the C fast path of the exporter worker's intake
(:meth:`cptrace_otel.export.worker.Exporter._item_event` over a batch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def load(src: str) -> Callable[..., Any] | None:
    """``intake(items, seq, default_rank, epochs, max_chars, value_fn, slow) -> [Event]`` (the worker's Events, with
    ``src`` as their ``Event.src``), or None when it was not built."""
    try:
        from . import _intake  # type: ignore[attr-defined]
    except ImportError:
        return None
    from .event import reader_types

    _intake.configure(*reader_types(), src)
    return _intake.intake
