"""Loader of ``_hot`` (``hot.c``): the gate of :func:`cptrace_otel.traced.api.cptrace` in C, so that a call below the
level or of a sampled-out node returns before its keyword arguments become a dict."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any


def load(slow: Callable[..., None], slow_enabled: Callable[..., Any],
         names: tuple[str, str]) -> tuple[ModuleType, Any] | None:
    """The C module and the gate's state it reads, a fresh ``_hot.State`` (``level``, ``drop``, ``submit``: api's
    Python definitions read the same object), configured with ``slow`` and ``slow_enabled`` (api's Python
    ``cptrace`` and ``trace_enabled``, which decide every call the C code does not) and ``names`` (the node-id
    field and the split tag: names the C code must not declare); None when it was not built."""
    try:
        from . import _hot  # type: ignore[attr-defined]
    except ImportError:
        return None
    state = _hot.State()
    _hot.configure(slow, slow_enabled, state, names)
    return _hot, state
