"""Span event attributes: the typed fields of one record as OTLP attributes, built lazily (:class:`EventAttrs`).

Split from spans.py (the trace model); spans.py re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import semconv as sc
from .attrs import fields_to_attributes
from .logline import Rng


def event_attributes(fields: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``attrs.fields_to_attributes(fields)`` and the approximate encoded size of those attributes
    (:func:`_approx_bytes`, the span byte cap's estimate)."""
    return fields_to_attributes(fields), _approx_bytes(fields)


class EventAttrs(Mapping):
    """A span event's attributes, kept as the event's typed fields plus its seq / epoch / level until someone reads
    them: ``attrs.fields_to_attributes(fields)`` followed by ``cptrace.seq``, ``cptrace.epoch``,
    ``cptrace.record.level``, in that order (a read-only mapping equal to that dict).

    Why lazy: the exporter's protobuf encoder (``export.otlp``) writes these straight from the typed fields, so the
    per-event attribute dict (most of the exporter's time per event) is only built for the JSON file sink, tests and
    other readers. Writing to it turns it into a plain dict copy (``dirty``), which the encoder then uses instead.
    """

    __slots__ = ("fields", "seq", "epoch", "level", "_d", "dirty")

    def __init__(self, fields: dict[str, Any], seq: int, epoch: int, level: int) -> None:
        self.fields = fields
        self.seq = seq
        self.epoch = epoch
        self.level = level
        self._d: dict[str, Any] | None = None
        self.dirty = False

    def as_dict(self) -> dict[str, Any]:
        d = self._d
        if d is None:
            d = fields_to_attributes(self.fields)
            d[sc.SEQ] = self.seq
            d[sc.EPOCH] = self.epoch
            d[sc.LEVEL] = self.level
            self._d = d
        return d

    def __getitem__(self, key: str) -> Any:
        if key == sc.SEQ and not self.dirty:
            return self.seq
        return self.as_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        if key == sc.SEQ and not self.dirty:
            return self.seq
        return self.as_dict().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.as_dict()[key] = value
        self.dirty = True

    def __delitem__(self, key: str) -> None:
        del self.as_dict()[key]
        self.dirty = True

    def __iter__(self) -> Any:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def items(self) -> Any:
        return self.as_dict().items()

    def keys(self) -> Any:
        return self.as_dict().keys()

    def values(self) -> Any:
        return self.as_dict().values()

    def copy(self) -> dict[str, Any]:
        return dict(self.as_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventAttrs):
            other = other.as_dict()
        return self.as_dict() == other

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dict

    def __repr__(self) -> str:
        return repr(self.as_dict())


def _approx_bytes(fields: dict[str, Any]) -> int:
    """Approximate encoded size of an event's attributes (the span byte cap)."""
    n = 16 + 12 * len(fields)
    for v in fields.values():
        t = type(v)
        if t is str:
            n += len(v) - 4
        elif t is not int and t is not float:
            n += 48 if t is Rng else len(str(v))
    return n
