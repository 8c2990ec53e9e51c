"""Use before load (LOAD): no layer of a loading node is read before its load-back completed that layer.

SGLang's layer-wise load-back (``HiCacheController.start_loading``) copies a step's nodes host->device layer by
layer, recording one completion event per layer, while the forward that needs them runs; each read of a layer's
buffer must wait for that layer's event first (``LayerDoneCounter.wait_until``). The records
(:mod:`cptrace_otel.traced.sglang._layerwise23`, level 2): ``ld_start`` (a step: ``op``, the ``ops`` it merges,
``nodes``), ``ld_layer`` (layer ``layer`` of step ``op`` completed), ``ld_read`` (the first read of ``layer`` by
``reader`` while step ``op`` was in flight, with ``waited``: the highest layer the forward had waited for).

* LOAD-early, at an ``ld_read`` of step ``op`` before the ``ack dir=h2d`` of any of its ops: the layer's
  ``ld_layer`` precedes it, and the forward had waited for that layer (``waited >= layer``). Either missing, the
  read saw pages still being loaded (SGLang #22811: the NSA indexer read a layer without waiting). One finding per
  (step, reader), at its first early read.

A stream without ``ld_*`` records (below level 2, or no layer-wise load-back) gives the rule nothing to check; an
``ld_read`` of a step whose ``ld_start`` the trace lacks is counted (``LOAD-skipped(no start)``), never passed.
"""

from __future__ import annotations

from ..model.events import Event
from .findings import Finding
from .lineage import Bounded
from .ranges import EXACT
from .rank_base import RankRuleBase

STEPS_KEPT = 4096   # load-back steps remembered (each closes at its ack; the oldest are forgotten beyond this)


class LoadStep:
    """One layer-wise load-back step as the records describe it."""

    __slots__ = ("done", "early", "ops", "ref", "running")

    def __init__(self, ops: list, ref: tuple) -> None:
        self.ops = ops
        self.ref = ref
        self.done: dict[int, tuple] = {}   # layer -> ref of its ld_layer
        self.early: set[str] = set()       # readers already reported
        self.running = True                # until an ack dir=h2d of one of its ops


def _int(v: object) -> int | None:
    return v if type(v) is int else None


class LoadRules(RankRuleBase):
    _ld_steps: Bounded       # step op -> LoadStep (set by RankChecker)
    _ld_by_op: Bounded       # queued (reload) op -> its step
    _ld_seen: bool           # any ld_* record: the rule applies to this stream

    def _ld_start(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
        self._ld_seen = True
        op = _int(f.get("op"))
        if op is None:
            return
        raw = f.get("ops")
        ops = [o for o in raw if type(o) is int] if isinstance(raw, list) else [op]
        step = LoadStep(ops, ref)
        self._ld_steps.put(op, step)
        for o in ops:
            self._ld_by_op.put(o, step)

    def _ld_layer(self, ev: Event, f: dict, nid: object, ref: tuple) -> None:
        self._ld_seen = True
        step = self._ld_steps.get(f.get("op"))
        layer = _int(f.get("layer"))
        if step is not None and layer is not None and layer not in step.done:
            step.done[layer] = ref

    def _ld_closed(self, op: object) -> None:
        """An ``ack dir=h2d`` of queued op ``op``: its step finished loading (every layer of it)."""
        step = self._ld_by_op.get(op)
        if step is not None:
            step.running = False

    def _load_early(self, ev: Event, f: dict, nid: object, ref: tuple) -> Finding | None:
        """LOAD-early at an ``ld_read``."""
        self._ld_seen = True
        op, layer, waited = _int(f.get("op")), _int(f.get("layer")), _int(f.get("waited"))
        reader = f.get("reader") if isinstance(f.get("reader"), str) else "?"
        node = nid if type(nid) is int and nid >= 0 else None
        step = self._ld_steps.get(op)
        if step is None or layer is None or waited is None:
            self._skip("LOAD-skipped(no start)", "LOAD", node,
                       "a layer read of a load-back step whose ld_start (or layer, waited) the trace lacks")
            return None
        if not step.running:
            return None
        done = step.done.get(layer)
        if done is not None and waited >= layer:
            return None
        if reader in step.early:
            return None
        step.early.add(reader)
        why = ("its load had not completed that layer (no ld_layer before the read)" if done is None else
               f"the forward had not waited for it (waited for layer {waited} only)")
        return self._finding("LOAD", "LOAD-early", node, op, EXACT, [step.ref, done, ref],
                             f"{reader} read layer {layer} of load-back step {op} before its load completed: {why}",
                             ev)
