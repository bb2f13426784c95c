"""The export panel (web/export.js) in a real Chromium, against a real server whose
exports run the stand-in export child (tests/helpers/stand_in_export_worker.py):
format and quantizations, progress per stage from the export stream, files with
sizes and download links, the `ollama create` line, errors in words, and stop."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.api.routes import export as export_routes
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.browser import SECOND, expect
from tests.helpers.children import STAND_IN_EXPORT_WORKER, STAND_IN_WORKER
from tests.helpers.exports import trained_job
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    monkeypatch.chdir(REPO)  # the stand-in children are imported from the repository
    monkeypatch.setattr(export_routes, "gguf_tools_problem", lambda: None)
    monkeypatch.setenv("FAKE_EXPORT_STEP_S", "0.05")
    monkeypatch.setenv("FAKE_EXPORT_CHUNKS", "16")
    settings = Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1)
    live = LiveServer(settings, LocalProcessLauncher(module=STAND_IN_WORKER), LocalProcessLauncher(module=STAND_IN_EXPORT_WORKER))
    with live:
        yield live


def open_job(page: Any, server: LiveServer, job_id: str) -> Any:
    page.goto(f"{server.url}/#job={job_id}")
    panel = page.get_by_test_id("export-panel")
    panel.wait_for(state="visible", timeout=20 * SECOND)
    return panel


def test_export_a_job_to_gguf_follow_its_stages_and_download_the_files(
    server: LiveServer, page: Any, tmp_path: Path
) -> None:
    job_id = trained_job(server, tmp_path)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    panel = open_job(page, server, job_id)
    expect(panel.get_by_test_id("export-format")).to_have_value("gguf")
    expect(panel.get_by_test_id("export-quant-q4_k_m")).to_be_checked()  # llama.cpp's usual choice
    panel.get_by_test_id("export-quant-q8_0").check()
    panel.get_by_test_id("export-start").click()

    item = panel.get_by_test_id("export-item")
    # Progress per stage while it runs: a row per stage, each naming the file it writes.
    page.wait_for_selector("[data-testid=export-stage][data-stage=quantizing]", timeout=30 * SECOND)
    stages = page.eval_on_selector_all("[data-testid=export-stage]", "rows => rows.map((r) => r.dataset.stage)")
    assert stages == ["merging", "converting", "quantizing"]
    expect(item.get_by_test_id("export-percent")).to_contain_text("%")

    page.wait_for_selector("[data-testid=export-item][data-phase=completed]", timeout=60 * SECOND)
    export_id = item.get_attribute("data-export-id")
    folder = server.settings.exports_dir / str(export_id)
    names = page.eval_on_selector_all("[data-testid=export-file]", "rows => rows.map((r) => r.dataset.name)")
    assert names == ["model-q4_k_m.gguf", "model-q8_0.gguf", "Modelfile"]
    sizes = item.get_by_test_id("export-file-size").all_inner_texts()
    assert sizes[0].strip() == "65.5 kB"  # 16 chunks of 4096 bytes (format.js bytes: decimal units)

    with page.expect_download() as download:
        item.locator("[data-name='model-q8_0.gguf'] a").click()
    saved = Path(download.value.path())
    assert download.value.suggested_filename == "model-q8_0.gguf"
    assert hashlib.sha256(saved.read_bytes()).digest() == hashlib.sha256((folder / "model-q8_0.gguf").read_bytes()).digest()

    command = item.get_by_test_id("ollama-command")
    expect(command).to_have_text(f"ollama create finetune-{job_id} -f Modelfile", use_inner_text=True)
    item.get_by_test_id("copy-ollama").click()
    page.wait_for_function("document.querySelector('[data-testid=copy-ollama]').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == command.inner_text()

    # A reload finds the export again (GET /export/jobs?job_id=), with its files.
    page.reload()
    page.wait_for_selector("[data-testid=export-item][data-phase=completed] [data-testid=export-file]", timeout=20 * SECOND)


def test_the_panel_says_what_went_wrong_and_stops_an_export(
    server: LiveServer, page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = trained_job(server, tmp_path)
    panel = open_job(page, server, job_id)

    monkeypatch.setattr(export_routes, "gguf_tools_problem", lambda: "GGUF needs llama.cpp: pip install 'finetune-studio[gguf]'")
    panel.get_by_test_id("export-format").select_option("lora_gguf")
    expect(panel.get_by_test_id("export-quant-f16")).to_be_checked()
    panel.get_by_test_id("export-start").click()
    error = panel.get_by_test_id("export-error")
    error.wait_for(state="visible", timeout=10 * SECOND)
    expect(error).to_contain_text("llama.cpp's tools are not installed", use_inner_text=True)
    expect(error).to_contain_text("pip install 'finetune-studio[gguf]'", use_inner_text=True)

    panel.get_by_test_id("export-format").select_option("gguf")
    panel.get_by_test_id("export-quant-q4_k_m").uncheck()
    panel.get_by_test_id("export-start").click()
    page.wait_for_function("document.querySelector('[data-testid=export-error]').textContent.includes('at least one')")

    monkeypatch.setenv("FAKE_EXPORT_STEP_S", "0.5")
    panel.get_by_test_id("export-format").select_option("merged_16bit")
    panel.get_by_test_id("export-start").click()
    expect(error).to_be_hidden()  # drawn on the next animation frame, not at once
    page.wait_for_selector("[data-testid=export-item][data-phase=merging] [data-testid=export-stage]", timeout=30 * SECOND)
    panel.get_by_test_id("export-stop").click()
    page.wait_for_selector("[data-testid=export-item][data-phase=stopped]", timeout=30 * SECOND)
    expect(panel.get_by_test_id("export-files")).to_have_count(0)

    monkeypatch.setenv("FAKE_EXPORT_STEP_S", "0")
    monkeypatch.setenv("FAKE_EXPORT_FAIL", "disk_full")
    panel.get_by_test_id("export-start").click()
    failure = page.locator("[data-testid=export-item][data-phase=error] [data-testid=export-failure]")
    failure.wait_for(timeout=30 * SECOND)
    expect(failure).to_contain_text("The disk is full", use_inner_text=True)
    expect(failure).to_contain_text("fake failure: disk_full", use_inner_text=True)
