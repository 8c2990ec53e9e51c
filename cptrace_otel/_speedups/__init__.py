"""Optional C speedups of the hot loops, one C module per Python module it mirrors, each next to its loader here.

=====================  ==========================  ===============================================================
loader (Python)        C module (built by setup)   mirrors (the same results, held equal by the unit tests)
=====================  ==========================  ===============================================================
:mod:`.logreader`      ``_logreader``              the log reader's parser and chunk loop (``analyze.sources.logs``)
:mod:`.intake`         ``_intake``                 the exporter worker's item intake (``export.worker``)
:mod:`.otlp`           ``_otlp``                   the protobuf span and event encoders (``export.otlp_proto``)
:mod:`.hot`            ``_hot``                    the gate of ``api.cptrace`` (level compare, sampled-out lookup)
:mod:`.fingerprint`    ``_fingerprint``            CPU ``khash``/``knz``/``rng`` (``fingerprint.cpu``'s numpy path)
:mod:`.lockstep`       ``_lockstep``               C1's per-epoch state and step (``checks.cross_base.EpochC1``)
:mod:`.sortedruns`     ``_sortedruns``             records packed and runs merged (``analyze.sources.sortedruns``)
=====================  ==========================  ===============================================================

``value.c`` (the common shapes of :func:`cptrace_otel.model.logline.fast_value`, and the readers' shared configured
state) and ``event.c`` (building Events, epoch numbering) are compiled into each of ``_logreader``, ``_intake``,
``_otlpin`` and ``_jaegerin``.

Each loader's ``load()`` imports its C module, hands it what it must not declare itself (the Python types it
builds, the attribute keys and key layout of :mod:`cptrace_otel.model.attrs` / :mod:`cptrace_otel.model.semconv`, the
epoch tags of :mod:`cptrace_otel.checks.epochs`) and returns it, or None when it was not built: every caller then takes
its pure-Python path, with identical results. ``CPTRACE_REQUIRE_SPEEDUPS=1`` (``.ci/run``) makes the tests fail
instead of skipping when a module is missing. Each ``.c`` file's header names its Python twin (``Twin:``) and the
tests that hold the two equal (``Held equal by:``); a module whose callers hold its C twin in a global lets tests
switch it off with :func:`twin_off`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def twin_off(namespace: dict[str, Any], name: str) -> Iterator[None]:
    """Inside the block ``namespace[name]`` (a module's handle on its C twin, e.g. its ``globals()``) is None, so the
    module runs its Python twin; the handle is put back after. It switches the module, not one call: not for other
    users of the module running meanwhile."""
    saved, namespace[name] = namespace[name], None
    try:
        yield
    finally:
        namespace[name] = saved
