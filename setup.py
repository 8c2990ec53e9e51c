"""Optional C speedups. Everything in the package works without them (pure-Python fallbacks with identical results,
held equal by the unit tests); with a C compiler ``pip install -e .`` builds them and the hot loops use them.
They all live in ``cptrace_otel/_speedups/``, each C module next to the Python loader that configures it:

* ``cptrace_otel._speedups._otlp``: OTLP protobuf encoding of span events (the exporter worker's largest cost).
* ``cptrace_otel._speedups._logreader``: the upstream log-line reader used by ``cptrace-otel check``.
* ``cptrace_otel._speedups._intake``: the exporter worker's intake of live records.
* ``cptrace_otel._speedups._otlpin``: ``cptrace-otel serve``'s reading of OTLP protobuf requests into records.
* ``cptrace_otel._speedups._jaegerin``, ``_otlpjson``: the readers of Jaeger's answers (``watch``) and of OTLP JSON
  lines (``check``, ``report``) into records.
* ``cptrace_otel._speedups._hot``: the gate of ``cptrace`` (level compare, sampled-out lookup) before any dict, and
  the record ring (``ring.c``: records encoded on the caller's thread into memory the exporter process reads).
* ``cptrace_otel._speedups._lockstep``: the cross-rank rule C1's per-epoch state and step (``check``, ``watch``,
  ``serve``).
* ``cptrace_otel._speedups._fingerprint``: exact CPU ``khash``/``knz``/``rng`` at memory speed (AVX2 where the CPU
  has it, chosen at import; a portable kernel elsewhere).

``optional=True``: a machine without a compiler (or Python headers) still installs; set
``CPTRACE_REQUIRE_SPEEDUPS=1`` in tests to fail instead of falling back (``.ci/run`` does).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

_PTH = "cptrace_otel_sglang.pth"


class _BuildPyWithPth(build_py):
    """Also put ``cptrace_otel_sglang.pth`` at the top of the wheel, i.e. into site-packages: the ``CPTRACE_SGLANG``
    switch (cptrace_otel/traced/sglang_shim.py; one environment lookup per interpreter start while it is off).
    Editable installs do not get it: ``python -m cptrace_otel.traced.sglang_shim --write-pth`` writes it there."""

    def run(self) -> None:
        super().run()
        from importlib.util import module_from_spec, spec_from_file_location

        spec = spec_from_file_location("_shim", os.path.join("cptrace_otel", "traced", "sglang_shim.py"))
        shim = module_from_spec(spec)
        spec.loader.exec_module(shim)
        shim.write_pth(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, _PTH)]

# -fvisibility=hidden: value.c and event.c are linked into several modules; only PyInit_* is exported.
_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wno-unused-function", "-fvisibility=hidden"]
_DIR = "cptrace_otel/_speedups/"
# every reader's: the value grammar and the readers' configured state (value.c), the Event builder (event.c)
_SHARED = [_DIR + "value.c", _DIR + "event.c"]
# grammar.h: the record grammar's constants, generated from cptrace_otel/model/grammar.py (a changed one rebuilds all)
_HEADERS = [_DIR + "value.h", _DIR + "event.h", _DIR + "jsonscan.h", _DIR + "ring.h", _DIR + "idset.h",
            _DIR + "grammar.h"]


def _ext(name: str, sources: list[str], flags: tuple[str, ...] = ()) -> Extension:
    return Extension("cptrace_otel._speedups." + name, sources, depends=_HEADERS,
                     extra_compile_args=_FLAGS + list(flags), optional=True)


setup(
    cmdclass={"build_py": _BuildPyWithPth},
    ext_modules=[
        _ext("_otlp", [_DIR + "otlp.c"]),
        _ext("_lockstep", [_DIR + "lockstep.c"]),
        _ext("_logreader", [_DIR + "logreader.c"] + _SHARED),
        _ext("_intake", [_DIR + "intake.c"] + _SHARED),
        _ext("_otlpin", [_DIR + "otlpin.c"] + _SHARED),
        _ext("_jaegerin", [_DIR + "jaegerin.c"] + _SHARED),
        _ext("_otlpjson", [_DIR + "otlpjson.c"] + _SHARED),
        _ext("_sortedruns", [_DIR + "sortedruns.c", _DIR + "event.c"]),
        _ext("_hot", [_DIR + "hot.c", _DIR + "ring.c", _DIR + "idset.c"]),
        # -O3: the portable kernel's row loops and the rng min/max loops are left to the auto-vectorizer
        _ext("_fingerprint", [_DIR + "fingerprint.c"], ("-O3",)),
    ],
)
