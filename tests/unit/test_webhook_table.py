"""The webhooks' outbox in the job store (jobs/webhooks.py): written in the status's own
transaction, and its writes fail as every store write does (StorageHealth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_studio.errors import StorageFailed
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore


def _full(store: JobStore) -> None:
    """The database may grow no more (SQLite's max_page_count on the store's own connection)."""
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_status_and_its_deliveries_are_written_together_or_not_at_all(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "studio.db")
    service = JobService(store, tmp_path / "jobs")
    hook = store.webhooks.add("http://127.0.0.1:9/", "whsec_" + "A" * 32, ["studio.job.phase", "fine_tuning.job.failed"])
    job = service.create_job({"model_name": "m"}, "Queued", {})
    assert [d.event_type for d in store.webhooks.deliveries(hook.id, 10)] == ["studio.job.phase"]
    # Fill the database with deliveries of other statuses until the next transaction cannot be written.
    _full(store)
    with pytest.raises(StorageFailed):
        for _ in range(10_000):
            store.webhooks.enqueue_test(hook.id)
    assert store.health.fault is not None and store.health.fault.error_code == "disk_full"
    before = (store.get_job(job.id).last_event_id, len(store.webhooks.deliveries(hook.id, 100_000)))
    with pytest.raises(StorageFailed):
        service.transition(job.id, "error", "failed", error="boom", details={"error_code": "training_failed"})
    after = (store.get_job(job.id).last_event_id, len(store.webhooks.deliveries(hook.id, 100_000)))
    assert after == before and store.get_job(job.id).phase == "idle"
    store._db.execute("PRAGMA max_page_count = 1073741823")
    service.transition(job.id, "error", "failed", error="boom", details={"error_code": "training_failed"})
    assert store.health.fault is None
    types = [d.event_type for d in store.webhooks.deliveries(hook.id, 3)]
    assert sorted(types[:2]) == ["fine_tuning.job.failed", "studio.job.phase"]


@pytest.mark.parametrize(
    ("phase", "details", "sent"),
    [
        ("completed", {}, {"fine_tuning.job.succeeded", "studio.job.phase"}),
        ("error", {}, {"fine_tuning.job.failed", "studio.job.phase"}),
        ("stopped", {}, {"fine_tuning.job.cancelled", "studio.job.phase"}),
        ("stopped", {"paused": True}, {"studio.job.phase"}),  # a pause is not an end
        ("stopped", {"pruned": True}, {"studio.job.phase"}),  # nor is a pruned trial cancelled
        ("training", {}, {"studio.job.phase"}),
    ],
)
def test_a_training_status_sends_exactly_its_events(phase: str, details: dict, sent: set) -> None:  # type: ignore[type-arg]
    from finetune_studio.jobs.webhooks import EVENTS

    assert {name for name, event in EVENTS.items() if event.kind == "train" and event.sent_by(phase, details)} == sent
