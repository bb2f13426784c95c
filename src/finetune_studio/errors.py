"""The error tree. One root; the API maps each branch to an HTTP answer in one handler.

    StudioError                      (500)
    +-- JobNotFound                  (404) no job has this id
    +-- JobAlreadyFinished           (409) stop or change asked of a finished job
    +-- StartRefused                 (400) a well-formed request the server cannot take
    |   +-- PathNotAllowed           (403) a path outside the configured roots, on an exposed server
    |   +-- QueueFull                (429) too many jobs waiting
    +-- InvalidTransition            (409) a phase change that the state machine forbids
    +-- UnsafeSettings               (never answered: the server refuses to start)
"""

from __future__ import annotations


class StudioError(Exception):
    status_code = 500


class JobNotFound(StudioError):
    status_code = 404

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class JobAlreadyFinished(StudioError):
    status_code = 409


class StartRefused(StudioError):
    status_code = 400


class PathNotAllowed(StartRefused):
    status_code = 403


class QueueFull(StartRefused):
    status_code = 429


class InvalidTransition(StudioError):
    status_code = 409


class UnsafeSettings(StudioError):
    """Settings that would expose the server to the network without protection."""
