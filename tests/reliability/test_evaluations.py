"""Evaluations as jobs (docs/API.md, Evaluation), server side: the real evaluation child against
the server's own /v1, whose chat child is the stand-in (tests/helpers/stand_in_chat_child.py:
it echoes the last user message, and answers `__model__` with the ModelRef the server
resolved), and training jobs played in-process (a saved adapter and job.json, no training).

Queued, streamed, listed and stopped like exports, their own slot, a killed child, a model
deleted meanwhile, restart recovery, every refusal of /eval/start, eval_after and eval_guard,
and the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.cli.client import StreamEvent, StudioClient
from finetune_studio.cli.main import build_parser
from finetune_studio.config import Settings
from finetune_studio.jobs.evaluations import eval_join, guard_drop
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.supervisor.launcher import EVAL_MODULE, WORKER_MODULES
from finetune_studio.supervisor.recovery import recover_jobs
from tests.helpers.children import STAND_IN_CHAT_CHILD
from tests.helpers.evaluations import AdapterLauncher, rows_file, trained
from tests.helpers.fake_openai import FakeOpenAI
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer


@pytest.fixture
def studio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> Iterator[Any]:
    """studio(**settings) -> a started LiveServer: jobs played in-process (AdapterLauncher), the stand-in
    chat child, real evaluation children that reach it at its own URL."""
    monkeypatch.chdir(REPO)
    servers: list[LiveServer] = []

    def start(**overrides: Any) -> LiveServer:
        values: dict[str, Any] = {"data_dir": tmp_path / "data", "stop_grace_seconds": 5, "kill_grace_seconds": 1}
        values.update(overrides)
        server = LiveServer(Settings(**values), AdapterLauncher(tiny_model), inference_module=STAND_IN_CHAT_CHILD)
        server.settings.port = server.port  # the URL its evaluation children reach it at
        servers.append(server)
        return server.__enter__()

    yield start
    for server in servers:
        server.__exit__()


def eval_events(client: StudioClient, eval_id: str, after: int = 0) -> list[StreamEvent]:
    return list(client.stream(eval_id, last_event_id=after, prefix="/eval"))


def finished(client: StudioClient, eval_id: str, timeout: float = 240) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := client.eval_status(eval_id))["phase"] in ("completed", "error", "stopped") and s,
        timeout=timeout, interval=0.1, what=f"evaluation {eval_id} to end",
    )
    return status


def has_completions_route(url: str) -> bool:
    answer = httpx.post(f"{url}/v1/completions", json={"model": "none", "prompt": "a", "max_tokens": 1})
    return answer.status_code != 404 or (answer.json().get("error") or {}).get("code") == "model_not_found"


def test_an_evaluation_is_queued_streamed_listed_and_its_results_kept(studio: Any, tmp_path: Path, tiny_model: Path) -> None:
    server = studio()
    with server.client() as client:
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
        data = rows_file(tmp_path / "heldout.jsonl", ["one two", "three four five", "six"])
        suites = [{"type": "heldout", "data": [str(data)], "max_new_tokens": 16}]
        eval_id = client.start_eval({"models": [job_id, f"base:{job_id}"], "suites": suites, "label": "first look"})
        events = eval_events(client, eval_id)
        statuses = [e.data for e in events if e.kind == "status"]
        assert [s["phase"] for s in statuses] == ["idle", "loading_model", "loading_model", "evaluating", "completed"], statuses[-1]
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        progress = [e.data for e in events if e.kind == "progress"]
        assert progress and progress[-1]["step"] == progress[-1]["total_steps"] == 6
        assert all(p["step"] <= p["total_steps"] for p in progress)
        final = client.eval_status(eval_id)
        assert final["eval_id"] == eval_id and final["phase"] == "completed" and final["is_running"] is False
        assert final["details"]["samples"] == 3 and final["details"]["results_url"] == f"/eval/results/{eval_id}"

        results = client.eval_results(eval_id)
        assert results["eval_id"] == eval_id and results["models"] == [job_id, f"base:{job_id}"]
        assert results["samples_url"] == f"/eval/results/{eval_id}/samples"
        exact = next(m for m in results["metrics"] if m["name"] == "heldout/exact_match")
        assert exact["values"] == {job_id: 1.0, f"base:{job_id}": 1.0}  # both echo the reference
        assert exact["deltas"] == {f"base:{job_id}": 0.0} and exact["deltas_ci95"] == {f"base:{job_id}": [0.0, 0.0]}
        names = {m["name"] for m in results["metrics"]}
        assert {"heldout/rouge_l", "heldout/bleu", "heldout/chrf"} <= names
        if not has_completions_route(server.url):
            assert "heldout/loss" not in names and any("POST /v1/completions" in w for w in results["warnings"])
        page = client.eval_samples(eval_id, suite="heldout", offset=1, limit=1)
        assert page["total"] == 3 and page["offset"] == 1 and len(page["data"]) == 1
        row = page["data"][0]
        assert row["suite"] == "heldout" and row["index"] == 1 and row["reference"] == "three four five"
        assert row["answers"] == {job_id: "three four five", f"base:{job_id}": "three four five"}
        assert client.eval_samples(eval_id, suite="other")["total"] == 0

        # Lists never mix, and an evaluation's id is no other kind's.
        assert [e["eval_id"] for e in client.evals()] == [eval_id]
        assert [j["job_id"] for j in client.jobs()] == [job_id]
        for path in (f"/train/status/{eval_id}", f"/export/status/{eval_id}", f"/eval/status/{job_id}", f"/eval/results/{job_id}"):
            assert client.http.get(path).status_code == 404, path
        # The results survive a restart: they are in SQLite.
    server.__exit__()
    again = LiveServer(server.settings, AdapterLauncher(tiny_model), inference_module=STAND_IN_CHAT_CHILD)
    with again, again.client() as client:
        assert client.eval_results(eval_id) == results
        assert client.eval_samples(eval_id)["total"] == 3


def test_refusals_name_the_field(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "a-judges-key")
    settings = Settings(data_dir=tmp_path / "data", judge_key_envs="JUDGE_KEY,UNSET_KEY")
    data = rows_file(tmp_path / "heldout.jsonl", ["hi"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with TestClient(create_app(settings, AdapterLauncher(tiny_model)), base_url="http://127.0.0.1") as client:
        job_id = client.post("/train/start", json={"model_name": "tiny/base", "training_type": "LoRA/QLoRA", "format_type": "auto",
                                                   "local_datasets": [str(data)]}).json()["job_id"]
        wait_for(lambda: client.get(f"/train/status/{job_id}").json()["phase"] == "completed", timeout=30, what="the job")

        def refused(body: dict[str, Any], code: int, field: str, words: str) -> None:
            answer = client.post("/eval/start", json=body)
            assert answer.status_code == code, answer.text
            refusal = answer.json()
            assert refusal["status"] == "error" and refusal["eval_id"] == "" and refusal["field"] == field, refusal
            assert words in refusal["error"], refusal["error"]

        heldout = {"type": "heldout", "data": [str(data)]}
        refused({"models": ["nope"], "suites": [heldout]}, 404, "models[0]", "'nope' does not exist")
        refused({"models": [job_id, "base:nothing"], "suites": [heldout]}, 404, "models[1]", "job 'nothing'")
        refused({"models": [job_id], "suites": [{"type": "heldout", "data": [str(data), str(tmp_path / "no.jsonl")]}]}, 400,
                "suites[0].data[1]", "does not exist")
        refused({"models": [job_id], "suites": [{"type": "heldout", "data": [str(empty)]}]}, 400, "suites[0].data[0]", "is empty")
        refused({"models": [job_id], "suites": [heldout, {"type": "lm_eval", "tasks": ["x"], "tasks_dir": str(data)}]}, 400,
                "suites[1].tasks_dir", "not a folder")
        judge = {"type": "judge", "prompts": str(data)}
        refused({"models": [job_id], "suites": [{**judge, "judge": {"model": "judge-that-is-not"}}]}, 404, "suites[0].judge.model",
                "an external judge needs judge.base_url")
        external = {"model": "gpt", "base_url": "https://judge.example/v1"}
        refused({"models": [job_id], "suites": [{**judge, "judge": {**external, "api_key_env": "OTHER_KEY"}}]}, 400,
                "suites[0].judge.api_key_env", "FINETUNE_STUDIO_JUDGE_KEY_ENVS")
        refused({"models": [job_id], "suites": [{**judge, "judge": {**external, "api_key_env": "FINETUNE_STUDIO_TOKEN"}}]}, 400,
                "suites[0].judge.api_key_env", "server's own settings")
        refused({"models": [job_id], "suites": [{**judge, "judge": {**external, "api_key_env": "UNSET_KEY"}}]}, 400,
                "suites[0].judge.api_key_env", "has no UNSET_KEY")
        assert client.post("/eval/start", json={"models": [job_id], "suites": [{**judge, "judge": {**external, "api_key_env": "JUDGE_KEY"}}]}).status_code == 200
        # Schema errors: FastAPI's 422, naming the field.
        for body in (
            {"models": [], "suites": [heldout]},
            {"models": [job_id, job_id], "suites": [heldout]},
            {"models": [job_id], "suites": []},
            {"models": [job_id], "suites": [heldout], "extra": 1},
            {"models": [job_id], "suites": [{"type": "lm_eval", "tasks": ["../x"]}]},
            {"models": [job_id], "suites": [{"type": "lm_eval", "tasks": ["x"], "limit": 2.5}]},
            {"models": [job_id], "suites": [{**judge, "judge": {"model": "m", "base_url": "ftp://x"}}]},
        ):
            assert client.post("/eval/start", json=body).status_code == 422, body
        # eval_after is checked at /train/start as /eval/start checks suites.
        start = {"model_name": "tiny/base", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": [str(data)]}
        answer = client.post("/train/start", json={**start, "eval_after": [{"type": "heldout", "data": [str(tmp_path / "no.jsonl")]}]})
        assert answer.status_code == 400 and answer.json()["field"] == "eval_after[0].data[0]"
        assert client.post("/train/start", json={**start, "eval_guard": {"metric": "heldout/loss", "max_drop": 0.1}}).status_code == 422
        guard_on_nothing = {**start, "eval_after": [heldout], "eval_guard": {"metric": "judge/win_rate", "max_drop": 0.1}}
        assert "names no suite of eval_after" in client.post("/train/start", json=guard_on_nothing).text

    # An exposed server reaches only the judges' hosts its operator allows.
    exposed = Settings(data_dir=tmp_path / "exposed", host="0.0.0.0", token="exposed-token-0123456789",  # noqa: S104
                       judge_allowed_hosts="judge.example")
    headers = {"Authorization": "Bearer exposed-token-0123456789"}
    with TestClient(create_app(exposed, AdapterLauncher(tiny_model)), base_url="http://127.0.0.1") as client:
        served = rows_file(tmp_path / "exposed" / "heldout.jsonl", ["hi"])
        job_id = client.post("/train/start", headers=headers, json={"model_name": "tiny/base", "training_type": "LoRA/QLoRA",
                                                                      "format_type": "auto", "local_datasets": [str(served)]}).json()["job_id"]
        wait_for(lambda: client.get(f"/train/status/{job_id}", headers=headers).json()["phase"] == "completed", timeout=30, what="job")
        body = {"models": [job_id], "suites": [{"type": "judge", "prompts": str(served), "judge": {"model": "m", "base_url": "http://10.0.0.9/v1"}}]}
        answer = client.post("/eval/start", headers=headers, json=body)
        assert answer.status_code == 403 and answer.json()["field"] == "suites[0].judge.base_url"
        body["suites"][0]["judge"]["base_url"] = "https://judge.example/v1"
        assert client.post("/eval/start", headers=headers, json=body).status_code == 200
        outside = {"models": [job_id], "suites": [{"type": "heldout", "data": [str(data)]}]}  # outside the data dir
        answer = client.post("/eval/start", headers=headers, json=outside)
        assert answer.status_code == 403 and answer.json()["field"] == "suites[0].data[0]"


def eval_pid(server: LiveServer, eval_id: str) -> int:
    return int(wait_for(lambda: server.studio.service.store.get_job(eval_id).worker_pid, timeout=60, what="the evaluation's child"))


def test_stop_a_killed_child_its_own_slot_and_a_model_deleted_meanwhile(studio: Any, tmp_path: Path) -> None:
    server = studio(max_concurrent_evals=1)
    with server.client() as client:
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
        other = trained(client, rows_file(tmp_path / "train2.jsonl", ["hi"]))
        hang = [{"type": "heldout", "data": [str(rows_file(tmp_path / "hang.jsonl", ["hang"]))], "max_new_tokens": 8}]
        quick = [{"type": "heldout", "data": [str(rows_file(tmp_path / "quick.jsonl", ["a b"]))], "max_new_tokens": 8}]

        held = client.start_eval({"models": [job_id], "suites": hang})
        wait_for(lambda: client.eval_status(held)["phase"] == "evaluating", timeout=60, what="the evaluation to ask its first answer")
        queued = client.start_eval({"models": [job_id, other], "suites": quick})
        doomed = client.start_eval({"models": [other], "suites": quick})
        assert client.eval_status(queued)["phase"] == "idle" and client.eval_status(queued)["details"]["queue_position"] == 1
        # A training job runs beside it: evaluations have slots of their own.
        assert client.status(trained(client, rows_file(tmp_path / "train3.jsonl", ["hi"])))["phase"] == "completed"

        stopped = client.stop_eval(doomed)  # queued: stopped at once
        assert stopped["phase"] == "stopped" and client.eval_status(doomed)["phase"] == "stopped"
        assert client.http.post(f"/eval/stop/{doomed}").status_code == 409

        # The job `other` goes while `queued` waits for it: it fails cleanly when its turn comes.
        assert client.http.delete(f"/train/jobs/{other}").status_code == 204

        os.kill(eval_pid(server, held), signal.SIGKILL)
        killed = finished(client, held)
        assert killed["phase"] == "error" and killed["details"]["error_code"] == "worker_died"
        assert "killed by SIGKILL" in killed["error"] and killed["details"]["signal"] == "SIGKILL"

        gone = finished(client, queued)  # the next one ran
        assert gone["phase"] == "error" and gone["details"]["error_code"] == "model_not_found"
        assert f"job {other!r}" in gone["error"] or other in gone["error"]
        assert "deleted since the evaluation was queued" in gone["error"]

        again = client.start_eval({"models": [job_id], "suites": hang})
        wait_for(lambda: client.eval_status(again)["phase"] == "evaluating", timeout=60, what="the evaluation to hang")
        answer = client.stop_eval(again)
        assert answer["details"]["stop_requested"] is True and answer["message"].startswith("Stop requested")
        ended = finished(client, again, timeout=60)
        assert ended["phase"] == "stopped"
        assert [s["phase"] for s in (e.data for e in eval_events(client, again) if e.kind == "status")][-1] == "stopped"


def test_a_restart_ends_running_evaluations_and_keeps_queued_ones(tmp_path: Path) -> None:
    assert EVAL_MODULE in WORKER_MODULES  # recovery knows an orphaned evaluation child by its command line
    store = JobStore(tmp_path / "studio.db")
    service = JobService(store, tmp_path / "jobs")
    request = {"models": ["m"], "suites": [], "suite_names": []}
    running = service.create_job(request, "Queued", {}, kind="eval")
    stopping = service.create_job(request, "Queued", {}, kind="eval")
    waiting = service.create_job(request, "Queued", {}, kind="eval")
    for job in (running, stopping):
        service.transition(job.id, "loading_model", "loading")
        service.transition(job.id, "evaluating", "evaluating")
    service.mark_stop_requested(stopping.id)
    recover_jobs(service)
    ended = store.get_job(running.id)
    assert ended.phase == "error" and ended.status["details"]["error_code"] == "server_restarted"
    assert "POST /eval/start" in ended.status["error"]
    assert store.get_job(stopping.id).phase == "stopped"
    assert store.get_job(waiting.id).phase == "idle"
    assert Path(running.output_dir).parent == tmp_path / "evals"
    store.close()


def test_eval_after_queues_an_evaluation_against_the_base_and_the_guard_warns(studio: Any, tmp_path: Path) -> None:
    def judge(model: str, messages: list[dict[str, Any]]) -> str:
        """Prefers the answer of a model with no adapter: the base (the stand-in chat child answers
        `__model__` with the model the server resolved)."""
        text = messages[-1]["content"]
        a = text.split("[Answer A]\n", 1)[1].split("\n\n[Answer B]\n", 1)[0]
        return json.dumps({"reason": "no adapter is better here", "winner": "A" if '"adapter": null' in a else "B"})

    server = studio()
    prompts = rows_file(tmp_path / "prompts.jsonl", ["__model__", "__model__"])
    with FakeOpenAI({"judge"}, judge) as external, server.client() as client:
        suites = [
            {"type": "heldout", "data": [str(rows_file(tmp_path / "heldout.jsonl", ["a b", "c"]))], "max_new_tokens": 16},
            {"type": "judge", "prompts": str(prompts), "judge": {"model": "judge", "base_url": f"{external.url}/v1"}, "max_new_tokens": 32},
        ]
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]), eval_after=suites,
                         eval_guard={"metric": "judge/win_rate", "max_drop": 0.5})
        status = client.status(job_id)
        eval_id = status["details"]["eval_id"]
        events_then = client.http.get(f"/train/jobs/{job_id}").json()
        assert status["details"]["eval"]["guard"]["state"] in ("pending", "failed")
        evaluation = finished(client, eval_id)
        assert evaluation["phase"] == "completed", (evaluation["error"], evaluation["details"])
        assert client.eval_results(eval_id)["models"] == [job_id, f"base:{job_id}"]

        joined = client.status(job_id)["details"]
        summary, guard = joined["eval"]["summary"], joined["eval"]["guard"]
        assert summary["phase"] == "completed" and summary["models"] == [job_id, f"base:{job_id}"]
        win = next(m for m in summary["metrics"] if m["name"] == "judge/win_rate")
        assert win["values"][f"base:{job_id}"] == 1.0
        assert guard["state"] == "failed" and guard["drop"] == 1.0 and guard["max_drop"] == 0.5
        assert guard["warning"] in joined["warnings"] and "falls behind its base on judge/win_rate" in guard["warning"]
        assert client.status(job_id)["phase"] == "completed"  # the run does not fail
        # The list joins it too; the job's stream gets no new event.
        listed = next(j for j in client.jobs() if j["job_id"] == job_id)
        assert listed["details"]["eval"]["guard"]["state"] == "failed"
        assert events_then["status"]["job_id"] == job_id
        stream = list(client.stream(job_id))
        assert stream[-1].data["phase"] == "completed" and "eval" not in stream[-1].data["details"]
        assert stream[-1].data["details"]["eval_id"] == eval_id


def test_the_guard_by_hand(tmp_path: Path) -> None:
    higher = {"values": {"ft": 0.7, "base": 0.8}, "higher_is_better": True}
    lower = {"values": {"ft": 1.2, "base": 1.0}, "higher_is_better": False}
    compared = {"values": {"ft": None, "base": 0.25}, "higher_is_better": True}
    assert guard_drop(higher, "ft", "base") == pytest.approx(0.1)
    assert guard_drop(lower, "ft", "base") == pytest.approx(0.2)
    assert guard_drop(compared, "ft", "base") == 0.25
    assert guard_drop({"values": {"ft": 1.0}, "higher_is_better": True}, "ft", "base") is None

    store = JobStore(tmp_path / "studio.db")
    service = JobService(store, tmp_path / "jobs")
    job = service.create_job({"eval_guard": {"metric": "heldout/loss", "max_drop": 0.25}}, "Queued", {})
    evaluation = service.create_job({"models": ["ft", "base"]}, "Queued", {}, kind="eval")
    pending = eval_join(store, job, {"eval_id": evaluation.id})
    assert pending["eval"]["guard"]["state"] == "pending" and pending["eval"]["summary"]["phase"] == "idle"
    service.transition(evaluation.id, "loading_model", "l")
    service.transition(evaluation.id, "evaluating", "e")
    results = {"eval_id": evaluation.id, "models": ["ft", "base"], "metrics": [{"name": "heldout/loss", **lower}]}
    store.save_eval_results(evaluation.id, results, [])
    service.transition(evaluation.id, "completed", "done")
    passed = eval_join(store, job, {"eval_id": evaluation.id})["eval"]["guard"]
    assert passed["state"] == "passed" and passed["drop"] == pytest.approx(0.2) and passed["warning"] is None
    missing = eval_join(store, store.get_job(service.create_job({"eval_guard": {"metric": "heldout/rouge_l", "max_drop": 0}}, "Q", {}).id),
                        {"eval_id": evaluation.id})["eval"]["guard"]
    assert missing["state"] == "unavailable" and "heldout/loss" in missing["reason"]
    assert eval_join(store, job, {"eval_id": "gone"})["eval"]["guard"]["state"] == "unavailable"
    store.close()


def test_the_cli_follows_an_evaluation_and_prints_the_table(studio: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from finetune_studio.cli.eval_job import run_eval_job

    token = "evaluation-token-0123456789"
    server = studio(token=token)  # the child reaches the server with the token on its stdin
    with server.client(token=token) as client:
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
    prompts = rows_file(tmp_path / "prompts.jsonl", ["a b", "c d"])
    with FakeOpenAI({"judge"}, lambda model, messages: "no verdict here") as judge:
        args = build_parser().parse_args([
            "eval", job_id, "--judge", "judge", "--judge-url", f"{judge.url}/v1", "--judge-prompts", str(prompts),
            "--max-new-tokens", "8", "--server", server.url, "--token", token, "--output-json", "--no-start-server",
        ])
        assert run_eval_job(args, sys.stdout, sys.stderr) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1] == {"event": "summary", "exit_code": 0, "phase": "completed"}
    results = lines[-2]
    assert results["event"] == "results" and results["data"]["models"] == [job_id, f"base:{job_id}"]
    assert {"status", "progress"} <= {line["event"] for line in lines[:-2]}
    # A judge that gives no verdict it can parse: every pair a tie, counted.
    unparsed = next(m for m in results["data"]["metrics"] if m["name"] == "judge/unparsed")
    assert unparsed["values"][f"base:{job_id}"] == 4.0

    args = build_parser().parse_args(["eval", job_id, "--data", str(tmp_path / "no.jsonl"), "--server", server.url, "--token", token,
                                      "--no-start-server"])
    assert run_eval_job(args, sys.stdout, sys.stderr) == 2
    assert "does not exist" in capsys.readouterr().err
    # The token travels on the child's stdin only: it is not in what the server stored.
    stored = json.dumps(server.studio.service.store.get_job(results["data"]["eval_id"]).request)
    assert token not in stored
