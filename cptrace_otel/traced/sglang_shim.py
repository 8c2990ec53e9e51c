"""SGLang with no code change: ``CPTRACE_SGLANG=1`` makes ``sglang.srt.mem_cache.cp_hicache_trace`` this package.

Contract:

* The file ``cptrace_otel_sglang.pth``, installed into site-packages with the package, runs one line at every
  interpreter start: it reads ``CPTRACE_SGLANG`` and, only when it is set to something other than ``0``, calls
  :func:`install`. With the switch off it costs one environment lookup and imports nothing.
* :func:`install` puts an :class:`AliasFinder` first on ``sys.meta_path``: importing
  :data:`MODULE` then yields :mod:`cptrace_otel.traced.api` itself (same functions, same module state), whether or not
  the installed SGLang ships its own ``cp_hicache_trace``. Every scheduler process SGLang spawns is a new interpreter
  that inherits the environment, so it gets the alias too; ranks come from SGLang's parallel state
  (:mod:`cptrace_otel.traced.ranks`).
* Stock SGLang (no call sites): the same finder hooks :data:`HOOKED`, SGLang's HiCache tree module: right
  after SGLang's own loader has run it, :func:`cptrace_otel.traced.sglang.instrument_from_env` applies the
  instrumentation (once per process; a version it does not support gets one warning; a build with its own call
  sites is left alone). Nothing of SGLang or of the instrumentation is imported before SGLang imports that module.
* Without the ``.pth`` (an editable install, a vendored copy):
  ``python -m cptrace_otel.traced.sglang_shim --write-pth`` writes it into this interpreter's site-packages (or ``--to
  DIR``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

MODULE = "sglang.srt.mem_cache.cp_hicache_trace"
# SGLang's HiCache tree modules: 0.5.20's, and the later releases' (refused with a warning, not silently)
HOOKED = ("sglang.srt.mem_cache.hiradix_cache", "sglang.srt.mem_cache.unified_radix_cache")
SWITCH = "CPTRACE_SGLANG"
PTH_NAME = "cptrace_otel_sglang.pth"
PTH_LINE = ("import os; os.environ.get('CPTRACE_SGLANG', '0') not in ('', '0') and "
            "__import__('cptrace_otel.traced.sglang_shim').traced.sglang_shim.install()\n")


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> Any:
        from . import api

        return api

    def exec_module(self, module: Any) -> None:
        pass   # cptrace_otel.traced.api is already executed


class AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves :data:`MODULE` to :mod:`cptrace_otel.traced.api`; every other name is left to the other finders."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in HOOKED:
            return self._instrumented(fullname, path, target)
        if fullname != MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(), origin="cptrace_otel.traced.api")

    def _instrumented(self, fullname: str, path: Any, target: Any) -> Any:
        """The spec the other finders give a :data:`HOOKED` module, its loader wrapped by
        :class:`_InstrumentingLoader`."""
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _InstrumentingLoader(spec.loader)
                return spec
        return None


class _InstrumentingLoader(importlib.abc.Loader):
    """SGLang's own loader; after it has executed the module, the instrumentation is applied (never raises)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:   # get_source, get_filename ...: the real loader's
        return getattr(self._inner, name)

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        try:
            from .sglang import instrument_from_env

            instrument_from_env()
        except Exception as e:  # e.g. the sglang extra (opentelemetry-instrumentation, wrapt) is not installed
            import logging

            logging.getLogger("cptrace_otel.sglang").warning(
                "cptrace-otel: SGLang not instrumented (%s: %s); install cptrace-otel[sglang]", type(e).__name__, e)


def install() -> bool:
    """Put the alias first on ``sys.meta_path`` (idempotent); True when it was not there before."""
    if any(isinstance(f, AliasFinder) for f in sys.meta_path):
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
