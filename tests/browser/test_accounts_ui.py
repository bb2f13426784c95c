"""The page with accounts on (issue 28, item 4), in a real Chromium: the sign-in form comes
before anything else and refuses a wrong password in words; alice signs in, starts a run
through the form and sees it, makes an API key in the key manager (shown once; it works)
and revokes it (it stops working), and signs out; bob then signs in on the same browser and
does not see alice's run. The server is the real app in this process with the scripted
worker the other page tests use (tests/helpers/page_studio.py), so nothing trains."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.api.accounts import SESSION_COOKIE
from finetune_studio.config import Settings
from tests.helpers.browser import SECOND, assert_fits, expect
from tests.helpers.page_studio import ScriptedLauncher, Studio, settle
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser

TOKEN = "accounts-page-token-7c2d0123456789"
PASSWORDS = {"alice": "alice-password-page", "bob": "bob-password-page"}


@pytest.fixture
def studio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Studio]:
    monkeypatch.chdir(REPO)
    launcher = ScriptedLauncher()
    settings = Settings(data_dir=tmp_path / "data", accounts=True, token=TOKEN, allowed_roots=[tmp_path],
                        stop_grace_seconds=5, kill_grace_seconds=1)
    with LiveServer(settings, launcher) as server:
        with contextlib.closing(Studio(server, launcher, tmp_path, TOKEN)) as studio:
            for name, password in PASSWORDS.items():
                made = studio.http.post("/auth/users", json={"name": name, "password": password})
                assert made.status_code == 201, made.text
            yield studio
            launcher.held.set()
            settle(server)


def sign_in(page: Any, name: str, password: str) -> None:
    """Sign in through the form, which the page shows before anything else, and wait until the page is ready."""
    dialog = page.get_by_test_id("signin-dialog")
    expect(dialog).to_be_visible()
    page.get_by_test_id("signin-name").fill(name)
    page.get_by_test_id("signin-password").fill(password)
    page.get_by_test_id("signin-submit").click()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("account-name")).to_have_text(name)
    expect(page.get_by_test_id("server-state")).to_have_attribute("data-state", "ok")


def session_cookies(page: Any) -> list[dict[str, Any]]:
    return [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]


def test_sign_in_train_keys_sign_out_and_another_user_sees_nothing_of_it(studio: Studio, page: Any) -> None:
    page.goto(f"{studio.url}/")
    # The sign-in form comes first: the page reads nothing before it (and Escape does not close it).
    expect(page.get_by_test_id("signin-dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("signin-dialog")).to_be_visible()
    assert page.evaluate("document.body.dataset.ready") is None
    assert_fits(page, "accounts-sign-in")
    page.get_by_test_id("signin-name").fill("alice")
    page.get_by_test_id("signin-password").fill("not-the-password")
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("signin-error")).to_contain_text("wrong name or password", use_inner_text=True)
    assert session_cookies(page) == []

    sign_in(page, "alice", PASSWORDS["alice"])
    cookie = session_cookies(page)[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == "", "the page's script can read the session cookie"

    # A run started through the form (a write with the cookie: the page sends the CSRF token).
    field = page.get_by_test_id
    field("field-model_name").fill(str(studio.model))
    field("field-local_datasets").fill(str(studio.data))
    field("field-project_name").fill("completed by alice")
    field("start-button").click()
    page.wait_for_function("window.__studio.phase() === 'completed'", timeout=30 * SECOND)
    job_id = page.evaluate("window.__studio.jobId()")
    expect(page.locator(f"[data-testid=job-item][data-job-id='{job_id}']")).to_be_visible()
    assert studio.detail(job_id)["request"]["project_name"] == "completed by alice"

    # The key manager: a key made here is shown once, works, and stops working once revoked.
    panel = field("keys-panel")
    panel.locator("summary").click()
    expect(field("key-list")).to_contain_text("No API keys yet", use_inner_text=True)
    field("key-name").fill("alice's laptop")
    field("key-scope-train").check()
    field("key-days").fill("30")
    field("key-create").click()
    secret = field("key-secret")
    expect(secret).to_contain_text("fts-")
    key = secret.inner_text().strip()
    item = field("key-item")
    expect(item).to_have_count(1)
    expect(item).to_contain_text("alice's laptop", use_inner_text=True)
    expect(field("key-prefix")).to_have_text(f"{key[:12]}…")
    expect(field("key-scopes-shown")).to_have_text("read, train")
    expect(field("key-dates")).to_contain_text("last used never", use_inner_text=True)
    assert_fits(page, "accounts-keys")
    with_key = httpx.get(f"{studio.url}/auth/me", headers={"Authorization": f"Bearer {key}"})
    assert with_key.status_code == 200 and with_key.json()["name"] == "alice"
    assert with_key.json()["scopes"] == ["read", "train"]
    field("key-revoke").click()
    expect(field("key-list")).to_contain_text("No API keys yet", use_inner_text=True)
    expect(secret).to_be_hidden()
    assert httpx.get(f"{studio.url}/auth/me", headers={"Authorization": f"Bearer {key}"}).status_code == 401

    # Sign out: the form comes back, the cookie is gone.
    field("sign-out").click()
    expect(page.get_by_test_id("signin-dialog")).to_be_visible()
    assert session_cookies(page) == []

    # Bob, on the same browser, sees none of alice's runs, nor reaches hers by its id.
    sign_in(page, "bob", PASSWORDS["bob"])
    expect(page.get_by_test_id("job-item")).to_have_count(0)
    expect(page.get_by_test_id("no-job")).to_be_visible()
    assert page.evaluate(f"fetch('train/status/{job_id}').then((r) => r.status)") == 404
    panel.locator("summary").click()
    expect(field("key-list")).to_contain_text("No API keys yet", use_inner_text=True)

    # Bob is removed: the page's next poll is a 401, and the sign-in form comes back saying why.
    assert studio.http.delete("/auth/users/bob").status_code == 204
    expect(page.get_by_test_id("signin-dialog")).to_be_visible(timeout=20 * SECOND)
    expect(page.get_by_test_id("signin-note")).to_contain_text("session has ended", use_inner_text=True)
    # Alice signs in there: the page starts again as hers, and her run is still there.
    page.get_by_test_id("signin-name").fill("alice")
    page.get_by_test_id("signin-password").fill(PASSWORDS["alice"])
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("account-name")).to_have_text("alice")
    expect(page.locator(f"[data-testid=job-item][data-job-id='{job_id}']")).to_be_visible()
