"""The project's own docs of the contract stay true to the code: every route the app serves
(accounts on, so that /auth is served too) is in docs/API.md, and every setting is in
docs/SETTINGS.md. A route or setting added without its doc fails here."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from tests.helpers.paths import REPO


def _shape(path: str) -> str:
    """A path with its parameters named alike: /webhooks/{webhook_id} and /webhooks/{id} are one."""
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_every_route_is_in_the_api_doc(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data", accounts=True)), base_url="http://127.0.0.1") as client:
        paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    documented = {_shape(path) for path in re.findall(r"`(?:GET|POST|PUT|PATCH|DELETE) (/[^`?\s]*)", (REPO / "docs" / "API.md").read_text())}
    missing = sorted(f"{method.upper()} {path}" for path, operations in paths.items() for method in operations
                     if _shape(path) not in documented)
    assert not missing, f"routes missing from docs/API.md (as `METHOD /path`): {missing}"


def test_every_setting_is_in_the_settings_doc() -> None:
    text = (REPO / "docs" / "SETTINGS.md").read_text()
    missing = sorted(name for name in Settings.model_fields if f"FINETUNE_STUDIO_{name.upper()}" not in text)
    assert not missing, f"settings missing from docs/SETTINGS.md: {missing}"
