"""SGLang with no code change: ``CPTRACE_SGLANG=1`` makes ``sglang.srt.mem_cache.cp_hicache_trace`` this package.

Contract:

* The switch: ``1``, ``true``, ``yes``, ``on`` (any case, white space stripped) turn it on; unset, empty, ``0``,
  ``false``, ``no``, ``off`` leave it off silently; any other value leaves it off with one warning line on stderr
  (:func:`switch`).
* The file ``cptrace_otel_sglang.pth``, installed into site-packages with the package, runs one line at every
  interpreter start (:data:`PTH_LINE`): with the switch off it costs one environment lookup and imports nothing.
  Otherwise it loads this file alone (found with ``importlib.util.find_spec("cptrace_otel")``, which locates the
  package without importing it) and calls :func:`boot`: a few milliseconds and no import of ``cptrace_otel``.
  Whatever fails there (a package that is gone, a broken file) is one warning line, never a traceback.
* :func:`install` puts an :class:`AliasFinder` first on ``sys.meta_path``. Only when something imports
  :data:`MODULE` does it import :mod:`cptrace_otel.traced.api` and resolve the name to that module itself (same
  functions, same module state), whether or not the installed SGLang ships its own ``cp_hicache_trace``. If the
  package cannot be imported then (a broken install), one warning line says so and the other finders resolve the
  name as they would without the switch. Every scheduler process SGLang spawns is a new interpreter that inherits
  the environment, so it gets the alias too; ranks come from SGLang's parallel state
  (:mod:`cptrace_otel.traced.ranks`).
* Stock SGLang (no call sites): the same finder hooks :data:`HOOKED`, SGLang's HiCache tree module: right
  after SGLang's own loader has run it, :func:`cptrace_otel.traced.sglang.instrument_from_env` applies the
  instrumentation (once per process; a version it does not support gets one warning; a build with its own call
  sites is left alone). Nothing of SGLang or of the instrumentation is imported before SGLang imports that module.
* SGLang's kv-canary: when SGLang imports :data:`CANARY_MODULE` (its violation reporter), the finder hands that
  module's logger to :mod:`cptrace_otel.traced.canary_hook`, so each violation it logs becomes a ``kv_canary`` record
  (the CANARY finding on the node that held the slot, live). Lazily too: nothing is imported before SGLang does.
* Without the ``.pth`` (an editable install, a vendored copy):
  ``python -m cptrace_otel.traced.sglang_shim --write-pth`` writes it into this interpreter's site-packages (or
  ``--to DIR``).

Imports only ``os`` and ``sys`` at load time (not even ``typing``; its names are for the type checker only): it
runs at interpreter start, before the program.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False   # (typing is not imported at interpreter start; mypy reads this name as True)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

MODULE = "sglang.srt.mem_cache.cp_hicache_trace"
# SGLang's HiCache tree modules: 0.5.20's HiRadixCache, 0.5.23's UnifiedRadixCache
HOOKED = ("sglang.srt.mem_cache.hiradix_cache", "sglang.srt.mem_cache.unified_radix_cache")
# SGLang's kv-canary violation reporter (its module logger is the one canary_hook listens to)
CANARY_MODULE = "sglang.srt.kv_canary.runner.violation_reporter"
SWITCH = "CPTRACE_SGLANG"
ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})
PTH_NAME = "cptrace_otel_sglang.pth"

# Run by the .pth line when the switch is not plainly off: load this file as the module it is, without importing the
# package, and call boot(); any failure is one line on stderr (a .pth line that raises prints a traceback).
_BOOT = """import os, sys
n = 'cptrace_otel.traced.sglang_shim'
try:
    m = sys.modules.get(n)
    if m is None:
        import importlib.util as u
        pkg = u.find_spec('cptrace_otel')
        if pkg is None or not pkg.submodule_search_locations:
            raise ImportError('the cptrace_otel package is not installed')
        s = u.spec_from_file_location(n, os.path.join(pkg.submodule_search_locations[0], 'traced', 'sglang_shim.py'))
        m = u.module_from_spec(s)
        sys.modules[n] = m
        try:
            s.loader.exec_module(m)
        except BaseException:
            del sys.modules[n]
            raise
    m.boot()
except Exception as e:
    sys.stderr.write('cptrace_otel: WARNING: CPTRACE_SGLANG is set but cptrace_otel cannot be loaded (%s: %s); '
                     'SGLang runs untraced\\n' % (type(e).__name__, e))
"""
PTH_LINE = ("import os; (os.environ.get('CPTRACE_SGLANG') or '').strip().lower() not in ('', '0', 'false', 'no', "
            f"'off') and exec({_BOOT!r}, {{'__name__': 'cptrace_otel_sglang_boot'}})\n")

_warned = False


def _warn(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        sys.stderr.write(f"cptrace_otel: WARNING: {msg}\n")


def switch(value: str | None) -> bool | None:
    """What a ``CPTRACE_SGLANG`` value means: True on, False off, None an unknown value (off, and warned about)."""
    v = (value or "").strip().lower()
    if v in ON:
        return True
    return False if v in OFF else None


def boot() -> bool:
    """The ``.pth`` line's entry: install the alias when the switch is on; one warning for an unknown value."""
    value = os.environ.get(SWITCH)
    state = switch(value)
    if state is None:
        _warn(f"{SWITCH}={value!r} is not one of 1/true/yes/on (on) or 0/false/no/off (off): the SGLang alias stays "
              "off")
    return install() if state else False


class _AliasLoader:
    """Gives the importer :mod:`cptrace_otel.traced.api` itself (already executed)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return self._module

    def exec_module(self, module: ModuleType) -> None:
        pass   # cptrace_otel.traced.api is already executed


class AliasFinder:
    """A ``sys.meta_path`` finder: resolves :data:`MODULE` to :mod:`cptrace_otel.traced.api`, imported only then;
    every other name (and this one, when the package cannot be imported) is left to the other finders."""

    cptrace_alias = True   # how install() recognises one (the .pth loads this file apart from the package)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname in HOOKED or fullname == CANARY_MODULE:
            return self._instrumented(fullname, path, target)
        if fullname != MODULE:
            return None
        try:
            from . import api
        except Exception as e:  # a broken install: say it once, and let SGLang import what it would without us
            _warn(f"{SWITCH} is on but cptrace_otel cannot be imported ({type(e).__name__}: {e}); {MODULE} is not "
                  "aliased")
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _AliasLoader(api), origin="cptrace_otel.traced.api")  # type: ignore[arg-type]

    def invalidate_caches(self) -> None:
        pass

    def _instrumented(self, fullname: str, path: Sequence[str] | None,
                      target: ModuleType | None) -> ModuleSpec | None:
        """The spec the other finders give a :data:`HOOKED` module, its loader wrapped by
        :class:`_InstrumentingLoader`."""
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _InstrumentingLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


class _InstrumentingLoader:
    """SGLang's own loader; after it has executed the module, the instrumentation (or, for :data:`CANARY_MODULE`, the
    kv-canary handler) is applied (never raises)."""

    def __init__(self, inner: Loader) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:   # get_source, get_filename ...: the real loader's
        return getattr(self._inner, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            if getattr(module, "__name__", None) == CANARY_MODULE:
                from . import canary_hook

                canary_hook.install()
                return
            from .sglang import instrument_from_env

            instrument_from_env()
        except Exception as e:  # e.g. the sglang extra (opentelemetry-instrumentation, wrapt) is not installed
            import logging

            logging.getLogger("cptrace_otel.sglang").warning(
                "cptrace-otel: SGLang not instrumented (%s: %s); install cptrace-otel[sglang]", type(e).__name__, e)


def install() -> bool:
    """Put the alias first on ``sys.meta_path`` (idempotent); True when it was not there before."""
    if any(getattr(f, "cptrace_alias", False) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, AliasFinder())
    return True


def write_pth(directory: str | None = None) -> str:
    """Write :data:`PTH_NAME` into ``directory`` (default: this interpreter's first site-packages); its path."""
    if directory is None:
        import sysconfig

        directory = sysconfig.get_paths()["purelib"]
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(PTH_LINE)
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m cptrace_otel.traced.sglang_shim",
                                description=__doc__.split("\n")[0])
    p.add_argument("--write-pth", action="store_true", help=f"write {PTH_NAME} (the CPTRACE_SGLANG switch)")
    p.add_argument("--to", default=None, help="folder to write it to (default: site-packages)")
    a = p.parse_args(argv)
    if a.write_pth:
        print(write_pth(a.to))
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
