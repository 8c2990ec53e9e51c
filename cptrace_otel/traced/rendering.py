"""Helpers of the pipeline's deque path (:mod:`cptrace_otel.traced.pipeline`): the fingerprint package's deferred
values for the drainer, the imports the drainer needs made on the caller's thread, and a buffered record's size
estimate for the byte bound."""

from __future__ import annotations

from typing import Any

from ..model.grammar import SIDE


def load_deferred() -> tuple[Any, Any]:
    """``(is_deferred, resolve)`` of the fingerprint package, or ``(None, None)`` when it cannot be imported."""
    try:
        from ..fingerprint import is_deferred, resolve

        return is_deferred, resolve
    except Exception:
        return None, None


def import_drainer_needs() -> None:
    """Import on the caller's thread what the drainer imports first: a thread importing at a fork leaves that
    module's lock held in the child for ever, and the child's drainer would block on it (seen with ``os.fork``)."""
    load_deferred()
    from ..model import semconv  # noqa: F401 - Config.resource(), in the drainer's INIT message


def estimate(fields: dict) -> int:
    """Rough bytes one buffered record holds: a constant per record and field plus its strings' and lists' lengths
    (one pass over the values; only called once the buffer is long, see ``pipeline.UNMEASURED``). The constants
    are :data:`cptrace_otel.model.grammar.SIDE`'s, which the ring's side deque (``ring.c``) counts with too."""
    n = SIDE.base + SIDE.per_field * len(fields)
    for v in fields.values():
        t = type(v)
        if t is str or t is bytes:
            n += len(v)
        elif t is list or t is tuple:
            n += SIDE.per_item * len(v)
    return n
