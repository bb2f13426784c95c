"""Restart recovery: what happens, on start-up, to the jobs the last server left behind.

No job may stay in a phase that nothing drives. For every job not in a terminal
phase:

- a child still alive (checked by pid and by its command line, so a reused pid is
  never killed) is killed, and waited for, so its memory is free before the next
  job starts;
- a queued job (`idle`) stays queued and runs in turn;
- a running job whose stop had been asked for ends `stopped`, as it would have
  had the server lived: the stop was the user's wish, and the child (which saw
  its stdin close) saved what it trained; a pause that was asked for ends it
  paused (`details.paused`), so it can still be resumed;
- any other running job ends `error` with `server_restarted`.

Either way the job's details name its last complete checkpoint (to resume from)
and any result a child saved as it went away.

An evaluation ends the same way (`stopped` or `error` with `server_restarted`) and is
not requeued either.

An export is not requeued: it ends the same way (`stopped` if its stop had been
asked for, else `error` with `server_restarted`), and every file its child had
begun is removed (`remove_export_files`), so nothing half-written is left or
served. Exporting again is one request; a requeued export would redo the same
work from the start anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobRecord
from finetune_studio.supervisor.launcher import is_our_worker
from finetune_studio.wire import JobFolder

log = logging.getLogger("finetune_studio.supervisor")

_ORPHAN_EXIT_SECONDS = 5.0


def recover_jobs(service: JobService) -> None:
    """End every job that was running when the server last went away."""
    for job in service.store.unfinished_jobs():
        if job.worker_pid:
            _kill_orphan(job.worker_pid, job.id)
            service.set_worker(job.id, None)
        if job.phase == "idle":
            continue
        if job.kind == "export":
            _end_export(service, job)
        elif job.kind == "eval":
            _end_eval(service, job)
        else:
            _end(service, job)


def remove_export_files(folder: Path) -> None:
    """Remove everything in an export's folder but its worker.log: what an export
    that did not complete had begun writing (a child killed mid-file cannot)."""
    if not folder.is_dir():
        return
    keep = JobFolder(folder).log
    for path in folder.iterdir():
        if path == keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _end_export(service: JobService, job: JobRecord) -> None:
    """An export that was running: its unfinished files removed, then ended as `_end_unrequeued` says."""
    remove_export_files(Path(job.output_dir))
    _end_unrequeued(service, job, "export", "; its unfinished files were removed. Start the export again"
                    " (POST /export/start with the same job_id and format).")


def _end_eval(service: JobService, job: JobRecord) -> None:
    """An evaluation that was running: its answers were the dead server's to keep."""
    _end_unrequeued(service, job, "evaluation", ". Start it again (POST /eval/start with the same models and suites);"
                    " nothing of this one was kept.")


def _end_unrequeued(service: JobService, job: JobRecord, what: str, advice: str) -> None:
    """An export or evaluation the server left running, not queued again: as a training job, `stopped`
    if its stop had been asked for, else `error` with `server_restarted` and `advice`."""
    details: dict[str, Any] = {"output_dir": job.output_dir}
    if job.stop_requested:
        service.transition(job.id, "stopped", f"Stopped: the server went away while the {what} was stopping in {job.phase}",
                           details=details)
        return
    service.transition(
        job.id,
        "error",
        f"The server stopped while this {what} was running",
        error=f"The server stopped while this {what} was in {job.phase}{advice}",
        details={**details, "error_code": "server_restarted"},
    )


def _end(service: JobService, job: JobRecord) -> None:
    folder = JobFolder(Path(job.output_dir))
    checkpoint = folder.last_checkpoint()
    details: dict[str, Any] = {"output_dir": job.output_dir, **folder.outputs()}
    if checkpoint is not None:
        details["last_checkpoint"] = str(checkpoint)
    if job.stop_requested:
        what = "pausing" if job.pause_requested else "stopping"
        if job.pause_requested:
            details["paused"] = True  # the pause was asked for: the job stays resumable
        service.transition(
            job.id, "stopped", f"Stopped: the server went away while the job was {what} in {job.phase}", details=details
        )
        return
    if checkpoint is not None:
        kept = f"Its last checkpoint is {checkpoint}. Start it again with resume_from_checkpoint {job.id!r} to go on"
    else:
        kept = "It had saved no checkpoint yet. Start the job again to train it"
    service.transition(
        job.id,
        "error",
        "The server stopped while this job was running",
        error=f"The server stopped while this job was in {job.phase}; its files stay in {job.output_dir}. {kept}.",
        details={**details, "error_code": "server_restarted"},
    )


def _kill_orphan(pid: int, job_id: str) -> None:
    if not is_our_worker(pid, job_id):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    log.warning("killed orphaned worker %s of job %s", pid, job_id)
    deadline = time.monotonic() + _ORPHAN_EXIT_SECONDS
    while is_our_worker(pid, job_id) and time.monotonic() < deadline:
        time.sleep(0.01)
