"""The event model every source feeds: live records, upstream log lines, OTLP files, trace backends.

An :class:`Event` is one cptrace call: its tag, the rank that emitted it, its position in that rank's stream
(``seq``, authoritative inside a rank), a timestamp, the rank's ``epoch`` (count of ``reset`` records before it) and
its typed fields (values as :func:`cptrace_otel.model.logline.parse_value` returns them).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(slots=True)
class Event:
    tag: str
    rank: int
    seq: int
    ts: int                      # ns; wall clock for live records, the ``ts=`` field (monotonic) for log lines
    epoch: int
    fields: dict[str, Any]
    level: int = 1               # the level argument of the cptrace call (1 when unknown)
    src: str = ""                # file path, "live", or a backend URL
    line_no: int = 0             # 1-based line in ``src`` for log files, 0 otherwise

    def get(self, key: str, default: object = None) -> Any:
        return self.fields.get(key, default)

    @property
    def node_id(self) -> int | None:
        v = self.fields.get("node_id")
        return v if isinstance(v, int) else None


def int_field(v: object) -> int | None:
    """``v`` when it is an int (not a bool: a field value's type is exact), else None: how a rule reads a field that
    must be an integer (an id, a count) and treats anything else as absent."""
    return v if type(v) is int else None


# Tags grouped by the trace level that enables them (docs/domain.md §3.2/§3.3).
LEVEL_OF_TAG: dict[str, int] = {
    "config": 1, "reset": 1, "rid_map": 1, "insert": 1, "split": 1, "prepare": 1, "backup": 1, "evict": 1,
    "reload": 1, "ack": 2, "free": 2, "compose": 2, "store": 2, "fwd_hash": 3,
    # SGLang's own kv-canary violation lines (cptrace_otel.model.canary): read from the same logs, any trace level
    "kv_canary": 1,
    # the L3 storage tier (cptrace_otel.model.l3): the transfers' completions are acks (level 2), like the d2h/h2d acks
    "l3_backup": 1, "l3_query": 1, "l3_prefetch": 1, "l3_hit": 1, "l3_ack": 2,
    # a layer-wise load-back step, its layers' completions and the first read of each (checks.rules_load)
    "ld_start": 2, "ld_layer": 2, "ld_read": 2,
    # a hybrid tree's sliding-window (SWA) pages moved by a backup or a load-back (checks.rules_swa)
    "swa": 2,
    # a hybrid tree's Mamba state slot moved by a backup or a load-back (checks.rules_mamba)
    "mamba": 2,
    # the opt-in audit of host copies at rest (cptrace_otel.traced.sglang._audit): written off the scheduler's thread
    "audit": 2,
}
