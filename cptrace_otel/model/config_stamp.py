"""A rank's ``config`` record carried on the OTLP resource of every request its exporter sends.

Why: the exporter puts the ``config`` record in the rank trace (``blake2b(run|rank|R)``), while a node's records
go to the node trace. Behind the collector's ``loadbalancing`` exporter (routing key ``traceID``) the two usually
land on different ``cptrace-otel serve`` replicas, so a replica checking a node trace does not know the CP group
size, mode, IO rank, sidecars or storage identity the config states, and the rules that read them judge wrongly
(C1 compared the ranks seen so far as the whole group; C3, C5 and C5-fence had no mode). The resource goes with
every request, so every replica that receives any span of the rank sees its config.

Contract:

* :func:`stamp` gives the resource attributes of one ``config`` record: its fields as ``cptrace.config.hicache.<k>``
  (the one fields -> attributes mapping, :func:`~.attrs.fields_to_attributes`, behind :data:`PREFIX`), its seq as
  :data:`SEQ`, its epoch as :data:`EPOCH` and its level as :data:`LEVEL`. A later ``config`` record replaces the
  stamp (the whole record, never a mix of two).
* :func:`record` gives back, from a resource's attributes, the ``config`` record of ``rank`` as an
  :class:`~.events.Event` (the same tag, seq, epoch, level and fields; time: its ``ts`` field), or None when the
  resource has no stamp (an exporter without it, another service): the readers then behave as before.

The readers of whole runs (``check`` over OTLP files, Jaeger, Tempo) ignore these attributes: they read the config
record itself, so their findings do not change.
"""

from __future__ import annotations

from typing import Any

from . import semconv as sc
from .attrs import attributes_to_fields, fields_to_attributes
from .events import Event

PREFIX, SEQ, EPOCH, LEVEL = sc.CONFIG_PREFIX, sc.CONFIG_SEQ, sc.CONFIG_EPOCH, sc.CONFIG_LEVEL


def stamp(ev: Event) -> dict[str, Any]:
    """The resource attributes that carry the ``config`` record ``ev`` (see the module doc)."""
    out = {PREFIX + k: v for k, v in fields_to_attributes(ev.fields).items()}
    out[SEQ], out[EPOCH], out[LEVEL] = ev.seq, ev.epoch, ev.level
    return out


def restamp(resource: dict[str, Any], ev: Event) -> dict[str, Any]:
    """``resource`` with its config stamp (if any) replaced by that of ``ev``: a new dict, ``resource`` untouched."""
    kept = {k: v for k, v in resource.items() if not k.startswith(PREFIX) and k not in (SEQ, EPOCH, LEVEL)}
    kept.update(stamp(ev))
    return kept


def record(attrs: dict[str, Any], rank: int, src: str = "otlp") -> Event | None:
    """The ``config`` record of ``rank`` stamped on a resource's ``attrs`` (None when there is none, or when its
    seq is not an int: a stamp this module did not write)."""
    seq = attrs.get(SEQ)
    if type(seq) is not int:
        return None
    n = len(PREFIX)
    fields = attributes_to_fields((k[n:], v) for k, v in attrs.items() if k.startswith(PREFIX))
    epoch, level, ts = attrs.get(EPOCH), attrs.get(LEVEL), fields.get("ts")
    return Event("config", rank, seq, ts if type(ts) is int else 0, epoch if type(epoch) is int else 0, fields,
                 level if type(level) is int else 1, src, 0)
