"""Webhooks end to end: real servers (the app under uvicorn; once a process of its own, SIGKILLed),
the stand-in training child, and a receiver on 127.0.0.1 that verifies every delivery with
Standard Webhooks' own library. And /metrics, parsed by prometheus_client's parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook

from finetune_studio.api.app import create_app
from finetune_studio.cli.local_server import free_port
from finetune_studio.cli.main import main as cli_main
from finetune_studio.config import Settings
from finetune_studio.supervisor.webhooks import signature
from tests.helpers.jobs import InstantLauncher, dataset, start_body
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.webhook_receiver import Receiver

pytestmark = pytest.mark.slow

ENDS = ["fine_tuning.job.succeeded", "fine_tuning.job.failed", "fine_tuning.job.cancelled"]
# Attempts 0.05 s apart, no jitter: a test never waits for the day-long default schedule.
QUICK: dict[str, Any] = {"webhook_retry_seconds": [0.05] * 6, "webhook_retry_jitter": 0}


def register(http: httpx.Client, url: str, events: list[str], **extra: Any) -> dict[str, Any]:
    answer = http.post("/webhooks", json={"url": url, "events": events, **extra})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def deliveries(http: httpx.Client, webhook_id: str) -> list[dict[str, Any]]:
    answer = http.get(f"/webhooks/{webhook_id}/deliveries", params={"limit": 100})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["data"])


def finished(http: httpx.Client, job_id: str) -> bool:
    return http.get(f"/train/status/{job_id}").json()["phase"] in ("completed", "error", "stopped")


def test_each_end_of_a_job_sends_one_openai_event(live_server: Any, tmp_path: Path) -> None:
    server = live_server(**QUICK)
    data = dataset(tmp_path)
    with Receiver() as receiver, httpx.Client(base_url=server.url, timeout=30) as http:
        hook = register(http, receiver.url, ENDS)
        assert hook["secret"].startswith("whsec_") and "secret" not in http.get("/webhooks").json()["data"][0]
        receiver.secret = hook["secret"]
        ok = http.post("/train/start", json=start_body(data)).json()["job_id"]
        crash = http.post("/train/start", json=start_body(data, project_name="crash")).json()["job_id"]
        wait_for(lambda: finished(http, ok) and finished(http, crash), what="two jobs to end")
        polite = http.post("/train/start", json=start_body(data, project_name="polite")).json()["job_id"]
        wait_for(lambda: http.get(f"/train/status/{polite}").json()["phase"] == "training", what="the polite job to train")
        assert http.post(f"/train/stop/{polite}").status_code == 200
        wait_for(lambda: finished(http, polite), what="the stop")
        wait_for(lambda: len([d for d in deliveries(http, hook["id"]) if d["state"] == "delivered"]) == 3,
                 what="three deliveries")

        assert all(r.error is None for r in receiver.received), [r.error for r in receiver.received]
        got = {payload["data"]["id"]: payload for payload in receiver.verified()}
        assert len(receiver.received) == 3 and set(got) == {ok, crash, polite}
        assert {job: got[job]["type"] for job in got} == {
            ok: "fine_tuning.job.succeeded", crash: "fine_tuning.job.failed", polite: "fine_tuning.job.cancelled"}
        for payload in got.values():  # OpenAI's event shape
            assert set(payload) == {"id", "object", "created_at", "type", "data"} and payload["object"] == "event"
            assert payload["data"] == {"id": payload["data"]["id"]} and payload["id"].startswith("evt_")
        ids = {r.headers["webhook-id"] for r in receiver.received}
        assert ids == {d["id"] for d in deliveries(http, hook["id"])}

        # The test event reaches the same receiver; an unknown event or a bad secret is refused by field.
        assert http.post(f"/webhooks/{hook['id']}/test").json()["event_type"] == "studio.webhook.test"
        wait_for(lambda: len(receiver.received) == 4, what="the test event")
        assert receiver.verified()[-1]["type"] == "studio.webhook.test"
        bad = http.post("/webhooks", json={"url": receiver.url, "events": ["fine_tuning.job.done"]})
        assert bad.status_code == 400 and bad.json()["field"] == "events[0]"
        bad = http.post("/webhooks", json={"url": receiver.url, "events": ENDS, "secret": "whsec_short"})
        assert bad.status_code == 400 and bad.json()["field"] == "secret"
        assert http.delete(f"/webhooks/{hook['id']}").json()["deleted"] is True
        assert http.get(f"/webhooks/{hook['id']}/deliveries").status_code == 404


def test_a_receiver_that_is_down_gets_the_deliveries_once_it_is_up(live_server: Any, tmp_path: Path) -> None:
    server = live_server(**QUICK)
    receiver = Receiver()  # not started yet: its port refuses connections
    with httpx.Client(base_url=server.url, timeout=30) as http:
        hook = register(http, receiver.url, ["fine_tuning.job.succeeded", "studio.job.phase"])
        receiver.secret = hook["secret"]
        job = http.post("/train/start", json=start_body(dataset(tmp_path))).json()["job_id"]
        wait_for(lambda: finished(http, job), what="the job")
        wait_for(lambda: all(len(d["attempts"]) >= 2 for d in deliveries(http, hook["id"])), what="failed attempts")
        with receiver:
            wait_for(lambda: all(d["state"] == "delivered" for d in deliveries(http, hook["id"])), what="the deliveries")
        sent = deliveries(http, hook["id"])
        # Every status of the job (idle, loading_model ... completed) and its OpenAI end, each received once.
        assert len(sent) == len(receiver.received) == 7
        assert sorted(r.headers["webhook-id"] for r in receiver.received) == sorted(d["id"] for d in sent)
        phases = [p["data"]["phase"] for p in receiver.verified() if p["type"] == "studio.job.phase"]
        assert sorted(phases) == sorted(["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"])
        for delivery in sent:
            first, last = delivery["attempts"][0], delivery["attempts"][-1]
            assert first["status_code"] is None and "ConnectError" in first["error"] and last["status_code"] == 200


def test_a_redirect_is_not_followed_and_a_target_that_keeps_failing_is_disabled(live_server: Any, tmp_path: Path) -> None:
    server = live_server(webhook_retry_seconds=[0.05, 0.05], webhook_retry_jitter=0)
    with Receiver() as elsewhere, Receiver() as receiver, httpx.Client(base_url=server.url, timeout=30) as http:
        receiver.mode, receiver.location = "redirect", elsewhere.url
        hook = register(http, receiver.url, ENDS)
        receiver.secret = elsewhere.secret = hook["secret"]
        job = http.post("/train/start", json=start_body(dataset(tmp_path))).json()["job_id"]
        wait_for(lambda: finished(http, job), what="the job")
        wait_for(lambda: http.get("/webhooks").json()["data"][0]["disabled"], what="the webhook to be disabled")
        (delivery,) = deliveries(http, hook["id"])
        assert delivery["state"] == "failed" and [a["status_code"] for a in delivery["attempts"]] == [302, 302, 302]
        assert "not followed" in delivery["attempts"][0]["error"]
        assert elsewhere.received == [] and len(receiver.received) == 3
        reason = http.get("/webhooks").json()["data"][0]["disabled_reason"]
        assert delivery["id"] in reason and "3 attempts" in reason


def test_an_exposed_server_refuses_loopback_targets_it_does_not_allow(tmp_path: Path) -> None:
    token = "exposed-token-0123456789"
    settings = Settings(data_dir=tmp_path / "data", host="0.0.0.0", token=token,  # noqa: S104 (exposed, never bound: TestClient)
                        webhook_allowed_hosts=["localhost"], **QUICK)
    headers = {"Authorization": f"Bearer {token}"}
    with Receiver() as receiver, TestClient(create_app(settings, InstantLauncher()), base_url="http://127.0.0.1") as client:
        refused = client.post("/webhooks", headers=headers, json={"url": receiver.url, "events": ENDS})
        assert refused.status_code == 403 and refused.json()["field"] == "url"
        assert "FINETUNE_STUDIO_WEBHOOK_ALLOWED_HOSTS" in refused.json()["detail"]
        # A listed name is taken, but it resolves to loopback, which is not listed: nothing is sent.
        url = receiver.url.replace("127.0.0.1", "localhost")
        hook = client.post("/webhooks", headers=headers, json={"url": url, "events": ENDS}).json()
        client.post(f"/webhooks/{hook['id']}/test", headers=headers)
        wait_for(lambda: client.get(f"/webhooks/{hook['id']}/deliveries", headers=headers).json()["data"][0]["state"] == "failed",
                 what="the refused delivery")
        (delivery,) = client.get(f"/webhooks/{hook['id']}/deliveries", headers=headers).json()["data"]
        assert all("refused" in a["error"] and "resolves to" in a["error"] for a in delivery["attempts"])
        assert receiver.received == []
        assert client.get("/metrics").status_code == 401  # behind the token like every route


def test_a_delivery_cut_short_by_sigkill_arrives_once_after_the_restart(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "FINETUNE_STUDIO_DATA_DIR": str(tmp_path / "data"), "FINETUNE_STUDIO_WEBHOOK_TIMEOUT_SECONDS": "600",
           "FINETUNE_STUDIO_WEBHOOK_RETRY_SECONDS": "0.05,0.05", "FINETUNE_STUDIO_WEBHOOK_RETRY_JITTER": "0"}

    def serve() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-m", "tests.helpers.stand_in_server", str(port)], cwd=REPO, env=env)
        wait_for(lambda: _answers(port), what="the server to start")
        return process

    with Receiver() as receiver, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        server = serve()
        try:
            hook = register(http, receiver.url, ["fine_tuning.job.succeeded"])
            receiver.secret, receiver.mode = hook["secret"], "hang"
            job = http.post("/train/start", json=start_body(dataset(tmp_path))).json()["job_id"]
            wait_for(lambda: len(receiver.received) == 1, what="the delivery to be in flight")
            first_id = receiver.received[0].headers["webhook-id"]
            server.send_signal(signal.SIGKILL)  # the delivery was sent, its answer never recorded
            server.wait()
        finally:
            server.kill()
            server.wait()
        receiver.mode = "ok"
        server = serve()
        try:
            wait_for(lambda: deliveries(http, hook["id"])[0]["state"] == "delivered", what="the delivery after the restart")
            assert [r.headers["webhook-id"] for r in receiver.received] == [first_id, first_id]
            assert receiver.received[1].payload is not None and receiver.received[1].payload["data"] == {"id": job}
            assert http.get(f"/train/status/{job}").json()["phase"] == "completed"
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait()
    assert len(receiver.received) == 2  # the one cut short, and the one that arrived: no other


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_metrics_agree_with_the_api(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.3")  # the first job still runs when its stream opens
    token = "metrics-token-0123456789"
    server = live_server(token=token, **QUICK)
    headers = {"Authorization": f"Bearer {token}"}
    data = dataset(tmp_path)
    with Receiver() as receiver, httpx.Client(base_url=server.url, timeout=30, headers=headers) as http:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        hook = register(http, receiver.url, ENDS)
        receiver.secret = hook["secret"]
        jobs = [http.post("/train/start", json=start_body(data, **extra)).json()["job_id"]
                for extra in ({}, {}, {"project_name": "crash"})]
        # Follow one job's stream live: its events' write-to-client latency is observed.
        with http.stream("GET", f"/train/stream/{jobs[0]}") as stream:
            for _ in stream.iter_lines():
                pass
        wait_for(lambda: all(finished(http, job) for job in jobs), what="the jobs")
        wait_for(lambda: all(d["state"] == "delivered" for d in deliveries(http, hook["id"])) and len(receiver.received) == 3,
                 what="the deliveries")
        answer = http.get("/metrics")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        values = metric_values(answer.text)

        listed = http.get("/train/jobs").json()["data"]
        for phase in ("completed", "error", "idle", "training"):
            expected = sum(1 for status in listed if status["phase"] == phase)
            assert values[("finetune_studio_jobs", (("kind", "train"), ("phase", phase)))] == expected
        assert values[("finetune_studio_queue_depth", (("slot", "training"),))] == 0
        assert values[("finetune_studio_slots", (("slot", "training"),))] == 1
        assert values[("finetune_studio_webhook_attempts_total", (("result", "delivered"),))] == 3
        assert values[("finetune_studio_webhook_deliveries", (("state", "delivered"),))] == 3
        assert values[("finetune_studio_open_streams", ())] == 0
        assert values[("finetune_studio_event_latency_seconds_count", ())] >= 1
        assert values[("finetune_studio_chat_requests_total", (("stream", "false"),))] == 0


def test_the_cli_adds_lists_and_removes_webhooks(live_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = live_server()
    url = "http://127.0.0.1:9/hooks"
    assert cli_main(["webhooks", "add", url, "--events", "fine_tuning.job.succeeded,studio.job.phase",
                     "--server", server.url]) == 0
    added = capsys.readouterr().out
    assert "secret: whsec_" in added
    assert cli_main(["webhooks", "list", "--server", server.url, "--output-json"]) == 0
    import json

    (hook,) = json.loads(capsys.readouterr().out)
    assert hook["url"] == url and hook["events"] == ["fine_tuning.job.succeeded", "studio.job.phase"]
    assert cli_main(["webhooks", "add", url, "--events", "nope", "--server", server.url]) == 2
    assert "events[0]" in capsys.readouterr().err
    assert cli_main(["webhooks", "remove", hook["id"], "--server", server.url]) == 0
    assert cli_main(["webhooks", "list", "--server", server.url]) == 0
    assert "no webhooks" in capsys.readouterr().out


def test_the_signature_is_standard_webhooks() -> None:
    from finetune_studio.jobs.webhooks import new_secret

    secret = new_secret()
    body = b'{"id":"evt_1","type":"fine_tuning.job.succeeded"}'
    import time

    now = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now), "webhook-signature": signature(secret, "msg_1", now, body)}
    assert Webhook(secret).verify(body, headers)["id"] == "evt_1"
