"""Accounts (issue 28): keys with scopes, owners, the fair queue, the audit log, no secret in clear.

The app runs with accounts on and the stand-in training child (no model loads); two users,
alice and bob, each get a key from the admin (FINETUNE_STUDIO_TOKEN)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from finetune_studio.api.app import create_app
from finetune_studio.api.scopes import OPEN_PATHS, OPEN_ROUTES, ROUTE_SCOPES
from finetune_studio.config import Settings
from finetune_studio.jobs.accounts import SCOPES
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from finetune_studio.supervisor.supervisor import fair_order
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.slow  # every test runs the app and stand-in children

TOKEN = "admin-token-0123456789abcdef"
PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-22"}


def make_app(tmp_path: Path, **settings: Any) -> Any:
    config = Settings(
        data_dir=tmp_path / "data", accounts=True, token=TOKEN, allowed_roots=[tmp_path / "in"],
        stop_grace_seconds=0.5, kill_grace_seconds=0.5, **settings,
    )
    return create_app(config, launcher=LocalProcessLauncher(module=STAND_IN_WORKER))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Team:
    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.admin = bearer(TOKEN)
        self.keys: dict[str, str] = {}
        for name, password in PASSWORDS.items():
            assert client.post("/auth/users", json={"name": name, "password": password}, headers=self.admin).status_code == 201
            self.keys[name] = self.key(name, ["read", "train", "chat", "files"])

    def key(self, user: str, scopes: list[str], **extra: Any) -> str:
        answer = self.client.post("/auth/keys", json={"name": "k", "scopes": scopes, "user": user, **extra}, headers=self.admin)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])

    def of(self, user: str) -> dict[str, str]:
        return bearer(self.keys[user])


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Team]:
    monkeypatch.chdir(REPO)  # the stand-in worker is imported from the repository
    (tmp_path / "in").mkdir()
    with TestClient(make_app(tmp_path), base_url="http://127.0.0.1") as client:
        yield Team(client)


def request(tmp_path: Path, mode: str = "run") -> dict[str, Any]:
    data = tmp_path / "in" / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    return {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": [str(data)], "project_name": mode}


def start(team: Team, user: str, tmp_path: Path, mode: str = "run") -> str:
    answer = team.client.post("/train/start", json=request(tmp_path, mode), headers=team.of(user))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["job_id"])


def phase(team: Team, job_id: str) -> str:
    return str(team.client.get(f"/train/status/{job_id}", headers=team.admin).json()["phase"])


def upload(team: Team, user: str) -> str:
    rows = "".join(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
                   for _ in range(10))
    answer = team.client.post("/v1/files", files={"file": ("f.jsonl", rows.encode())}, data={"purpose": "fine-tune"},
                              headers=team.of(user))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def test_every_route_has_one_scope_and_every_row_a_route(tmp_path: Path) -> None:
    paths = make_app(tmp_path).openapi()["paths"]
    routes = {(method.upper(), path) for path, methods in paths.items() for method in methods if path not in OPEN_PATHS}
    routes -= OPEN_ROUTES  # signing in needs no key
    table = {(method, re.sub(r":\w+}", "}", path)) for method, path in ROUTE_SCOPES}  # OpenAPI drops {name:path}'s converter
    assert not sorted(routes - table), f"routes without a scope in api/scopes.py ROUTE_SCOPES: {sorted(routes - table)}"
    assert not sorted(table - routes), f"ROUTE_SCOPES rows that name no route: {sorted(table - routes)}"
    assert set(ROUTE_SCOPES.values()) <= set(SCOPES)


def test_a_router_whose_routes_would_not_ask_their_scope_is_refused() -> None:
    from fastapi import APIRouter

    from finetune_studio.api.accounts import AuthorizedRoute, check_authorized

    plain = APIRouter(prefix="/plain")
    plain.get("/x")(lambda: None)
    with pytest.raises(TypeError, match="route_class=AuthorizedRoute"):
        check_authorized([plain])
    checked = APIRouter(prefix="/checked", route_class=AuthorizedRoute)
    checked.get("/x")(lambda: None)
    check_authorized([checked])


def test_another_users_object_is_the_404_of_an_unknown_id_on_every_route(team: Team, tmp_path: Path) -> None:
    job = start(team, "alice", tmp_path, "polite")  # it waits in training: every route finds it live
    wait_for(lambda: phase(team, job) == "training", timeout=20, what="alice's job to train")
    file_id = upload(team, "alice")
    hook = team.client.post("/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["studio.job.phase"]},
                            headers=team.of("alice"))
    assert hook.status_code == 200, hook.text
    owned = {"job_id": job, "export_id": job, "eval_id": job, "file_id": file_id, "webhook_id": hook.json()["id"]}
    unknown = {"job_id": "0" * 12, "export_id": "0" * 12, "eval_id": "0" * 12, "file_id": "file-" + "0" * 24,
               "webhook_id": "wh_" + "0" * 16}
    before = team.client.get(f"/train/jobs/{job}", headers=team.of("alice")).json()
    tried = 0
    for path, methods in team.client.get("/openapi.json", headers=team.admin).json()["paths"].items():
        names = re.findall(r"{(\w+)(?::path)?}", path)
        if not any(name in owned for name in names):
            continue
        for method in methods:
            def url(ids: dict[str, str], path: str = path) -> str:
                return re.sub(r"{(\w+)(?::path)?}", lambda m: ids.get(m.group(1), "x"), path)

            body = {"project_name": "bob-was-here"} if method == "patch" else None
            others = team.client.request(method, url(owned), json=body, headers=team.of("bob"))
            missing = team.client.request(method, url(unknown), json=body, headers=team.of("bob"))
            assert others.status_code == 404, (method, path, others.status_code, others.text)
            # The same body, but for the id it names.
            assert others.text.replace(owned[names[0]], "ID") == missing.text.replace(unknown[names[0]], "ID"), (method, path)
            tried += 1
    assert tried >= 20
    # Nothing changed: alice's job trains on, her file is there, her lists hold them; bob's are empty.
    assert phase(team, job) == "training"
    after = team.client.get(f"/train/jobs/{job}", headers=team.of("alice")).json()
    assert "bob-was-here" not in json.dumps(after) and after["status"]["phase"] == before["status"]["phase"]
    assert team.client.get(f"/v1/files/{file_id}", headers=team.of("alice")).status_code == 200
    assert [j["job_id"] for j in team.client.get("/train/jobs", headers=team.of("alice")).json()["data"]] == [job]
    assert team.client.get("/train/jobs", headers=team.of("bob")).json()["count"] == 0
    assert team.client.get("/v1/files", headers=team.of("bob")).json()["data"] == []
    assert [h["id"] for h in team.client.get("/webhooks", headers=team.of("alice")).json()["data"]] == [owned["webhook_id"]]
    assert team.client.get("/webhooks", headers=team.of("bob")).json()["data"] == []
    # A list's cursor is no way round it: alice's ids in bob's `after` are as unknown as made-up ones.
    for listing, owned_id, made_up in (("/v1/files", file_id, "file-000000000000000000000000"),
                                       ("/v1/fine_tuning/jobs", job, "000000000000")):
        others = team.client.get(listing, params={"after": owned_id}, headers=team.of("bob"))
        missing = team.client.get(listing, params={"after": made_up}, headers=team.of("bob"))
        assert others.status_code == missing.status_code != 200, (listing, others.text)
        assert others.text.replace(owned_id, "ID") == missing.text.replace(made_up, "ID"), listing
    # The admin sees everything.
    assert [j["job_id"] for j in team.client.get("/train/jobs", headers=team.admin).json()["data"]] == [job]
    team.client.post(f"/train/stop/{job}", headers=team.of("alice"))
    wait_for(lambda: phase(team, job) == "stopped", timeout=20, what="alice's job to stop")


def test_scopes_a_read_key_cannot_start_a_chat_key_cannot_list_files(team: Team, tmp_path: Path) -> None:
    read = bearer(team.key("alice", ["read"]))
    chat = bearer(team.key("alice", ["chat"]))
    refused = team.client.post("/train/start", json=request(tmp_path), headers=read)
    assert refused.status_code == 403 and "'train' scope" in refused.json()["detail"]
    assert team.client.get("/train/jobs", headers=read).status_code == 200
    files = team.client.get("/v1/files", headers=chat)
    assert files.status_code == 403 and files.json()["error"]["message"].startswith("this key lacks the 'files' scope")
    # A user's key reaches no admin route, and makes no key with more than it holds.
    assert team.client.get("/auth/audit", headers=team.of("alice")).status_code == 403
    more = team.client.post("/auth/keys", json={"name": "x", "scopes": ["read", "chat"]}, headers=read)
    assert more.status_code == 403
    assert team.client.post("/auth/keys", json={"name": "x", "scopes": ["admin"]}, headers=team.of("alice")).status_code == 403


def test_a_revoked_key_is_401_at_once_and_its_open_stream_ends(team: Team, tmp_path: Path) -> None:
    key = team.key("alice", ["read", "train"])
    job = team.client.post("/train/start", json=request(tmp_path, "polite"), headers=bearer(key)).json()["job_id"]
    wait_for(lambda: phase(team, job) == "training", timeout=20, what="the job to train")
    key_id = next(k["id"] for k in team.client.get("/auth/keys", headers=bearer(key)).json()["data"] if key.startswith(k["prefix"]))
    received: list[str] = []
    opened = threading.Event()

    def follow() -> None:
        with team.client.stream("GET", f"/train/stream/{job}", headers=bearer(key)) as stream:
            for line in stream.iter_lines():
                received.append(line)
                opened.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert opened.wait(20), "the stream sent nothing"
    assert team.client.delete(f"/auth/keys/{key_id}", headers=team.of("alice")).status_code == 204
    reader.join(20)
    assert not reader.is_alive(), "the revoked key's stream is still open"
    assert phase(team, job) == "training"  # the stream ended, not the job
    denied = team.client.get("/train/jobs", headers=bearer(key))
    assert denied.status_code == 401 and "revoked" in denied.json()["detail"]
    assert key not in denied.text
    expired = bearer(team.key("alice", ["read"], expires_in_days=1e-9))
    assert team.client.get("/train/jobs", headers=expired).status_code == 401
    team.client.post(f"/train/stop/{job}", headers=team.admin)
    wait_for(lambda: phase(team, job) == "stopped", timeout=20, what="the job to stop")
    audit = [row["action"] for row in team.client.get("/auth/audit", headers=team.admin).json()["data"]]
    assert "key_revoked" in audit and "POST /train/start" in audit and f"POST /train/stop/{job}" in audit


def test_a_user_removed_by_another_process_is_401_at_their_next_request(team: Team, tmp_path: Path) -> None:
    # The server keeps what it found of a key (api/accounts.py); the CLI's `users remove` writes the
    # database from a process of its own, which the server must see by the next request (it asks SQLite every 50 ms; the CLI takes longer to start).
    assert team.client.get("/train/jobs", headers=team.of("bob")).status_code == 200  # found, and kept
    assert team.client.get("/train/jobs", headers=team.of("bob")).status_code == 200
    removed = subprocess.run([sys.executable, "-m", "finetune_studio.cli.main", "users", "remove", "bob",
                              "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, check=False)
    assert removed.returncode == 0, removed.stderr
    assert team.client.get("/train/jobs", headers=team.of("bob")).status_code == 401
    assert team.client.get("/train/jobs", headers=team.of("alice")).status_code == 200


def test_failed_keys_are_rate_limited_per_address(team: Team) -> None:
    answers = [team.client.get("/train/jobs", headers=bearer("fts-wrong")).status_code for _ in range(11)]
    assert answers[:10] == [401] * 10 and answers[10] == 429
    limited = team.client.get("/train/jobs", headers=team.of("alice"))
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1


def test_paths_must_lie_under_the_allowed_roots_and_never_under_the_data_dir(team: Team, tmp_path: Path) -> None:
    inside_data = tmp_path / "data" / "files" / "x.jsonl"
    outside = tmp_path / "elsewhere.jsonl"
    for path in (inside_data, outside):
        path.write_text('{"text": "x"}\n')
        for field in ("local_datasets", "model_name"):
            body = request(tmp_path) | ({field: [str(path)]} if field == "local_datasets" else {field: str(path.parent)})
            answer = team.client.post("/train/start", json=body, headers=team.of("alice"))
            assert answer.status_code == 403 and answer.json()["field"] == field, answer.text


def test_a_sweep_and_every_trial_it_queues_belong_to_its_maker(team: Team, tmp_path: Path) -> None:
    body = {"request": request(tmp_path), "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3}},
            "objective": {"metric": "train_loss"}, "trials": 2, "max_parallel": 1, "seed": 1}
    created = team.client.post("/sweeps", json=body, headers=team.of("alice"))
    assert created.status_code == 200, created.text
    sweep_id = created.json()["sweep_id"]
    final = wait_for(lambda: (s := team.client.get(f"/sweeps/{sweep_id}", headers=team.of("alice")).json())["status"]
                     in ("completed", "stopped", "error") and s, timeout=60, what="alice's sweep to end")
    assert final["status"] == "completed", final
    # The second trial was queued by the server's own task, after the first ended: alice's all the same.
    trials = [t["job_id"] for t in final["trials"]]
    assert len(trials) == 2
    alices = {j["job_id"] for j in team.client.get("/train/jobs", headers=team.of("alice")).json()["data"]}
    assert set(trials) <= alices
    assert team.client.get("/train/jobs", headers=team.of("bob")).json()["count"] == 0
    # Bob: the sweep is the 404 of an id never made, on every sweep route, and his list is empty.
    unknown = "sw_" + "0" * 12
    for method, path in (("GET", "/sweeps/{}"), ("GET", "/sweeps/{}/stream"), ("POST", "/sweeps/{}/stop")):
        others = team.client.request(method, path.format(sweep_id), headers=team.of("bob"))
        missing = team.client.request(method, path.format(unknown), headers=team.of("bob"))
        assert others.status_code == 404 == missing.status_code, (path, others.text)
        assert others.text.replace(sweep_id, "ID") == missing.text.replace(unknown, "ID"), path
    assert team.client.get("/sweeps", headers=team.of("bob")).json()["sweeps"] == []
    assert [s["sweep_id"] for s in team.client.get("/sweeps", headers=team.of("alice")).json()["sweeps"]] == [sweep_id]
    assert [s["sweep_id"] for s in team.client.get("/sweeps", headers=team.admin).json()["sweeps"]] == [sweep_id]


def test_a_webhook_is_told_of_its_makers_objects_only_and_an_admins_of_everyones(team: Team, tmp_path: Path) -> None:
    events = ["studio.job.phase", "fine_tuning.job.succeeded"]
    hooks = {}
    for who, headers in (("alice", team.of("alice")), ("bob", team.of("bob")), ("admin", team.admin)):
        made = team.client.post("/webhooks", json={"url": f"http://127.0.0.1:9/{who}", "events": events}, headers=headers)
        assert made.status_code == 200, made.text
        hooks[who] = made.json()["id"]
    # A read key lists them; registering one takes `train`.
    read = bearer(team.key("alice", ["read"]))
    assert [h["id"] for h in team.client.get("/webhooks", headers=read).json()["data"]] == [hooks["alice"]]
    refused = team.client.post("/webhooks", json={"url": "http://127.0.0.1:9/x", "events": events}, headers=read)
    assert refused.status_code == 403 and "'train' scope" in refused.json()["detail"]
    assert [h["id"] for h in team.client.get("/webhooks", headers=team.admin).json()["data"]] == list(hooks.values())

    job = start(team, "alice", tmp_path)
    wait_for(lambda: phase(team, job) == "completed", timeout=30, what="alice's job to complete")

    def told(who: str) -> set[tuple[str, str]]:
        deliveries = team.client.get(f"/webhooks/{hooks[who]}/deliveries", params={"limit": 100}, headers=team.admin).json()["data"]
        return {(d["event_type"], d["payload"]["data"]["id"]) for d in deliveries}

    assert ("fine_tuning.job.succeeded", job) in told("alice")
    assert ("fine_tuning.job.succeeded", job) in told("admin")
    assert told("bob") == set(), "bob's webhook hears nothing of alice's job"
    # Bob's own job is his webhook's (and the admin's), never alice's.
    bobs = start(team, "bob", tmp_path)
    wait_for(lambda: phase(team, bobs) == "completed", timeout=30, what="bob's job to complete")
    assert {job_id for _, job_id in told("bob")} == {bobs}
    assert bobs not in {job_id for _, job_id in told("alice")}
    assert {job, bobs} <= {job_id for _, job_id in told("admin")}


def test_fair_queue_a_queues_three_then_b_one_b_runs_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert fair_order([("a2", "a"), ("a3", "a"), ("b1", "b")], {"a": 1}) == ["b1", "a2", "a3"]
    assert fair_order([("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c"), ("b2", "b")], {}) == ["a1", "b1", "c1", "a2", "b2"]
    assert fair_order([("1", None), ("2", None), ("3", None)], {None: 7}) == ["1", "2", "3"]  # one owner: FIFO
    log, go = tmp_path / "starts.log", tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))  # each run waits for it before its first step
    monkeypatch.chdir(REPO)
    (tmp_path / "in").mkdir()
    with TestClient(make_app(tmp_path), base_url="http://127.0.0.1") as client:
        team = Team(client)
        first = start(team, "alice", tmp_path)
        wait_for(lambda: phase(team, first) != "idle", timeout=20, what="the first job to start")
        later = [start(team, "alice", tmp_path) for _ in range(2)]
        bobs = start(team, "bob", tmp_path)
        assert client.get(f"/train/status/{bobs}", headers=team.of("bob")).json()["details"]["queue_position"] == 1
        assert client.get(f"/train/status/{later[0]}", headers=team.of("alice")).json()["details"]["queue_position"] == 2
        go.write_text("")
        for job in (first, *later, bobs):
            wait_for(lambda job=job: phase(team, job) == "completed", timeout=30, what=f"{job} to complete")
    started = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("start")]
    assert started == [first, bobs, *later]


def test_the_openai_sdk_with_a_users_key_sees_only_that_users_jobs_and_files(team: Team, tmp_path: Path) -> None:
    jobs = {user: start(team, user, tmp_path) for user in PASSWORDS}
    files = {user: upload(team, user) for user in PASSWORDS}
    for job in jobs.values():
        wait_for(lambda job=job: phase(team, job) == "completed", timeout=30, what=f"{job} to complete")
    for user, job in jobs.items():
        sdk = OpenAI(base_url="http://127.0.0.1/v1", api_key=team.keys[user], http_client=team.client, max_retries=0)
        assert [j.id for j in sdk.fine_tuning.jobs.list()] == [job]
        assert sdk.fine_tuning.jobs.retrieve(job).id == job
        assert [f.id for f in sdk.files.list()] == [files[user]]
        other = next(name for name in PASSWORDS if name != user)
        from openai import NotFoundError

        with pytest.raises(NotFoundError):
            sdk.fine_tuning.jobs.retrieve(jobs[other])
        assert not {m.id for m in sdk.models.list()} & {jobs[other], files[other]}
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        OpenAI(base_url="http://127.0.0.1/v1", api_key="fts-nope", http_client=team.client, max_retries=0).models.list()


def test_no_key_or_password_in_clear_in_the_data_dir_or_the_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(REPO)
    (tmp_path / "in").mkdir()
    caplog.set_level(logging.DEBUG)
    with TestClient(make_app(tmp_path), base_url="http://127.0.0.1") as client:
        team = Team(client)
        job = start(team, "alice", tmp_path)
        wait_for(lambda: phase(team, job) == "completed", timeout=30, what="the job to complete")
        client.get("/train/jobs", headers=bearer("fts-" + "x" * 43))  # a wrong key is logged as a failure, never quoted
        short = client.post("/auth/users", json={"name": "carol", "password": "tiny7"}, headers=team.admin)
        assert short.status_code == 422 and "tiny7" not in short.text
        secrets = [TOKEN, *PASSWORDS.values(), *team.keys.values(), "x" * 43]
    with TestClient(make_app(tmp_path), base_url="http://127.0.0.1") as client:  # a restart
        assert client.get("/train/jobs", headers=bearer(team.keys["alice"])).json()["count"] == 1
    secret_file = tmp_path / "data" / "secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    stored = b"".join(path.read_bytes() for path in (tmp_path / "data").rglob("*") if path.is_file())
    logged = caplog.text.encode()
    for secret in secrets:
        assert secret.encode() not in stored and secret.encode() not in logged
