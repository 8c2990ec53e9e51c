"""cptrace-otel: SGLang CP-HiCache KV round-trip tracing as OpenTelemetry spans, with online invariant checks.

Drop-in for ``sglang.srt.mem_cache.cp_hicache_trace``::

    from cptrace_otel import cptrace, trace_level, trace_enabled, rng, khash, knz, fwd_hash

Importing this package loads nothing heavy (no torch, no protobuf, no network): the gate is one int compare and the
pipeline starts on the first enabled record.
"""

from ._version import __version__
from .traced.api import (
    configure,
    cptrace,
    flush,
    fwd_hash,
    get_config,
    khash,
    knz,
    reload_config,
    rng,
    shutdown,
    trace_enabled,
    trace_level,
)

__all__ = [
    "__version__",
    "configure",
    "cptrace",
    "flush",
    "fwd_hash",
    "get_config",
    "khash",
    "knz",
    "reload_config",
    "rng",
    "shutdown",
    "trace_enabled",
    "trace_level",
]
