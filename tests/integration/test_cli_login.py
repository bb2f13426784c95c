"""`finetune-studio login` / `logout` (issue 28, item 4): a key checked against a real server
with accounts on, kept in the user's config file (mode 0600), and used by every client command
that is given no --token; a refused key is not kept."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from finetune_studio.cli.follow import EXIT_REFUSED
from finetune_studio.cli.login import CONFIG_ENV, stored_key
from finetune_studio.cli.main import main
from finetune_studio.config import Settings
from tests.helpers.jobs import InstantLauncher
from tests.helpers.servers import LiveServer

TOKEN = "admin-token-0123456789abcdef"


@pytest.fixture
def accounts_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "home" / "config.json"))
    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN", raising=False)
    settings = Settings(data_dir=tmp_path / "data", accounts=True, token=TOKEN)
    with LiveServer(settings, InstantLauncher()) as server:
        admin = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.post(f"{server.url}/auth/users", json={"name": "alice", "password": "alice-password-1"},
                          headers=admin).status_code == 201
        made = httpx.post(f"{server.url}/auth/keys", json={"name": "cli", "scopes": ["read"], "user": "alice"}, headers=admin)
        assert made.status_code == 201, made.text
        yield server, str(made.json()["key"])


def test_login_keeps_a_checked_key_private_and_every_command_uses_it(accounts_server, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    server, key = accounts_server
    config = tmp_path / "home" / "config.json"
    # Without a key, a client command is refused by the server.
    assert main(["jobs", "--server", server.url]) == EXIT_REFUSED
    assert main(["login", "--server", server.url + "/", "--token", key]) == 0
    said = capsys.readouterr().out
    assert "as alice" in said and str(config) in said and key not in said
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text()) == {"keys": {server.url: key}}
    assert stored_key(server.url) == key
    # Now the same command works with no --token, for this server only.
    assert main(["jobs", "--server", server.url, "--output-json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert stored_key("http://127.0.0.1:1") is None
    # An explicit --token still wins: a wrong one is refused although a good key is kept.
    assert main(["jobs", "--server", server.url, "--token", "fts-wrong-key-0123456789"]) == EXIT_REFUSED
    assert main(["logout", "--server", server.url]) == 0
    assert json.loads(config.read_text()) == {"keys": {}}
    assert main(["jobs", "--server", server.url]) == EXIT_REFUSED


def test_a_refused_key_is_not_kept(accounts_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, _ = accounts_server
    with pytest.raises(SystemExit, match="refused the key"):
        main(["login", "--server", server.url, "--token", "fts-not-a-key-of-this-server-000000"])
    assert not (tmp_path / "home" / "config.json").exists()
