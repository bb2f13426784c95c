"""`finetune-studio login` and `logout`: a key kept in the user's config file, used by every client command.

The file is `$FINETUNE_STUDIO_CONFIG`, else `$XDG_CONFIG_HOME/finetune-studio/config.json`, else
`~/.config/finetune-studio/config.json`: `{"keys": {"<server URL>": "<key>"}}`, mode 0600 (written
to a private temporary file in the same folder, then renamed over the old one, so no other
user ever reads it and a crash leaves the old file or the new one). A client command's key is
its `--token`, else `FINETUNE_STUDIO_TOKEN`, else the one stored for its `--server`.

`login` checks the key before storing it: `GET /auth/me` must answer 200 (a server with accounts
off answers 404 there: then the key is checked on `/train/jobs`, which wants the server's token
when one is set). A key that is refused is not stored, and the error says what the server said.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, TextIO

import httpx

CONFIG_ENV = "FINETUNE_STUDIO_CONFIG"


def config_path() -> Path:
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).expanduser()
    base = Path(os.environ["XDG_CONFIG_HOME"]).expanduser() if os.environ.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "finetune-studio" / "config.json"


def server_key(url: str) -> str:
    """The server URL as the file keys it: no trailing slash."""
    return url.rstrip("/")


def read_config(path: Optional[Path] = None) -> dict[str, Any]:
    """The config file's content; an absent or unreadable file is an empty config (a command then
    goes on without a stored key, and the server says whether it wants one)."""
    try:
        found = json.loads((path or config_path()).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def stored_keys(config: dict[str, Any]) -> dict[str, str]:
    """The config's keys by server (anything else there is left out)."""
    keys = config.get("keys")
    return {k: v for k, v in keys.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(keys, dict) else {}


def stored_key(url: str, path: Optional[Path] = None) -> Optional[str]:
    return stored_keys(read_config(path)).get(server_key(url)) or None


def write_config(content: dict[str, Any], path: Optional[Path] = None) -> Path:
    """Replace the config file with `content`, mode 0600 from its first byte."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, partial = tempfile.mkstemp(prefix=".config-", suffix=".json", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(content, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return path


def check_key(url: str, key: str) -> str:
    """Who the key signs in as, or SystemExit saying why the server refused it."""
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
            me = http.get("/auth/me")
            if me.status_code == 200:
                body = me.json()
                return f"{body.get('name')}{' (admin)' if body.get('admin') else ''}, scopes {', '.join(body.get('scopes') or [])}"
            if me.status_code == 404:  # accounts off: the server's token, or none
                jobs = http.get("/train/jobs")
                if jobs.status_code == 200:
                    return "the server's token (this server has no accounts)"
                me = jobs
    except httpx.HTTPError as exc:
        raise SystemExit(f"error: no answer from {url} ({exc}); start the server or pass --server URL") from None
    try:
        detail = me.json().get("detail") or me.text
    except ValueError:
        detail = me.text
    raise SystemExit(f"error: {url} refused the key ({me.status_code}: {detail}); nothing was stored")


def login(url: str, token: Optional[str], out: Optional[TextIO] = None, stdin: Optional[TextIO] = None) -> int:
    out, stdin = out or sys.stdout, stdin or sys.stdin
    key = token
    if not key:
        key = getpass.getpass(f"API key for {url}: ") if stdin.isatty() else stdin.readline()
    key = key.strip()
    if not key:
        raise SystemExit("error: no key given: pass --token KEY, pipe it on stdin, or type it at the prompt")
    who = check_key(url, key)
    config = read_config()
    config["keys"] = {**stored_keys(config), server_key(url): key}
    path = write_config(config)
    print(f"Signed in to {server_key(url)} as {who}; the key is kept in {path} (mode 0600)", file=out)
    return 0


def logout(url: str, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    config = read_config()
    keys = stored_keys(config)
    if server_key(url) not in keys:
        print(f"No key is kept for {server_key(url)} in {config_path()}", file=out)
        return 0
    config["keys"] = {k: v for k, v in keys.items() if k != server_key(url)}
    write_config(config)
    print(f"Signed out of {server_key(url)}: its key is removed from {config_path()}", file=out)
    return 0
