"""The page's sign-in (issue 28, item 4) against a real server (uvicorn on loopback, real SQLite,
httpx): a name and password set an HttpOnly, SameSite=Strict session cookie, every write made
with it must carry the session's CSRF token, signing out or removing the user ends it (and
its open streams), failed sign-ins are rate-limited per address and per account, and another
site's page can write nothing, with the cookie or without. After each test the data dir and
the server's log are searched for every password and session id used: none is there."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from finetune_studio.api.accounts import CSRF_HEADER, MAX_FAILURES, SESSION_COOKIE
from finetune_studio.config import Settings
from finetune_studio.jobs import accounts as accounts_table
from finetune_studio.jobs.accounts import SESSION_SECONDS
from tests.helpers.jobs import job_request
from tests.helpers.page_studio import ScriptedLauncher
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.slow  # each test runs a server

TOKEN = "admin-token-page-0123456789abcdef"
PASSWORDS = {"root": "root-password-3141", "alice": "alice-password-2718", "bob": "bob-password-1618"}


class Page:
    """A live server with accounts on (root an admin; alice, bob users) and what a page would send it."""

    def __init__(self, server: LiveServer, launcher: ScriptedLauncher, root: Path) -> None:
        self.server, self.launcher, self.url = server, launcher, server.url
        self.http = httpx.Client(base_url=server.url, timeout=30)
        self.admin = {"Authorization": f"Bearer {TOKEN}"}
        self.sessions: list[str] = []  # every session cookie's value handed out: never stored, never logged
        for name, password in PASSWORDS.items():
            made = self.http.post("/auth/users", json={"name": name, "password": password, "admin": name == "root"},
                                  headers=self.admin)
            assert made.status_code == 201, made.text
        self.model = root / "in" / "model"
        self.model.mkdir(parents=True)
        (self.model / "config.json").write_text("{}")
        self.data = root / "in" / "train.jsonl"
        self.data.write_text('{"instruction": "hi", "output": "hello"}\n')

    def sign_in(self, name: str, password: Optional[str] = None, **options: Any) -> httpx.Response:
        answer = self.http.post("/auth/session", json={"name": name, "password": password or PASSWORDS[name]}, **options)
        value = session_of(answer)
        if value:
            self.sessions.append(value)
        self.http.cookies.clear()  # each request below names its cookie itself
        return answer

    def session(self, name: str) -> tuple[dict[str, str], str]:
        """A signed-in session of `name`: its Cookie header and its CSRF token."""
        answer = self.sign_in(name)
        assert answer.status_code == 200, answer.text
        return cookie(session_of(answer)), str(answer.json()["csrf_token"])

    def job(self, script: str = "completed") -> dict[str, Any]:
        return job_request(self.model, local_datasets=[str(self.data)], project_name=script)


def session_of(answer: httpx.Response) -> str:
    """The session cookie's value that `answer` sets ("" when none)."""
    for header in answer.headers.get_list("set-cookie"):
        jar: SimpleCookie = SimpleCookie()
        jar.load(header)
        if SESSION_COOKIE in jar:
            return jar[SESSION_COOKIE].value
    return ""


def cookie_attributes(answer: httpx.Response) -> dict[str, str]:
    """The attributes (lower-case names) of the session cookie `answer` sets."""
    header = next(h for h in answer.headers.get_list("set-cookie") if h.startswith(f"{SESSION_COOKIE}="))
    parts = [part.strip() for part in header.split(";")[1:]]
    return {name.lower(): value for name, _, value in (part.partition("=") for part in parts)}


def cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={value}"}


@pytest.fixture
def page(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[Page]:
    caplog.set_level(logging.DEBUG)
    launcher = ScriptedLauncher()
    settings = Settings(data_dir=tmp_path / "data", accounts=True, token=TOKEN, allowed_roots=[tmp_path / "in"],
                        stop_grace_seconds=1, kill_grace_seconds=1)
    with LiveServer(settings, launcher) as server:
        studio = Page(server, launcher, tmp_path)
        try:
            yield studio
        finally:
            launcher.held.set()
            studio.http.close()
    # Nothing secret in clear: the data dir (database, WAL, job folders) and the server's log.
    stored = b"".join(path.read_bytes() for path in (tmp_path / "data").rglob("*") if path.is_file())
    logged = caplog.text.encode()
    for secret in [*PASSWORDS.values(), *studio.sessions]:
        assert secret.encode() not in stored, "a password or session id is stored in clear"
        assert secret.encode() not in logged, "a password or session id is in the server's log"


def test_sign_in_checks_the_password_and_sets_a_strict_http_only_cookie(page: Page) -> None:
    wrong = page.sign_in("alice", "not-alices-password")
    assert wrong.status_code == 401 and not session_of(wrong)
    assert "wrong name or password" in wrong.json()["detail"] and "not-alices-password" not in wrong.text
    unknown = page.sign_in("nobody", "whatever-password")
    assert unknown.status_code == 401 and unknown.json() == wrong.json()  # names are not told apart

    right = page.sign_in("alice")
    assert right.status_code == 200, right.text
    value = session_of(right)
    assert len(value) >= 43  # 32 random bytes, URL-safe base64
    attributes = cookie_attributes(right)
    assert "httponly" in attributes and attributes["samesite"].lower() == "strict" and attributes["path"] == "/"
    assert "secure" not in attributes  # over plain http the browser would drop a Secure cookie
    assert int(attributes["max-age"]) == int(SESSION_SECONDS)
    answer = right.json()
    assert answer["name"] == "alice" and answer["admin"] is False and "admin" not in answer["scopes"]
    assert answer["session"] is True and answer["csrf_token"] and answer["csrf_token"] != value

    me = page.http.get("/auth/me", headers=cookie(value))
    assert me.status_code == 200, me.text
    assert me.json()["name"] == "alice" and me.json()["csrf_token"] == answer["csrf_token"]
    assert set(me.json()["scopes"]) == {"read", "train", "chat", "files"}
    # An admin's session holds the admin scope too.
    root_cookie, _ = page.session("root")
    assert "admin" in page.http.get("/auth/me", headers=root_cookie).json()["scopes"]
    assert page.http.get("/auth/users", headers=root_cookie).status_code == 200
    assert page.http.get("/auth/users", headers=cookie(value)).status_code == 403
    # Behind a proxy that says the page came over https, the cookie is Secure.
    proxied = page.sign_in("alice", headers={"X-Forwarded-Proto": "https"})
    assert proxied.status_code == 200 and "secure" in cookie_attributes(proxied)
    # A made-up cookie is a 401, and the answer clears it.
    made_up = page.http.get("/train/jobs", headers=cookie("x" * 43))
    assert made_up.status_code == 401 and "session" in made_up.json()["detail"]
    assert session_of(made_up) == "" and f"{SESSION_COOKIE}=" in made_up.headers["set-cookie"]


def test_a_write_with_the_cookie_needs_the_csrf_token_and_a_key_does_not(page: Page) -> None:
    alice, csrf = page.session("alice")
    missing = page.http.post("/train/start", json=page.job(), headers=alice)
    assert missing.status_code == 403 and CSRF_HEADER in missing.json()["detail"], missing.text
    wrong = page.http.post("/train/start", json=page.job(), headers={**alice, CSRF_HEADER: csrf[:-4] + "0000"})
    assert wrong.status_code == 403 and "wrong CSRF token" in wrong.json()["detail"]
    # Another session's token does not fit this one.
    _, bobs_csrf = page.session("bob")
    assert page.http.post("/train/start", json=page.job(), headers={**alice, CSRF_HEADER: bobs_csrf}).status_code == 403
    assert page.http.get("/train/jobs", headers=alice).json()["count"] == 0  # nothing refused was started
    started = page.http.post("/train/start", json=page.job(), headers={**alice, CSRF_HEADER: csrf})
    assert started.status_code == 200, started.text
    job_id = started.json()["job_id"]
    # Reads need no token; the job is alice's.
    assert page.http.get(f"/train/status/{job_id}", headers=alice).status_code == 200
    # A key made on the page (with the token) writes with no CSRF token: no browser sends it by itself.
    made = page.http.post("/auth/keys", json={"name": "script", "scopes": ["read", "train"]}, headers={**alice, CSRF_HEADER: csrf})
    assert made.status_code == 201, made.text
    key = {"Authorization": f"Bearer {made.json()['key']}"}
    assert page.http.post("/train/start", json=page.job(), headers=key).status_code == 200
    assert page.http.get("/train/jobs", headers=alice).json()["count"] == 2
    # A key wins over a cookie sent with it: the cookie's CSRF rule does not apply.
    assert page.http.post("/train/start", json=page.job(), headers={**key, **alice}).status_code == 200


def test_sign_out_ends_the_session_and_clears_the_cookie(page: Page) -> None:
    alice, csrf = page.session("alice")
    assert page.http.delete("/auth/session", headers=alice).status_code == 403  # a write: the token is needed
    out = page.http.delete("/auth/session", headers={**alice, CSRF_HEADER: csrf})
    assert out.status_code == 204, out.text
    assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"] or "max-age=0" in out.headers["set-cookie"].lower()
    after = page.http.get("/auth/me", headers=alice)
    assert after.status_code == 401 and "sign in again" in after.json()["detail"]
    actions = [row["action"] for row in page.http.get("/auth/audit", headers=page.admin).json()["data"]]
    assert "signed_in" in actions and "signed_out" in actions
    # A key cannot sign out (it has no session).
    refused = page.http.delete("/auth/session", headers=page.admin)
    assert refused.status_code == 400 and "API key" in refused.json()["detail"]


def test_a_removed_users_cookie_is_401_and_their_open_stream_ends(page: Page) -> None:
    bob, csrf = page.session("bob")
    started = page.http.post("/train/start", json=page.job("held"), headers={**bob, CSRF_HEADER: csrf})
    assert started.status_code == 200, started.text
    job_id = started.json()["job_id"]
    wait_for(lambda: page.http.get(f"/train/status/{job_id}", headers=bob).json()["phase"] == "loading_model",
             timeout=30, what="bob's job to hold in loading_model")
    ended = threading.Event()
    received: list[bytes] = []

    def follow() -> None:
        with httpx.Client(base_url=page.url, timeout=60) as client, client.stream(
            "GET", f"/train/stream/{job_id}", headers=bob
        ) as stream:
            assert stream.status_code == 200
            for chunk in stream.iter_bytes():
                received.append(chunk)
        ended.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait_for(lambda: b"loading_model" in b"".join(received), timeout=30, what="the stream's first events")
    assert not ended.is_set()
    assert page.http.delete("/auth/users/bob", headers=page.admin).status_code == 204
    wait_for(ended.is_set, timeout=30, what="bob's open stream to end")
    reader.join(timeout=30)
    gone = page.http.get("/train/jobs", headers=bob)
    assert gone.status_code == 401
    # The job stays (the admins'), and no session of bob is left.
    assert page.http.get(f"/train/status/{job_id}", headers=page.admin).status_code == 200
    assert page.server.app.state.accounts.table.sessions_of("bob") == []


def test_an_expired_session_is_401_and_its_row_is_dropped(page: Page, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounts_table, "SESSION_SECONDS", 1.0)
    alice, _ = page.session("alice")
    assert page.http.get("/auth/me", headers=alice).status_code == 200
    wait_for(lambda: page.http.get("/auth/me", headers=alice).status_code == 401, timeout=30,
             what="alice's session to expire")
    assert "expired" in page.http.get("/train/jobs", headers=alice).json()["detail"]
    assert page.server.app.state.accounts.table.sessions_of("alice") == []


def test_failed_sign_ins_are_rate_limited_per_address_and_per_account(page: Page) -> None:
    for _ in range(MAX_FAILURES):
        assert page.sign_in("alice", "a-wrong-password").status_code == 401
    limited = page.sign_in("alice")  # the right password, too late
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1 and not session_of(limited)
    # This address is limited on every route, with a key or a cookie ...
    assert page.http.get("/train/jobs", headers=page.admin).status_code == 429
    # ... and the account from any address (127.0.0.2 is loopback too), while others sign in there.
    elsewhere = httpx.Client(base_url=page.url, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with elsewhere:
        alice = elsewhere.post("/auth/session", json={"name": "alice", "password": PASSWORDS["alice"]})
        assert alice.status_code == 429 and "Retry-After" in alice.headers
        bob = elsewhere.post("/auth/session", json={"name": "bob", "password": PASSWORDS["bob"]})
        assert bob.status_code == 200, bob.text
        page.sessions.append(session_of(bob))
        audit = elsewhere.get("/auth/audit", headers=page.admin, params={"limit": 1000}).json()["data"]
    failed = [row for row in audit if row["action"] == "signin_failed"]
    assert len(failed) == MAX_FAILURES and {row["target"] for row in failed} == {"alice"}
    assert {row["address"] for row in failed} == {"127.0.0.1"}


def test_an_unknown_name_is_audited_without_the_name(page: Page) -> None:
    # A password typed into the name field must not land in the audit log.
    typed = "alice-password-2718"
    assert page.sign_in(typed, "x").status_code == 401
    rows = page.http.get("/auth/audit", headers=page.admin).json()["data"]
    failed = [row for row in rows if row["action"] == "signin_failed"]
    assert len(failed) == 1 and failed[0]["target"] is None and typed not in str(rows)


def test_another_sites_write_is_refused_with_the_cookie_and_without(page: Page) -> None:
    alice, csrf = page.session("alice")
    foreign = {"Origin": "http://evil.example"}
    for headers in ({**foreign, **alice, CSRF_HEADER: csrf}, {**foreign, **alice}, foreign, {"Sec-Fetch-Site": "cross-site", **alice}):
        refused = page.http.post("/train/start", json=page.job(), headers=headers)
        assert refused.status_code == 403 and ("Origin" in refused.text or "cross-site" in refused.text), refused.text
    # Nor can another site sign a browser in (as its own user) or out.
    assert page.http.post("/auth/session", json={"name": "bob", "password": PASSWORDS["bob"]}, headers=foreign).status_code == 403
    assert page.http.delete("/auth/session", headers={**foreign, **alice, CSRF_HEADER: csrf}).status_code == 403
    assert page.http.get("/train/jobs", headers=alice).json()["count"] == 0
    # The page's own origin passes.
    own = {"Origin": page.url, **alice, CSRF_HEADER: csrf}
    assert page.http.post("/train/start", json=page.job(), headers=own).status_code == 200
