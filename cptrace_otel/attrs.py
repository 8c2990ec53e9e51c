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


def _scalar_attr(v: Any) -> int | float | str:
    t = type(v)
    if t is int:
        return v if _INT64_MIN <= v <= _INT64_MAX else str(v)  # OTLP ints are int64; wider ints travel as text
    if t is float or t is str:
        return v
    return render_value(v)


def fields_to_attributes(fields: dict[str, Any], out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Attributes of one record's fields (``hicache.<k>``; range summaries as five int parts)."""
    out = {} if out is None else out
    for k, v in fields.items():
        if type(v) is Rng:
            base = _PREFIX + k + "."
            for part, pv in zip(sc.RNG_PARTS, v):
                out[base + part] = _scalar_attr(pv)
        else:
            out[_PREFIX + k] = _scalar_attr(v)
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
