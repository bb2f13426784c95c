"""A token that cannot protect anything is a start-up error, however the server is
started: empty (`FINETUNE_STUDIO_TOKEN=`, which let in `Authorization: Bearer` with
nothing after it), only whitespace, whitespace at an end (never matched: HTTP drops
it), characters a header cannot carry, or fewer than 16 characters."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from finetune_studio.api.app import create_app
from finetune_studio.cli.local_server import free_port
from finetune_studio.config import MIN_TOKEN_CHARS, Settings, get_settings
from finetune_studio.errors import UnsafeSettings
from tests.helpers.jobs import InstantLauncher

GOOD = "correct-horse-battery-staple"

# token -> what the refusal must say about it
BAD_TOKENS = {
    "": "empty",
    "    ": "only whitespace",
    "\t\n": "only whitespace",
    "short-token": "too short",
    "a" * (MIN_TOKEN_CHARS - 1): "too short",
    f" {GOOD}": "starts or ends with whitespace",
    f"{GOOD}\n": "starts or ends with whitespace",  # a token read from a file with its newline
    "correct horse battery staple": "cannot carry",
    "correct-horse-bättery-staple": "cannot carry",
    "correct-horse\x01battery-staple": "cannot carry",
}
IDS = ["empty", "spaces", "tab-newline", "short", "15-chars", "leading-space", "trailing-newline", "inner-space",
       "non-ascii", "control-char"]


@pytest.mark.parametrize(("token", "reason"), BAD_TOKENS.items(), ids=IDS)
def test_serve_refuses_a_token_that_cannot_protect_anything(tmp_path: Path, token: str, reason: str) -> None:
    # The attack: an exposed server whose token check an empty token passed. A token
    # is refused on loopback too (there it would guard nothing, yet look as if it did).
    host = "127.0.0.1" if token == "" else "192.0.2.10"  # reserved for documentation: nothing can listen on it
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--host", host, "--port", str(port),
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, env={**os.environ, "FINETUNE_STUDIO_TOKEN": token}, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: refusing to start: FINETUNE_STUDIO_TOKEN")
    assert reason in result.stderr
    assert "Traceback" not in result.stderr
    if token.strip():
        assert token.strip() not in result.stderr  # the (bad) secret is never printed
    # Refused before anything started: no database, nothing listening.
    assert not (tmp_path / "data" / "studio.db").exists()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(("token", "reason"), BAD_TOKENS.items(), ids=IDS)
def test_settings_and_the_app_refuse_a_token_that_cannot_protect_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, reason: str
) -> None:
    with pytest.raises(UnsafeSettings, match=reason) as given:
        Settings(data_dir=tmp_path, token=token)
    if token.strip():
        assert token.strip() not in str(given.value)
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", token)
    with pytest.raises(UnsafeSettings, match=reason):
        get_settings(data_dir=tmp_path)
    # Settings made without validation (any other way of serving the app): create_app refuses.
    unchecked = Settings.model_construct(**{**Settings(data_dir=tmp_path, token=GOOD).__dict__, "token": SecretStr(token)})
    with pytest.raises(UnsafeSettings, match=reason):
        create_app(unchecked, launcher=InstantLauncher())


def test_a_good_token_is_taken_and_an_empty_bearer_is_not(tmp_path: Path) -> None:
    token = "x" * MIN_TOKEN_CHARS
    settings = Settings(data_dir=tmp_path, token=token)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        for header in ("Bearer", "Bearer ", "Bearer  ", f"Bearer {token[:-1]}"):
            assert client.get("/train/jobs", headers={"Authorization": header}).status_code == 401
        assert client.get("/train/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
