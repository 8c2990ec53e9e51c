"""Fields <-> OTLP attributes: the one mapping used by the exporter (write) and the OTLP readers (read back).

Write: :func:`fields_to_attributes` turns typed fields (see :mod:`cptrace_otel.logline`) into a flat dict of
attribute key -> int | float | str, following the schema in :mod:`cptrace_otel.semconv`.
Read: :func:`attributes_to_fields` inverts it exactly, so an event read back from Jaeger, Tempo or an OTLP file is
the event that was written (same keys, same order, same typed values).
"""

from __future__ import annotations

from typing import Any, Iterable

from . import semconv as sc
from .logline import Rng, parse_value, render_value

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
            for pk, pv in zip(_RKEYS.get(k) or range_keys(k), v):
                out[pk] = pv if type(pv) is int and _INT64_MIN <= pv <= _INT64_MAX else _scalar_attr(pv)
        else:
            out[keys.get(k) or attribute_key(k)] = render_value(v)
    return out


def attributes_to_fields(attrs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Inverse of :func:`fields_to_attributes`: typed fields, in attribute order. Non-``hicache.`` keys are skipped."""
    fields: dict[str, Any] = {}
    pending: dict[str, dict[str, Any]] = {}
    for key, val in attrs:
        if not key.startswith(_PREFIX):
            continue
        name = key[_PLEN:]
        base, dot, part = name.rpartition(".")
        if dot and part in sc.RNG_PARTS:
            parts = pending.setdefault(base, {})
            if not parts:
                fields[base] = None  # keep the field's position
            parts[part] = val if not isinstance(val, str) else parse_value(val)
            if len(parts) == 5:
                fields[base] = Rng(*(parts[p] for p in sc.RNG_PARTS))
                del pending[base]
            continue
        fields[name] = parse_value(val) if isinstance(val, str) else val
    for base, parts in pending.items():  # incomplete summaries (should not happen): keep what is there, as text
        fields[base] = ",".join(f"{p}={parts[p]}" for p in sc.RNG_PARTS if p in parts)
    return fields
