"""Optional C speedups. Everything in the package works without them (pure-Python fallbacks with identical results,
held equal by the unit tests); with a C compiler ``pip install -e .`` builds them and the hot loops use them.

* ``cptrace_otel.export._otlpc``: OTLP protobuf encoding of span events (the exporter worker's largest cost).
* ``cptrace_otel.analyze.sources._logc``: the upstream log-line field parser used by ``cptrace-otel check``.

``optional=True``: a machine without a compiler (or Python headers) still installs; set
``CPTRACE_REQUIRE_SPEEDUPS=1`` in tests to fail instead of falling back (``.ci/run`` does).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

_PTH = "cptrace_otel_sglang.pth"


class _BuildPyWithPth(build_py):
    """Also put ``cptrace_otel_sglang.pth`` at the top of the wheel, i.e. into site-packages: the ``CPTRACE_SGLANG``
    switch (cptrace_otel/sglang_shim.py; one environment lookup per interpreter start while it is off). Editable
    installs do not get it: ``python -m cptrace_otel.sglang_shim --write-pth`` writes it there."""

    def run(self) -> None:
        super().run()
        from importlib.util import module_from_spec, spec_from_file_location

        spec = spec_from_file_location("_shim", os.path.join("cptrace_otel", "sglang_shim.py"))
        shim = module_from_spec(spec)
        spec.loader.exec_module(shim)
        shim.write_pth(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, _PTH)]

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wno-unused-function"]

setup(
    cmdclass={"build_py": _BuildPyWithPth},
    ext_modules=[
        Extension("cptrace_otel.export._otlpc", ["cptrace_otel/export/_otlpc.c"], extra_compile_args=_FLAGS,
                  optional=True),
        Extension("cptrace_otel.analyze.sources._logc", ["cptrace_otel/analyze/sources/_logc.c"],
                  extra_compile_args=_FLAGS, optional=True),
    ],
)
