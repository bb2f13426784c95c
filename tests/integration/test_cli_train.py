"""The real `finetune-studio train`, watch, jobs, status and stop commands, as subprocesses, against real servers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from finetune_studio.cli.local_server import free_port
from tests.helpers.paths import DEMO_DATA, REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train

# The tiny job of tests.helpers.jobs.job_request, as flags.
TINY_JOB = ["--format", "alpaca", "--lr", "1e-3", "--batch-size", "2", "--lora-r", "4", "--max-seq-length", "128",
            "--set", "lora_alpha=8", "--set", "save_steps=0"]
# Bounds every command, so that a broken one fails the test instead of hanging it.
COMMAND_BOUND_SECONDS = 600


def command() -> list[str]:
    """The installed console script, as a user runs it (or the module, where it is not installed)."""
    script = Path(sys.executable).with_name("finetune-studio")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "finetune_studio.cli.main"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FINETUNE_STUDIO_")}
    return {**env, "FINETUNE_STUDIO_STOP_GRACE_SECONDS": "20", **extra}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, env=cli_env(), cwd=REPO,
        timeout=COMMAND_BOUND_SECONDS,
    )


def test_train_follows_a_job_to_completed(server: ServerProcess, tiny_model: Path) -> None:
    done = run_cli("train", "--model", str(tiny_model), "--data", str(DEMO_DATA), "--max-steps", "4", *TINY_JOB,
                   "--server", server.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    job_id = re.search(r"queued job (\w+) at", done.stdout).group(1)  # type: ignore[union-attr]
    # Not a terminal: plain lines, one per phase, the first and the last step, and where the adapter is.
    assert [line.split("]")[0] + "]" for line in lines if line.startswith("[")] == [
        "[idle]", "[loading_model]", "[loading_dataset]", "[configuring]", "[training]", "[completed]"
    ], done.stdout
    assert "[training] Training for 4 steps" in lines
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[0].startswith("step 1/4 ") and steps[-1].startswith("step 4/4  100.0%  loss ")
    assert "warning" not in done.stdout  # on CPU the command asks for what works there: nothing falls back
    assert "\x1b[" not in done.stdout
    assert lines[-1] == f"job {job_id} completed; saved in {server.data_dir / 'jobs' / job_id / 'adapter'}"
    with server.client() as client:
        request = client.status(job_id)["details"]
        assert request["model_name"] == str(tiny_model)


def test_train_starts_a_server_when_none_answers_and_stops_it_after(tmp_path: Path, tiny_model: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "own-data"
    done = run_cli("train", "--model", str(tiny_model), "--data", str(DEMO_DATA), "--max-steps", "3", *TINY_JOB,
                   "--server", f"http://127.0.0.1:{port}", "--data-dir", str(data_dir), "--output-json")
    assert done.returncode == 0, done.stderr
    assert f"nothing answers at http://127.0.0.1:{port}; starting a server there (data in {data_dir})" in done.stderr
    pid = int(re.search(r"\(pid (\d+)\); it stops when the job ends", done.stderr).group(1))  # type: ignore[union-attr]

    # --output-json: stdout is JSON lines only, the events and then the summary.
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {record["event"] for record in records[:-1]} == {"status", "progress"}
    assert [r["data"]["step"] for r in records if r["event"] == "progress"] == [1, 2, 3]
    summary = records[-1]
    assert summary["event"] == "summary" and summary["phase"] == "completed" and summary["exit_code"] == 0
    assert summary["steps"] == 3 and summary["saved_to"] == str(data_dir / "jobs" / summary["job_id"] / "adapter")
    assert (data_dir / "studio.db").is_file() and (data_dir / "server.log").is_file()

    wait_for(lambda: gone(pid), timeout=60, what="the started server to exit")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_refused_job_exits_2_and_a_failing_job_exits_1_with_its_error(server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    refused = run_cli("train", "--model", str(tiny_model), "--data", str(missing), "--server", server.url)
    assert refused.returncode == 2
    assert f"error: the job was not queued: 400: dataset file not found: {missing}" in refused.stderr

    bad = REPO / "tests" / "data" / "bad" / "bad_json.jsonl"
    failed = run_cli("train", "--model", str(tiny_model), "--data", str(bad), "--max-steps", "3", *TINY_JOB,
                     "--server", server.url)
    assert failed.returncode == 1
    assert "[error] Training failed" in failed.stdout
    assert f"  error (dataset_invalid): {bad}, line 3" in failed.stdout
    assert re.search(rf"error: job \w+ ended in error \(dataset_invalid\): {re.escape(str(bad))}, line 3", failed.stderr)


def test_with_no_start_server_nothing_answering_is_refused() -> None:
    done = run_cli("train", "--model", "m", "--data", str(DEMO_DATA), "--server", f"http://127.0.0.1:{free_port()}",
                   "--no-start-server")
    assert done.returncode == 2
    assert "nothing answers at http://127.0.0.1:" in done.stderr and "--no-start-server was given" in done.stderr


def gone(pid: int) -> bool:
    """Exited (its parent is gone, so it may linger as a zombie until init reaps it)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def left_running() -> Iterator[list[int]]:
    """Pids of servers that a command left running (--detach): stopped at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda pid=pid: gone(pid), timeout=60, what=f"the server {pid} to exit")


def test_detach_then_watch_ctrl_c_stop_status_and_jobs(tmp_path: Path, tiny_model: Path, left_running: list[int]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    data_dir = tmp_path / "detached-data"
    # Far more steps than the test lets it train (it is stopped), so that no machine finishes it
    # first: a fast one trained 500 steps before watch's Ctrl-C. Not compiled: a run this long
    # would be, under compile: auto, and the test reads the training messages.
    queued = run_cli("train", "--model", str(tiny_model), "--data", str(DEMO_DATA), "--max-steps", "100000", *TINY_JOB,
                     "--set", "compile=false", "--server", url, "--data-dir", str(data_dir), "--detach")
    kept = re.search(rf"the server at {url} keeps running \(pid (\d+), log {data_dir / 'server.log'}\); stop it with `kill \d+`",
                     queued.stderr)
    assert kept, queued.stderr
    left_running.append(int(kept.group(1)))
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()  # --detach prints the id alone; every note goes to stderr
    assert re.fullmatch(r"\w+", job_id) and f"finetune-studio watch {job_id}" in queued.stderr
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # it outlived the command

    # watch, with stdin not a terminal: Ctrl-C leaves the job running, and says so.
    watch = subprocess.Popen([*command(), "watch", job_id, "--server", url], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=REPO)
    seen: list[str] = []

    def watched_a_step() -> bool:
        assert watch.stdout is not None
        seen.append(watch.stdout.readline())
        assert seen[-1], f"watch ended before the first step: {seen}"
        return seen[-1].startswith("step ")

    try:
        wait_for(watched_a_step, timeout=300, interval=0, what="watch to show a step")
        watch.send_signal(signal.SIGINT)
        rest, _ = watch.communicate(timeout=COMMAND_BOUND_SECONDS)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 130
    assert "stdin is not a terminal" in rest and f"left job {job_id} running" in rest

    jobs = run_cli("jobs", "--server", url)
    assert jobs.returncode == 0
    header, row = jobs.stdout.splitlines()
    assert header == "id\tphase\tmodel\tstep\tmessage"
    # The message moves on while it trains ("Training for 100000 steps", then what the trainer says
    # after its first steps), so the row is checked by its columns, not one message.
    row_id, phase, model, step, message = row.split("\t")
    assert (row_id, phase, model) == (job_id, "training", str(tiny_model))
    assert re.fullmatch(r"\d+/100000", step) and message.startswith("Training"), row

    stop = run_cli("stop", job_id, "--server", url)
    assert stop.returncode == 0 and "Stop requested" in stop.stdout

    def stopped() -> Any:
        status = run_cli("status", job_id, "--server", url, "--output-json")
        return json.loads(status.stdout)["phase"] == "stopped"

    wait_for(stopped, timeout=120, interval=0.5, what="the job to stop")
    status = run_cli("status", job_id, "--server", url)
    lines = status.stdout.splitlines()
    assert lines[0] == f"job {job_id}" and lines[1].startswith("  [stopped] Stopped at step ")
    assert f"saved in: {data_dir / 'jobs' / job_id / 'adapter'}" in status.stdout
    again = run_cli("stop", job_id, "--server", url)
    assert again.returncode == 2 and "409" in again.stderr and "already ended in stopped" in again.stderr
