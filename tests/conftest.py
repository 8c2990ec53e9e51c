"""Shared fixtures: every test starts with no cptrace/OTel variables from the developer's shell."""

from __future__ import annotations

import os

import pytest

_PREFIXES = ("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE_KV_TRACE")


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(_PREFIXES):
            monkeypatch.delenv(k, raising=False)
