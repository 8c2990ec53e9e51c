"""Loader of ``_hot`` (``hot.c``): the gate of :func:`cptrace_otel.api.cptrace` in C, so that a call below the
level or of a sampled-out node returns before its keyword arguments become a dict."""

from __future__ import annotations

from types import ModuleType
from typing import Callable


def load(slow: Callable[..., None], state: dict, names: tuple[str, str, str, str, str]) -> ModuleType | None:
    """The C module configured with ``slow`` (api's Python ``cptrace``, which decides every call the C code does
    not), ``state`` (api's module globals, read on each call) and ``names`` (the globals holding the gate, the drop
    set and the submit function, then the node-id field and the split tag: names the C code must not declare), or
    None when it was not built."""
    try:
        from . import _hot  # type: ignore[attr-defined]
    except ImportError:
        return None
    _hot.configure(slow, state, names)
    return _hot
