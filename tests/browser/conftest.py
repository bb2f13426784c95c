"""Browser fixtures: Debian's Chromium driven by Python Playwright (headless).

The browser binary is the system's `chromium` (never one downloaded by
`playwright install`). Each test gets a fresh context (empty localStorage and
IndexedDB) with a laptop-sized viewport; uncaught page errors fail the test.

Without Chromium (or Playwright) the browser tests skip on a laptop, but fail
under CI (the environment variable CI set, as CI services do): there a skip
would hide that the UI went untested. The page helpers are tests/helpers/browser.py's.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.browser import CHROMIUM_ARGS, VIEWPORT, missing


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
