"""Browser fixtures: Debian's Chromium driven by Python Playwright (headless).

The browser binary is the system's `chromium` (never one downloaded by
`playwright install`). Each test gets a fresh context (empty localStorage and
IndexedDB) with a laptop-sized viewport; uncaught page errors fail the test.

Without Chromium (or Playwright) the browser tests skip on a laptop, but fail
under CI (the environment variable CI set, as CI services do): there a skip
would hide that the UI went untested.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any, NoReturn

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
EXPECT_TIMEOUT = 15_000  # milliseconds


def expect(target: Any, message: str | None = None) -> Any:
    """Playwright's `expect`: its assertions retry until the state holds or EXPECT_TIMEOUT
    passes. What the page shows after an action (a click, a fill, a state the test waited
    for in `window.__studio`) is drawn on a later animation frame, so it is read through
    this, never at once (`is_hidden()`, `count()`, `inner_text()` read once and race the
    next frame). Imported when called, so the tests still skip where Playwright is missing."""
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=EXPECT_TIMEOUT)
    return playwright_expect(target, message)


def missing(what: str) -> NoReturn:
    """Skip the browser tests for want of `what`; under CI, fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{what}; CI must run the browser tests: install it in the CI image", pytrace=False)
    pytest.skip(what)


# Package scope: Playwright's sync API keeps an event loop running in this thread
# while it lives, so it must be gone before other tests call asyncio.run().
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    executable = shutil.which("chromium")
    if executable is None:
        missing("chromium is not on PATH (Debian: apt-get install chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        missing("playwright is not installed (pip install playwright)")
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
