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
        if fullname != MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(), origin="cptrace_otel.traced.api")


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
