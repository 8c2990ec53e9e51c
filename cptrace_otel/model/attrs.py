"""Fields <-> OTLP attributes: the one mapping used by the exporter (write) and the OTLP readers (read back).

Write: :func:`fields_to_attributes` turns typed fields (see :mod:`cptrace_otel.model.logline`) into a flat dict of
attribute key -> int | float | str, following the schema in :mod:`cptrace_otel.model.semconv`.
Read: :func:`attributes_to_fields` inverts it exactly, so an event read back from Jaeger, Tempo or an OTLP file is
the event that was written (same keys, same order, same typed values).
Span events: :class:`EventAttrs` keeps one record's typed fields as its span event's attributes, built from them
lazily by the same mapping, and :func:`approx_bytes` estimates their encoded size (the span byte cap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import semconv as sc
from .logline import Rng, fast_value, render_value

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PREFIX = sc.FIELD_PREFIX
_PLEN = len(_PREFIX)
# What follows a field's key in the key of each range part (semconv.rng_key: "hicache.<k>" + ".cnt", ...). With
# FIELD_PREFIX these are the whole key layout; the C span-event encoder gets both from here when it is loaded.
RNG_SUFFIXES: tuple[str, ...] = tuple(sc.rng_key("", p)[len(sc.field_key("")):] for p in sc.RNG_PARTS)

# field name -> its attribute key / its five range part keys: the same strings every time (no concatenation and
# no hashing of a fresh key per event). Bounded: a caller inventing names must not grow them forever.
_KEYS: dict[str, str] = {}
_RKEYS: dict[str, tuple[str, ...]] = {}
_KEYS_MAX = 10_000


def _scalar_attr(v: Any) -> int | float | str:
    t = type(v)
    if t is int:
        return v if _INT64_MIN <= v <= _INT64_MAX else str(v)  # OTLP ints are int64; wider ints travel as text
    if t is float or t is str:
        return v
    return render_value(v)


def attribute_key(name: str) -> str:
    """Attribute key of field ``name`` (``semconv.field_key``), cached."""
    key = _KEYS.get(name)
    if key is None:
        if len(_KEYS) >= _KEYS_MAX:
            _KEYS.clear()
        key = _KEYS[name] = sc.field_key(name)
    return key


def range_keys(name: str) -> tuple[str, ...]:
    """Attribute keys of the five parts of a range summary in field ``name`` (``semconv.rng_key``), cached."""
    keys = _RKEYS.get(name)
    if keys is None:
        if len(_RKEYS) >= _KEYS_MAX:
            _RKEYS.clear()
        base = sc.field_key(name)
        keys = _RKEYS[name] = tuple(base + s for s in RNG_SUFFIXES)
    return keys


def fields_to_attributes(fields: dict[str, Any], out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Attributes of one record's fields (``hicache.<k>``; range summaries as five int parts), in field order.

    The one fields -> attributes mapping: the span builder's lazy event attributes, both OTLP encoders (the
    protobuf one writes its bytes, a test holds them equal) and the readers' inverse follow it. Hot (every event
    of the JSON file sink): the common types are tested first and the keys come from caches."""
    out = {} if out is None else out
    keys = _KEYS
    for k, v in fields.items():
        t = type(v)
        if t is int:
            out[keys.get(k) or attribute_key(k)] = v if _INT64_MIN <= v <= _INT64_MAX else str(v)
        elif t is str or t is float:
            out[keys.get(k) or attribute_key(k)] = v
        elif t is Rng:
            for pk, pv in zip(_RKEYS.get(k) or range_keys(k), v, strict=False):
                out[pk] = pv if type(pv) is int and _INT64_MIN <= pv <= _INT64_MAX else _scalar_attr(pv)
        else:
            out[keys.get(k) or attribute_key(k)] = render_value(v)
    return out


def _key_layout(key: str) -> tuple[str, str | None] | None:
    """What attribute ``key`` is, computed and cached in :data:`_LAYOUT`: None when it is not a field's (no
    ``hicache.`` prefix); ``(field, None)`` for a field's own key; ``(field, part)`` for a part of a range summary."""
    if len(_LAYOUT) >= _KEYS_MAX:
        _LAYOUT.clear()
    got: tuple[str, str | None] | None = None
    if key.startswith(_PREFIX):
        name = key[_PLEN:]
        base, dot, part = name.rpartition(".")
        got = (base, part) if dot and part in sc.RNG_PARTS else (name, None)
    _LAYOUT[key] = got
    return got


_LAYOUT: dict[str, tuple[str, str | None] | None] = {}   # attribute key -> _key_layout (bounded as _KEYS)


def attributes_to_fields(attrs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Inverse of :func:`fields_to_attributes`: typed fields, in attribute order. Non-``hicache.`` keys are skipped.
    Text values are read by the grammar's fast path (``logline.fast_value``: the same values as ``parse_value``)."""
    fields: dict[str, Any] = {}
    pending: dict[str, dict[str, Any]] | None = None
    layout = _LAYOUT
    for key, val in attrs:
        lay = layout.get(key)
        if lay is None:
            if key in layout:
                continue   # a key known not to be a field's
            lay = _key_layout(key)
            if lay is None:
                continue
        name, part = lay
        if part is not None:
            if pending is None:
                pending = {}
            parts = pending.setdefault(name, {})
            if not parts:
                fields[name] = None  # keep the field's position
            parts[part] = val if not isinstance(val, str) else fast_value(val)
            if len(parts) == 5:
                fields[name] = Rng(*(parts[p] for p in sc.RNG_PARTS))
                del pending[name]
            continue
        fields[name] = fast_value(val) if isinstance(val, str) else val
    if not pending:
        return fields
    for base, parts in pending.items():  # incomplete summaries (should not happen): keep what is there, as text
        fields[base] = ",".join(f"{p}={parts[p]}" for p in sc.RNG_PARTS if p in parts)
    return fields


# -- span event attributes ---------------------------------------------------------------------------------------
def event_attributes(fields: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``attrs.fields_to_attributes(fields)`` and the approximate encoded size of those attributes
    (:func:`approx_bytes`, the span byte cap's estimate)."""
    return fields_to_attributes(fields), approx_bytes(fields)


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

    def get(self, key: str, default: object = None) -> Any:
        if key == sc.SEQ and not self.dirty:
            return self.seq
        return self.as_dict().get(key, default)

    def __setitem__(self, key: str, value: object) -> None:
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


def approx_bytes(fields: dict[str, Any]) -> int:
    """Approximate encoded size of an event's attributes (the span byte cap)."""
    n = 16 + 12 * len(fields)
    for v in fields.values():
        t = type(v)
        if t is str:
            n += len(v) - 4
        elif t is not int and t is not float:
            n += 48 if t is Rng else len(str(v))
    return n
