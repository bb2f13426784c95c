"""No one let in: the server will not go on the network without a token, and with a
token every route but /health wants it (the stream and the OpenAI-compatible /v1/
routes included; those answer in OpenAI's error shape)."""

from __future__ import annotations

import hmac
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from finetune_studio.api import auth
from finetune_studio.api.app import API_PREFIXES, API_ROUTERS, create_app
from finetune_studio.api.auth import under_prefixes
from finetune_studio.api.openai_errors import OPENAI_PREFIX
from finetune_studio.config import Settings
from finetune_studio.errors import UnsafeSettings
from tests.helpers.jobs import InstantLauncher, dataset, start_body

TOKEN = "correct-horse-battery-staple"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.10", False), ("my-host.example", False)],
)
def test_only_loopback_counts_as_loopback(host: str, loopback: bool) -> None:
    assert Settings(host=host).is_loopback() is loopback


def test_serve_refuses_a_network_address_without_a_token_and_says_why(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FINETUNE_STUDIO_TOKEN"}
    # 192.0.2.0/24 is reserved for documentation: even a broken check could not listen on it.
    result = subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--host", "192.0.2.10", "--port", "8",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "refusing to bind 192.0.2.10" in result.stderr and "FINETUNE_STUDIO_TOKEN" in result.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_the_app_itself_refuses_to_be_exposed_without_a_token(host: str, tmp_path: Path) -> None:
    with pytest.raises(UnsafeSettings, match="FINETUNE_STUDIO_TOKEN"):
        create_app(Settings(host=host, data_dir=tmp_path))
    create_app(Settings(host=host, data_dir=tmp_path, token=TOKEN))  # with a token it builds


# Wrong Authorization headers, each with the token the guard must compare (in
# constant time) with the expected one; None where the scheme is not Bearer.
WRONG_HEADERS: list[tuple[dict[str, str], Optional[bytes]]] = [
    ({}, None),
    ({"Authorization": "Bearer wrong"}, b"wrong"),
    ({"Authorization": f"Bearer {TOKEN}x"}, f"{TOKEN}x".encode()),
    ({"Authorization": TOKEN}, None),
    ({"Authorization": f"Basic {TOKEN}"}, None),
    ({"Authorization": f"Bearer {TOKEN[:-1]}"}, TOKEN[:-1].encode()),
]


def _calls(app: Any, job_id: str) -> list[tuple[str, str]]:
    """(method, path) for every operation in the app's OpenAPI schema, path parameters filled in."""
    return [
        (method.upper(), path.replace("{job_id}", job_id))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    ]


def refusal(path: str, body: dict[str, Any]) -> str:
    """The words of a 401: OpenAI's shape under /v1/ (its clients raise AuthenticationError), FastAPI's elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        assert set(body) == {"error"} and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["param"] is None
        return str(body["error"]["message"])
    return str(body["detail"])


def test_with_a_token_every_route_but_health_wants_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    compare_digest = hmac.compare_digest

    def spy(given: bytes, expected: bytes) -> bool:
        compared.append((given, expected))
        return compare_digest(given, expected)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    settings = Settings(host="0.0.0.0", data_dir=tmp_path / "data", token=TOKEN)
    app = create_app(settings, launcher=InstantLauncher())
    good = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        data = dataset(settings.data_dir)  # exposed: only paths under the data dir are accepted
        job_id = client.post("/train/start", json=start_body(data), headers=good).json()["job_id"]
        calls = _calls(app, job_id)
        assert ("GET", f"/train/stream/{job_id}") in calls and ("HEAD", "/health") in calls
        assert ("GET", "/v1/models") in calls and ("POST", "/v1/chat/completions") in calls
        # every API router's routes are in the schema, so the loops below try each one
        assert all(any(under_prefixes(path, (router.prefix + "/",)) for _, path in calls) for router in API_ROUTERS)

        for method, path in calls:
            if path == "/health":
                assert client.request(method, path).status_code == 200
                continue
            for headers, given in WRONG_HEADERS:
                compared.clear()  # each header on its own: what this one request compared
                response = client.request(method, path, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.status_code)
                assert response.headers["www-authenticate"] == "Bearer"
                assert "FINETUNE_STUDIO_TOKEN" in refusal(path, response.json())
                assert job_id not in response.text
                if given is not None:  # a Bearer token: compared with the expected one in constant time
                    assert compared == [(given, TOKEN.encode())], (method, path, headers, compared)

        # Every API route, also one left out of the schema, lies under the guard's prefix.
        routers = [getattr(route, "original_router", None) for route in app.routes]  # what include_router added
        routes = [route for router in routers if router is not None for route in router.routes]
        unguarded = {route.path for route in routes if isinstance(route, APIRoute)} - {"/health"}
        assert unguarded and not [path for path in unguarded if not under_prefixes(path, API_PREFIXES)]

        # Every method on every API path, HEAD included, and a Bearer with nothing after it
        # (what an empty token would have matched): 401 before any routing.
        for path in {path for _, path in calls if path != "/health"}:
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
                for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer "}):
                    response = client.request(method, path, headers=headers)
                    assert response.status_code == 401, (method, path, headers, response.status_code)
                    assert response.headers["www-authenticate"] == "Bearer"
                    assert job_id not in response.text

        # With the token: the stream and the rest answer.
        compared.clear()
        stream = client.get(f"/train/stream/{job_id}", headers=good)
        assert compared == [(TOKEN.encode(), TOKEN.encode())]
        assert stream.status_code == 200 and "event: status" in stream.text
        assert client.get("/train/jobs", headers=good).json()["count"] == 1
        assert client.get("/v1/models", headers=good).json()["object"] == "list"
        # Only the web page's static files are served without it; they hold no job data.
        page = client.get("/")
        assert page.status_code == 200 and job_id not in page.text
