"""Servers for the tests: a real `finetune-studio serve` process (ServerProcess), or the
app under a real uvicorn in a thread of the test process (LiveServer), each on a free
loopback port."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

import psutil
import uvicorn

from finetune_studio.api.app import create_app
from finetune_studio.api.deps import Studio
from finetune_studio.cli.client import StudioClient
from finetune_studio.cli.local_server import LocalServer, free_port
from finetune_studio.config import Settings
from finetune_studio.supervisor.inspector import Inspector
from finetune_studio.supervisor.launcher import WorkerLauncher
from tests.helpers.polling import wait_for

Live = TypeVar("Live", bound="LiveServer")


Made = TypeVar("Made")


def stopped_at_teardown(make: Callable[..., Made], start: Callable[[Made], Made],
                        stop: Callable[[Made], Any]) -> Iterator[Callable[..., Made]]:
    """A fixture's body (`yield from` it): yields a function that makes a server, keeps it, and
    starts it; at teardown every server it made is stopped, a start that failed included."""
    made: list[Made] = []

    def started(*args: Any, **kwargs: Any) -> Made:
        made.append(make(*args, **kwargs))
        return start(made[-1])

    yield started
    for server in made:
        stop(server)


class ServerProcess(LocalServer):
    """A `finetune-studio serve` child on a free loopback port, and clients for it."""

    def __init__(self, data_dir: Path, env: Optional[dict[str, str]] = None, args: Optional[list[str]] = None) -> None:
        super().__init__(data_dir, env={"FINETUNE_STUDIO_STOP_GRACE_SECONDS": "20", **(env or {})}, args=args or ())

    def client(self, token: Optional[str] = None) -> StudioClient:
        return StudioClient(self.url, token=token)

    def inference_child(self) -> Optional[int]:
        """The pid of the server's chat child, None while it has none."""
        assert self.pid is not None
        for child in psutil.Process(self.pid).children():
            if "finetune_studio.inference.child" in child.cmdline():
                return int(child.pid)
        return None


class LiveServer:
    """create_app(settings, launcher, ...) served by uvicorn on 127.0.0.1, in a thread of the
    test process; `with` starts and stops it. `app_options` go to create_app as they are
    (inference_module, inspect_module: stand-in children)."""

    def __init__(
        self,
        settings: Settings,
        launcher: Optional[WorkerLauncher] = None,
        export_launcher: Optional[WorkerLauncher] = None,
        **app_options: Any,
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, launcher, export_launcher=export_launcher, **app_options)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            ws="none",
            lifespan="on",
            backlog=2048,
            timeout_graceful_shutdown=3,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def __enter__(self: Live) -> Live:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), timeout=30, what="uvicorn to start")
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def studio(self) -> Studio:
        return self.app.state.studio  # type: ignore[no-any-return]

    @property
    def inspector(self) -> Inspector:
        return self.app.state.inspector  # type: ignore[no-any-return]

    @property
    def inference_log(self) -> str:
        """What the chat child has said on stderr so far (the server's inference.log)."""
        path = self.settings.data_dir / "inference.log"
        return path.read_text() if path.exists() else ""

    def client(self, token: Optional[str] = None) -> StudioClient:
        return StudioClient(self.url, token=token)
