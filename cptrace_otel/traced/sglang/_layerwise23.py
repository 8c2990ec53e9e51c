"""Use before load: sglang 0.5.23's layer-wise load-back, at level 2 (:data:`LAYERWISE_SITES23`, part of
``SITES23``).

A load-back step (``HiCacheController.start_loading``) merges the queued load ops into one host->device copy that
moves layer by layer; after each layer it records that layer's event (``LayerLoadingEvent.complete(l)`` of the
``LayerDoneCounter`` slot the step took, its producer index). The forward of the batch that needs the pages runs
meanwhile (``set_consumer(slot)``) and every read of a layer's buffer waits first for that layer's event
(``LayerDoneCounter.wait_until(l)``: in ``MLATokenToKVPool.get_key_buffer``/``get_value_buffer``, the MHA pool's
and the DSA indexer's ``IndexKeyCache.get_local_buffer``, which ``DSATokenToKVPool.get_index_k_with_scale_buffer``
reads). A read that skips the wait reads pages still being
loaded (the GLM-5 report, SGLang #22811: the NSA indexer's reads did).

Records (level 2; below level 2 nothing here records and a read costs one check of an empty dict):

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

from typing import Any

from ..api import cptrace, trace_level
from ._state import arg, safe, state_of

CC = "sglang.srt.managers.cache_controller"
MEMPOOL = "sglang.srt.mem_cache.memory_pool"
INDEX_KEYS = "sglang.srt.mem_cache.index_key_cache"


class Live:
    """A load-back step in flight: what its reads are recorded against."""

    __slots__ = ("event", "key", "nodes", "op", "read", "waited")

    def __init__(self, key: tuple[int, int], op: int, nodes: list[int], event: Any) -> None:
        self.key, self.op, self.nodes, self.event = key, op, nodes, event
        self.waited = -1
        self.read: set[tuple[int, str]] = set()


# (id(LayerDoneCounter), slot) -> the step in flight in that slot. Empty whenever no load-back is in flight (and
# always below level 2), which is all the wait and read wrappers look at then.
LIVE: dict[tuple[int, int], Live] = {}


def end(node_ids: list) -> None:
    """The steps whose load ops named ``node_ids`` were acked (``loading_check``): no longer in flight."""
    if not LIVE:
        return
    ids = set(node_ids)
    for key, live in list(LIVE.items()):
        if ids.intersection(live.nodes):
            _drop(key, live)


def drop_counter(counter: Any) -> None:
    """Forget every step of ``counter`` (a cache reset aborts them)."""
    for key, live in list(LIVE.items()):
        if key[0] == id(counter):
            _drop(key, live)


def _drop(key: tuple[int, int], live: Live) -> None:
    LIVE.pop(key, None)
    if getattr(live.event, "_cptrace_live", None) is live:
        live.event._cptrace_live = None


def _start(cc: Any) -> Live | None:
    """``ld_start`` of the step ``start_loading`` is about to submit; registers it under the slot it will take
    (``LayerDoneCounter.update_producer``: the next one, modulo the slots)."""
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
    LIVE[key] = live
    event._cptrace_live = live
    return live


def _start_loading(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if trace_level() < 2 or state_of(instance) is None:
        return wrapped(*args, **kwargs)
    live = safe(_start, instance)
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        if live is not None:
            _drop(live.key, live)   # nothing was submitted
        raise


def _complete(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    out = wrapped(*args, **kwargs)
    live = getattr(instance, "_cptrace_live", None)
    if live is not None:
        safe(lambda: cptrace(2, "ld_layer", op=live.op, layer=int(arg(args, kwargs, 0, "layer_index"))))
    return out


def _wait_until(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    out = wrapped(*args, **kwargs)
    if LIVE:
        live = LIVE.get((id(instance), instance.consumer_index))
        if live is not None:
            t = arg(args, kwargs, 0, "threshold")
            if type(t) is int and t > live.waited:
                live.waited = t
    return out


def _read(pool: Any, reader: str, layer_id: Any) -> None:
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


def _reader(reader: str, of_pool: bool) -> Any:
    """A read site of ``reader``'s buffers; ``of_pool``: the wrapped object holds the KV pool in ``.pool``."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        if LIVE:   # (no load-back in flight: nothing more)
            safe(_read, instance.pool if of_pool else instance, reader, arg(args, kwargs, 0, "layer_id"))
        return out

    return wrapper


_KV, _IDX_POOL, _IDX = _reader("kv", False), _reader("indexer", False), _reader("indexer", True)

# (module, "Class.method", wrapper): the layer-wise load-back sites of sglang 0.5.23
LAYERWISE_SITES23: list[tuple[str, str, Any]] = [
    (CC, "HiCacheController.start_loading", _start_loading),
    (CC, "LayerLoadingEvent.complete", _complete),
    (CC, "LayerDoneCounter.wait_until", _wait_until),
    (MEMPOOL, "MHATokenToKVPool.get_key_buffer", _KV),
    (MEMPOOL, "MHATokenToKVPool.get_value_buffer", _KV),
    (MEMPOOL, "MLATokenToKVPool.get_key_buffer", _KV),
    (MEMPOOL, "MLATokenToKVPool.get_value_buffer", _KV),
    # the indexer reads through the DSA pool (dsa_indexer.py), which reads the IndexKeyCache: both are read sites
    (MEMPOOL, "DSATokenToKVPool.get_index_k_with_scale_buffer", _IDX_POOL),
    (MEMPOOL, "DSATokenToKVPool.get_index_k_scale_buffer", _IDX_POOL),
    (INDEX_KEYS, "IndexKeyCache.get_local_buffer", _IDX),
]
