"""Browser fixtures: Debian's Chromium driven by Python Playwright (headless).

The browser binary is the system's `chromium` (never one downloaded by
`playwright install`). Each test gets a fresh context (empty localStorage and
IndexedDB) with a laptop-sized viewport; uncaught page errors fail the test.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}


# Package scope: Playwright's sync API keeps an event loop running in this thread
# while it lives, so it must be gone before other tests call asyncio.run().
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium); the browser tests need it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
