"""The CP mode of a traced SGLang process (the ``config`` record's ``mode``), read from SGLang's own server arguments.

Contract:

* :func:`derive` maps SGLang's server arguments (0.5.20 and 0.5.23 name them alike) to a mode of
  :data:`cptrace_otel.model.config.CP_MODES`, with the arguments it read as space-free ``name:value`` tokens:

  - ``--enable-kv-cache-sharding`` with ``--attn-cp-size N>1`` (0.5.23, PD-prefill only): ``sharded`` (page ``P`` on
    rank ``(b+P)%N``; SGLang refuses an L3 backend there);
  - ``--enable-dsa-cache-layer-split`` with ``--attn-cp-size N>1`` (0.5.23, PD-prefill only): ``layersplit`` (each CP
    rank keeps its own range of the DSA KV and indexer layers);
  - ``--attn-cp-size N>1`` otherwise: ``prefill_cp``. Stock prefill CP (zigzag and interleave, ``--enable-prefill-cp``
    or the DSA models' own) all-gathers the KV and writes it whole on every CP rank, so every rank holds and backs
    up the same KV, while L3 keys are per CP rank (the ``file`` backend's ``_cp<r>_<N>``, Mooncake's ``cp<r>``);
    for MLA stock 0.5.23 elects one storage writer by the global TP rank, so only CP rank 0 writes (SGLang #37149;
    L3c finds it in this mode);
  - ``--dcp-size D>1`` (MLA only): ``dcp``; else ``none``.

* :func:`resolve` decides the mode a ``config`` record states: a group of one rank is ``none``; a mode someone set
  (``instrument(cp_mode=...)``, else ``CPTRACE_CP_MODE``) wins, with one warning where the server arguments say
  otherwise; else the derived one. Where nothing says (no server arguments published, or an attention CP group of
  several ranks that the arguments do not explain) the mode is ``""`` (unknown, one warning): the ``config`` record
  then states none, and ``check`` lists the mode-dependent rules as unchecked rather than judge them under a guess.
* Never raises and imports nothing of SGLang: it reads ``sglang.srt.runtime_context`` only when SGLang has imported it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

logger = logging.getLogger("cptrace_otel.sglang")

# the device KV pools whose KV SGLang treats as rank-replicated (``is_mla_model`` of its storage config)
MLA_POOLS = frozenset(("MLATokenToKVPool", "DeepSeekV4TokenToKVPool"))


class CpMode(NamedTuple):
    """What a ``config`` record says about the mode: ``mode`` ("" unknown), ``src`` (who decided: ``instrument``,
    ``CPTRACE_CP_MODE``, ``server_args``, ``cp_group`` for a group of one, ``unknown``) and ``why`` (the tokens
    read)."""

    mode: str
    src: str
    why: list[str]


def server_args() -> Any:
    """SGLang's published server arguments (``runtime_context.get_server_args()``), None where SGLang has not
    imported its runtime context or published none."""
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is None:
        return None
    try:
        return rc.get_server_args()
    except Exception:   # nothing published yet
        return None


def is_mla(pool: object) -> int:
    """1 when ``pool`` (the device KV pool) is one SGLang treats as rank-replicated MLA, 0 when not, -1 unknown."""
    if pool is None:
        return -1
    return int(any(c.__name__ in MLA_POOLS for c in type(pool).__mro__))


def _num(sa: object, name: str) -> int:
    try:
        return int(getattr(sa, name, 1) or 1)
    except Exception:   # (a derived width SGLang cannot compute yet raises on read)
        return 1


def derive(sa: object, cp_size: int, mla: int) -> tuple[str, list[str]]:
    """``(mode, tokens)`` from server arguments ``sa`` (None: ``("", ...)``) for an attention CP group of
    ``cp_size`` ranks; ``mode`` is ``""`` where the arguments do not explain the group."""
    why = [f"cp_group:{cp_size}", f"mla:{mla}"]
    if sa is None:
        return "", [*why, "server_args:none"]
    n, dcp = _num(sa, "attn_cp_size"), _num(sa, "dcp_size")
    sharding = bool(getattr(sa, "enable_kv_cache_sharding", False))
    split = bool(getattr(sa, "enable_dsa_cache_layer_split", False))
    why += [f"attn_cp_size:{n}", f"prefill_cp:{int(bool(getattr(sa, 'enable_prefill_cp', False)))}",
            f"cp_strategy:{getattr(sa, 'cp_strategy', None)}", f"kv_cache_sharding:{int(sharding)}",
            f"layer_split:{int(split)}", f"dcp_size:{dcp}", f"tp_size:{_num(sa, 'tp_size')}",
            f"attn_tp_size:{_num(sa, 'attn_tp_size')}"]
    if n > 1:   # (SGLang refuses sharding together with the layer split)
        mode = "sharded" if sharding else "layersplit" if split else "prefill_cp"
    elif dcp > 1:
        mode = "dcp"
    else:
        mode = "none"
    if cp_size > 1 and mode == "none":
        return "", why   # a CP group the arguments do not account for: not guessed
    return mode, why


def _warn(key: str, msg: str) -> None:
    logger.warning(msg)


def resolve(explicit: str, explicit_src: str, cp_size: int, pool: object, sa: object = None,
            warn_once: Callable[[str, str], None] = _warn) -> CpMode:
    """The mode of a cache whose attention CP group has ``cp_size`` ranks and whose device pool is ``pool``;
    ``explicit`` a mode someone set (``""`` none) and ``explicit_src`` who; ``sa`` the server arguments (default
    :func:`server_args`). Warns through ``warn_once(key, message)`` (the instrumentation's: once per key and process)
    where an explicit mode disagrees with the derived one and where the mode stays unknown."""
    mla = is_mla(pool)
    if cp_size <= 1:
        return CpMode("none", "cp_group", [f"cp_group:{cp_size}", f"mla:{mla}"])
    derived, why = derive(server_args() if sa is None else sa, cp_size, mla)
    if explicit:
        if derived and derived != explicit:
            warn_once(f"cpmode:{explicit}:{derived}",
                      f"cptrace-otel: CP mode {explicit} (set by {explicit_src}) overrides {derived}, the mode "
                      f"SGLang's server arguments give ({', '.join(why)}); the cross-rank rules judge the run as "
                      f"{explicit}")
        return CpMode(explicit, explicit_src, why)
    if not derived:
        warn_once("cpmode:unknown",
                  f"cptrace-otel: CP mode unknown for an attention CP group of {cp_size} ranks ({', '.join(why)}): "
                  "the config record states none and the mode-dependent cross-rank rules are not run; set "
                  "CPTRACE_CP_MODE")
        return CpMode("", "unknown", why)
    logger.info("cptrace-otel: CP mode %s, from SGLang's server arguments (%s)", derived, ", ".join(why))
    return CpMode(derived, "server_args", why)
