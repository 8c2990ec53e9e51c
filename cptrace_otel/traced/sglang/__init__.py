"""Instrumentation of stock SGLang's HiCache: every record of the domain reference at its real site, no code change.

Stock SGLang has no ``cp_hicache_trace`` call sites (they exist only in private builds). This package adds them
from the outside, the way OpenTelemetry's instrumentations do: :class:`SGLangInstrumentor` is a
``BaseInstrumentor`` (package ``opentelemetry-instrumentation``, extra ``cptrace-otel[sglang]``) whose
:meth:`~SGLangInstrumentor.instrument` wraps SGLang's methods with ``wrapt`` and whose
:meth:`~SGLangInstrumentor.uninstrument` restores them. Records go through the project's public API
(:func:`cptrace_otel.cptrace`), so the gate (``CPTRACE_LEVEL``), the sinks and the checks are the usual ones.

Contract:

* Supported: sglang ``>= 0.5.20, <= 0.5.23``: 0.5.20 (``HiRadixCache``, its last release; :data:`SITES`) and
  0.5.23 (``UnifiedRadixCache`` + ``HybridCacheController`` over the Python ``UnifiedTreeCore``, the full-attention
  KV component; :data:`SITES23`, whose module doc says what is not covered) and over its Rust tree core, the one
  SGLang selects by default, at the core's Python boundary (:data:`._rust23.RUST_SITES23`, armed when SGLang
  imports the core's adapter; the module doc lists what is inferred there, what is not traced and what is missing).
  The user's tree core is kept; ``CPTRACE_SGLANG_TREE_CORE=python`` is the option that switches to the Python core
  where SGLang's variable is unset (:func:`python_tree_core`). :func:`sites` picks the table of the
  importable SGLang; both share one record grammar and its code. Another version, or a build with neither cache:
  one warning, nothing wrapped, never an exception. A build that ships its own ``cp_hicache_trace`` call sites is
  never instrumented (one info line).
* ``CPTRACE_SGLANG=1`` applies it in every SGLang process, lazily, when SGLang imports its ``hiradix_cache`` or
  ``unified_radix_cache`` (:mod:`cptrace_otel.traced.sglang_shim`).
* Nothing here ever raises into SGLang or changes what SGLang computes: each wrapper calls the wrapped method
  exactly as called and records around it; a recording error costs that record only.
* No work while tracing is off (level 0): ``instrument()`` then wraps only the sites that must act at any level
  (:data:`ALWAYS`: the cache constructors and the storage backend's attach); every other site, a hot one (the
  allocator's frees, the match, the insert and eviction steps, the backups, the acks, the Rust core's boundary), is
  wrapped when tracing turns on (``configure``/``reload_config`` to level 1 or more,
  :func:`cptrace_otel.traced.api.watch_switch`: before the new level is in force) and unwrapped when it turns off
  (after level 0 is), so a process at level 0 runs SGLang's own methods at every hot site. Each hot wrapper's first
  act is to find tracing off and pass through, so wrapped or not at level 0, SGLang runs the same: a cache built while
  tracing is off is traced when it turns on, as before (its state attached at its build; its records begin mid-life,
  without the ``config`` record written at the build). Why not a cheaper wrapper instead: any wrapper costs a Python
  call per site call, about 25 a scheduler step (``wrapt``'s dispatch was about 0.8 us of them), and an unwrapped
  method costs nothing; ``wrapt`` keeps ``uninstrument()`` exact (the same function objects back). Wrapping is all or
  none at each switch: where a site cannot be wrapped, none stays wrapped (one warning).
* ``CPTRACE_SGLANG_EXACT=1`` adds the exact run-length sets ``devx``/``hostx``/``idx_x`` (domain 3.1) to the
  records that carry slot ranges.

Readings of SGLang that decide where a record goes (the README's "Use it with SGLang" lists them):

* ``ack dir=h2d``: SGLang's load ack names only the load's last node; one record is written per node of the
  load's chain (as recorded by ``reload``, with the splits that happened while the load was in flight applied),
  each with that node's own device hash.
* write_back staging: ``_evict_write_back`` detaches a node (``_detach_backuped``: value=None) before the
  flush's write acks and frees its device pages only in the flush's ``evict_device``. ``evict tier=dev`` is
  recorded there, where the pages are really freed, after the acks.
* ``rid_map`` is recorded when the call carries the request (``params.req`` with a ``rid``), as the scheduler's
  calls do; where SGLang traces that request it carries SGLang's request span (``req_span``) and SGLang's request
  gets a ``cptrace.node`` event back (:mod:`._reqlink`, docs/traces.md).
* The L3 storage tier (a storage backend on): :mod:`._l3_sites` (0.5.20) and :mod:`._l3_sites23` (0.5.23, the
  ``file`` and ``seaweedfs`` backends; another backend leaves the cache untraced) write ``l3_backup``, ``l3_ack``,
  ``l3_query``, ``l3_prefetch``, ``l3_hit`` on the scheduler thread, with the same wrappers; SGLang's storage threads
  are never wrapped.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Collection
from typing import Any, ClassVar

from opentelemetry.instrumentation import instrumentor as _otel_instrumentor

from ..api import unwatch_switch, watch_switch
from . import _audit
from ._rust23 import ADAPTER, RUST_SITES23
from ._sites import SITES
from ._sites23 import SITES23
from ._state import (
    RUST_ARMED as _RUST_ARMED,
    Recorder,
    cache_flavour,
    python_core_option,
    version_verdict,
    warn_once as _warn_once,
)

# Any: the package's type information differs between its versions (the subclass is checked at run time by it)
# (getattr: mypy sees the attribute as absent in some of those versions)
BaseInstrumentor: Any = getattr(_otel_instrumentor, "BaseInstrumentor")  # noqa: B009

__all__ = ["SITES", "SITES23", "SUPPORTED", "SGLangInstrumentor", "instrument_from_env", "sites", "version_verdict"]

logger = logging.getLogger("cptrace_otel.sglang")

SUPPORTED = "sglang >= 0.5.20, <= 0.5.23"

def sites() -> list[tuple[str, str, Any]]:
    """The site table of the importable SGLang: :data:`SITES` (0.5.20's ``HiRadixCache``) or :data:`SITES23`
    (0.5.23's ``UnifiedRadixCache``; the Rust tree core's boundary sites, :data:`._rust23.RUST_SITES23`, are wrapped
    apart, when SGLang imports their module); one grammar, the record code shared."""
    if cache_flavour() != "unified":
        return SITES
    return SITES23


class SGLangInstrumentor(BaseInstrumentor):
    """``SGLangInstrumentor().instrument()`` adds the records; ``.uninstrument()`` removes every wrapper.

    Keyword arguments of :meth:`instrument`: ``exact`` (bool, default the ``CPTRACE_SGLANG_EXACT`` setting) and
    ``cp_mode`` (the ``config`` record's ``mode`` when the attention CP group has more than one rank; default the
    ``CPTRACE_CP_MODE`` setting, else the mode SGLang's own server arguments give: stock prefill CP is
    ``prefill_cp``, KV-cache sharding ``sharded``, DCP ``dcp``; :mod:`._cpmode`). A mode set here or in the
    environment that disagrees with the derived one wins, with one warning; the ``config`` record says which mode,
    who decided it (``mode_src``) and what it was derived from (``mode_why``). ``audit_mbps`` (default the
    ``CPTRACE_AUDIT_MBPS`` setting, else 0: off): the rate of the audit of host copies at rest (:mod:`._audit`)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return (SUPPORTED,)

    def instrument(self, **kwargs: object) -> Any:
        """Wrap SGLang's HiCache (see the module doc); None, with one warning, where this SGLang is not supported.

        The version is read from the imported ``sglang`` package itself (a vendored copy has no dist metadata),
        so BaseInstrumentor's metadata check is replaced by :func:`version_verdict`."""
        try:
            ok, why = version_verdict()
        except Exception as e:  # an SGLang that cannot even be inspected is not instrumented
            ok, why = False, f"cannot inspect sglang ({type(e).__name__}: {e})"
        if not ok:
            if why.startswith("own-call-sites"):
                logger.info("cptrace-otel: %s; not instrumenting it twice", why.split(":", 1)[1].strip())
            else:
                _warn_once(why, f"cptrace-otel: SGLang not instrumented: {why} (supported: {SUPPORTED})")
            return None
        kwargs["skip_dep_check"] = True
        return super().instrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:   # (Any: the caller's options, each checked at run time)
        from ...model import config as _config

        exact = kwargs.get("exact")
        env = _config.from_env()
        if exact is None:
            exact = env.sglang_exact
        mode = _config.cp_mode_setting(kwargs.get("cp_mode"), "instrument(cp_mode)")
        Recorder.configure(exact=bool(exact), cp_mode=mode or env.cp_mode,
                           cp_mode_src="instrument" if mode else "CPTRACE_CP_MODE" if env.cp_mode else "",
                           audit_mbps=_audit.rate_setting(kwargs.get("audit_mbps")))
        unified = cache_flavour() == "unified"
        if unified:
            python_tree_core()
        table = sites()
        self._cptrace_sites = table
        _register_cache_class()
        _wrap_all([s for s in table if s[1] in ALWAYS])   # (raises, nothing left wrapped, where one fails)
        try:
            for module, attr, _ in table:   # all or nothing: every site is there before any record
                _resolve(module, attr)
        except Exception:
            self._uninstrument()
            raise
        with _Hot.lock:
            _Hot.sites = [s for s in table if s[1] not in ALWAYS]
            _Hot.armed = True
        if unified:
            _arm_rust_when_imported()
        watch_switch(_switch)   # (wraps the hot sites at once where tracing is on)

    def _uninstrument(self, **kwargs: object) -> None:
        unwatch_switch(_switch)   # (after any switch in progress: none follows)
        _audit.stop()
        with _Hot.lock:
            _Hot.armed = False
            for module, attr, _ in [*(getattr(self, "_cptrace_sites", None) or sites()), *_RUST_ARMED]:
                _unwrap(module, attr)   # (a site not wrapped now is left as it is)
            _Hot.sites, _Hot.on = [], False
            _RUST_ARMED.clear()
        from ._layerwise23 import drop_all

        drop_all()   # the per-object hooks of load-backs still in flight


# The sites wrapped from instrument() on, whatever the level (the module doc's "No work while tracing is off"): the
# cache constructors attach the per-cache state (a cache built while tracing is off is traced when it turns on), and a
# storage backend attached at run time detaches a cache the sites do not cover (attached while off and not detached,
# the cache would give partial records once tracing turns on).
ALWAYS = frozenset({"HiRadixCache.__init__", "UnifiedRadixCache.init_hicache",
                    "UnifiedRadixCache.attach_storage_backend"})


class _Hot:
    """The hot sites (see :data:`ALWAYS`) of the instrumented SGLang: wrapped while tracing is on, all or none."""

    lock = threading.Lock()   # one of instrument's, uninstrument's, a switch's or the Rust import's changes at a time
    sites: ClassVar[list[tuple[str, str, Any]]] = []   # the table's hot sites (the Rust ones: :data:`_RUST_ARMED`)
    armed = False   # instrumented (a post-import hook left from an earlier instrument() finds it False)
    on = False      # the hot sites are wrapped now


def _switch(on: bool) -> None:
    """Tracing turned on (wrap every hot site, the Rust core's among them once armed) or off (unwrap them, and drop
    the per-object hooks of load-backs in flight, whose acks will not be recorded). Never raises: where a wrap
    fails, none stays wrapped and the caches are not traced (one warning)."""
    with _Hot.lock:
        if not _Hot.armed or on == _Hot.on:
            return
        if not on:
            for module, attr, _ in [*_Hot.sites, *_RUST_ARMED]:
                _unwrap(module, attr)
            _Hot.on = False
            from ._layerwise23 import drop_all

            drop_all()
            return
        try:
            _wrap_all([*_Hot.sites, *_RUST_ARMED])
        except Exception as e:  # the traced process is never crashed by tracing
            _warn_once("hot-sites", f"cptrace-otel: SGLang's sites could not be wrapped when tracing turned on "
                       f"({type(e).__name__}: {e}); its caches are not traced")
            return
        _Hot.on = True


def _wrap_all(table: list[tuple[str, str, Any]]) -> None:
    """Wrap every site of ``table``, or (raising the failure) none."""
    import wrapt

    done: list[tuple[str, str]] = []
    try:
        for module, attr, wrapper in table:
            wrapt.wrap_function_wrapper(module, attr, wrapper)
            done.append((module, attr))
    except Exception:
        for module, attr in done:   # a half-instrumented SGLang would give false findings
            _unwrap(module, attr)
        raise


def _register_cache_class() -> None:
    """Name the cache class to :func:`._state.state_of`, which warns about a cache built before ``instrument()``."""
    from . import _state

    mod, name = (_state.UNIFIED, "UnifiedRadixCache") if cache_flavour() == "unified" else (_state.HIRADIX,
                                                                                               "HiRadixCache")
    cls = getattr(importlib.import_module(mod), name)
    if cls not in _state.CACHE_CLASSES:
        _state.CACHE_CLASSES.append(cls)


TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def python_tree_core() -> bool:
    """The option ``CPTRACE_SGLANG_TREE_CORE=python``: choose 0.5.23's Python ``UnifiedTreeCore`` for the caches
    this process builds, unless the user chose a tree core (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` set). True
    when it chose.

    By default nothing is set: the cache is the one SGLang selects (its Rust core wherever its extension loads),
    and a Rust core is traced at its Python boundary (:mod:`._rust23`). What that boundary cannot trace (the audit
    of copies at rest) gets one warning naming this option, which
    traces it on the Python core. SGLang reads the variable when a cache is built, and its own KV-sharding hook
    defaults it to ``python`` the same way (only when unset)."""
    if not python_core_option() or os.environ.get(TREE_CORE_ENV) is not None:   # (a bad value warned about first)
        return False
    os.environ[TREE_CORE_ENV] = "python"
    logger.info("cptrace-otel: %s=python (CPTRACE_SGLANG_TREE_CORE=python: the Python tree core)", TREE_CORE_ENV)
    return True


def _arm_rust_when_imported() -> None:
    """Arm :data:`RUST_SITES23` when SGLang imports the Rust core's adapter (at once where it has). SGLang imports
    it only to build a Rust core, and importing it loads (or builds) the Rust extension: the instrumentation never
    imports it itself."""
    import wrapt

    # (calls it now where the module is imported; a hook left from an earlier instrument() finds the sites armed)
    wrapt.register_post_import_hook(_arm_rust, ADAPTER)


def _arm_rust(module: object) -> None:
    """Arm all of :data:`RUST_SITES23` (each resolved; wrapped now where tracing is on, else at the switch) or none
    (one warning: a Rust-core cache is then left untraced, ``_sites23.untraceable``); never raises into SGLang's
    import."""
    with _Hot.lock:
        if not _Hot.armed or _RUST_ARMED:
            return
        try:
            for mod, attr, _ in RUST_SITES23:
                _resolve(mod, attr)
            if _Hot.on:
                _wrap_all(RUST_SITES23)
        except Exception as e:  # the traced process is never crashed by tracing
            _warn_once("rust-sites", f"cptrace-otel: the Rust tree core's boundary could not be wrapped "
                       f"({type(e).__name__}: {e}); a Rust-core cache is not traced (CPTRACE_SGLANG_TREE_CORE=python "
                       "traces the Python core)")
            return
        _RUST_ARMED.extend(RUST_SITES23)


def _resolve(module: str, attr: str) -> Any:
    """The object ``module``'s dotted ``attr`` names (raises where it is missing)."""
    obj: Any = importlib.import_module(module)
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def _unwrap(module: str, attr: str) -> None:
    from opentelemetry.instrumentation.utils import unwrap

    owner, _, name = attr.rpartition(".")
    unwrap(_resolve(module, owner) if owner else importlib.import_module(module), name)


def instrument_from_env() -> bool:
    """Apply :class:`SGLangInstrumentor` once in this process (the ``CPTRACE_SGLANG=1`` hook); never raises.
    True when SGLang is instrumented after the call."""
    try:
        inst = SGLangInstrumentor()
        if not inst.is_instrumented_by_opentelemetry:
            inst.instrument()
        return bool(inst.is_instrumented_by_opentelemetry)
    except Exception as e:  # the traced process is never crashed by tracing
        _warn_once("hook", f"cptrace-otel: SGLang instrumentation failed ({type(e).__name__}: {e}); not traced")
        return False
