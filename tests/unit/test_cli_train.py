"""`finetune-studio train` against a real app (create_app with stand-in jobs, under uvicorn
in this process): the request the server stores, with the fields the flags leave unset
filled as its `GET /system` recommends, as the page fills its form."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from finetune_studio.api.routes.system import CpuInfo, Recommended, SystemInfo
from finetune_studio.cli.main import main
from finetune_studio.cli.train import CPU_SETTINGS
from tests.helpers.chat import BASE, TOKEN, ChatServer
from tests.helpers.paths import REPO

CPU_ONLY = {"cuda": False, "bitsandbytes": False, "recommended": Recommended(load_in_4bit=False, optim="adamw_torch")}
CUDA_NO_BNB = {"cuda": True, "bitsandbytes": False, "recommended": Recommended(load_in_4bit=False, optim="adamw_torch")}
CUDA_BNB = {"cuda": True, "bitsandbytes": True, "recommended": Recommended(load_in_4bit=True, optim="adamw_8bit")}


class OlderServer:
    """The app, except that while `older` is set `GET /system` is a 404, as from a server
    that predates the route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.older = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.older and scope["type"] == "http" and scope["path"] == "/system":
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps({"detail": "Not Found"}).encode()})
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChatServer, OlderServer]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the stand-in children are imported from the repository
        running = ChatServer(tmp_path_factory.mktemp("cli-train") / "data")
        older = OlderServer(running.app)
        running.server.config.app = older  # uvicorn loads its app when it starts
        with running:
            yield running, older


@pytest.fixture
def server(switch: tuple[ChatServer, OlderServer]) -> ChatServer:
    return switch[0]


def machine(server: ChatServer, **answer: Any) -> None:
    """Make the server's `GET /system` say this (it keeps its first answer in app.state)."""
    base = SystemInfo(platform="Linux x86_64", python="3", cpu_count=2, nvidia_smi=False, cuda=False, bitsandbytes=False,
                      cpu=CpuInfo(model=None, bf16="none", bf16_flags=[], native_bf16=False),
                      versions={}, recommended=Recommended(load_in_4bit=False, optim="adamw_torch"))
    server.app.state.system_info = base.model_copy(update=answer)


def train(server: ChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, Any], str]:
    """`finetune-studio train ... --detach` in this process: the request the server stored, and stderr."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"instruction": "hi", "output": "hello"}\n')
    code = main([
        "train", "--model", BASE, "--data", str(data), "--detach", "--no-start-server",
        "--server", server.url, "--token", TOKEN, "--set", "project_name=lora", *flags,
    ])
    out, err = capsys.readouterr()
    assert code == 0, err
    answer = server.http.get(f"/train/jobs/{out.strip()}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["request"]), err


def test_on_a_cpu_only_server_the_request_asks_for_what_it_can_do(
    server: ChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine looks like a GPU box, so the older guess would send nothing; the server's word counts.
    monkeypatch.setattr("finetune_studio.cli.train.has_nvidia_gpu", lambda: True)
    machine(server, **CPU_ONLY)
    request, err = train(server, tmp_path, capsys)
    assert request["load_in_4bit"] is False and request["optim"] == "adamw_torch"
    assert "the server has no CUDA GPU, so 4-bit loading and the 8-bit optimizer are off" in err
    assert "(load_in_4bit=false, optim=adamw_torch)" in err


def test_a_field_the_user_sets_wins_over_the_machine(
    server: ChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine(server, **CPU_ONLY)
    request, err = train(server, tmp_path, capsys, "--set", "optim=adafactor")
    assert request["optim"] == "adafactor" and request["load_in_4bit"] is False
    assert "(load_in_4bit=false)" in err  # the note names only what it filled

    # --device says which itself: cuda sends the request's own defaults, even to this server.
    request, err = train(server, tmp_path, capsys, "--device", "cuda")
    assert request["load_in_4bit"] is True and request["optim"] == "adamw_8bit"
    assert "4-bit" not in err


def test_a_cuda_server_keeps_the_gpu_defaults_and_one_without_bitsandbytes_says_why(
    server: ChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine(server, **CUDA_BNB)
    request, err = train(server, tmp_path, capsys)
    assert request["load_in_4bit"] is True and request["optim"] == "adamw_8bit"
    assert "4-bit" not in err

    machine(server, **CUDA_NO_BNB)
    request, err = train(server, tmp_path, capsys)
    assert request["load_in_4bit"] is False and request["optim"] == "adamw_torch"
    assert "bitsandbytes is not installed there, so 4-bit loading and the 8-bit optimizer are off" in err


@pytest.fixture
def older_server(switch: tuple[ChatServer, OlderServer]) -> Iterator[ChatServer]:
    """The server as one from before `GET /system`, for this test only."""
    running, older = switch
    older.older = True
    try:
        yield running
    finally:
        older.older = False


@pytest.mark.parametrize("nvidia", [True, False])
def test_an_older_server_gets_the_request_as_before_and_nothing_is_said(
    older_server: ChatServer, nvidia: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert older_server.http.get("/system").status_code == 404
    # Before GET /system, --device auto guessed from this machine (the server is on it).
    monkeypatch.setattr("finetune_studio.cli.train.has_nvidia_gpu", lambda: nvidia)
    request, err = train(older_server, tmp_path, capsys)
    expected = {"load_in_4bit": True, "optim": "adamw_8bit"} if nvidia else CPU_SETTINGS
    assert {name: request[name] for name in expected} == expected
    assert "4-bit" not in err and "system" not in err.lower()
