"""Optional C speedups of the hot loops, one C module per Python module it mirrors, each next to its loader here.

=====================  ==========================  ===============================================================
loader (Python)        C module (built by setup)   mirrors (the same results, held equal by the unit tests)
=====================  ==========================  ===============================================================
:mod:`.logreader`      ``_logreader``              the log reader's parser and chunk loop (``analyze.sources.logs``)
:mod:`.intake`         ``_intake``                 the exporter worker's item intake (``export.worker``)
:mod:`.otlp`           ``_otlp``                   the protobuf span-event encoder (``export.otlp._event_field``)
=====================  ==========================  ===============================================================

``value.c`` (the common shapes of :func:`cptrace_otel.model.logline.fast_value`) and ``event.c`` (building Events, epoch
numbering) are compiled into both ``_logreader`` and ``_intake``.

Each loader's ``load()`` imports its C module, hands it what it must not declare itself (the Python types it
builds, the attribute keys and key layout of :mod:`cptrace_otel.model.attrs` / :mod:`cptrace_otel.model.semconv`, the
epoch tags of :mod:`cptrace_otel.checks.epochs`) and returns it, or None when it was not built: every caller then takes
its pure-Python path, with identical results. ``CPTRACE_REQUIRE_SPEEDUPS=1`` (``.ci/run``) makes the tests fail
instead of skipping when a module is missing.
"""
