"""Span, event and attribute names shared by the exporter, the online checks and the analyzer.

Every key the project writes to OTLP is declared here, once.  Rules of the schema:

* A cptrace field ``k`` becomes the event attribute ``hicache.<k>`` (:func:`field_key`), typed: ints stay ints
  (so Jaeger tag search and TraceQL numeric comparisons work), floats are doubles, everything else is the
  upstream space-free rendering as a string (lists such as ``chain=[3,4]`` included).
* A range summary ``rng()`` = ``(cnt=N,min=a,max=b,first=c,last=d)`` becomes five int attributes
  ``hicache.<k>.cnt`` ... ``hicache.<k>.last`` (:data:`RNG_PARTS`); its sentinels ``(none)``, ``(0)`` and
  ``(err:...)`` stay one string attribute ``hicache.<k>``.
* Ids and hashes are attributes, never span names or metric dimensions.
"""

from __future__ import annotations

from typing import Final

# -- resource (one per rank process) -------------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
DEFAULT_SERVICE_NAME: Final = "sglang-hicache"
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
CP_RANK: Final = "sglang.cp.rank"
TP_RANK: Final = "sglang.tp.rank"
DP_RANK: Final = "sglang.dp.rank"
RUN_ID: Final = "cptrace.run_id"
TRACE_LEVEL: Final = "cptrace.level"
RANK_SOURCE: Final = "cptrace.rank.source"   # where a discovered rank came from (cptrace_otel.traced.ranks)
SAMPLE: Final = "cptrace.sample"             # fraction of node lineages kept, on sampled streams only
# the rank's config record on the resource (cptrace_otel.model.config_stamp): its fields, seq, epoch and level;
# every key of the stamp starts with CONFIG_STAMP, so a reader finds a stamp by that one prefix
CONFIG_STAMP: Final = "cptrace.config"
CONFIG_PREFIX: Final = CONFIG_STAMP + "."         # + "hicache.<field>"
CONFIG_SEQ: Final = CONFIG_STAMP + "_seq"         # (not under CONFIG_PREFIX: the fields stay exactly the record's)
CONFIG_EPOCH: Final = CONFIG_STAMP + "_epoch"
CONFIG_LEVEL: Final = CONFIG_STAMP + "_level"
SCOPE_NAME: Final = "cptrace_otel"

# -- span names (low cardinality; one per stage) --------------------------------------------------------------
SPAN_D2H: Final = "hicache.d2h"          # prepare -> ack dir=d2h (backup records inside)
SPAN_H2D: Final = "hicache.h2d"          # reload -> ack dir=h2d
SPAN_NODE: Final = "hicache.node"        # structural records of one node on one rank (insert, split, evict, ...)
SPAN_RANK: Final = "hicache.rank"        # records with no node: config, reset, free of unowned slots
SPAN_REQUEST: Final = "hicache.request"  # per-request trace: fwd_hash records, links to node traces from rid_map
SPAN_L3_BACKUP: Final = "hicache.l3.backup"      # l3_backup -> l3_ack dir=backup (host pages to L3 storage)
SPAN_L3_PREFETCH: Final = "hicache.l3.prefetch"  # l3_prefetch -> l3_ack dir=prefetch (L3 storage to host pages)
# These are span *kinds* (attribute SPAN_KIND); the span name says rank and stage: span_name(rank, kind), e.g.
# "rank 3 · d2h". The node kind is the rank's lane in a node trace: the d2h/h2d spans are its children.
SPAN_LANE: Final = SPAN_NODE
STAGE_WORDS: Final = {SPAN_D2H: "d2h", SPAN_H2D: "h2d", SPAN_NODE: "node", SPAN_RANK: "process",
                      SPAN_REQUEST: "request", SPAN_L3_BACKUP: "l3-backup", SPAN_L3_PREFETCH: "l3-prefetch"}

# -- attributes on every event ----------------------------------------------------------------------------------
FIELD_PREFIX: Final = "hicache."
NODE_ID: Final = "hicache.node_id"
NEW_ID: Final = "hicache.new_id"
OP: Final = "hicache.op"
RID: Final = "hicache.rid"
SEQ: Final = "cptrace.seq"               # per-rank record order (authoritative inside a rank)
EPOCH: Final = "cptrace.epoch"           # per-rank count of reset records so far
LEVEL: Final = "cptrace.record.level"    # the level argument the record was emitted at
RANK: Final = "sglang.cp.rank"           # also stamped on spans so cross-rank views need no resource join

# -- sidecar pools (record fields; their attributes are hicache.<field>) -----------------------------------------
# Pools whose slots follow the KV's (SGLang 0.5.23's sidecars with indices_from_pool=KV: the DSA/NSA indexer's
# index_k_with_scale_buffer, ``indexer``). ``config`` names them (SIDECARS, "+"-joined); ``backup`` and ``reload``
# name those their copy op moves (SIDE_MOVED, "+"-joined, "-" for none); ``backup`` and ``ack dir=h2d`` carry each one's
# fingerprint of the node's pages as the KV's h/nz/hp are (side_field(SIDE_H, pool), ...). A KV-only cache writes
# none of these fields.
SIDECARS: Final = "sidecars"
SIDE_MOVED: Final = "sp"
SIDE_H: Final = "sh_"
SIDE_NZ: Final = "snz_"
SIDE_HP: Final = "shp_"


def side_field(kind: str, pool: str) -> str:
    """The record field of fingerprint ``kind`` (:data:`SIDE_H`, :data:`SIDE_NZ`, :data:`SIDE_HP`) of sidecar
    ``pool``: ``sh_indexer``."""
    return kind + pool


# -- span attributes -------------------------------------------------------------------------------------------
STAGE_CLOSED: Final = "cptrace.span.closed_by"  # "tag" (closing record), timeout, reset, limit, bound, flush
VIOLATION: Final = "cptrace.violation"          # comma-joined codes (H1..H4, ZERO, HASH) found on this span
VIOLATION_RULES: Final = "cptrace.violation.rules"
VIOLATION_CODE_PREFIX: Final = "cptrace.violation."  # + code: boolean True per code found on the span
SPAN_KIND: Final = "cptrace.span.kind"          # SPAN_D2H, SPAN_H2D, SPAN_NODE (lane), SPAN_RANK, SPAN_REQUEST
CONTINUES: Final = "cptrace.span.continues"     # True on a stage span continuing one cut by timeout/limit/lane end
LINK_KIND: Final = "cptrace.link.kind"          # on span links: "evidence" (finding -> record), "continues",
#                                                 "l3-prefetch" (an l3_hit's lane -> the prefetch that fetched it) or
#                                                 "request" (-> SGLang's request span, cptrace_otel.model.reqlink)
REQUEST_LINKS_DROPPED: Final = "cptrace.link.request.dropped"  # request links past reqlink.MAX_LINKS on this span
CERTAINTY: Final = "cptrace.certainty"

# -- violation event (one per finding, on the span that holds the evidence) ------------------------------------
EVENT_VIOLATION: Final = "hicache.violation"
V_CODE: Final = "code"
V_RULE: Final = "rule"
V_CERTAINTY: Final = "certainty"
V_EVIDENCE: Final = "evidence_seq"
V_MESSAGE: Final = "message"
V_EVIDENCE_DESC: Final = "evidence"      # "seq 171 backup op=5 rank 3; ...": the evidence records, readable

# -- pipeline self-telemetry (resource-level counters on the rank span at flush) -----------------------------------
DROPPED: Final = "cptrace.dropped"
# Set on the rank span by an exporter worker that replaced one that died: how many restarts so far, and that the
# online checks started over (their state died with the old worker: findings spanning the restart can be missed).
EXPORTER_RESTARTS: Final = "cptrace.exporter.restarts"
CHECKS_RESTARTED: Final = "cptrace.checks.restarted"

RNG_PARTS: Final = ("cnt", "min", "max", "first", "last")


def span_name(rank: int, kind: str) -> str:
    """Span name of a ``kind`` span of ``rank``: ``"rank 3 · d2h"`` (ranks and stages are bounded sets)."""
    return f"rank {rank} \u00b7 {STAGE_WORDS.get(kind, kind)}"


def field_key(name: str) -> str:
    """Attribute key of the cptrace field ``name``."""
    return FIELD_PREFIX + name


def rng_key(name: str, part: str) -> str:
    """Attribute key of one part (see :data:`RNG_PARTS`) of the range summary in field ``name``."""
    return f"{FIELD_PREFIX}{name}.{part}"
