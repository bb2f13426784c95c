"""A request that goes away takes its work with it (api/request_scoped.py).

Every route in the registry of request-scoped routes (`request_scoped_routes`: the
routes whose endpoint is marked `@request_scoped`) is walked: a raw client sends a
request whose work holds (a stand-in inspection child that sleeps, a chat answer the
stand-in chat child never ends), closes its connection once the work is under way,
and the test sees (a) the work gone (the inspection's child reaped; the chat child
told to cancel that request) and (b) its slot free again (the next inspection is not
429; the chat child holds no request). A new route of this kind is walked as soon
as it is marked; the test then asks for its entry in CASES.

The app runs under a real uvicorn on 127.0.0.1 in this process, with the stand-in
children of tests/helpers (stand_in_inspect_child.py, stand_in_chat_child.py).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter

from finetune_studio.api.app import API_ROUTERS
from finetune_studio.api.request_scoped import check_request_scoped, request_scoped, request_scoped_routes
from finetune_studio.config import Settings
from tests.helpers.chat import ScriptedLauncher
from tests.helpers.children import STAND_IN_CHAT_CHILD, STAND_IN_INSPECT_CHILD
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.processes import pid_exists
from tests.helpers.servers import LiveServer

WAIT = 30  # seconds any one awaited change may take before the test fails

# The registry, as create_app walks it: (method, path) of every request-scoped route.
ROUTES = sorted({(method, route.path) for route in request_scoped_routes(API_ROUTERS) for method in route.methods})


class Server(LiveServer):
    """create_app with both stand-in children, under uvicorn on 127.0.0.1 in a thread;
    one inspection slot, so that a held one makes the next 429."""

    def __init__(self, data_dir: Path) -> None:
        settings = Settings(data_dir=data_dir, max_concurrent_inspections=1, inspect_timeout_seconds=600,
                            stop_grace_seconds=5, kill_grace_seconds=2)
        super().__init__(settings, ScriptedLauncher(), inference_module=STAND_IN_CHAT_CHILD,
                         inspect_module=STAND_IN_INSPECT_CHILD)
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.data = data_dir / "rows.jsonl"

    def __enter__(self) -> Server:
        super().__enter__()
        self.data.write_text('{"text": "a row"}\n')
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        super().__exit__(*exc)

    def trained_model(self) -> str:
        """A completed job's id (its stand-in saved an adapter): a model to chat with."""
        body = {"model_name": "some-org/base-model", "training_type": "LoRA/QLoRA", "format_type": "raw",
                "local_datasets": [str(self.data)], "project_name": "lora"}
        job_id = str(self.http.post("/train/start", json=body).json()["job_id"])
        wait_for(lambda: self.http.get(f"/train/status/{job_id}").json()["phase"] == "completed", timeout=WAIT,
                 what=f"job {job_id} to complete")
        return job_id

    def post_and_leave(
        self, path: str, body: dict[str, Any], held: Callable[[], Any], meanwhile: Callable[[Server], None]
    ) -> Any:
        """POST `body` on a connection of its own, wait until `held()` says the work is under
        way (and returns what names it), run `meanwhile`, then close the connection without
        reading a byte."""
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT) as connection:
            connection.sendall(head.encode() + data)
            work = wait_for(held, timeout=WAIT, what=f"the work of POST {path} to be under way")
            meanwhile(self)
        return work


@dataclass(frozen=True)
class Case:
    """One way of holding a route's work: the body to send, what says the work is held
    (and names it), what holds while it is (its slot taken), and what says it is gone
    and its slot free."""

    name: str
    body: Callable[[Server], dict[str, Any]]
    held: Callable[[Server], Callable[[], Any]]
    gone: Callable[[Server, Any], bool]
    free: Callable[[Server], bool]
    meanwhile: Callable[[Server], None] = lambda server: None


def inspection(server: Server, act: str) -> dict[str, Any]:
    return {"local_datasets": [str(server.data)], "model_name": f"stand-in/{act}"}


def inspection_child(server: Server) -> Callable[[], Any]:
    return lambda: next((process.pid for process in list(server.inspector.processes)), None)


def next_inspection_not_refused(server: Server) -> bool:
    answer = server.http.post("/datasets/inspect", json=inspection(server, "answer"))
    assert answer.status_code in (200, 429), answer.text
    return answer.status_code == 200


def inspections_refused(server: Server) -> None:
    answer = server.http.post("/datasets/inspect", json=inspection(server, "answer"))
    assert answer.status_code == 429, answer.text  # the held one has the only slot


def chat(stream: bool) -> Callable[[Server], dict[str, Any]]:
    def body(server: Server) -> dict[str, Any]:
        return {"model": server.trained_model(), "messages": [{"role": "user", "content": "hang"}], "stream": stream}

    return body


def completion(stream: bool) -> Callable[[Server], dict[str, Any]]:
    def body(server: Server) -> dict[str, Any]:
        return {"model": server.trained_model(), "prompt": "hang", "max_tokens": 16, "stream": stream}

    return body


def chat_request_held(server: Server) -> Callable[[], Any]:
    """The id of the next request the stand-in chat child holds (it logs `holding <id>`)."""
    before = len(re.findall(r"holding (\S+)", server.inference_log))
    return lambda: next(iter(re.findall(r"holding (\S+)", server.inference_log)[before:]), None)


def chat_request_cancelled(server: Server, request_id: str) -> bool:
    return f"cancelled {request_id}" in server.inference_log


INSPECT = Case(
    "held inspection",
    body=lambda server: inspection(server, "hang"),
    held=inspection_child,
    gone=lambda server, pid: not pid_exists(pid) and server.inspector.running == 0,
    free=next_inspection_not_refused,
    meanwhile=inspections_refused,
)
CASES: dict[tuple[str, str], list[Case]] = {
    ("POST", "/datasets/inspect"): [INSPECT],
    ("POST", "/v1/chat/completions"): [
        Case(f"{how} chat answer", body=chat(stream), held=chat_request_held, gone=chat_request_cancelled,
             free=lambda server: server.studio.inference.active == 0)
        for how, stream in (("whole", False), ("streamed", True))
    ],
    ("POST", "/v1/completions"): [
        Case(f"{how} completion", body=completion(stream), held=chat_request_held, gone=chat_request_cancelled,
             free=lambda server: server.studio.inference.active == 0)
        for how, stream in (("whole", False), ("streamed", True))
    ],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the stand-in children are imported from the repository
        with Server(tmp_path_factory.mktemp("disconnect") / "data") as running:
            yield running


def test_the_registry_holds_the_work_that_lives_for_its_request_and_no_job() -> None:
    assert {("POST", "/datasets/inspect"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")} <= set(ROUTES)
    # Training and export jobs outlive the request that started them.
    assert not [path for _, path in ROUTES if path.startswith(("/train", "/export", "/v1/fine_tuning"))]


@pytest.mark.parametrize("route", ROUTES, ids=[f"{method} {path}" for method, path in ROUTES])
def test_a_client_that_goes_away_takes_its_work_with_it(server: Server, route: tuple[str, str]) -> None:
    method, path = route
    cases = CASES.get(route)
    assert cases, (f"{method} {path} is request-scoped: add to CASES how to hold its work with a stand-in child, and"
                   " how to see it gone and its slot free")
    assert method == "POST"  # post_and_leave sends a body; a route of another method needs a client for it
    for case in cases:
        leave_and_see_the_work_go(server, path, case)


def leave_and_see_the_work_go(server: Server, path: str, case: Case) -> None:
    work = server.post_and_leave(path, case.body(server), case.held(server), case.meanwhile)
    wait_for(lambda: case.gone(server, work), timeout=WAIT, what=f"the {case.name} ({work}) to be gone")
    wait_for(lambda: case.free(server), timeout=WAIT, what=f"the slot of the {case.name} to be free")


def test_a_body_that_comes_in_parts_reaches_the_route_whole(server: Server) -> None:
    """A body that comes in many parts reaches the route whole while the watcher is in place (it
    listens only once the body is read; uvicorn would in any case wake the route's receive first)."""
    body = {"model": server.trained_model(), "messages": [{"role": "user", "content": "every part arrived"}]}
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as connection:
        connection.sendall(head.encode())
        for start in range(0, len(data), 16):  # parts the server reads one by one (no assertion waits on this)
            time.sleep(0.02)
            connection.sendall(data[start:start + 16])
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK", answer
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"] == "every part arrived"


def test_a_marked_route_that_nothing_would_watch_is_refused() -> None:
    router = APIRouter(prefix="/elsewhere")

    @router.post("/work")
    @request_scoped
    async def work() -> None:
        return None

    with pytest.raises(TypeError, match=r"\['POST'\] /elsewhere/work is @request_scoped, but its router's route_class is APIRoute"):
        check_request_scoped([router])
