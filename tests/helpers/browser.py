"""The browser tests' helpers: Playwright's `expect`, the Chromium the `browser` fixture
launches (tests/browser/conftest.py), and what the tests do to the page (open it, show
a job, check that it fits). The page's `window.__studio` hook is what they wait on."""

from __future__ import annotations

import os
from typing import Any, NoReturn, Optional

import pytest

from tests.helpers.paths import REPO

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
VIEWPORT = {"width": 1280, "height": 900}  # the `page` fixture's
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
EXPECT_TIMEOUT = 15_000  # milliseconds
SECOND = 1000  # Playwright timeouts are in milliseconds
SCREENS = REPO / "test-artifacts" / "screens"
OVERFLOW = "document.scrollingElement.scrollWidth - window.innerWidth"

WRITE_IDB = """async (rows) => {
  const open = indexedDB.open("finetune-studio");
  const db = await new Promise((resolve, reject) => { open.onsuccess = () => resolve(open.result); open.onerror = () => reject(open.error); });
  const tx = db.transaction("events", "readwrite");
  for (const row of rows) tx.objectStore("events").put({ ...row, stored_at: Date.now() });
  await new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = () => reject(tx.error); });
  db.close();
}"""


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


def open_page(page: Any, url: str, fragment: str = "") -> None:
    """Open the page at `url` (after its `/`, `fragment`) and wait until it is ready."""
    page.goto(f"{url}/{fragment}")
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)


def open_ui(page: Any, url: str, job_id: Optional[str] = None, compare: Optional[str] = None) -> None:
    """Open the page showing `job_id` (beside `compare`), or no job."""
    fragment = ""
    if job_id:
        fragment = f"#job={job_id}" + (f"&compare={compare}" if compare else "")
    open_page(page, url, fragment)


def wait_js(page: Any, expression: str, timeout_s: float = 300) -> None:
    page.wait_for_function(expression, timeout=timeout_s * SECOND)


def next_frame(page: Any) -> None:
    """The view draws once per animation frame: let the frame after the data arrived pass."""
    page.evaluate("new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def show_job(page: Any, job_id: str, phase: str) -> None:
    """Show a job of the server, once the page has it in `phase`."""
    page.evaluate(f"location.hash = 'job={job_id}'")
    page.wait_for_function(
        f"window.__studio.jobId() === '{job_id}' && window.__studio.phase() === '{phase}'", timeout=20 * SECOND
    )
    page.wait_for_selector(f"[data-testid=job-item][data-job-id='{job_id}']", timeout=10 * SECOND)
    next_frame(page)


def status_event(job_id: str, event_id: int, phase: str, time: Optional[float]) -> dict[str, Any]:
    """A stored status event of a job, as the page keeps it in IndexedDB."""
    details: dict[str, Any] = (
        {"model_name": "/models/stored"} if time is None else {"model_name": "/models/stored", "time": time}
    )
    data = {
        "job_id": job_id,
        "phase": phase,
        "is_training_running": phase == "training",
        "message": phase,
        "error": None,
        "details": details,
    }
    return {"job_id": job_id, "id": event_id, "kind": "status", "data": data}


def show_stored_job(page: Any, job_id: str, events: list[dict[str, Any]]) -> None:
    """Put a job's events in IndexedDB and show it: the page draws it from there."""
    page.evaluate(WRITE_IDB, events)
    page.evaluate(f"location.hash = 'job={job_id}'")
    wait_js(page, f"window.__studio.jobId() === '{job_id}' && window.__studio.historyCount() === {len(events)}", 20)
    next_frame(page)


def assert_fits(page: Any, what: str) -> None:
    """Nothing scrolls sideways, and the whole screenshot is kept (test-artifacts/screens/)."""
    width = page.viewport_size["width"]
    overflow = page.evaluate(OVERFLOW)
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, 0)
    page.screenshot(path=str(SCREENS / f"{what}-{width}.png"), full_page=True)
    if overflow > 0:
        wide = page.evaluate(
            """() => [...document.querySelectorAll("body *")]
                 .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 0.5 && el.getClientRects().length)
                 .slice(0, 5).map((el) => `${el.tagName}.${el.className} ${Math.round(el.getBoundingClientRect().right)}`)"""
        )
        raise AssertionError(f"{what} at {width} px scrolls sideways by {overflow} px; too wide: {wide}")
