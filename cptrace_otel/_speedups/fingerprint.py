"""Loader of ``_fingerprint`` (``fingerprint.c``): exact CPU ``khash``/``knz``/``rng`` for
:mod:`cptrace_otel.fingerprint.cpu`."""

from __future__ import annotations

from types import ModuleType


def load() -> ModuleType | None:
    """The C module (``sums``, ``khash_knz``, ``khash``, ``knz``, ``minmax``, ``kernel``; see ``fingerprint.c``), or
    None when it was not built. It needs nothing from Python: the formula constants are upstream's and fixed."""
    try:
        from . import _fingerprint  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _fingerprint
