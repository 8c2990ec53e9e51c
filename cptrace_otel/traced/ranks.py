"""Who is this process in the run: its CP / TP / DP rank, the run's size, and the run id, found without help.

Contract:

* :func:`discover` looks, in this order of trust, at: what the caller configured (``configure(cp_rank=...)`` or
  ``CPTRACE_CP_RANK``; already in the :class:`~cptrace_otel.model.config.Config`), the ``config`` record's ``cp_rank`` /
  ``tp_rank`` / ``dp_rank`` when the call site emitted one (:meth:`RankHold.add` sees it), SGLang's own parallel
  state (``sglang.srt.runtime_context.get_parallel()``: ``attn_cp_rank``, ``attn_tp_rank``, ``attn_dp_rank``, the
  names of the sglang 0.5.23 wheel), ``torch.distributed`` when it is initialized (its rank is the CP rank), and the
  environment last (``RANK`` with ``WORLD_SIZE``, as torchrun sets them). It never imports SGLang or torch: a
  module that the process has not imported has nothing to say, so looking costs a ``sys.modules`` lookup.
* :class:`RankHold` is how a rank learned after the first records still labels them: the exporter worker holds the
  first records (the drainer ships them as usual, after a ``PREINIT``; the traced process keeps none, so an
  ``os._exit`` meanwhile loses nothing) until the drainer, which watches them go by, finds the rank, ``hold_s`` has
  passed, a flush asks for delivery, or ``cap`` records went by; then it sends the worker ``INIT`` with the resolved
  :class:`~cptrace_otel.model.config.Config`, whose resource, file names and span ranks label every record. A rank
  that stays unknown in a run of several processes is warned about once, loudly (stderr).
* :func:`agreed_run_id`: the run id all ranks of one launch share. ``CPTRACE_RUN_ID`` (or an override) wins, then
  ``TORCHELASTIC_RUN_ID`` (torchrun; its placeholder ``none`` does not count), then, when ``torch.distributed`` is
  initialized, an id agreed through its own store (the one at the init address: ``MASTER_ADDR``/``MASTER_PORT``, or
  SGLang's ``dist_init_addr`` / nccl port): the first rank to ask puts a fresh random id there with ``compare_set``
  and every rank reads that one back, so ranks on several hosts agree and two launches (two stores) never share one.
  Otherwise the per-host rule of :func:`cptrace_otel.model.config.derive_run_id` stands (host, launcher pid and start
  time).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..model.config import Config

UNKNOWN = -1
STORE_KEY = "cptrace_otel/run_id"


class Ranks(NamedTuple):
    """A discovery's answer: ranks (-1 unknown), the run's process count (0 unknown) and where they came from."""

    cp: int = UNKNOWN
    tp: int = UNKNOWN
    dp: int = UNKNOWN
    world: int = 0
    source: str = ""


def _int(v: object) -> int | None:
    return v if type(v) is int and v >= 0 else None


def from_config_record(fields: Mapping[str, Any]) -> Ranks | None:
    """The ranks a ``config`` record states (None when it states no ``cp_rank``)."""
    cp = _int(fields.get("cp_rank"))
    if cp is None:
        return None
    tp, dp = _int(fields.get("tp_rank")), _int(fields.get("dp_rank"))
    return Ranks(cp, UNKNOWN if tp is None else tp, UNKNOWN if dp is None else dp,
                 _int(fields.get("cp_size")) or 0, "config-record")


def from_sglang() -> Ranks | None:
    """SGLang's parallel state, when SGLang is imported in this process and has published its ranks."""
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is None:
        return None
    try:
        par = rc.get_parallel()
        cp = _int(par.attn_cp_rank)
    except Exception:   # not published yet: reading an unset parallel name raises
        return None
    if cp is None:
        return None

    def opt(name: str) -> int:
        try:
            v = _int(getattr(par, name))
        except Exception:
            v = None
        return UNKNOWN if v is None else v

    world = 0
    try:
        world = int(par.attn_cp_size)
    except Exception:
        pass
    return Ranks(cp, opt("attn_tp_rank"), opt("attn_dp_rank"), world, "sglang")


def _torch_dist() -> Any:
    td = sys.modules.get("torch.distributed")
    try:
        if td is not None and td.is_available() and td.is_initialized():
            return td
    except Exception:
        pass
    return None


def from_torch() -> Ranks | None:
    """``torch.distributed``'s rank and world size, when this process initialized it."""
    td = _torch_dist()
    if td is None:
        return None
    try:
        return Ranks(int(td.get_rank()), UNKNOWN, UNKNOWN, int(td.get_world_size()), "torch.distributed")
    except Exception:
        return None


def from_env(env: Mapping[str, str]) -> Ranks | None:
    """``RANK`` / ``WORLD_SIZE`` as torchrun and other launchers set them (the weakest source)."""
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return Ranks(rank, UNKNOWN, UNKNOWN, world, "env") if rank >= 0 else None


def world_hint(env: Mapping[str, str]) -> int:
    """How many processes the run has, as far as anything here can tell (0 unknown)."""
    for r in (from_sglang(), from_torch()):
        if r is not None and r.world:
            return r.world
    try:
        return int(env.get("WORLD_SIZE", "0"))
    except ValueError:
        return 0


def discover(env: Mapping[str, str] | None = None) -> Ranks | None:
    """The process's ranks from SGLang, torch.distributed or the environment, in that order; None if none says."""
    env = os.environ if env is None else env
    return from_sglang() or from_torch() or from_env(env)


def apply(cfg: Config, r: Ranks) -> Config:
    """``cfg`` with the discovered ranks (a rank the caller configured is kept) and ``rank_source``."""
    return dataclasses.replace(
        cfg, cp_rank=r.cp, tp_rank=cfg.tp_rank if cfg.tp_rank >= 0 else r.tp,
        dp_rank=cfg.dp_rank if cfg.dp_rank >= 0 else r.dp, rank_source=r.source)


def agreed_run_id(cfg: Config, env: Mapping[str, str] | None = None) -> str:
    """The run id to use for ``cfg`` (see the module docstring); ``cfg.run_id`` when nothing better is known."""
    env = os.environ if env is None else env
    if cfg.run_id_given or (env.get("TORCHELASTIC_RUN_ID") or "none") != "none":
        return cfg.run_id
    td = _torch_dist()
    if td is None:
        return cfg.run_id
    try:
        store = td.distributed_c10d._get_default_store()
        mine = "ds-" + uuid.uuid4().hex[:12]
        got = store.compare_set(STORE_KEY, "", mine)
        got = got.decode() if isinstance(got, bytes) else str(got)
        return got or mine
    except Exception:
        return cfg.run_id


class RankHold:
    """The drainer's hold on the first records while the rank is unknown (see the module docstring).

    ``add(items)`` sees a batch of compact items go by (a ``config`` record may state the rank); ``due(flush_asked)``
    says whether to stop holding; ``resolve()`` returns the final Config (and warns once when the rank stayed unknown
    in a run of several processes)."""

    POLL_S = 0.05

    def __init__(self, cfg: Config, hold_s: float = 2.0, cap: int = 262144) -> None:
        self.cfg = cfg
        self.held = 0
        self.cap = cap
        self.found: Ranks | None = None
        self.world = 0
        self._deadline = time.monotonic() + hold_s
        self._next_poll = 0.0

    @property
    def known(self) -> bool:
        return self.cfg.cp_rank >= 0 or self.found is not None

    def add(self, items: list) -> None:
        self.held += len(items)
        if self.found is None:
            for it in items:
                if it[2] == "config" and type(it[3]) is dict:
                    r = from_config_record(it[3])
                    if r is not None:
                        self.found = r
                        break
                    self.world = self.world or (_int(it[3].get("cp_size")) or 0)

    def due(self, flush_asked: bool = False) -> bool:
        if self.known or flush_asked or self.held >= self.cap:
            return True
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.POLL_S
            self.found = discover()
            if self.found is not None:
                return True
        return now >= self._deadline

    def resolve(self) -> Any:
        cfg = self.cfg
        if cfg.cp_rank < 0 and self.found is None:
            self.found = discover()
        if cfg.cp_rank < 0 and self.found is not None:
            cfg = apply(cfg, self.found)
        if cfg.cp_rank < 0:
            world = max(self.world, world_hint(os.environ))
            if world > 1:
                print(f"cptrace_otel: WARNING: this process (pid {os.getpid()}) is one of {world} in its run but "
                      "its CP rank is unknown (no CPTRACE_CP_RANK, no config record with cp_rank, no SGLang or "
                      "torch.distributed rank): its spans are labelled rank -1 and `cptrace-otel check` will not run "
                      "the cross-rank rules; set CPTRACE_CP_RANK or emit the config record first",
                      file=sys.stderr, flush=True)
        return cfg
