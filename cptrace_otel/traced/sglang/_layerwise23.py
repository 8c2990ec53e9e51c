"""Use before load: sglang 0.5.23's layer-wise load-back, at level 2 (:data:`LAYERWISE_SITES23`, part of
``SITES23``).

A load-back step (``HiCacheController.start_loading``) merges the queued load ops into one host->device copy that
moves layer by layer; after each layer it records that layer's event (``LayerLoadingEvent.complete(l)`` of the
``LayerDoneCounter`` slot the step took, its producer index). The forward of the batch that needs the pages runs
meanwhile (``set_consumer(slot)``) and every read of a layer's buffer waits first for that layer's event
(``LayerDoneCounter.wait_until(l)``: in ``MLATokenToKVPool.get_key_buffer``/``get_value_buffer``, the MHA pool's
and the DSA indexer's ``IndexKeyCache.get_local_buffer``, which ``DSATokenToKVPool.get_index_k_with_scale_buffer``
reads). A read that skips the wait reads pages still being loaded (the GLM-5 report, SGLang #22811: the NSA
indexer's reads did).

Cost: the one class-level wrapper is ``start_loading``'s (once per load-back step). The per-layer sites (the
forward's reads and waits, the step's completions) are hooked on the objects themselves (instance attributes over
whatever those objects resolve to then) only while a step of their counter is in flight at level 2, and unhooked
when the last one ends: below level 2, and between load-backs, a read runs SGLang's code alone.

Records (level 2):

* ``ld_start`` at ``start_loading``, before the copy is submitted: ``op`` (the step's id: its first queued op's),
  ``ops`` (every queued op it merges: the ``op`` of their ``reload`` records), ``nodes`` (the load ops' nodes, as
  their ``reload`` records name them), ``slot`` (the counter slot it takes), ``layers`` (the layers it moves);
* ``ld_layer`` at ``LayerLoadingEvent.complete(l)`` of that slot: ``op``, ``layer``: the completion SGLang's reads
  wait for (on a GPU recorded on the load stream when submitted, so the reader's wait is what orders the read);
* ``ld_read`` at the first read of each layer by each reader while the step is in flight: ``op``, ``node_id`` (the
  step's first node: the finding's lane), ``layer``, ``reader`` (``kv`` or ``indexer``), ``waited`` (the highest
  layer whose event this forward had waited for on the step's slot, -1 none).

A step is in flight from ``start_loading`` until its ``ack dir=h2d`` (``loading_check``; :meth:`end`). One
``ld_read`` per (step, layer, reader), never per token or per call. Rule ``LOAD-early``
(:mod:`cptrace_otel.checks.rules_load`) reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..api import cptrace, trace_level
from ._state import State, arg, safe, state_of

if TYPE_CHECKING:
    from ._types import CacheController, KVPool, LayerDoneCounter, LayerLoadingEvent

CC = "sglang.srt.managers.cache_controller"

KV_GETTERS = ("get_key_buffer", "get_value_buffer")   # attention's reads (MHA, MLA and DSA pools)
# the DSA indexer reads through the pool (dsa_indexer.py), which reads its IndexKeyCache: both are read sites
INDEXER_GETTERS = ("get_index_k_with_scale_buffer", "get_index_k_scale_buffer")


class Live:
    """A load-back step in flight: what its reads are recorded against."""

    __slots__ = ("event", "key", "nodes", "op", "read", "waited")

    def __init__(self, key: tuple[int, int], op: int, nodes: list[int], event: LayerLoadingEvent) -> None:
        self.key, self.op, self.nodes, self.event = key, op, nodes, event
        self.waited = -1
        self.read: set[tuple[int, str]] = set()


# (id(LayerDoneCounter), slot) -> the step in flight in that slot
LIVE: dict[tuple[int, int], Live] = {}
# id(LayerDoneCounter) -> the hooks set on its pool and counter while a step of it is in flight
_HOOKS: dict[int, list[tuple[object, str, bool, object]]] = {}


def _hook(obj: object, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
          ) -> tuple[object, str, bool, object]:
    """Set ``obj.name`` to ``make(what obj.name resolves to now)``; returns how to undo it (:func:`_unhook`)."""
    own = vars(obj)
    had, prev = name in own, own.get(name)
    setattr(obj, name, make(getattr(obj, name)))
    return obj, name, had, prev


def _unhook(hooks: list[tuple[object, str, bool, object]]) -> None:
    for obj, name, had, prev in reversed(hooks):
        if had:
            setattr(obj, name, prev)
        else:
            vars(obj).pop(name, None)


def end(node_ids: list) -> None:
    """The steps whose load ops named ``node_ids`` were acked (``loading_check``): no longer in flight."""
    if not LIVE:
        return
    ids = set(node_ids)
    for key, live in list(LIVE.items()):
        if ids.intersection(live.nodes):
            _drop(key, live)


def drop_counter(counter: LayerDoneCounter) -> None:
    """Forget every step of ``counter`` (a cache reset aborts them)."""
    for key, live in list(LIVE.items()):
        if key[0] == id(counter):
            _drop(key, live)


def drop_all() -> None:
    """Forget every step and remove every hook (``uninstrument``)."""
    for key, live in list(LIVE.items()):
        _drop(key, live)
    for hooks in list(_HOOKS.values()):
        _unhook(hooks)
    _HOOKS.clear()


def _drop(key: tuple[int, int], live: Live) -> None:
    if LIVE.get(key) is live:
        del LIVE[key]
    ev = live.event
    if "complete" in vars(ev) and getattr(vars(ev)["complete"], "_cptrace_live", None) is live:
        del vars(ev)["complete"]
    if not any(k[0] == key[0] for k in LIVE):
        _unhook(_HOOKS.pop(key[0], []))


def _start(st: State, cc: CacheController) -> Live | None:
    """``ld_start`` of the step ``start_loading`` is about to submit; registers it under the slot it will take
    (``LayerDoneCounter.update_producer``: the next one, modulo the slots) and hooks the per-layer sites."""
    q = cc.load_queue
    if not q:
        return None
    counter = cc.layer_done_counter
    slot = (counter.producer_index + 1) % counter.num_counters
    ops = [int(o.id) for o in q]
    nodes = [int(n) for o in q for n in o.node_ids]
    cptrace(2, "ld_start", op=ops[0], ops=ops, nodes=nodes, slot=slot, layers=int(cc.transfer_layer_id_max))
    key = (id(counter), slot)
    old = LIVE.get(key)
    if old is not None:
        _drop(key, old)
    event = counter.events[slot]
    live = Live(key, ops[0], nodes, event)
    if key[0] not in _HOOKS:
        _HOOKS[key[0]] = _hooks(counter, cc.mem_pool_device)
    LIVE[key] = live
    complete = _completer(live, event.complete)
    event.complete = complete   # SGLang takes it as the step's on_layer_done
    return live


def _hooks(counter: LayerDoneCounter, pool: KVPool) -> list[tuple[object, str, bool, object]]:
    """The forward's wait and read sites of ``counter``'s pool, hooked."""
    out = [_hook(counter, "wait_until", lambda orig: _waiter(counter, orig))]
    for name in KV_GETTERS:
        if hasattr(pool, name):
            out.append(_hook(pool, name, lambda orig: _reader(pool, "kv", orig)))
    for name in INDEXER_GETTERS:
        if hasattr(pool, name):
            out.append(_hook(pool, name, lambda orig: _reader(pool, "indexer", orig)))
    ikc = getattr(pool, "index_key_cache", None)
    if ikc is not None and hasattr(ikc, "get_local_buffer"):
        out.append(_hook(ikc, "get_local_buffer", lambda orig: _reader(pool, "indexer", orig)))
    return out


def _start_loading(wrapped: Callable[..., Any], instance: CacheController, args: tuple, kwargs: dict) -> Any:
    if trace_level() < 2:
        return wrapped(*args, **kwargs)
    st = state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    live = safe(_start, st, instance)
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        if live is not None:
            safe(_drop, live.key, live)   # nothing was submitted
        raise


def _completer(live: Live, orig: Callable[..., Any]) -> Any:
    def complete(*args: object, **kwargs: object) -> Any:
        out = orig(*args, **kwargs)
        safe(lambda: cptrace(2, "ld_layer", op=live.op, layer=int(arg(args, kwargs, 0, "layer_index"))))
        return out

    complete._cptrace_live = live  # type: ignore[attr-defined]
    return complete


def _waiter(counter: LayerDoneCounter, orig: Callable[..., Any]) -> Any:
    def wait_until(*args: object, **kwargs: object) -> Any:
        out = orig(*args, **kwargs)
        live = LIVE.get((id(counter), counter.consumer_index))
        if live is not None:
            t = arg(args, kwargs, 0, "threshold")
            if type(t) is int and t > live.waited:
                live.waited = t
        return out

    return wait_until


def _reader(pool: KVPool, reader: str, orig: Callable[..., Any]) -> Any:
    def read(*args: object, **kwargs: object) -> Any:
        out = orig(*args, **kwargs)
        safe(_read, pool, reader, arg(args, kwargs, 0, "layer_id"))
        return out

    return read


def _read(pool: KVPool, reader: str, layer_id: int) -> None:
    counter = pool.layer_transfer_counter
    if counter is None:
        return
    live = LIVE.get((id(counter), counter.consumer_index))
    if live is None:
        return
    layer = int(layer_id) - int(pool.start_layer)
    key = (layer, reader)
    if key in live.read:
        return
    live.read.add(key)
    cptrace(2, "ld_read", op=live.op, node_id=live.nodes[0] if live.nodes else -1, layer=layer, reader=reader,
            waited=live.waited)


# (module, "Class.method", wrapper): the layer-wise load-back site of sglang 0.5.23 (the per-layer ones are hooked
# per object while a step is in flight)
LAYERWISE_SITES23: list[tuple[str, str, Any]] = [
    (CC, "HiCacheController.start_loading", _start_loading),
]
