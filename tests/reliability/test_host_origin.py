"""Hold under attack: web pages of other sites (issue 24, items 2 and 3).

DNS rebinding: a page on a site whose name is pointed at 127.0.0.1 after it loaded is
same-origin with a loopback server for the browser, so it could read every answer
(and files, through POST /datasets/inspect). Its requests still name the attacker's
site in `Host`: a loopback server answers only loopback names (and the ones listed in
FINETUNE_STUDIO_SERVER_NAMES) and says 421 to any other, on every path. An exposed
server (always behind the token) does not check Host.

Cross-site writes: a page of another site can send a form, an upload or a body-less
POST without a preflight. A request that may change something and carries a foreign
`Origin` (`null` included) or `Sec-Fetch-Site: cross-site` is refused with 403, on
every server; clients that send neither header (curl, the SDKs, the CLI) pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from finetune_studio.wire import WorkerSpec
from tests.helpers.jobs import InstantLauncher, ScriptedWorker, dataset, start_body
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

TOKEN = "host-origin-test-token-0123456789"
SETTING = "FINETUNE_STUDIO_SERVER_NAMES"
PATHS = ["/train/jobs", "/health", "/", "/v1/models", "/index.html"]
FOREIGN_HOSTS = ["evil.example", "evil.example:{port}", "localhost.evil.example:{port}", "127.0.0.1.nip.io:{port}",
                 "localhost:{port}.evil.example", "[::1].evil.example", "evil.localhost.example", ".localhost", ""]
LOOPBACK_HOSTS = ["127.0.0.1", "127.0.0.1:{port}", "localhost", "localhost:{port}", "LocalHost:{port}", "app.localhost",
                  "app.localhost:{port}", "[::1]", "[::1]:{port}"]


def assert_misdirected(answer: httpx.Response, path: str, host: str) -> None:
    assert answer.status_code == 421, f"{host!r} {path}: {answer.status_code} {answer.text[:200]}"
    body = answer.json()
    if path.startswith("/v1/"):
        assert set(body) == {"error"}, body
        assert body["error"]["code"] == "misdirected_request" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        message = body["detail"]
    assert SETTING in message and "DNS rebinding" in message and "loopback" in message, message
    assert "jobs" not in body and "data" not in body


def assert_cross_site(answer: httpx.Response, path: str) -> str:
    assert answer.status_code == 403, f"{path}: {answer.status_code} {answer.text[:200]}"
    body = answer.json()
    if path.startswith("/v1/"):
        assert set(body) == {"error"}, body
        assert body["error"]["code"] == "cross_site_request"
        message: str = body["error"]["message"]
    else:
        message = body["detail"]
    assert message.startswith("refused POST") and "another site" in message, message
    return message


# -- DNS rebinding -----------------------------------------------------------------


def test_a_real_loopback_server_answers_421_to_a_rebinding_name_on_every_path(start_server: Any) -> None:
    server = start_server(env={SETTING: "studio.lan, Other.Example"})
    port = server.port
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path in PATHS:
            for host in FOREIGN_HOSTS:
                value = host.format(port=port)
                assert_misdirected(http.get(path, headers={"Host": value}), path, value)
        # The attack itself: reading a file through the inspection, from a rebound page.
        answer = http.post("/datasets/inspect", json={"path": "/etc/passwd"}, headers={"Host": f"evil.example:{port}"})
        assert_misdirected(answer, "/datasets/inspect", "evil.example")
        assert "evil.example" in answer.json()["detail"]

        for host in [*LOOPBACK_HOSTS, "studio.lan", "studio.lan:{port}", "other.example", "OTHER.example:{port}"]:
            value = host.format(port=port)
            for path in ("/train/jobs", "/health", "/", "/v1/models"):
                answer = http.get(path, headers={"Host": value})
                assert answer.status_code == 200, f"{value!r} {path}: {answer.status_code} {answer.text[:200]}"
        # A name listed is the name, not one under it.
        assert_misdirected(http.get("/health", headers={"Host": "x.studio.lan"}), "/health", "x.studio.lan")
        # Without a Host header override, the client's own (127.0.0.1:port) passes: curl, the CLI.
        assert http.get("/train/jobs").status_code == 200


@pytest.mark.parametrize("path", PATHS)
def test_the_app_on_loopback_refuses_other_names_and_takes_loopback_ones(path: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", server_names="studio.lan,[fd00::1]")
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        for host in FOREIGN_HOSTS:
            value = host.format(port=8000)
            assert_misdirected(client.get(path, headers={"Host": value}), path, value)
        for host in [*LOOPBACK_HOSTS, "studio.lan:8000", "[fd00::1]:8000", "127.0.0.2:8000", "[0:0::1]"]:
            value = host.format(port=8000)
            answer = client.get(path, headers={"Host": value})
            assert answer.status_code == 200, f"{value!r} {path}: {answer.status_code} {answer.text[:200]}"


def test_server_names_come_from_the_environment_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTING, " studio.lan, Proxy.Example ,,[fd00::1],10.0.0.5")
    assert Settings().server_names == ["studio.lan", "proxy.example", "fd00::1", "10.0.0.5"]
    monkeypatch.setenv(SETTING, '["a.lan", "b.lan"]')
    assert Settings().server_names == ["a.lan", "b.lan"]
    monkeypatch.delenv(SETTING)
    assert Settings().server_names == []
    for wrong in ("http://studio.lan", "studio.lan:8000", "studio.lan/ui"):
        with pytest.raises(ValidationError, match=f"{SETTING}.*not a host name.*without a scheme, port or path"):
            Settings(server_names=[wrong])


def test_an_exposed_server_does_not_check_host_but_still_refuses_cross_site_writes(tmp_path: Path) -> None:
    settings = Settings(host="0.0.0.0", token=TOKEN, data_dir=tmp_path / "data")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://studio.example.com") as client:
        for host in ("studio.example.com", "evil.example:8000", "203.0.113.7"):
            assert client.get("/health", headers={"Host": host}).status_code == 200
            assert client.get("/", headers={"Host": host}).status_code == 200
            assert client.get("/train/jobs", headers={"Host": host, **auth}).status_code == 200
            assert client.get("/v1/models", headers={"Host": host, **auth}).status_code == 200
        assert client.get("/train/jobs").status_code == 401  # the token is checked as before
        answer = client.post("/train/stop/abc", headers={"Origin": "http://evil.example", **auth})
        assert_cross_site(answer, "/train/stop/abc")
        # The server's own page (Origin = its Host) passes to the token check and the route.
        same = {"Origin": "https://studio.example.com", "Sec-Fetch-Site": "same-origin"}
        assert client.post("/train/stop/abc", headers={**same, **auth}).status_code == 404
        assert client.post("/train/stop/abc", headers=same).status_code == 401


# -- cross-site writes ---------------------------------------------------------------


class HeldHandle(ScriptedWorker):
    """A worker that is no process: it reports loading_model, then waits until stopped."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__()
        self.log_path = spec.output_dir / "worker.log"

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        yield {"type": "status", "phase": "loading_model", "message": "loading", "details": {}}
        await self.stop.wait()
        yield {"type": "status", "phase": "stopped", "message": "Stopped during loading_model", "details": {}}


class HeldLauncher:
    async def launch(self, spec: WorkerSpec) -> HeldHandle:
        return HeldHandle(spec)


def foreign_headers(port: int) -> list[dict[str, str]]:
    """What a page of another site sends with a write, and near misses of this server's own origin."""
    return [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"},
        {"Origin": f"http://127.0.0.1:{port}.evil.example"},
        {"Origin": f"http://evil.example/http://127.0.0.1:{port}"},
        {"Origin": "http://127.0.0.1"},  # another port is another origin
        {"Origin": f"http://localhost:{port}"},  # a loopback name, but not the one this request addressed
        {"Origin": f"ftp://127.0.0.1:{port}"},
        {"Origin": ""},
    ]


def test_cross_site_writes_are_refused_and_same_origin_ones_pass(live_server: Any) -> None:
    server: LiveServer = live_server(launcher=HeldLauncher())
    port = server.port
    own = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        data = dataset(server.data_dir.parent)
        ids = []
        for _ in range(3):
            answer = http.post("/train/start", json=start_body(data))
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["job_id"])
        held, queued, other = ids
        wait_for(lambda: http.get(f"/train/status/{held}").json()["phase"] == "loading_model", timeout=30, what="the held job")

        # A start from a page of another site (a form's text/plain JSON would do as well).
        for headers in foreign_headers(port):
            answer = http.post("/train/start", json=start_body(data), headers=headers)
            assert_cross_site(answer, "/train/start")
        for path in (f"/train/stop/{held}", f"/train/stop/{queued}", f"/v1/fine_tuning/jobs/{held}/cancel",
                     f"/v1/fine_tuning/jobs/{queued}/cancel", f"/train/jobs/{other}"):
            for headers in foreign_headers(port):
                method = "DELETE" if path.startswith("/train/jobs/") else "POST"
                answer = http.request(method, path, headers=headers)
                assert answer.status_code == 403, f"{method} {path} {headers}: {answer.status_code} {answer.text[:200]}"
                if method == "POST":
                    message = assert_cross_site(answer, path)
                    assert ("Origin" in message) or ("Sec-Fetch-Site" in message), message
        assert http.patch(f"/train/jobs/{other}", json={"project_name": "x"}, headers={"Origin": "null"}).status_code == 403
        assert http.put(f"/train/jobs/{other}", headers={"Origin": "http://evil.example"}).status_code == 403
        jobs = {job["job_id"]: job for job in http.get("/train/jobs").json()["data"]}
        assert len(jobs) == 3, "a refused start queued a job"
        assert jobs[held]["phase"] == "loading_model" and jobs[queued]["phase"] == "idle" and jobs[other]["phase"] == "idle"
        assert http.get(f"/train/jobs/{other}").json()["request"].get("project_name") != "x"

        # Reads are not refused by this rule (the browser keeps another site's page from reading them).
        assert http.get("/train/jobs", headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}).status_code == 200

        # The server's own page: Origin = http(s):// + its Host, Sec-Fetch-Site same-origin.
        answer = http.post(f"/train/stop/{queued}", headers={"Origin": own, "Sec-Fetch-Site": "same-origin"})
        assert answer.status_code == 200 and answer.json()["phase"] == "stopped", answer.text
        # Same-site (another port of this machine, say) is not cross-site; no header at all: curl, SDKs, the CLI.
        assert http.post(f"/train/stop/{other}", headers={"Sec-Fetch-Site": "same-site"}).status_code == 200
        assert http.post(f"/train/stop/{other}").status_code == 409  # reached the route: already stopped
        answer = http.post(f"/v1/fine_tuning/jobs/{held}/cancel", headers={"Origin": f"https://127.0.0.1:{port}"})
        assert answer.status_code == 200, answer.text
        wait_for(lambda: http.get(f"/train/status/{held}").json()["phase"] == "stopped", timeout=30, what="the cancel")


def test_a_cross_origin_upload_is_refused_and_nothing_is_stored(live_server: Any) -> None:
    server: LiveServer = live_server(launcher=InstantLauncher())
    row = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for headers in foreign_headers(server.port):
            answer = http.post("/v1/files", files={"file": ("train.jsonl", row)}, data={"purpose": "fine-tune"}, headers=headers)
            assert_cross_site(answer, "/v1/files")
            assert answer.headers.get("connection") == "close"
        assert http.get("/v1/files").json()["data"] == []
        files_dir = server.settings.files_dir
        assert not files_dir.exists() or not [path for path in files_dir.rglob("*") if path.is_file()], "a refused upload left a file"

        own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
        answer = http.post("/v1/files", files={"file": ("train.jsonl", row)}, data={"purpose": "fine-tune"}, headers=own)
        assert answer.status_code == 200, answer.text
        stored = answer.json()["id"]
        assert [item["id"] for item in http.get("/v1/files").json()["data"]] == [stored]
        # Deleting it from another site: refused, and it stays.
        answer = http.delete(f"/v1/files/{stored}", headers={"Origin": "null"})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "cross_site_request"
        assert [item["id"] for item in http.get("/v1/files").json()["data"]] == [stored]


def test_a_refused_write_on_a_rebinding_name_is_421_first(tmp_path: Path) -> None:
    """Both rules hold at once: the Host is checked before the Origin."""
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"), launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        answer = client.post("/train/stop/abc", headers={"Host": "evil.example", "Origin": "http://evil.example"})
        assert answer.status_code == 421
        answer = client.post("/train/stop/abc", headers={"Origin": "http://evil.example"})
        assert answer.status_code == 403
        assert client.post("/train/stop/abc", headers={"Origin": "http://127.0.0.1"}).status_code == 404
        assert client.post("/train/stop/abc").status_code == 404
