"""The page in a real Chromium at a laptop's 1280x800 and a phone's 390x844
(issue 19): it never scrolls sideways in any state, mistakes show at their
fields before anything is queued, a wrong token is refused in words, runs can be
run again, resumed, renamed and deleted, and a file uploaded through the page
trains.

Most tests run the real server in this process with a scripted worker (no
training; tests/helpers/page_studio.py): each job's `project_name` says what it
does (`completed`, `failed`, `stopped`, `held`: it waits in loading_model until the
test lets it go, then trains until stopped), with the long messages and paths real
runs have. The upload test trains the tiny model for real. Screenshots of every
state are kept under test-artifacts/screens/.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.config import Settings
from tests.helpers.browser import LAPTOP, PHONE, SECOND, assert_fits, expect, open_page, show_job
from tests.helpers.page_studio import ScriptedLauncher, Studio, settle
from tests.helpers.paths import DEMO_DATA, REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser

TOKEN = "page-test-token-5b1e"


@pytest.fixture
def studio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Studio]:
    monkeypatch.chdir(REPO)
    launcher = ScriptedLauncher()
    with LiveServer(Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1), launcher) as server:
        with contextlib.closing(Studio(server, launcher, tmp_path, None)) as studio:
            yield studio
            launcher.held.set()
            settle(server)


@pytest.fixture
def page_at(browser: Any) -> Iterator[Any]:
    """page_at(viewport) -> a fresh page of that size; uncaught page errors fail the test."""
    contexts: list[Any] = []
    errors: list[str] = []

    def make(viewport: dict[str, int]) -> Any:
        context = browser.new_context(viewport=viewport)
        context.set_default_timeout(20 * SECOND)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_nothing_scrolls_sideways_in_any_state(studio: Studio, page_at: Any, viewport: dict[str, int]) -> None:
    page = page_at(viewport)
    open_page(page, studio.url)
    assert_fits(page, "empty")

    ended = {script: studio.start(script) for script in ("completed", "failed", "stopped")}
    for script, job_id in ended.items():
        studio.wait_phase(job_id, script if script != "failed" else "error")
    held = studio.start("held")
    studio.wait_phase(held, "loading_model")
    queued = studio.start("completed queued behind the held run")

    show_job(page, held, "loading_model")
    assert "Loading model" in page.locator("#job-message").inner_text()
    assert_fits(page, "loading")
    show_job(page, queued, "idle")
    assert_fits(page, "queued")

    studio.launcher.held.set()
    show_job(page, held, "training")
    page.wait_for_function("window.__studio.points('loss') >= 30", timeout=20 * SECOND)
    assert_fits(page, "training")

    for state, phase in (("completed", "completed"), ("failed", "error"), ("stopped", "stopped")):
        show_job(page, ended[state], phase)
        assert_fits(page, state)
    # The phases in words for screen readers: the failed phase says so.
    assert page.locator("[data-testid=phase-timeline] li[data-phase=end] [data-testid=phase-state]").inner_text() == ": stopped here"

    studio.http.post(f"/train/stop/{held}")
    studio.wait_phase(queued, "completed")


def test_the_list_of_runs_grows_and_is_searched_and_filtered(studio: Studio, page_at: Any) -> None:
    ids = [studio.start("completed" if number % 3 else "failed", project_name=f"{'completed' if number % 3 else 'failed'} run-{number}")
           for number in range(12)]
    for job_id in ids:
        studio.wait_phase(job_id, "completed", "error")
    page = page_at(LAPTOP)
    open_page(page, studio.url)
    items = page.locator("[data-testid=job-item]")
    page.wait_for_function("document.querySelectorAll('[data-testid=job-item]').length === 12", timeout=10 * SECOND)
    # Every run is in view of the page's scroll: the list has no box of its own to scroll.
    assert page.evaluate("getComputedStyle(document.querySelector('[data-testid=job-list]')).overflowY") == "visible"

    page.get_by_test_id("job-search").fill("run-7")
    page.wait_for_function("document.querySelectorAll('[data-testid=job-item]').length === 1", timeout=5 * SECOND)
    assert "run-7" in items.first.inner_text()
    page.get_by_test_id("job-search").fill("")
    page.get_by_test_id("job-filter").select_option("error")
    page.wait_for_function("document.querySelectorAll('[data-testid=job-item]').length === 4", timeout=5 * SECOND)
    assert set(items.evaluate_all("els => els.map((el) => el.dataset.phase)")) == {"error"}
    expect(page.get_by_test_id("jobs-count")).to_have_text("4 of 12", use_inner_text=True)


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_mistakes_show_at_their_fields_and_nothing_is_queued(studio: Studio, page_at: Any, viewport: dict[str, int]) -> None:
    page = page_at(viewport)
    open_page(page, studio.url)
    field = page.get_by_test_id
    field("field-format_type").select_option("alpaca")

    # Letters in a number field: refused as they are typed, beside the field.
    field("field-max_steps").fill("abc")
    error = field("error-max_steps")
    error.wait_for(state="visible", timeout=5 * SECOND)
    expect(error).to_contain_text("whole number", use_inner_text=True)
    expect(error).to_contain_text("abc", use_inner_text=True)
    expect(field("field-max_steps")).to_have_attribute("aria-invalid", "true")
    field("field-model_name").fill(str(studio.model))
    field("field-local_datasets").fill(str(studio.data))
    field("start-button").click()
    expect(field("field-max_steps")).to_be_focused()
    expect(field("start-error")).to_contain_text("Max steps", use_inner_text=True)
    field("field-max_steps").fill("4")
    expect(error).to_be_hidden()

    # A model path that does not exist: the server's 400 names the field; shown there in its words.
    missing = studio.model.parent / "no-such-model"
    field("field-model_name").fill(str(missing))
    field("start-button").click()
    model_error = field("error-model_name")
    model_error.wait_for(state="visible", timeout=10 * SECOND)
    expect(model_error).to_contain_text(str(missing), use_inner_text=True)
    expect(model_error).to_contain_text("does not exist", use_inner_text=True)
    expect(model_error).not_to_contain_text("model_name", use_inner_text=True)
    expect(field("field-model_name")).to_have_attribute("aria-invalid", "true")
    assert_fits(page, "form-errors")

    # A dataset file that does not exist: at the dataset field.
    field("field-model_name").fill(str(studio.model))
    field("field-local_datasets").fill(str(studio.data.parent / "nope.jsonl"))
    field("start-button").click()
    data_error = field("error-local_datasets")
    data_error.wait_for(state="visible", timeout=10 * SECOND)
    expect(data_error).to_contain_text("nope.jsonl", use_inner_text=True)
    expect(data_error).to_contain_text("Dataset files", use_inner_text=True)
    expect(model_error).to_be_hidden()

    # A schema error (422) lands at its field too.
    field("field-local_datasets").fill(str(studio.data))
    field("field-batch_size").fill("0")
    field("start-button").click()
    batch_error = field("error-batch_size")
    batch_error.wait_for(state="visible", timeout=10 * SECOND)
    expect(batch_error).to_contain_text("greater than or equal to 1", use_inner_text=True)
    assert studio.http.get("/train/jobs").json()["count"] == 0, "a refused start queued a job"

    # Fixed: it starts, and on a phone the run's live view comes into sight.
    field("field-batch_size").fill("2")
    field("field-project_name").fill("completed from the form")
    field("start-button").click()
    page.wait_for_function("window.__studio.phase() === 'completed'", timeout=30 * SECOND)
    box = page.get_by_test_id("job-view").bounding_box()
    assert box is not None and box["y"] < viewport["height"] / 2, f"the run's view is not in sight: {box}"
    sent = studio.detail(page.evaluate("window.__studio.jobId()"))["request"]
    # The defaults fit this machine (no CUDA here): nothing it cannot do is asked.
    system = studio.http.get("/system").json()
    assert sent["load_in_4bit"] == system["recommended"]["load_in_4bit"]
    assert sent["optim"] == system["recommended"]["optim"]
    assert "warnings" not in (studio.http.get("/train/jobs").json()["data"][0]["details"] or {})


def test_a_wrong_token_is_refused_in_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page_at: Any) -> None:
    monkeypatch.chdir(REPO)
    launcher = ScriptedLauncher()
    settings = Settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings, launcher) as server, contextlib.closing(Studio(server, launcher, tmp_path, TOKEN)) as studio:
        job_id = studio.start("completed")
        studio.wait_phase(job_id, "completed")
        page = page_at(PHONE)
        open_page(page, server.url)
        dialog = page.get_by_test_id("settings-dialog")
        dialog.wait_for(state="visible", timeout=10 * SECOND)

        page.get_by_test_id("token-input").fill("not-the-token")
        page.get_by_test_id("token-input").press("Enter")
        problem = page.get_by_test_id("settings-error")
        problem.wait_for(state="visible", timeout=10 * SECOND)
        expect(problem).to_contain_text("refused this token", use_inner_text=True)
        expect(dialog, "a refused token closed the dialog").to_be_visible()
        expect(page.get_by_test_id("token-state")).to_have_text("token rejected", use_inner_text=True)
        assert_fits(page, "token-rejected")

        page.locator("#settings-cancel").click()
        dialog.wait_for(state="hidden", timeout=5 * SECOND)
        empty = page.get_by_test_id("jobs-empty")
        expect(empty).to_contain_text("API token", use_inner_text=True)
        expect(empty).not_to_contain_text("No runs yet", use_inner_text=True)

        page.get_by_test_id("settings-button").click()
        page.get_by_test_id("token-input").fill(TOKEN)
        page.get_by_test_id("token-input").press("Enter")
        dialog.wait_for(state="hidden", timeout=10 * SECOND)
        page.wait_for_selector(f"[data-testid=job-item][data-job-id='{job_id}']", timeout=10 * SECOND)
        expect(page.get_by_test_id("token-state")).to_have_text("token set", use_inner_text=True)
        settle(server)


def test_run_again_reproduces_a_runs_request(studio: Studio, page_at: Any) -> None:
    eval_file = studio.data.with_name("eval.jsonl")
    eval_file.write_text(studio.data.read_text())
    original = studio.start(
        "completed",
        local_eval_datasets=[str(eval_file)],
        eval_steps=0.25,
        packing=True,
        train_on_completions=True,
        lora_dropout=0.05,
        target_modules=["q_proj", "v_proj"],
        warmup_ratio=0.1,
        gradient_accumulation_steps=2,
        random_seed=7,
        lr_scheduler_type="cosine",
        optim="adamw_torch",
        load_in_4bit=False,
        dataset_slice_end=40,
        custom_format_mapping={"instruction": "user", "output": "assistant"},
    )
    studio.wait_phase(original, "completed")
    page = page_at(LAPTOP)
    open_page(page, studio.url, f"#job={original}")
    page.wait_for_function("window.__studio.phase() === 'completed'", timeout=20 * SECOND)

    page.get_by_test_id("run-settings").locator("summary").click()
    page.wait_for_selector("[data-testid=settings-list] dd[data-field=target_modules]", timeout=10 * SECOND)
    expect(page.locator("[data-testid=settings-list] dd[data-field=target_modules]")).to_have_text("q_proj, v_proj", use_inner_text=True)

    page.get_by_test_id("run-again").click()
    page.wait_for_function("document.querySelector('[data-testid=field-model_name]').value !== ''", timeout=10 * SECOND)
    expect(page.get_by_test_id("advanced"), "Advanced holds changed fields: it opens").to_have_js_property("open", True)
    expect(page.get_by_test_id("field-packing")).to_be_checked()
    page.get_by_test_id("start-button").click()
    page.wait_for_function(f"window.__studio.jobId() && window.__studio.jobId() !== '{original}'", timeout=10 * SECOND)
    again = page.evaluate("window.__studio.jobId()")
    assert studio.detail(again)["request"] == studio.detail(original)["request"]


def test_resume_rename_and_delete_a_run(studio: Studio, page_at: Any) -> None:
    stopped = studio.start("stopped")
    studio.wait_phase(stopped, "stopped")
    folder = studio.server.data_dir / "jobs" / stopped
    checkpoint = folder / "checkpoints" / "checkpoint-30"
    assert checkpoint.is_dir()
    page = page_at(PHONE)
    open_page(page, studio.url, f"#job={stopped}")
    page.wait_for_function("window.__studio.phase() === 'stopped'", timeout=20 * SECOND)

    # Rename: the server keeps the new label; the list shows it.
    page.get_by_test_id("rename-button").click()
    page.get_by_test_id("rename-input").fill("stopped, renamed")
    page.get_by_test_id("rename-input").press("Enter")
    page.wait_for_selector(f"[data-testid=job-item][data-job-id='{stopped}'] >> text=stopped, renamed", timeout=10 * SECOND)
    assert studio.detail(stopped)["request"]["project_name"] == "stopped, renamed"
    expect(page.get_by_test_id("rename-button"), "focus left the rename").to_be_focused()

    # Resume: a new job from the stopped run's checkpoint.
    page.get_by_test_id("resume-button").click()
    page.wait_for_function(f"window.__studio.jobId() && window.__studio.jobId() !== '{stopped}'", timeout=10 * SECOND)
    resumed = page.evaluate("window.__studio.jobId()")
    assert studio.detail(resumed)["request"]["resume_from_checkpoint"] == str(checkpoint)
    studio.wait_phase(resumed, "completed")

    # Delete, asked once: its events, folder and history go; the list forgets it.
    show_job(page, stopped, "stopped")
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.get_by_test_id("delete-button").click()
    page.wait_for_function(f"!document.querySelector(\"[data-testid=job-item][data-job-id='{stopped}']\")", timeout=10 * SECOND)
    assert len(asked) == 1 and stopped in asked[0]
    assert studio.http.get(f"/train/jobs/{stopped}").status_code == 404
    assert studio.http.get(f"/train/status/{stopped}").status_code == 404
    assert not folder.exists(), "the run's files were left behind"
    assert (studio.server.data_dir / "jobs" / resumed).exists(), "another run's files went too"
    assert_fits(page, "after-delete")


def test_the_page_opened_at_localhost_starts_stops_and_uploads(studio: Studio, page_at: Any) -> None:
    """The server refuses other sites' names and writes (api/origin.py); its own page,
    opened under either loopback name, is neither: its writes carry its own Origin."""
    url = studio.url.replace("127.0.0.1", "localhost")
    page = page_at(LAPTOP)
    writes: list[Any] = []
    page.on("request", lambda request: writes.append(request) if request.method != "GET" else None)
    open_page(page, url)
    field = page.get_by_test_id
    field("field-format_type").select_option("alpaca")
    field("field-model_name").fill(str(studio.model))
    field("field-local_datasets").fill(str(studio.data))
    field("field-project_name").fill("held from localhost")
    field("start-button").click()
    page.wait_for_function("window.__studio.jobId() && window.__studio.phase() === 'loading_model'", timeout=20 * SECOND)
    job_id = page.evaluate("window.__studio.jobId()")

    field("stop-button").click()
    page.wait_for_function("window.__studio.phase() === 'stopped'", timeout=20 * SECOND)
    assert studio.phase(job_id) == "stopped"

    field("upload-input").set_input_files(str(DEMO_DATA))
    page.wait_for_function(
        "document.querySelector('[data-testid=upload-state]').textContent.startsWith('Uploaded')", timeout=30 * SECOND
    )
    assert [item["filename"] for item in studio.http.get("/v1/files").json()["data"]] == ["tiny_alpaca.jsonl"]

    sent = {(request.method, request.url.removeprefix(url)): request.all_headers().get("origin") for request in writes}
    assert ("POST", "/train/start") in sent and ("POST", f"/train/stop/{job_id}") in sent and ("POST", "/v1/files") in sent, sent
    assert set(sent.values()) == {url}, f"the page's writes did not carry its own origin: {sent}"
    # The same page at a name the server does not answer is refused before it loads.
    assert httpx.get(f"{studio.url}/", headers={"Host": "evil.example"}).status_code == 421


@pytest.mark.train
def test_a_file_uploaded_through_the_page_trains(server: Any, page_at: Any, tiny_model: Path) -> None:
    page = page_at(LAPTOP)
    open_page(page, server.url)
    page.get_by_test_id("upload-input").set_input_files(str(DEMO_DATA))
    state = page.get_by_test_id("upload-state")
    page.wait_for_function(
        "document.querySelector('[data-testid=upload-state]').textContent.startsWith('Uploaded')", timeout=30 * SECOND
    )
    expect(state).to_contain_text("tiny_alpaca.jsonl", use_inner_text=True)
    expect(page.get_by_test_id("field-local_datasets")).not_to_have_value(re.compile(r"^\s*$"))
    named = page.get_by_test_id("field-local_datasets").input_value().strip()
    assert named and named != str(DEMO_DATA)
    expect(page.locator("[data-testid=upload-list] li")).to_have_count(1)

    for name, value in {"model_name": str(tiny_model), "max_steps": "4", "learning_rate": "1e-3", "batch_size": "2",
                        "lora_r": "4", "lora_alpha": "8", "max_seq_length": "128"}.items():
        page.get_by_test_id(f"field-{name}").fill(value)
    page.get_by_test_id("field-format_type").select_option("alpaca")
    page.get_by_test_id("start-button").click()
    page.wait_for_function("window.__studio.phase() === 'completed'", timeout=300 * SECOND)
    assert page.evaluate("window.__studio.points('loss')") == 4
    assert_fits(page, "trained-from-upload")
