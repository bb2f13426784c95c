"""The sweep view (sweeps.js, #sweep=<id>) in a real Chromium against a real server sweeping
the tiny model: 3 trials of a grid over the learning rate and the LoRA rank, each a real
training child. The page is opened as the sweep starts and follows it live; once it has
ended the view draws one loss curve per trial (each with a point per step), the best trial
marked (in the table and the chart's legend), a plot of the objective per parameter, and a
trial's "Run again with these" fills the form with that trial's values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import PHONE, VIEWPORT, assert_fits, expect, next_frame, open_page, wait_js
from tests.helpers.jobs import job_request
from tests.helpers.servers import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.train]
STEPS = 4
SPACE = {"learning_rate": {"type": "categorical", "choices": [1e-4, 2e-2]},
         "lora_r": {"type": "categorical", "choices": [2, 4]}}


def sweep(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__studio.sweep()")  # type: ignore[no-any-return]


def test_the_sweep_view_overlays_every_trials_curve_marks_the_best_and_runs_a_trial_again(
    page: Any, server: ServerProcess, tiny_model: Path
) -> None:
    body = {"request": job_request(tiny_model, max_steps=STEPS), "space": SPACE, "objective": {"metric": "train_loss"},
            "trials": 3, "sampler": "grid", "seed": 1, "label": "lr and rank"}
    with server.client() as client:
        created = client.http.post("/sweeps", json=body)
        assert created.status_code == 200, created.text
        sweep_id = created.json()["sweep_id"]
        open_page(page, server.url, f"#sweep={sweep_id}")  # while it runs: the view follows it live
        wait_js(page, "window.__studio.sweep().status === 'completed'", timeout_s=900)
        final = client.http.get(f"/sweeps/{sweep_id}").json()
    assert final["status"] == "completed" and len(final["trials"]) == 3, final
    best = final["best"]["number"]
    view = page.get_by_test_id("sweep-view")
    expect(view).to_be_visible()
    expect(page.get_by_test_id("sweep-title")).to_have_text("lr and rank")
    expect(page.get_by_test_id("sweep-status")).to_have_text("Completed")
    expect(page.get_by_test_id("sweep-item")).to_have_count(1)
    expect(page.get_by_test_id("sweep-item")).to_have_attribute("aria-current", "page")

    # One curve per trial, each with a point per step, the best one named so in the legend.
    wait_js(page, f"window.__studio.sweep().series.length === 3 && window.__studio.sweep().series.every((s) => s.points === {STEPS})",
            timeout_s=60)
    labels = [series["label"] for series in sweep(page)["series"]]
    assert labels == [f"trial {t['number']}" + (" · best" if t["number"] == best else "") for t in final["trials"]]
    legend = page.get_by_test_id("sweep-chart-loss").locator(".u-legend")
    expect(legend).to_contain_text(f"trial {best} · best")
    expect(page.get_by_test_id("sweep-chart-loss").locator("canvas")).to_have_count(1)

    # The best trial's row is marked, and its objective is the least.
    rows = page.get_by_test_id("sweep-trial")
    expect(rows).to_have_count(3)
    marked = page.locator("[data-testid=sweep-trial][data-best=true]")
    expect(marked).to_have_count(1)
    expect(marked).to_have_attribute("data-number", str(best))
    expect(marked.get_by_test_id("best-mark")).to_be_visible()
    assert final["best"]["value"] == min(t["value"] for t in final["trials"])

    # The objective against each parameter: a plot per field of the space, a point per trial.
    charts = page.get_by_test_id("sweep-param-chart")
    expect(charts).to_have_count(2)
    assert [charts.nth(i).get_attribute("data-param") for i in range(2)] == ["learning_rate", "lora_r"]
    assert sweep(page)["params"] == {"learning_rate": 3, "lora_r": 3}
    for i in range(2):
        expect(charts.nth(i).locator("canvas")).to_have_count(1)

    # Every trial saved an adapter: each offers its chat and its export.
    expect(page.get_by_test_id("trial-chat")).to_have_count(3)
    expect(page.get_by_test_id("trial-export")).to_have_count(3)

    # Nothing scrolls sideways, on a laptop or a phone (the trials' table scrolls within its box).
    assert_fits(page, "sweep")
    page.set_viewport_size(PHONE)
    next_frame(page)
    assert_fits(page, "sweep")
    page.set_viewport_size(VIEWPORT)
    next_frame(page)

    # "Run again with these" on a trial that is not the best: the form holds that trial's values.
    other = next(t for t in final["trials"] if t["number"] != best)
    row = page.locator(f"[data-testid=sweep-trial][data-number='{other['number']}']")
    row.get_by_test_id("trial-run-again").click()
    expect(page.get_by_test_id("start-result")).to_contain_text(f"trial {other['number']} of sweep {sweep_id}")
    wait_js(page, f"Number(document.querySelector('[data-testid=field-learning_rate]').value) === {other['params']['learning_rate']}",
            timeout_s=10)
    expect(page.get_by_test_id("field-lora_r")).to_have_value(str(other["params"]["lora_r"]))
    expect(page.get_by_test_id("field-max_steps")).to_have_value(str(STEPS))

    # Export: the trial's own run view, at its export panel.
    marked.get_by_test_id("trial-export").click()
    wait_js(page, f"window.__studio.jobId() === '{final['best']['job_id']}'", timeout_s=20)
    expect(page.get_by_test_id("export-panel")).to_be_visible()
    expect(page.get_by_test_id("sweep-view")).to_be_hidden()
