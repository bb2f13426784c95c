"""The SQLite store: guarded transitions, the event log, and durability across connections."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from finetune_studio.errors import InvalidTransition, JobNotFound
from finetune_studio.jobs.phases import ALLOWED_FROM, PHASES, TERMINAL, can_enter
from finetune_studio.jobs.service import make_status
from finetune_studio.jobs.store import MIGRATIONS, JobStore


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "studio.db")


def new_job(store: JobStore, job_id: str = "j1") -> None:
    store.create_job(job_id, {"model_name": "m"}, "/out", make_status(job_id, "idle", "Queued"))


def test_the_database_is_wal_and_migrated(store: JobStore, tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "studio.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_job_walks_the_seed_order_and_every_change_is_an_event(store: JobStore) -> None:
    new_job(store)
    for phase in ["loading_model", "loading_dataset", "configuring", "training"]:
        store.transition("j1", make_status("j1", phase, phase))
    assert store.append_progress("j1", {"step": 1}) is not None
    store.transition("j1", make_status("j1", "completed", "done"))
    events = store.events_after("j1", 0)
    assert [e.id for e in events] == [1, 2, 3, 4, 5, 6, 7]
    assert [e.kind for e in events] == ["status"] * 5 + ["progress", "status"]
    assert events[-1].is_terminal_status
    job = store.get_job("j1")
    assert job.phase == "completed" and job.last_event_id == 7 and job.progress == {"step": 1}


def test_forbidden_transitions_are_refused_and_change_nothing(store: JobStore) -> None:
    new_job(store)
    with pytest.raises(InvalidTransition, match="cannot go from idle to training"):
        store.transition("j1", make_status("j1", "training", "x"))
    store.transition("j1", make_status("j1", "stopped", "x"))
    for phase in PHASES:
        if phase != "idle":
            with pytest.raises(InvalidTransition):
                store.transition("j1", make_status("j1", phase, "x"))
    assert store.get_job("j1").phase == "stopped"
    assert len(store.events_after("j1", 0)) == 2


def test_progress_is_only_taken_while_training(store: JobStore) -> None:
    new_job(store)
    assert store.append_progress("j1", {"step": 1}) is None
    assert store.events_after("j1", 0)[-1].kind == "status"


def test_the_transition_table_matches_the_phase_diagram() -> None:
    # The one edge out of a terminal phase is resume (stopped -> idle; the store lets only a paused job take it).
    exits = {(t, target) for t in TERMINAL for target in ALLOWED_FROM if can_enter(target, t)}
    assert exits == {("stopped", "idle")}
    assert can_enter("error", "idle") and can_enter("stopped", "training")
    assert not can_enter("completed", "configuring")


def test_unknown_jobs_raise_job_not_found(store: JobStore) -> None:
    with pytest.raises(JobNotFound):
        store.get_job("nope")
    with pytest.raises(JobNotFound):
        store.transition("nope", make_status("nope", "error", "x"))


def test_state_survives_a_new_connection(store: JobStore, tmp_path: Path) -> None:
    new_job(store, "a")
    new_job(store, "b")
    store.transition("a", make_status("a", "loading_model", "x"))
    store.close()
    reopened = JobStore(tmp_path / "studio.db")
    assert [j.id for j in reopened.list_jobs()] == ["b", "a"]
    assert reopened.queued_job_ids() == ["b"]
    assert [j.id for j in reopened.unfinished_jobs()] == ["a", "b"]


def test_events_after_pages(store: JobStore) -> None:
    new_job(store)
    for phase in ["loading_model", "loading_dataset", "configuring", "training"]:
        store.transition("j1", make_status("j1", phase, phase))
    for step in range(1, 11):
        store.append_progress("j1", {"step": step})
    assert [e.id for e in store.events_after("j1", 3, limit=4)] == [4, 5, 6, 7]
    assert store.events_after("j1", 15) == []
