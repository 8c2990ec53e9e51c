"""Loader of ``_lockstep`` (``lockstep.c``): the cross-rank rule C1's per-epoch state and step in C
(:class:`cptrace_otel.checks.cross_base.EpochC1` is the Python twin)."""

from __future__ import annotations

from types import ModuleType


def load(names: tuple[str, ...]) -> ModuleType | None:
    """The ``_lockstep`` module (its type ``EpochC1``), configured with ``names`` (``cross_base.C1_NAMES``: the
    fields a C1 tuple reads and the two tags that change how, names the C code must not declare), or None when the
    extension was not built."""
    try:
        from . import _lockstep  # type: ignore[attr-defined]
    except ImportError:
        return None
    _lockstep.configure(names)
    return _lockstep
