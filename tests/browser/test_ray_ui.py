"""The page when jobs run on a Ray cluster, in a real Chromium: the start form offers
the Cluster fields (workers, resources per worker) only where /system says `ray`,
and sends them; the run's view shows its workers and backend, what it waits for
while Ray places the workers, its restarts and its storage URI.

No cluster is needed: the server is started with a Ray address (FINETUNE_STUDIO_RAY_ADDRESS
or the setting; nothing connects to it at start) and a scripted worker that plays
the statuses a Ray driver relays (ray_train/driver.py): `details.ray`, then
`waiting_for` until the test lets it go, then a lost worker's restart and the
URI its files travel through.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from finetune_studio.wire import WorkerSpec
from tests.helpers.browser import PHONE, SECOND, assert_fits, expect, open_page, show_job
from tests.helpers.page_studio import ScriptedHandle, ScriptedLauncher, Studio, progress, settle, status
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser

ADDRESS = "ray://127.0.0.1:10001"  # nothing listens there: the scripted worker never connects
TOKEN = "ray-page-token-7c2d"
RESTART = (
    "A worker was lost (rank 1 on node 10.0.0.7); Ray Train restarted the run (restart 1 of at most 2)"
    " and it resumes from the job's last checkpoint"
)
OTHER_WARNING = "packing is off for this dataset: its rows are longer than max_seq_length"


class RayHandle(ScriptedHandle):
    """Plays a Ray driver's statuses for a `ray` job; other scripts as test_page's worker does."""

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        request = self.spec.request
        if str(request.get("project_name") or "").split()[:1] != ["ray"]:
            async for message in super().messages():
                yield message
            return
        self.spec.output_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("scripted Ray driver\n")
        resources = request.get("resources_per_worker") or {"CPU": 1.0}
        facts: dict[str, Any] = {
            "model_name": request["model_name"],
            "output_dir": str(self.spec.output_dir),
            "ray": {"address": ADDRESS, "num_workers": request["num_workers"], "resources_per_worker": resources,
                    "max_failures": 2, "backend": "nccl" if resources.get("GPU", 0) > 0 else "gloo"},
        }
        yield status("loading_model", f"Connecting to the Ray cluster at {ADDRESS}", **facts)
        waiting = {"num_workers": request["num_workers"], "resources_per_worker": resources}
        yield status("loading_model", "Waiting for the Ray cluster to place the workers (free now: 0 GPU of 1 GPU)",
                     waiting_for=waiting, **facts)
        while not self.held.is_set() and not self.stop.is_set():
            await asyncio.sleep(0.02)
        # A long URI, as object stores' are: the line must cut it, not widen the page.
        facts["storage"] = f"s3://a-bucket-with-a-long-name-for-training-runs/studio/{'deep/' * 8}jobs/{self.spec.job_id}"
        yield status("loading_dataset", "Read 1 file: 1 row (alpaca), 0 bad rows", **facts)
        yield status("configuring", "Preparing the trainer on 2 workers", **facts)
        after = {**facts, "restarts": [RESTART], "warnings": [RESTART, OTHER_WARNING]}
        yield status("training", "Training for 20 steps", total_steps=20, **after)
        for step in range(1, 6):
            yield progress(step, 20)
        yield status("completed", "Trained 5 steps", train_loss=0.5, **after)


class RayLauncher(ScriptedLauncher):
    async def launch(self, spec: WorkerSpec) -> RayHandle:
        return RayHandle(spec, self.held)


@contextlib.contextmanager
def serving(tmp_path: Path, token: str | None = None, **settings: Any) -> Iterator[Studio]:
    """A live server with the scripted Ray worker; the Settings read the environment too."""
    launcher = RayLauncher()
    config = Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1, token=token, **settings)
    with LiveServer(config, launcher) as server, contextlib.closing(Studio(server, launcher, tmp_path, token)) as studio:
        try:
            yield studio
        finally:
            launcher.held.set()
            settle(server)


def start_from_form(page: Any, studio: Studio) -> dict[str, Any]:
    """Fill model and data, press Start; the body the page sent."""
    page.get_by_test_id("field-model_name").fill(str(studio.model))
    page.get_by_test_id("field-local_datasets").fill(str(studio.data))
    page.get_by_test_id("field-format_type").select_option("alpaca")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/train/start")) as sent:
        page.get_by_test_id("start-button").click()
    page.wait_for_function("window.__studio.phase() === 'completed'", timeout=30 * SECOND)
    body: dict[str, Any] = sent.value.post_data_json
    return body


def test_the_cluster_fields_are_offered_and_sent_where_jobs_run_on_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: Any
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESS", ADDRESS)
    with serving(tmp_path, token=TOKEN) as studio:
        assert studio.http.get("/system").json()["ray"]["address"] == ADDRESS
        open_page(page, studio.url)
        # /system answers 401 before the token: no Cluster fields yet, then they appear without a reload.
        page.get_by_test_id("settings-dialog").wait_for(state="visible", timeout=10 * SECOND)
        expect(page.get_by_test_id("field-num_workers")).to_be_hidden()
        page.get_by_test_id("token-input").fill(TOKEN)
        page.get_by_test_id("token-input").press("Enter")
        page.get_by_test_id("settings-dialog").wait_for(state="hidden", timeout=10 * SECOND)

        page.get_by_test_id("advanced").locator("summary").click()
        workers = page.get_by_test_id("field-num_workers")
        workers.wait_for(state="visible", timeout=10 * SECOND)
        expect(page.locator("fieldset.group legend", has_text="Cluster")).to_be_visible()
        expect(workers).to_have_value("1")  # the request model's default
        expect(page.locator("#hint-num_workers")).to_contain_text("batch size × gradient accumulation × workers", use_inner_text=True)
        expect(page.get_by_test_id("system-note")).to_contain_text(ADDRESS, use_inner_text=True)

        # A mistake in the JSON is shown at the field, in its words, before anything is sent.
        page.get_by_test_id("field-resources_per_worker").fill('{"CPU": 2,')
        page.get_by_test_id("start-button").click()
        error = page.get_by_test_id("error-resources_per_worker")
        error.wait_for(state="visible", timeout=5 * SECOND)
        expect(error).to_contain_text("not valid JSON", use_inner_text=True)
        expect(page.get_by_test_id("start-error")).to_contain_text("Resources per worker", use_inner_text=True)

        workers.fill("2")
        page.get_by_test_id("field-resources_per_worker").fill('{"CPU": 2, "GPU": 0}')
        page.get_by_test_id("field-project_name").fill("completed from the form")
        body = start_from_form(page, studio)
        assert body["num_workers"] == 2 and body["resources_per_worker"] == {"CPU": 2, "GPU": 0}
        stored = studio.detail(page.evaluate("window.__studio.jobId()"))["request"]
        assert stored["num_workers"] == 2 and stored["resources_per_worker"] == {"CPU": 2.0, "GPU": 0.0}


def test_without_ray_the_cluster_fields_are_absent_and_never_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: Any
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("FINETUNE_STUDIO_RAY_ADDRESS", raising=False)
    with serving(tmp_path) as studio:
        assert studio.http.get("/system").json()["ray"] is None
        open_page(page, studio.url)
        page.get_by_test_id("advanced").locator("summary").click()
        page.get_by_test_id("field-gradient_accumulation_steps").wait_for(state="visible", timeout=10 * SECOND)
        for name in ("num_workers", "resources_per_worker"):
            expect(page.get_by_test_id(f"field-{name}")).to_be_hidden()
        expect(page.locator("fieldset.group legend", has_text="Cluster")).to_be_hidden()
        expect(page.get_by_test_id("system-note")).not_to_contain_text("Ray", use_inner_text=True)
        page.get_by_test_id("field-project_name").fill("completed from the form")
        body = start_from_form(page, studio)
        assert "num_workers" not in body and "resources_per_worker" not in body
        assert "model_name" in body  # the body was read: the fields above are left out, not everything


def test_the_run_view_shows_a_ray_jobs_workers_wait_restarts_and_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: Any
) -> None:
    monkeypatch.chdir(REPO)
    with serving(tmp_path, ray_address=ADDRESS) as studio:
        job_id = studio.start("ray", num_workers=2, resources_per_worker={"CPU": 2, "GPU": 1})
        open_page(page, studio.url)
        show_job(page, job_id, "loading_model")
        cluster = page.get_by_test_id("job-cluster")
        waiting = page.get_by_test_id("cluster-waiting")
        waiting.wait_for(state="visible", timeout=10 * SECOND)
        expect(waiting).to_have_text("Waiting for the cluster to place 2 workers (2 CPU, 1 GPU each)", use_inner_text=True)
        expect(page.get_by_test_id("cluster-address")).to_have_text(ADDRESS, use_inner_text=True)
        expect(page.get_by_test_id("cluster-workers")).to_have_text("2 × 2 CPU, 1 GPU", use_inner_text=True)
        expect(page.get_by_test_id("cluster-backend")).to_have_text("nccl", use_inner_text=True)
        expect(page.get_by_test_id("cluster-restart-count")).to_have_text("0 of at most 2", use_inner_text=True)
        expect(page.get_by_test_id("cluster-storage")).to_have_count(0)  # the files travel through no URI yet
        expect(page.get_by_test_id("cluster-restarts")).to_have_count(0)
        assert_fits(page, "ray-waiting")

        studio.launcher.held.set()
        page.wait_for_function("window.__studio.phase() === 'completed'", timeout=30 * SECOND)
        page.get_by_test_id("cluster-restarts").wait_for(state="visible", timeout=10 * SECOND)
        expect(waiting, "a run that was placed still says it waits").to_be_hidden()
        expect(page.get_by_test_id("cluster-restarts")).to_have_text(RESTART, use_inner_text=True)
        expect(page.get_by_test_id("cluster-restart-count")).to_have_text("1 of at most 2", use_inner_text=True)
        storage = page.get_by_test_id("cluster-storage")
        expect(storage).to_have_text(re.compile(rf"^s3://a-bucket-with-a-long-name.*{re.escape(job_id)}$"), use_inner_text=True)
        # The restart is a warning too, but said once: in the cluster line.
        warnings = page.get_by_test_id("job-warnings")
        expect(warnings).to_contain_text(OTHER_WARNING, use_inner_text=True)
        expect(warnings).to_contain_text("1 warning", use_inner_text=True)
        expect(warnings).not_to_contain_text(RESTART, use_inner_text=True)
        assert_fits(page, "ray-run")
        page.set_viewport_size(PHONE)
        assert_fits(page, "ray-run")
        expect(cluster).to_be_visible()

        # A run trained on the server's machine has no cluster line.
        local = studio.start("completed")
        studio.wait_phase(local, "completed")
        show_job(page, local, "completed")
        expect(cluster).to_be_hidden()
