"""The hot path: drop-in replacements for SGLang's ``cp_hicache_trace`` functions.

Contract (what a call site may rely on):

* Same names, signatures, sentinels and values as upstream (``cptrace``, ``trace_level``, ``trace_enabled``,
  ``rng``, ``khash``, ``knz``, ``fwd_hash``).
* The gate is read once (``CPTRACE_LEVEL``, else ``SGLANG_CP_HICACHE_KV_TRACE``) into an int; a call below the
  level costs one compare. :func:`reload_config` (or :func:`configure`) re-reads it, and tells the code that is in
  place only while tracing is on (:func:`watch_switch`: the SGLang instrumentation's wrappers) when it turns on or off.
* ``level`` may be anything: an int (or float) is compared with the gate; a string is parsed as an int
  (``"2"``); anything else that does not compare with an int (``None``, a non-numeric string) counts as below the
  gate and the record is skipped (not counted as dropped). The gate functions never raise.
* With ``CPTRACE_SAMPLE`` < 1 a record of a node whose lineage was sampled out (:mod:`cptrace_otel.model.sampling`) is
  dropped here, by one set lookup: it costs what a call below the level costs. With the C speedups built, both
  decisions are made in C before the keyword arguments become a dict (``_speedups/hot.c``, which reads the gate's
  state ``_STATE``, ``level``, ``drop`` and ``submit``, on each call, and looks an int node id up in ``drop``, a
  ``_hot.IdSet``, by a C hash probe); the Python function :func:`_cptrace_py` is the definition, reads the same
  state, and decides every call the C gate does not (levels that are not ints); :func:`trace_enabled` likewise
  (``_hot.trace_enabled``, defined by :func:`_trace_enabled_py`).
* An enabled ``cptrace`` only takes a timestamp and appends ``(ts, level, tag, fields)`` to a bounded buffer; all
  rendering, span mapping, checking, encoding and sending happen off the caller's thread. It never raises and never
  blocks; when the buffer is full the record is dropped and counted. (An exception that an application's signal
  handler raises while a ``cptrace`` call runs, its SIGTERM handler's ``SystemExit`` or a ``KeyboardInterrupt``, is
  the application's: it propagates, as it would without tracing, and that record may be lost with the process.)
* Field values are rendered off the caller's thread: pass values that will not be mutated after the call (ints,
  strings, ``rng()`` strings, deferred fingerprints, fresh lists), as SGLang's call sites do.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from ..model import config as _config
from . import lifecycle as _lifecycle, losses as _losses

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

_CONFIG: _config.Config | None = None
_lock = threading.Lock()


class _State:
    """The gate's state, one object that the C gate (``_hot.State``, the same three attributes, when built) and
    :func:`_cptrace_py` both read on every call, so that setting an attribute is seen at once by both (the C gate
    reads an attribute as one load, a module global would cost it a dict lookup): ``level`` (the gate, an int),
    ``drop`` (the node ids sampled out, :mod:`cptrace_otel.model.sampling`, while ``CPTRACE_SAMPLE`` < 1, else None)
    and ``submit`` (the record's way on: the pipeline's bounded-buffer append once started)."""

    __slots__ = ("level", "drop", "submit")

    def __init__(self) -> None:
        self.level: Any = 0
        self.drop: Any = None
        self.submit: Any = None


def _submit_unstarted(level: int, tag: str, fields: dict) -> None:
    """First enabled record of a process: start the pipeline, install its submit function, hand it the record."""
    try:
        with _lock:
            if _STATE.submit is _submit_unstarted:
                # A pipeline that cannot start (no file descriptor, no room for a thread, an import that fails)
                # is tried again after a backoff, not once per record; meanwhile each record is counted (losses).
                if not _losses.START.due():
                    _losses.START.drop()
                    return
                try:
                    from . import pipeline

                    _STATE.submit = _started(pipeline)
                except Exception as e:
                    _losses.START.failed(e)
                    _losses.START.drop()
                    return
                _losses.START.started()
        _STATE.submit(level, tag, fields)
    except Exception:  # tracing must never crash the traced process
        pass


def _started(pipeline: ModuleType) -> Callable[[int, str, dict], None]:
    """Start the pipeline for the configuration in force, with the run id all ranks agree on
    (:func:`cptrace_otel.traced.ranks.agreed_run_id`, once, before the first record is kept: the sampling decision
    hashes it), and return the submit function to install (behind the sampler when ``CPTRACE_SAMPLE`` < 1)."""
    global _CONFIG
    import dataclasses

    from .ranks import agreed_run_id

    cfg = get_config()
    run_id = agreed_run_id(cfg)
    if run_id != cfg.run_id:
        cfg = _CONFIG = dataclasses.replace(cfg, run_id=run_id)
    submit = pipeline.start(cfg, _uninstall)
    _STATE.drop = None
    if cfg.sample < 1.0:
        from ..model.sampling import make_submit

        drop = _hot.IdSet() if _hot is not None else set()
        submit = make_submit(submit, cfg.run_id, cfg.sample, drop)
        _STATE.drop = drop
    return submit


def _uninstall() -> None:
    """The pipeline stopped (shutdown, configure, exit): the next record starts a new one. Under the lock that
    installs, so a submit function obtained from the stopped pipeline is never installed after this."""
    with _lock:
        _STATE.submit = _submit_unstarted
        _STATE.drop = None


def get_config() -> _config.Config:
    """The configuration in force (resolved from the environment on first use)."""
    if _CONFIG is None:
        reload_config()
    assert _CONFIG is not None
    return _CONFIG


def reload_config(**overrides: Any) -> _config.Config:
    """Re-read the environment (and apply ``overrides``); the new gate applies to the next call.

    A running pipeline keeps its sinks until :func:`shutdown`; records after a reload use the new level.
    """
    global _CONFIG
    cfg = _config.from_env(**overrides)
    _CONFIG = cfg
    _losses.START.retry_now()   # (a pipeline that could not start is tried at once with the new settings)
    with _switch_lock:
        old, new = _STATE.level, cfg.level
        if old < 1 <= new:
            _switched(True)
        _STATE.level = new
        if new < 1 <= old:
            _switched(False)
    return cfg


_switch_lock = threading.Lock()   # one switch at a time, and a watcher sees each switch once
_watchers: list[Callable[[bool], None]] = []


def watch_switch(fn: Callable[[bool], None]) -> None:
    """Call ``fn(True)`` each time tracing turns on (the level from 0 to 1 or more), before the new level is in
    force, and ``fn(False)`` each time it turns off, once level 0 is: what ``fn`` sets up for the records is in place
    for the first one and taken down after the last. Where tracing is on now, ``fn(True)`` is called at once. ``fn``
    runs in the thread that changes the level, under a lock held across the switch; it must not change the level."""
    with _switch_lock:
        if fn not in _watchers:
            _watchers.append(fn)
            if _STATE.level >= 1:
                _call(fn, True)


def unwatch_switch(fn: Callable[[bool], None]) -> None:
    """Stop calling ``fn`` (see :func:`watch_switch`); what it set up is the caller's to take down."""
    with _switch_lock:
        if fn in _watchers:
            _watchers.remove(fn)


def _switched(on: bool) -> None:
    for fn in list(_watchers):
        _call(fn, on)


def _call(fn: Callable[[bool], None], on: bool) -> None:
    try:
        fn(on)
    except Exception:  # a watcher's failure never fails the level change (the watchers report their own)
        pass


def configure(**overrides: Any) -> _config.Config:
    """Set settings in code (names as :class:`cptrace_otel.model.config.Config` fields); restarts a running pipeline."""
    from . import pipeline

    pipeline.shutdown(timeout_s=10.0)
    return reload_config(**overrides)


def trace_level() -> int:
    """The trace level in force (0 = off)."""
    return _STATE.level


def _gate_level(level: object) -> int | None:
    """A level that does not compare with an int: a numeric string as its int, anything else None (below the
    gate). Only reached when the comparison raised, so the hot path never pays for it."""
    try:
        if isinstance(level, (str, bytes)):
            return int(level.strip())
    except Exception:
        pass
    return None


def _trace_enabled_py(level: int = 1) -> bool:
    """True when records at ``level`` are traced (False for a level that is not a number, see the module doc).

    The definition: with the C speedups built, :data:`trace_enabled` is ``_hot.trace_enabled``, which compares ints
    itself and calls this for anything else."""
    try:
        return _STATE.level >= level
    except Exception:
        lv = _gate_level(level)
        return lv is not None and _STATE.level >= lv


def _cptrace_py(level: object, tag: str, /, **fields: object) -> None:
    """Record one ``tag`` event with ``fields`` if the gate is at least ``level``; never raises, never blocks.

    ``level`` and ``tag`` are positional-only (upstream call sites pass them positionally), so a record may carry
    fields named ``level`` or ``tag``, as the ``config`` record's ``level=`` does."""
    st = _STATE
    try:
        if level > st.level:
            return
    except Exception:  # a level that is not a number (see the module doc); free when none is raised
        level = _gate_level(level)
        if level is None or level > st.level:
            return
    drop = st.drop
    if drop is not None:
        try:
            if fields.get(_NODE_KEY, _NO_NODE) in drop and tag != _SPLIT:
                return   # sampled out: its lineage's decision is known (a split still goes on: its child inherits it)
        except TypeError:   # an unhashable node id: never decided out (the sampler's guard drops it)
            pass
    st.submit(level, tag, fields)


_NODE_KEY = "node_id"   # the field the sampling decision is about (sampling.py reads the same one)
_SPLIT = "split"        # the record whose new node inherits its origin's decision
_NO_NODE = object()     # a record without a node id: in no drop set


def _load_hot() -> tuple[Any, Any] | None:
    """The C gate configured with :func:`_cptrace_py`, and the state it reads; None when not built, or with
    ``CPTRACE_PY_GATE=1``."""
    if os.environ.get("CPTRACE_PY_GATE") == "1":
        return None
    from .._speedups.hot import load

    return load(_cptrace_py, _trace_enabled_py, (_NODE_KEY, _SPLIT))


_loaded = _load_hot()
_hot: Any = _loaded[0] if _loaded is not None else None
_STATE: Any = _loaded[1] if _loaded is not None else _State()
del _loaded
# Replaced by the started pipeline's bounded-buffer append (restored by _uninstall and on fork).
_STATE.submit = _submit_unstarted
# The call sites' cptrace: the C gate when built (same contract, see the module doc), else the Python definition.
cptrace = _hot.cptrace if _hot is not None else _cptrace_py
trace_enabled = _hot.trace_enabled if _hot is not None else _trace_enabled_py


def flush(timeout_s: float = 30.0) -> bool:
    """Block until every record emitted before this call is exported or written; False on timeout, and once any
    record of this process was lost (:mod:`.losses`)."""
    try:
        from . import pipeline

        return pipeline.flush(timeout_s) and _losses.START.dropped == 0
    except Exception:  # (an import that fails where no file descriptor is left)
        return False


def shutdown(timeout_s: float = 30.0) -> bool:
    """Flush, then stop the pipeline (a later ``cptrace`` starts a new one). False if the flush timed out or any
    record of this process was lost."""
    try:
        from . import pipeline

        ok = pipeline.shutdown(timeout_s)
        return ok and _losses.START.take() == 0   # (drops with no pipeline: this shutdown answers for them)
    except Exception:
        return False


def rng(t: object) -> str:
    """Upstream ``rng``: ``(cnt=N,min=a,max=b,first=c,last=d)``, ``(0)``, ``(none)`` or ``(err:...)``.

    On a CUDA tensor the summary is computed in one launch and the result is deferred (see :func:`khash`).
    """
    from ..fingerprint import rng as _rng

    return _rng(t)


def khash(t: object) -> Any:
    """Upstream ``khash``: position-weighted fingerprint of the tensor's bytes (0 empty, -1 failure, -2 non-tensor
    where upstream gives it). On a CUDA tensor it returns a deferred value; ``int()`` forces it (a sync), passing it
    to ``cptrace`` resolves it off the caller's thread."""
    from ..fingerprint import khash as _khash

    return _khash(t)


def knz(t: object) -> Any:
    """Upstream ``knz``: count of nonzero bytes (0 empty, -1 failure). Deferred on CUDA tensors, like :func:`khash`."""
    from ..fingerprint import knz as _knz

    return _knz(t)


def fwd_hash(forward_batch: object, layer_id: object, stage: object, t: object, *, level: object = 3) -> None:
    """Upstream ``fwd_hash``: a level-3 ``fwd_hash`` record for one per-layer forward tensor.

    Skipped outside the EXTEND path and under CUDA-graph capture (nothing is launched there)."""
    try:
        if level > _STATE.level:
            return
    except Exception:
        level = _gate_level(level)
        if level is None or level > _STATE.level:
            return
    try:
        fm = getattr(forward_batch, "forward_mode", None)
        if fm is not None and hasattr(fm, "is_extend") and not fm.is_extend():
            return
        from ..fingerprint import forward_fingerprint

        h, nz, rows = forward_fingerprint(t)
        rids = getattr(forward_batch, "rids", None)
        lay = getattr(forward_batch, "cp_shared_kv_layout", None)
        cptrace(
            level,
            "fwd_hash",
            rid=(rids[0] if rids else "?"),
            nreq=(len(rids) if rids else 0),
            layer=layer_id,
            stage=stage,
            h=h,
            nz=nz,
            rows=rows,
            cprank=(getattr(lay, "cp_rank", -1) if lay is not None else -1),
        )
    except Exception:
        pass


def _after_fork_in_child() -> None:
    # The child inherits a copy of the buffer and a dead drainer thread: start over lazily on the next record.
    global _lock, _switch_lock
    _STATE.submit = _submit_unstarted
    _STATE.drop = None
    _lock = threading.Lock()
    _switch_lock = threading.Lock()   # (a fork during another thread's level change leaves it held)


# A forked child forgets the parent's pipeline (lifecycle runs this first, then the pipeline's own callback).
_lifecycle.on_fork_child(_after_fork_in_child)
# Now, before the application registers its own exit handlers: ours runs after them (see lifecycle).
_lifecycle.install_exit_hook()

reload_config()
