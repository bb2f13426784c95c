"""Restart recovery: what happens, on start-up, to the jobs the last server left behind.

No job may stay in a phase that nothing drives. For every job not in a terminal
phase:

- a child still alive (checked by pid and by its command line, so a reused pid is
  never killed) is killed, and waited for, so its memory is free before the next
  job starts;
- a queued job (`idle`) stays queued and runs in turn;
- a running job whose stop had been asked for ends `stopped`, as it would have
  had the server lived: the stop was the user's wish, and the child (which saw
  its stdin close) saved what it trained;
- any other running job ends `error` with `server_restarted`.

Either way the job's details name its last complete checkpoint (to resume from)
and any result a child saved as it went away.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
        if job.phase != "idle":
            _end(service, job)


def _end(service: JobService, job: JobRecord) -> None:
    folder = JobFolder(Path(job.output_dir))
    checkpoint = folder.last_checkpoint()
    details: dict[str, Any] = {"output_dir": job.output_dir, **folder.outputs()}
    if checkpoint is not None:
        details["last_checkpoint"] = str(checkpoint)
    if job.stop_requested:
        service.transition(
            job.id, "stopped", f"Stopped: the server went away while the job was stopping in {job.phase}", details=details
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
