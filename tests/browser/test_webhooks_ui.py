"""The webhooks panel (web/webhooks.js) and a run's tracker links (web/trackers.js) in a real
Chromium, against the real app with the scripted worker (tests/helpers/page_studio.py): a webhook
added from the page to a receiver on 127.0.0.1 that verifies each delivery with the
`standardwebhooks` library, its test event sent and seen delivered in the page, then removed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from tests.helpers.browser import SECOND, expect, open_ui
from tests.helpers.page_studio import TRACKED, ScriptedLauncher, Studio, settle
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer
from tests.helpers.webhook_receiver import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def studio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Studio]:
    monkeypatch.chdir(REPO)
    launcher = ScriptedLauncher()
    settings = Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1)
    with LiveServer(settings, launcher) as server:
        with contextlib.closing(Studio(server, launcher, tmp_path, None)) as studio:
            yield studio
            settle(server)


def test_add_a_webhook_send_its_test_event_see_the_delivery_and_remove_it(studio: Studio, page: Any) -> None:
    with Receiver() as receiver:
        open_ui(page, studio.url)
        panel = page.get_by_test_id("webhooks-panel")
        panel.locator("summary").click()
        # The event choices come from the server (GET /webhook-events); OpenAI's three are ticked.
        expect(panel.get_by_test_id("webhook-event-fine_tuning.job.succeeded")).to_be_checked()
        expect(panel.get_by_test_id("webhook-event-studio.job.phase")).not_to_be_checked()

        # A URL that is none: the server's refusal, in words, naming the field.
        panel.get_by_test_id("webhook-url").fill("not a url")
        panel.get_by_test_id("webhook-add").click()
        expect(panel.get_by_test_id("webhook-error")).to_contain_text("url")

        panel.get_by_test_id("webhook-url").fill(receiver.url)
        panel.get_by_test_id("webhook-event-studio.export.completed").check()
        panel.get_by_test_id("webhook-add").click()
        hook = panel.get_by_test_id("webhook")
        expect(hook.get_by_test_id("webhook-target")).to_have_text(receiver.url)
        expect(panel.get_by_test_id("webhook-error")).to_be_hidden()
        secret = panel.get_by_test_id("webhook-secret-value").inner_text()
        assert secret.startswith("whsec_")
        listed = studio.http.get("/webhooks").json()["data"]
        assert [(h["url"], h["events"]) for h in listed] == [(receiver.url, [
            "fine_tuning.job.succeeded", "fine_tuning.job.failed", "fine_tuning.job.cancelled", "studio.export.completed"])]
        receiver.secret = secret  # the secret the page showed is the one the deliveries are signed with

        hook.get_by_test_id("webhook-test").click()
        delivery = hook.get_by_test_id("webhook-delivery")
        expect(delivery).to_have_attribute("data-state", "delivered", timeout=30 * SECOND)
        expect(delivery).to_contain_text("studio.webhook.test")
        expect(delivery).to_contain_text("HTTP 200 after 1 attempt")
        wait_for(lambda: len(receiver.received) == 1, what="the receiver to have the test event")
        received = receiver.received[0]
        assert received.error is None and received.payload is not None
        assert received.payload["type"] == "studio.webhook.test"
        assert delivery.get_attribute("title") == received.headers["webhook-id"]

        hook.get_by_test_id("webhook-remove").click()
        expect(panel.get_by_test_id("webhook")).to_have_count(0)
        assert studio.http.get("/webhooks").json()["data"] == []


def test_a_run_logged_to_trackers_links_to_its_tracker_run(studio: Studio, page: Any) -> None:
    tracked = studio.start("tracked")
    plain = studio.start("completed")
    studio.wait_phase(tracked, "completed")
    studio.wait_phase(plain, "completed")
    open_ui(page, studio.url, tracked)
    box = page.get_by_test_id("job-trackers")
    link = box.get_by_test_id("tracker-link-mlflow")
    expect(link).to_have_attribute("href", TRACKED[0]["url"])
    expect(link).to_contain_text("MLflow: run 0123abcd in tracked")
    # A local Trackio project has no web address: its name and how to open its dashboard.
    expect(box.get_by_test_id("tracker-trackio")).to_contain_text('trackio show --project "tracked"')
    expect(box.get_by_test_id("tracker-link-trackio")).to_have_count(0)
    open_ui(page, studio.url, plain)
    expect(page.get_by_test_id("job-id")).to_have_text(plain)
    expect(box).to_be_hidden()
