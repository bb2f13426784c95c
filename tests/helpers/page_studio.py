"""The server the page tests drive (tests/browser/test_page.py, test_ray_ui.py): the real
app in this process (LiveServer) with a scripted worker that trains nothing. Each job's
`project_name` says what it does (`completed`, `tracked` (completed, logged to trackers), `failed`, `stopped`, `held`: it waits in
loading_model until the test lets it go, then trains until stopped), with the long
messages and paths real runs have."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

import httpx

from finetune_studio.wire import WorkerSpec
from tests.helpers.jobs import ScriptedWorker, job_request
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

# A model folder with the long path real ones have: it exists (admission checks that).
LONG = "a-rather-long-model-folder-name-as-people-make-them-" + "x" * 60


# details.trackers of a `tracked` job: an MLflow server's run (a link) and a local Trackio project (none).
TRACKED = [
    {"name": "mlflow", "run_id": "0123abcd", "experiment_id": "7", "experiment": "tracked",
     "tracking_uri": "http://127.0.0.1:5000", "url": "http://127.0.0.1:5000/#/experiments/7/runs/0123abcd"},
    {"name": "trackio", "project": "tracked", "run": "job", "dir": "/tmp/trackio"},
]


def status(phase: str, message: str, error: Optional[str] = None, **details: Any) -> dict[str, Any]:
    return {"type": "status", "phase": phase, "message": message, "error": error, "details": details}


def progress(step: int, total: int) -> dict[str, Any]:
    values = {"step": step, "total_steps": total, "loss": 2.0 / step, "learning_rate": 2e-4,
              "progress_percent": 100.0 * step / total, "epoch": step / total, "num_tokens": 512 * step}
    return {"type": "progress", "progress": values}


class ScriptedHandle(ScriptedWorker):
    """A worker that is no process: it plays the script its request's project_name names."""

    def __init__(self, spec: WorkerSpec, held: threading.Event) -> None:
        super().__init__()
        self.spec = spec
        self.log_path = spec.output_dir / "worker.log"
        self.held = held

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        request = self.spec.request
        script = str(request.get("project_name") or "completed").split()[0]
        out = self.spec.output_dir
        out.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("scripted worker\n")
        model = str(request["model_name"])
        yield status("loading_model", f"Loading model {model} (reading every row of {request['local_datasets'][0]} first)")
        if script == "held":
            while not self.held.is_set() and not self.stop.is_set():
                await asyncio.sleep(0.02)
        yield status("loading_dataset", f"Read {len(request['local_datasets'])} files: 50 rows (alpaca), 0 bad rows")
        if script == "failed":
            yield status(
                "error",
                "The dataset could not be read",
                error=f"{request['local_datasets'][0]} line 3: the row has no 'instruction' field; every alpaca row needs"
                " instruction and output (found keys: question, answer). Set format_type, or custom_format_mapping to"
                " read these columns as they are: " + "/very/long/path/segment" * 8,
                details={"error_code": "dataset_invalid"},
            )
            return
        yield status("configuring", "Preparing the trainer")
        total = 200
        yield status("training", f"Training for {total} steps", total_steps=total)
        steps = 30
        for step in range(1, steps + 1):
            yield progress(step, total)
        if script == "held":
            await self.stop.wait()
        checkpoint = out / "checkpoints" / f"checkpoint-{steps}"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "trainer_state.json").write_text("{}")
        adapter = out / "adapter"
        adapter.mkdir(exist_ok=True)
        (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
        saved = {"adapter_dir": str(adapter), "output_dir": str(out), "last_checkpoint": str(checkpoint), "steps": steps}
        if script == "tracked":  # logged to trackers (training/trackers.py): where, as the training child says it
            saved["trackers"] = TRACKED
        if script in ("stopped", "held"):
            message = f"Stopped at step {steps} of {total} (a stop was requested); what was trained is saved in {adapter}"
            yield status("stopped", message, **saved)
        else:
            yield status("completed", f"Trained {steps} steps; the adapter is saved in {adapter}", train_loss=0.5, **saved)


class ScriptedLauncher:
    def __init__(self) -> None:
        self.held = threading.Event()  # lets `held` jobs go on from loading_model

    async def launch(self, spec: WorkerSpec) -> ScriptedHandle:
        return ScriptedHandle(spec, self.held)


class Studio:
    """A live server with the scripted worker, the files its requests name, and HTTP helpers."""

    def __init__(self, server: LiveServer, launcher: ScriptedLauncher, root: Path, token: Optional[str]) -> None:
        self.server, self.launcher, self.url = server, launcher, server.url
        self.model = root / "models" / LONG
        self.model.mkdir(parents=True)
        (self.model / "config.json").write_text("{}")
        self.data = root / "data-files" / "train.jsonl"
        self.data.parent.mkdir()
        self.data.write_text('{"instruction": "hi", "output": "hello"}\n')
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.url, headers=headers, timeout=30)

    def close(self) -> None:
        self.http.close()

    def request(self, script: str, **fields: Any) -> dict[str, Any]:
        body = job_request(self.model, local_datasets=[str(self.data)], project_name=script)
        body.update(fields)
        return body

    def start(self, script: str, **fields: Any) -> str:
        answer = self.http.post("/train/start", json=self.request(script, **fields))
        assert answer.status_code == 200, answer.text
        return str(answer.json()["job_id"])

    def phase(self, job_id: str) -> str:
        return str(self.http.get(f"/train/status/{job_id}").json()["phase"])

    def wait_phase(self, job_id: str, *phases: str) -> None:
        wait_for(lambda: self.phase(job_id) in phases, timeout=30, what=f"job {job_id} to be {phases}")

    def detail(self, job_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/train/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]


def settle(server: LiveServer) -> None:
    """Let the dataset previews the page asked for (each a child process) end before the
    server stops: a child still running when its loop closes is an unclosed transport."""
    inspector = getattr(server.app.state, "inspector", None)
    if inspector is not None:
        wait_for(lambda: inspector.running == 0, timeout=120, what="the dataset inspections to end")
