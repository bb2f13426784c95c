"""The evaluation view (web/evaluation.js, evaltable.js, evalrows.js) and a run's Evaluations
panel (web/evalpanel.js) in a real Chromium, against a real server: training jobs played
in-process (AdapterLauncher: a saved adapter and job.json naming the tiny model as base),
the stand-in chat child (it echoes; `__by_adapter__ A | B` answers A for the job and B for
its base), and the real evaluation child, which reaches them through the server's /v1.

The view of a finished evaluation: one column per model, one row per `suite/name` metric,
each value with the server's 95% interval, the differences marked where their interval
excludes zero, and the per-sample rows in the order of the gains, then of the losses; the
run page's "Evaluate against its base" starts one (and a refusal names the file); a run
trained with eval_after shows its evaluation's summary and eval_guard's warning."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from tests.helpers.browser import SECOND, expect, open_page
from tests.helpers.children import STAND_IN_CHAT_CHILD
from tests.helpers.evaluations import AdapterLauncher, rows_file, trained
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser

# (reference, the job's answer, its base's answer); the rows' indices are their places here.
ROWS = [
    *[(f"one two three four {n}", f"one two three four {n}", "nothing here") for n in range(10)],  # 0-9: the base loses all
    ("five six seven eight", "five six", "five six seven eight"),  # 10: the base gains a little
    ("nine ten", "nine ten", "nine ten"),  # 11: the same answer
    ("red green blue white", "black", "red green blue white"),  # 12: the base gains most
    ("cat dog bird fish", "cat dog bird fish", "cat dog"),  # 13: the base loses a little
]
GAINS_FIRST = [12, 10, 11, 13, *range(10)]  # the base's ROUGE-L minus the job's, largest first (ties in order)
LOSSES_FIRST = [*range(10), 13, 11, 10, 12]


def apart_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    """Held-out conversations that the job and its base answer apart (the stand-in's `__by_adapter__`)."""
    lines = [
        json.dumps({"messages": [{"role": "user", "content": f"__by_adapter__ {tuned} | {base}"},
                                 {"role": "assistant", "content": reference}]})
        for reference, tuned, base in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> Iterator[LiveServer]:
    monkeypatch.chdir(REPO)  # the stand-in chat child is imported from the repository
    settings = Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1)
    live = LiveServer(settings, AdapterLauncher(tiny_model), inference_module=STAND_IN_CHAT_CHILD)
    live.settings.port = live.port  # the URL its evaluation children reach it at
    with live:
        yield live


def finished_eval(client: Any, eval_id: str) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := client.eval_status(eval_id))["phase"] in ("completed", "error", "stopped") and s,
        timeout=240, interval=0.1, what=f"evaluation {eval_id} to end",
    )
    assert status["phase"] == "completed", status
    return status


def interval(bounds: list[float]) -> str:
    """The page's "[low, high]" of an interval, as format.js `metric(value, 3)` writes each bound."""
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"


def shown_indices(page: Any) -> list[int]:
    return [int(i) for i in page.eval_on_selector_all("[data-testid=eval-row]", "rows => rows.map((r) => r.dataset.index)")]


def test_the_comparison_view_of_a_finished_evaluation(server: LiveServer, page: Any, tmp_path: Path) -> None:
    with server.client() as client:
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]), project_name="support-bot")
        data = apart_rows(tmp_path / "heldout.jsonl", ROWS)
        base = f"base:{job_id}"
        eval_id = client.start_eval({"models": [job_id, base], "suites": [{"type": "heldout", "data": [str(data)], "max_new_tokens": 16}]})
        finished_eval(client, eval_id)
        results = client.eval_results(eval_id)
    metrics = {metric["name"]: metric for metric in results["metrics"]}
    exact = metrics["heldout/exact_match"]
    assert exact["values"] == {job_id: pytest.approx(12 / 14), base: pytest.approx(3 / 14)}  # as the data says
    low, high = exact["deltas_ci95"][base]
    assert high < 0, exact  # the base is clearly worse: its interval excludes zero

    open_page(page, server.url, f"#eval={eval_id}")
    view = page.get_by_test_id("eval-view")
    expect(view).to_have_attribute("data-phase", "completed")
    expect(view.get_by_test_id("eval-phase")).to_have_text("Completed")
    table = view.get_by_test_id("eval-table")
    expect(table).to_be_visible()
    # One column per model (the run by its label, the base by whose base it is), one row per metric.
    columns = table.locator("thead th[data-model]")
    expect(columns).to_have_count(2)
    expect(columns.nth(0)).to_contain_text("support-bot")
    expect(columns.nth(1)).to_contain_text("base of support-bot")
    rows = table.get_by_test_id("eval-metric")
    expect(rows).to_have_count(len(results["metrics"]))
    assert rows.evaluate_all("rows => rows.map((r) => r.dataset.metric)") == [m["name"] for m in results["metrics"]]

    # Each value with the server's interval; the base's difference from the run, with its own.
    row = table.locator("[data-testid=eval-metric][data-metric='heldout/exact_match']")
    first, second = row.locator(f"td[data-model='{job_id}']"), row.locator(f"td[data-model='{base}']")
    expect(first.get_by_test_id("eval-value")).to_have_text("0.857")
    expect(first.get_by_test_id("eval-ci")).to_have_text(interval(exact["ci95"][job_id]))
    expect(second.get_by_test_id("eval-value")).to_have_text("0.214")
    expect(second.get_by_test_id("eval-ci")).to_have_text(interval(exact["ci95"][base]))
    expect(first.get_by_test_id("eval-delta")).to_have_count(0)  # the first model is what the others differ from
    delta = second.get_by_test_id("eval-delta")
    expect(delta.get_by_test_id("eval-delta-value")).to_have_text("Δ −0.643")
    expect(delta.get_by_test_id("eval-delta-ci")).to_have_text(interval(exact["deltas_ci95"][base]))
    expect(delta).to_have_attribute("data-verdict", "worse")  # higher is better, and the whole interval is below zero
    # A difference whose interval holds zero is not marked.
    for name, metric in metrics.items():
        bounds = metric["deltas_ci95"].get(base)
        if bounds and bounds[0] <= 0 <= bounds[1]:
            cell = table.locator(f"[data-testid=eval-metric][data-metric='{name}'] td[data-model='{base}'] [data-testid=eval-delta]")
            expect(cell).to_have_attribute("data-verdict", "unsure")

    # The samples, by ROUGE-L: the base's largest gains first, then (the toggle) its largest losses.
    samples = view.get_by_test_id("eval-samples-view")
    expect(samples.get_by_test_id("eval-rows")).to_be_visible()
    samples.get_by_test_id("eval-rows-metric").select_option("rouge_l")
    expect(samples.get_by_test_id("eval-row")).to_have_count(len(ROWS))
    expect(samples.get_by_test_id("eval-rows-order-gains")).to_have_attribute("aria-pressed", "true")
    wait_for(lambda: shown_indices(page) == GAINS_FIRST, timeout=15, what="the samples in the order of their gains")
    top = samples.get_by_test_id("eval-row").first
    expect(top.get_by_test_id("eval-row-gain")).to_have_text("+1.000 rouge_l")
    expect(top.get_by_test_id("eval-row-gain")).to_have_attribute("data-direction", "gain")
    expect(top.get_by_test_id("eval-row-reference")).to_have_text("red green blue white")
    expect(top.locator(f"[data-testid=eval-row-answer][data-model='{job_id}'] pre")).to_have_text("black")
    expect(top.locator(f"[data-testid=eval-row-answer][data-model='{base}'] pre")).to_have_text("red green blue white")
    expect(top.locator(f"[data-testid=eval-row-answer][data-model='{base}'] [data-testid=eval-row-scores]")).to_contain_text("exact_match 1.000")
    expect(top.get_by_test_id("eval-row-prompt")).to_contain_text("__by_adapter__ black | red green blue white")
    samples.get_by_test_id("eval-rows-order-losses").click()
    expect(samples.get_by_test_id("eval-rows-order-losses")).to_have_attribute("aria-pressed", "true")
    wait_for(lambda: shown_indices(page) == LOSSES_FIRST, timeout=15, what="the samples in the order of their losses")
    expect(samples.get_by_test_id("eval-row").first.get_by_test_id("eval-row-gain")).to_have_attribute("data-direction", "loss")

    # "← Run" leads back to the run the evaluation compares.
    view.get_by_test_id("eval-back").click()
    expect(page.get_by_test_id("job-view")).to_be_visible()
    expect(page.get_by_test_id("job-id")).to_have_text(job_id)
    item = page.locator(f"[data-testid=eval-item][data-eval-id='{eval_id}']")
    expect(item).to_have_attribute("data-phase", "completed")


def test_the_run_page_starts_an_evaluation_against_its_base(server: LiveServer, page: Any, tmp_path: Path) -> None:
    with server.client() as client:
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
    words = [f"word{n} and more" for n in range(230)]
    data = rows_file(tmp_path / "heldout.jsonl", words)

    open_page(page, server.url, f"#job={job_id}")
    panel = page.get_by_test_id("eval-panel")
    expect(panel.get_by_test_id("eval-form")).to_be_visible()
    # A file that is not there: the server's refusal, naming it, and the field marked.
    panel.get_by_test_id("eval-data").fill(str(tmp_path / "missing.jsonl"))
    panel.get_by_test_id("eval-start").click()
    error = panel.get_by_test_id("eval-start-error")
    expect(error).to_contain_text("suites[0].data[0]")
    expect(error).to_contain_text("missing.jsonl")
    expect(panel.get_by_test_id("eval-data")).to_have_attribute("aria-invalid", "true")

    panel.get_by_test_id("eval-data").fill(str(data))
    panel.get_by_test_id("eval-limit").fill("220")
    panel.get_by_test_id("eval-max-tokens").fill("16")  # the stand-in's context is 64 words
    panel.get_by_test_id("eval-start").click()
    page.wait_for_url("**#eval=*", timeout=20 * SECOND)
    eval_id = page.url.split("#eval=")[1]
    view = page.get_by_test_id("eval-view")
    expect(view.get_by_test_id("eval-id")).to_have_text(eval_id)
    # The view followed the stream to the end, then drew the table and the samples.
    expect(view).to_have_attribute("data-phase", re.compile("^(completed|error|stopped)$"), timeout=240 * SECOND)
    expect(view.get_by_test_id("eval-error")).to_be_hidden()
    expect(view).to_have_attribute("data-phase", "completed")
    expect(view.get_by_test_id("eval-progress")).to_be_hidden()
    expect(view.locator("[data-testid=eval-metric][data-metric='heldout/exact_match']")).to_be_visible()
    with server.client() as client:
        started = client.eval_status(eval_id)
    assert started["details"]["models"] == [job_id, f"base:{job_id}"] and started["details"]["suites"] == ["heldout"]
    # 220 rows (the limit), drawn 20 at a time.
    samples = view.get_by_test_id("eval-samples-view")
    expect(samples.get_by_test_id("eval-rows-page")).to_have_text("Samples 1–20 of 220")
    expect(samples.get_by_test_id("eval-row")).to_have_count(20)
    samples.get_by_test_id("eval-rows-next").click()
    expect(samples.get_by_test_id("eval-rows-page")).to_have_text("Samples 21–40 of 220")
    # Back on the run's page, its list has the evaluation.
    page.go_back()
    expect(page.get_by_test_id("job-id")).to_have_text(job_id)
    expect(page.locator(f"[data-testid=eval-item][data-eval-id='{eval_id}']")).to_have_attribute("data-phase", "completed")


def test_a_run_trained_with_eval_after_shows_its_evaluation_and_guard(server: LiveServer, page: Any, tmp_path: Path) -> None:
    # The base right on every row, the job on none: the job falls behind its base by 1.0, over max_drop.
    data = apart_rows(tmp_path / "heldout.jsonl", [(f"red green {n}", "black", f"red green {n}") for n in range(4)])
    with server.client() as client:
        job_id = trained(
            client, rows_file(tmp_path / "train.jsonl", ["hi"]),
            eval_after=[{"type": "heldout", "data": [str(data)], "max_new_tokens": 16}],
            eval_guard={"metric": "heldout/exact_match", "max_drop": 0.5},
        )
        eval_id = client.status(job_id)["details"]["eval_id"]
        finished_eval(client, eval_id)
        joined = client.status(job_id)["details"]["eval"]
    assert joined["guard"]["state"] == "failed", joined

    open_page(page, server.url, f"#job={job_id}")
    after = page.get_by_test_id("eval-after")
    expect(after.get_by_test_id("eval-after-phase")).to_have_text("Completed")
    metric = after.locator("[data-testid=eval-after-metric][data-metric='heldout/exact_match']")
    expect(metric).to_contain_text("0.000")
    expect(metric).to_contain_text("base of")
    expect(metric).to_contain_text("1.000 (Δ +1.000)")
    guard = after.get_by_test_id("eval-guard")
    expect(guard).to_have_attribute("data-state", "failed")
    expect(guard).to_contain_text(joined["guard"]["warning"])
    after.get_by_test_id("eval-after-link").click()
    expect(page.get_by_test_id("eval-view").get_by_test_id("eval-id")).to_have_text(eval_id)
    expect(page.get_by_test_id("eval-view").get_by_test_id("eval-table")).to_be_visible()
