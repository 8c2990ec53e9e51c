"""Headless Chromium for the browser tests: Debian's ``chromium`` package driven by Playwright from PyPI.

Playwright's own browser download (``playwright install``) is never used: the browser is launched from
``CPTRACE_CHROMIUM`` (default ``/usr/bin/chromium``) with ``--no-sandbox`` (the tests run as root) and
``--disable-dev-shm-usage`` (containers have a small /dev/shm). Where the browser or Playwright is missing the tests
skip with the reason, unless ``CPTRACE_REQUIRE_BROWSER=1`` (``.ci/run`` sets it): then they fail. Screenshots go to
``CPTRACE_TEST_ARTIFACTS`` (default ``out/browser`` in the repository,
git-ignored) and their paths are printed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Read at import: the root conftest clears CPTRACE_* from os.environ for every test.
REQUIRE_BROWSER = os.environ.get("CPTRACE_REQUIRE_BROWSER", "").strip() == "1"
CHROMIUM = os.environ.get("CPTRACE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("CPTRACE_TEST_ARTIFACTS") or ROOT / "out" / "browser")
_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE"))}


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``cptrace-otel ARGV...`` of this checkout in a subprocess (no cptrace/OTel variables of the caller)."""
    env = dict(_ENV, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), _ENV.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)


def browser_unavailable(reason: str) -> None:
    if REQUIRE_BROWSER:
        pytest.fail(f"{reason} (CPTRACE_REQUIRE_BROWSER=1, so this is an error, not a skip)", pytrace=False)
    pytest.skip(f"{reason}: apt-get install chromium; pip install playwright (set CPTRACE_REQUIRE_BROWSER=1 to fail "
                "instead)")


@contextlib.contextmanager
def chromium_page(width: int = 1500, height: int = 900) -> Iterator[tuple[object, list[str]]]:
    """``(page, errors)``: a page of a fresh headless Chromium; ``errors`` collects console errors and uncaught
    page exceptions as they happen."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_unavailable("Playwright is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        browser_unavailable(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"],
                                    headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            yield page, errors
        finally:
            browser.close()


def screenshot(page, name: str, full_page: bool = True) -> Path:
    """Save a PNG of ``page`` under :data:`ARTIFACTS` and print where."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    print(f"screenshot: {path}")
    return path
