"""The chat routes' server for the tests (tests/unit/test_chat_api.py, test_cli_chat.py,
test_cli_train.py): the app under uvicorn in this process, with the stand-in chat child
(stand_in_chat_child.py, which echoes the last user message word by word) and training
jobs that are no process (ScriptedJob)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Optional

import httpx
import openai
import pytest

from finetune_studio.config import Settings
from finetune_studio.wire import JobFolder, WorkerSpec
from tests.helpers.children import STAND_IN_CHAT_CHILD
from tests.helpers.jobs import ScriptedWorker
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

TOKEN = "chat-test-token-0123456789"
BASE = "some-org/base-model"


class ScriptedJob(ScriptedWorker):
    """A training job that is no process. Its request's `project_name` says what it does:
    `lora` and `full` save an adapter (a model) and complete; `fail` fails before saving;
    `hold` trains until stopped, then stops without saving; `hold-save` saves when stopped."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__()
        self.folder = JobFolder(spec.output_dir)
        self.log_path = self.folder.log
        self.mode = spec.request.get("project_name") or "lora"

    def _save(self, method: str) -> dict[str, Any]:
        self.folder.root.mkdir(parents=True, exist_ok=True)
        record = {"base_model": {"kind": "hub", "location": BASE}, "method": method, "trust_remote_code": False}
        self.folder.job_file.write_text(json.dumps(record))
        saved = self.folder.model if method == "full" else self.folder.adapter
        saved.mkdir()
        return {f"{saved.name}_dir": str(saved), "model_name": BASE}  # as the real child's facts say

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        for phase in ("loading_model", "loading_dataset", "configuring", "training"):
            yield {"type": "status", "phase": phase, "message": phase, "details": {}}
        if self.mode in ("lora", "full"):
            yield {"type": "status", "phase": "completed", "message": "done", "details": self._save(self.mode)}
        elif self.mode == "fail":
            yield {"type": "status", "phase": "error", "message": "failed", "error": "the data was bad",
                   "details": {"error_code": "dataset_invalid"}}
        else:
            await self.stop.wait()
            details = self._save("lora") if self.mode == "hold-save" else {}
            yield {"type": "status", "phase": "stopped", "message": "stopped", "details": details}


class ScriptedLauncher:
    async def launch(self, spec: WorkerSpec) -> ScriptedJob:
        return ScriptedJob(spec)


class ChatServer(LiveServer):
    """create_app with the stand-in child, under uvicorn on 127.0.0.1 in a thread of this process."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        super().__init__(
            Settings(data_dir=data_dir, token=TOKEN, stop_grace_seconds=5, kill_grace_seconds=2, max_concurrent_jobs=4,
                     **settings),
            ScriptedLauncher(),
            inference_module=STAND_IN_CHAT_CHILD,
        )
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        self.clients: dict[str, openai.OpenAI] = {}

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        for client in self.clients.values():
            client.close()
        super().__exit__(*exc)

    @property
    def log(self) -> str:
        """What the stand-in child has been told (its stderr): `cancelled <id>`, `unloaded`, `args ...`."""
        return self.inference_log

    def sdk(self, api_key: str = TOKEN) -> openai.OpenAI:
        """The official client, with no retries: each test sees the server's first answer."""
        if api_key not in self.clients:
            self.clients[api_key] = openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)
        return self.clients[api_key]

    def job(self, mode: str, phase: Optional[str] = None) -> str:
        data = self.settings.data_dir / "d.jsonl"
        data.write_text('{"text": "x"}\n')
        body = {"model_name": BASE, "training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": [str(data)],
                "project_name": mode}
        job_id = str(self.http.post("/train/start", json=body).json()["job_id"])
        if phase:
            wait_for(lambda: self.http.get(f"/train/status/{job_id}").json()["phase"] == phase, timeout=30,
                     what=f"job {job_id} to reach {phase}")
        return job_id


@contextlib.contextmanager
def chat_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[ChatServer]:
    """A ChatServer on a new data dir, for a module's `server` fixture."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the stand-in child is imported from the repository
        with ChatServer(tmp_path_factory.mktemp(name) / "data") as running:
            yield running


def wait_for_an_idle_child(request: pytest.FixtureRequest) -> None:
    """After a test that used the module's `server`: every request it made of the child
    has ended (answered, cancelled or failed), so none is left behind for the next."""
    if "server" in request.fixturenames:
        running: ChatServer = request.getfixturevalue("server")
        wait_for(lambda: running.studio.inference.active == 0, timeout=30, what="the child's requests to end")


def chat_module_fixtures(name: str) -> tuple[Any, Any]:
    """A module's `server` (one ChatServer for the module, on a data dir named `name`) and an
    autouse fixture that waits, after each test, until the child holds no request of it:
    `server, nothing_left_in_the_child = chat_module_fixtures("chat")`."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatServer]:
        with chat_server(tmp_path_factory, name) as running:
            yield running

    @pytest.fixture(autouse=True)
    def nothing_left_in_the_child(request: pytest.FixtureRequest) -> Iterator[None]:
        yield
        wait_for_an_idle_child(request)

    return server, nothing_left_in_the_child


def kill_the_child_once_it_holds(server: ChatServer, requests: int) -> int:
    """SIGKILL the chat child once it holds `requests` requests; its pid."""
    wait_for(lambda: server.studio.inference.active == requests, timeout=30, what="the request to reach the child")
    pid = server.studio.inference.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid
