"""Shared fixtures: every test starts with no cptrace/OTel variables from the developer's shell; ``fresh_pipeline``
for the tests that trace."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_PREFIXES = ("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE_KV_TRACE")


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(_PREFIXES):
            monkeypatch.delenv(k, raising=False)


@pytest.fixture
def python_log_reader() -> Iterator[None]:
    """The upstream log reader reads with its Python reader alone for the test (the C reader switched off)."""
    from cptrace_otel.analyze.sources import logs

    with logs.python_reader():
        yield


@pytest.fixture
def python_worker_intake() -> Iterator[None]:
    """The exporter worker takes items in with its Python intake alone for the test (the C intake switched off)."""
    from cptrace_otel.export import worker

    with worker.python_intake():
        yield


@pytest.fixture
def fresh_pipeline() -> Iterator[None]:
    """No pipeline running when the test starts, none left behind after it, and the settings read again from the
    (cleaned) environment. Modules that trace use it for every test: ``pytestmark = usefixtures("fresh_pipeline")``."""
    from cptrace_otel.traced import api

    api.shutdown(10)
    yield
    api.shutdown(10)
    api.reload_config()
