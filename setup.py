"""Optional C speedups. Everything in the package works without them (pure-Python fallbacks with identical results,
held equal by the unit tests); with a C compiler ``pip install -e .`` builds them and the hot loops use them.

* ``cptrace_otel.export._otlpc``: OTLP protobuf encoding of span events (the exporter worker's largest cost).
* ``cptrace_otel.analyze.sources._logc``: the upstream log-line field parser used by ``cptrace-otel check``.

``optional=True``: a machine without a compiler (or Python headers) still installs; set
``CPTRACE_REQUIRE_SPEEDUPS=1`` in tests to fail instead of falling back (``.ci/run`` does).
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wno-unused-function"]

setup(
    ext_modules=[
        Extension("cptrace_otel.export._otlpc", ["cptrace_otel/export/_otlpc.c"], extra_compile_args=_FLAGS,
                  optional=True),
        Extension("cptrace_otel.analyze.sources._logc", ["cptrace_otel/analyze/sources/_logc.c"],
                  extra_compile_args=_FLAGS, optional=True),
    ],
)
