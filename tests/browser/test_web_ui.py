"""The web UI in a real Chromium against a real server training the tiny model.

What the page exposes for these tests: `data-testid` attributes on what a person
sees, and `window.__studio`, a read-only hook (chart points, the feed's last event
id, the stream connections it made). Every wait is bounded by a timeout.
"""

from __future__ import annotations

import re
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.browser import SECOND, expect, open_ui, show_stored_job, status_event, wait_js
from tests.helpers.jobs import collect, job_request
from tests.helpers.paths import DEMO_DATA, REPO
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "test-artifacts"

READ_IDB = """async (jobId) => {
  const open = indexedDB.open("finetune-studio");
  const db = await new Promise((resolve, reject) => { open.onsuccess = () => resolve(open.result); open.onerror = () => reject(open.error); });
  const range = IDBKeyRange.bound([jobId, -Infinity], [jobId, Infinity]);
  const get = db.transaction("events", "readonly").objectStore("events").getAll(range);
  const rows = await new Promise((resolve, reject) => { get.onsuccess = () => resolve(get.result); get.onerror = () => reject(get.error); });
  db.close();
  return rows.map((row) => ({ job_id: row.job_id, id: row.id, kind: row.kind, data: row.data }));
}"""

# Each timeline node: its phase, the seconds it took (data-seconds) and the words shown.
TIMELINE = """() => [...document.querySelectorAll("[data-testid=phase-timeline] li")].map((li) => ({
  phase: li.dataset.phase, seconds: li.dataset.seconds ?? null, took: li.querySelector("[data-testid=phase-took]").textContent }))"""

# Where the job view's parts sit on the page, to check that streaming moves nothing.
LAYOUT = """() => Object.fromEntries(
  ["job-view", "phase-timeline", "progress-bar", "stats", "chart-loss", "chart-lr", "chart-grad", "stream-state"]
    .map((id) => { const r = document.querySelector(`[data-testid=${id}]`).getBoundingClientRect();
                   return [id, [r.x, r.y, r.width, r.height]]; }))"""


def studio(page: Any, expression: str) -> Any:
    return page.evaluate(f"window.__studio.{expression}")


def tiny_run(tiny_model: Path, **fields: Any) -> dict[str, Any]:
    """The form's fields for a short LoRA run of the tiny model on the demo data, with `fields` over them."""
    return {"model_name": tiny_model, "local_datasets": [str(DEMO_DATA)], "format_type": "alpaca", "learning_rate": "1e-3",
            "batch_size": 2, "lora_r": 4, "lora_alpha": 8, "max_seq_length": 128, **fields}


def fill_form(page: Any, **fields: Any) -> None:
    for name, value in fields.items():
        locator = page.get_by_test_id(f"field-{name}")
        if locator.evaluate("el => el.tagName") == "SELECT":
            locator.select_option(str(value))
        else:
            locator.fill("\n".join(value) if isinstance(value, list) else str(value))


def stored_events(page: Any, job_id: str) -> list[dict[str, Any]]:
    page.evaluate("window.__studio.flushed()")
    return page.evaluate(READ_IDB, job_id)  # type: ignore[no-any-return]


def assert_history_matches_server(page: Any, server: Any, job_id: str) -> list[dict[str, Any]]:
    """IndexedDB holds every event of the job exactly once, equal to the server's."""
    rows = stored_events(page, job_id)
    ids = [row["id"] for row in rows]
    with server.client() as client:
        expected = collect(client, job_id)
    assert len(ids) == len(set(ids)), "an event is stored twice"
    assert ids == [event.id for event in expected], "IndexedDB misses events or holds extra ones"
    for row, event in zip(rows, expected, strict=True):
        assert (row["kind"], row["data"]) == (event.kind, event.data)
    return rows


def timeline(page: Any) -> dict[str, dict[str, Any]]:
    return {node["phase"]: node for node in page.evaluate(TIMELINE)}


def assert_timeline_durations_match_server(page: Any, server: Any, job_id: str) -> None:
    """Each phase shows the time from its first status event to the next phase's, by their
    `details.time` (a phase may be said again with new words: training's compile decision)."""
    with server.client() as client:
        statuses = [e.data for e in collect(client, job_id) if e.kind == "status"]
    firsts: list[tuple[str, float]] = []
    for status in statuses:
        if not firsts or firsts[-1][0] != status["phase"]:
            firsts.append((status["phase"], status["details"]["time"]))
    expected = {phase: end - start for (phase, start), (_, end) in pairwise(firsts)}
    nodes = timeline(page)
    for phase, seconds in expected.items():
        assert nodes[phase]["seconds"] is not None, f"the timeline shows no duration for {phase}"
        assert float(nodes[phase]["seconds"]) == pytest.approx(seconds, abs=1e-6), phase
        assert nodes[phase]["took"], phase
    assert nodes["end"]["took"] == "" and nodes["end"]["seconds"] is None


def test_form_defaults_come_from_the_request_model(server: Any, page: Any) -> None:
    open_ui(page, server.url)
    schema = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]["TrainingStartRequest"][
        "properties"
    ]
    for name in ("num_epochs", "batch_size", "lora_r", "lora_alpha", "max_seq_length"):
        assert page.get_by_test_id(f"field-{name}").input_value() == str(schema[name]["default"]), name
    assert float(page.get_by_test_id("field-learning_rate").input_value()) == schema["learning_rate"]["default"]
    assert page.get_by_test_id("field-max_steps").input_value() == ""
    formats = page.get_by_test_id("field-format_type").locator("option").all_inner_texts()
    assert formats == schema["format_type"]["enum"]
    training = page.get_by_test_id("field-training_type").locator("option").all_inner_texts()
    assert training == schema["training_type"]["enum"]


@pytest.mark.train
def test_start_from_the_form_and_watch_it_complete(server: Any, page: Any, tiny_model: Path) -> None:
    open_ui(page, server.url)
    fill_form(page, **tiny_run(tiny_model, max_steps=12, project_name="form-run"))
    page.get_by_test_id("field-max_seq_length").press("Enter")  # the keyboard submits

    wait_js(page, "window.__studio.phase() === 'completed'")
    job_id = studio(page, "jobId()")
    # The state is drawn on a later animation frame: read what is shown through expect.
    expect(page.get_by_test_id("job-phase")).to_have_text("Completed", use_inner_text=True)
    assert studio(page, "steps()") == list(range(1, 13))
    assert studio(page, "points('loss')") == 12
    assert studio(page, "points('lr')") == 12
    expect(page.get_by_test_id("stat-step")).to_have_text("12 / 12", use_inner_text=True)
    expect(page.get_by_test_id("stat-tps")).to_have_text(re.compile(r"^[1-9][\d,]*$"), use_inner_text=True)  # the server's tokens/s
    expect(page.get_by_test_id("stat-mfu")).to_have_text(re.compile(r"^\d+(\.\d+)?%$"), use_inner_text=True)  # and its MFU beside it
    expect(page.locator("[data-testid=phase-timeline] li[data-state=done]")).to_have_count(6)
    assert_timeline_durations_match_server(page, server, job_id)
    expect(page.get_by_test_id("job-outputs")).to_contain_text("adapter", use_inner_text=True)
    item = page.locator(f"[data-testid=job-item][data-job-id='{job_id}']")
    page.wait_for_selector(f"[data-testid=job-item][data-job-id='{job_id}'][data-phase=completed]", timeout=10 * SECOND)
    expect(item).to_contain_text("form-run", use_inner_text=True)
    # The list draws the run's loss from the server's summary: one point per step (12 <= 64).
    spark = item.locator("[data-testid=job-sparkline] polyline")
    spark.wait_for(state="attached", timeout=10 * SECOND)
    assert len(spark.get_attribute("points").split()) == 12

    with server.client() as client:
        status = client.status(job_id)
        assert status["phase"] == "completed"
        assert client.progress(job_id)["total_steps"] == 12  # the form's max_steps reached the server
    assert_history_matches_server(page, server, job_id)


@pytest.mark.train
def test_reload_mid_training_keeps_history_and_resumes_without_gap(server: Any, page: Any, tiny_model: Path) -> None:
    total = 200
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=total))
    open_ui(page, server.url, job_id)
    wait_js(page, "window.__studio.points('loss') >= 20")
    before = page.evaluate(
        """async () => {
            const s = window.__studio;
            const seen = { steps: s.steps(), lastEventId: s.lastEventId(), phase: s.phase() };
            await s.flushed();
            return seen;
        }"""
    )
    assert before["phase"] == "training"
    assert len(before["steps"]) < total, "the job finished before the reload: it cannot test a resume"

    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    wait_js(page, "window.__studio.historyCount() !== null", 20)
    # Drawn from IndexedDB at once: every point seen before the reload is back.
    assert studio(page, "historyPoints()") >= len(before["steps"])
    assert studio(page, "historyCount()") >= before["lastEventId"]
    assert set(before["steps"]) <= set(studio(page, "steps()"))
    # The stream resumed right after the last stored event.
    wait_js(page, "window.__studio.connections.length > 0", 20)
    first = studio(page, "connections[0]")
    assert first["job_id"] == job_id
    assert first["last_event_id"] == studio(page, "historyCount()") > 0

    page.mouse.move(0, 0)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "job-view-training.png"), full_page=True)

    # Nothing moves while steps stream in.
    layout_before = page.evaluate(LAYOUT)
    drawn = studio(page, "points('loss')")
    wait_js(page, f"window.__studio.points('loss') >= {min(drawn + 10, total)}")
    if studio(page, "phase()") == "training":
        assert page.evaluate(LAYOUT) == layout_before

    wait_js(page, "window.__studio.phase() === 'completed'")
    assert studio(page, "steps()") == list(range(1, total + 1))
    assert studio(page, "points('loss')") == total
    rows = assert_history_matches_server(page, server, job_id)
    assert sum(1 for row in rows if row["kind"] == "progress") == total


@pytest.mark.train
def test_refused_start_shows_the_servers_error(server: Any, page: Any, tiny_model: Path) -> None:
    open_ui(page, server.url)
    missing = "/nonexistent/finetune-studio/train.jsonl"
    fill_form(page, model_name=tiny_model, local_datasets=[missing], format_type="alpaca", max_steps=4)
    page.get_by_test_id("start-button").click()
    error = page.get_by_test_id("start-error")
    error.wait_for(state="visible", timeout=10 * SECOND)
    refused = httpx.post(f"{server.url}/train/start", json=job_request(tiny_model, local_datasets=[missing]))
    assert refused.status_code == 400 and refused.json()["field"] == "local_datasets"
    # Beside its field, in the form's words (its label, not the API's name); the summary names the field.
    at_field = page.get_by_test_id("error-local_datasets")
    expect(at_field).to_contain_text(missing, use_inner_text=True)
    expect(at_field).to_contain_text("Dataset files", use_inner_text=True)
    expect(at_field).not_to_contain_text("local_datasets", use_inner_text=True)
    expect(error).to_contain_text("refused to start", use_inner_text=True)
    expect(error).to_contain_text("Dataset files", use_inner_text=True)

    # A schema error (422): at the field its `loc` names, marked.
    fill_form(page, local_datasets=[str(DEMO_DATA)], batch_size=0)
    page.get_by_test_id("start-button").click()
    page.get_by_test_id("error-batch_size").wait_for(state="visible", timeout=10 * SECOND)
    expect(page.get_by_test_id("error-batch_size")).to_have_text(
        re.compile(r"Input should be greater than or equal to 1$"), use_inner_text=True
    )
    expect(error).to_contain_text("Batch size", use_inner_text=True)
    expect(page.get_by_test_id("field-batch_size")).to_have_attribute("aria-invalid", "true")

    fill_form(page, batch_size=1, num_epochs=0, max_steps="")
    page.get_by_test_id("start-button").click()
    page.wait_for_function(
        "document.querySelector('[data-testid=start-error]').innerText.includes('both 0')", timeout=10 * SECOND
    )
    with server.client() as client:
        assert client.jobs() == [], "a refused start created a job"


@pytest.mark.train
def test_stop_ends_a_running_job_stopped_and_a_queued_one_too(server: Any, page: Any, tiny_model: Path) -> None:
    with server.client() as client:
        running = client.start(job_request(tiny_model, max_steps=5000))
        queued = client.start(job_request(tiny_model, max_steps=5000))
    open_ui(page, server.url, running)
    wait_js(page, "window.__studio.points('loss') >= 3")
    position = page.locator(f"[data-testid=job-item][data-job-id='{queued}'] [data-testid=queue-position]")
    position.wait_for(timeout=10 * SECOND)
    expect(position).to_have_text("#1 in queue", use_inner_text=True)

    stop = page.get_by_test_id("stop-button")
    expect(stop).to_be_enabled()
    stop.click()
    wait_js(page, "window.__studio.phase() === 'stopped'", 120)
    expect(page.get_by_test_id("job-phase")).to_have_text("Stopped", use_inner_text=True)
    expect(stop).to_be_disabled()
    expect(page.locator("[data-testid=phase-timeline] li[data-phase=end]")).to_have_attribute("data-state", "stopped")
    with server.client() as client:
        assert client.status(running)["phase"] == "stopped"

    # The next job starts by itself; stop it from its own view.
    page.locator(f"[data-testid=job-item][data-job-id='{queued}']").click()
    wait_js(page, f"window.__studio.jobId() === '{queued}' && window.__studio.phase() !== null", 20)
    page.get_by_test_id("stop-button").click()
    wait_js(page, "window.__studio.phase() === 'stopped'", 120)
    with server.client() as client:
        assert client.status(queued)["phase"] == "stopped"
    assert_history_matches_server(page, server, queued)


@pytest.mark.train
def test_token_protected_server_works_once_the_token_is_entered(start_server: Any, page: Any, tiny_model: Path) -> None:
    token = "browser-test-token-7f3a"
    server = start_server(env={"FINETUNE_STUDIO_TOKEN": token})
    assert httpx.get(f"{server.url}/train/jobs").status_code == 401
    open_ui(page, server.url)
    dialog = page.get_by_test_id("settings-dialog")
    dialog.wait_for(state="visible", timeout=10 * SECOND)  # a 401 asks for the token
    expect(page.get_by_test_id("settings-note")).to_contain_text("FINETUNE_STUDIO_TOKEN", use_inner_text=True)
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-input").press("Enter")
    dialog.wait_for(state="hidden", timeout=5 * SECOND)
    page.wait_for_selector("[data-testid=server-state][data-state=ok]", timeout=10 * SECOND)
    expect(page.get_by_test_id("token-state")).to_have_text("token set", use_inner_text=True)

    fill_form(page, **tiny_run(tiny_model, max_steps=6))
    page.get_by_test_id("start-button").click()
    wait_js(page, "window.__studio.phase() === 'completed'")
    assert studio(page, "points('loss')") == 6
    job_id = studio(page, "jobId()")
    assert page.evaluate("localStorage.getItem('finetune-studio.token')") == token

    # After a reload the stored token is used at once: no prompt, history intact.
    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    page.wait_for_selector("[data-testid=server-state][data-state=ok]", timeout=10 * SECOND)
    expect(dialog).to_be_hidden()
    assert studio(page, "jobId()") == job_id
    rows = stored_events(page, job_id)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http:
        assert http.get(f"/train/status/{job_id}").json()["phase"] == "completed"
    assert [row["id"] for row in rows] == list(range(1, len(rows) + 1))


@pytest.mark.train
def test_reconnects_after_the_server_restarts(server: Any, page: Any, tiny_model: Path) -> None:
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=5000))
    open_ui(page, server.url, job_id)
    wait_js(page, "window.__studio.points('loss') >= 5")
    server.kill()  # no goodbye: the stream just breaks
    wait_js(page, "window.__studio.connection() === 'reconnecting'", 20)
    server.start()  # same port, same data directory
    wait_js(page, "window.__studio.phase() === 'error'", 120)
    assert studio(page, "connections.length") >= 2
    assert studio(page, "connections")[-1]["last_event_id"] > 0
    expect(page.get_by_test_id("error-code")).to_have_text("server_restarted", use_inner_text=True)
    expect(page.get_by_test_id("job-error")).to_contain_text("server", ignore_case=True, use_inner_text=True)
    assert_history_matches_server(page, server, job_id)


@pytest.mark.train
def test_compare_two_runs_and_save_a_screenshot(server: Any, page: Any, tiny_model: Path) -> None:
    with server.client() as client:
        first = client.start(job_request(tiny_model, max_steps=30, learning_rate="2e-3", project_name="lr 2e-3"))
        second = client.start(job_request(tiny_model, max_steps=30, learning_rate="5e-4", project_name="lr 5e-4"))
        wait_for(lambda: client.status(second)["phase"] == "completed", timeout=300, what="both jobs to complete")
    open_ui(page, server.url, second)
    wait_js(page, "window.__studio.points('loss') === 30", 30)
    page.get_by_test_id("compare-select").select_option(first)
    wait_js(page, f"window.__studio.compareId() === '{first}' && window.__studio.comparePoints() === 30", 30)
    assert studio(page, "points('loss', 1)") == 30  # the overlaid run's loss, on the same chart
    assert f"compare={first}" in page.url
    expect(page.get_by_test_id("chart-loss")).to_contain_text("lr 2e-3", use_inner_text=True)  # the legend

    # Reload: both runs come back from IndexedDB and the comparison is kept.
    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    wait_js(page, "window.__studio.points('loss') === 30 && window.__studio.comparePoints() === 30", 30)
    assert studio(page, "connections.length") == 0, "finished runs in IndexedDB need no stream"

    page.mouse.move(0, 0)
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "job-view.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


def test_timeline_shows_how_long_each_phase_took(server: Any, page: Any) -> None:
    """Durations from `details.time`; none for events from before it; the running phase ticks."""
    open_ui(page, server.url)
    stamped = "5a0000000001"
    times = {
        "idle": 1000.0,
        "loading_model": 1002.5,
        "loading_dataset": 1010.0,
        "configuring": 1010.5,
        "training": 1011.0,
        "completed": 1196.0,
    }
    show_stored_job(
        page, stamped, [status_event(stamped, i, phase, t) for i, (phase, t) in enumerate(times.items(), 1)]
    )
    shown = {phase: node["took"] for phase, node in timeline(page).items()}
    assert shown == {
        "idle": "2.5 s",
        "loading_model": "7.5 s",
        "loading_dataset": "0.5 s",
        "configuring": "0.5 s",
        "training": "3:05",
        "end": "",
    }

    old = "5a0000000002"  # stored before the server stamped its status events
    show_stored_job(page, old, [status_event(old, i, phase, None) for i, phase in enumerate(times, 1)])
    expect(page.get_by_test_id("job-phase")).to_have_text("Completed", use_inner_text=True)
    assert all(node["took"] == "" and node["seconds"] is None for node in timeline(page).values())

    running = "5a0000000003"  # unknown to this server: its stream answers 404 and the view keeps what it has
    now = time.time()
    started = {
        "idle": now - 200,
        "loading_model": now - 190,
        "loading_dataset": now - 180,
        "configuring": now - 179,
        "training": now - 65,
    }
    show_stored_job(
        page, running, [status_event(running, i, phase, t) for i, (phase, t) in enumerate(started.items(), 1)]
    )
    nodes = timeline(page)
    assert nodes["loading_model"]["took"] == "10 s"
    first = nodes["training"]["took"]
    assert re.fullmatch(r"1:0\d", first), first
    wait_js(
        page, f"document.querySelector('[data-phase=training] [data-testid=phase-took]').textContent !== '{first}'", 10
    )
    assert nodes["end"]["took"] == ""


def test_event_stream_parser_follows_the_standard(server: Any, page: Any) -> None:
    """Chunks split anywhere (even inside CRLF), comments, multi-line data, ids that carry over."""
    open_ui(page, server.url)
    parsed = page.evaluate(
        r"""async () => {
            const { eventParser } = await import("./sse.js");
            const stream = ": keep-alive\r\n\r\nid: 1\r\nevent: status\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
              + "data:no-space\rid:2\r\r" + "event: progress\ndata: x\nid: 3\n\n" + "data: no-id\n\n"
              + "data: tail-without-blank-line";
            const runs = [];
            for (const size of [1, 2, 3, 7, stream.length]) {
                const events = [];
                let comments = 0;
                const parser = eventParser((e) => events.push(e), { onComment: () => { comments += 1; } });
                for (let i = 0; i < stream.length; i += size) parser.feed(stream.slice(i, i + size));
                runs.push({ events, comments });
            }
            return runs;
        }"""
    )
    expected = [
        {"id": "1", "event": "status", "data": '{"a":\n1}'},
        {"id": "2", "event": "message", "data": "no-space"},
        {"id": "3", "event": "progress", "data": "x"},
        {"id": "3", "event": "message", "data": "no-id"},  # the last id named, as EventSource keeps it
    ]
    for run in parsed:
        assert run == {"events": expected, "comments": 1}
