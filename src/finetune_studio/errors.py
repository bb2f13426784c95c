"""The error tree. One root; the API maps each branch to an HTTP answer in one handler.

    StudioError                      (500)
    +-- JobNotFound                  (404) no job has this id
    +-- JobAlreadyFinished           (409) stop or change asked of a finished job
    +-- JobNotFinished               (409) delete asked of a job that is queued or running
    +-- StartRefused                 (400) a well-formed request the server cannot take
    |   +-- PathNotAllowed           (403) a path outside the configured roots, on an exposed server
    |   +-- QueueFull                (429) too many jobs waiting
    +-- WebhookNotFound              (404) no webhook has this id
    +-- WebhookRefused               (400, 403 a target the server may not reach) a registration it will not take
    +-- InvalidTransition            (409) a phase change that the state machine forbids
    +-- PastLastEvent                (416) a Last-Event-ID beyond the job's last event
    +-- InspectionBusy               (429) as many dataset inspections running as the server allows
    +-- InspectionFailed             (503) a dataset inspection's process died or ran out of time
    +-- StorageFailed                (507 disk full, 503 otherwise) a write of the server's own failed
    +-- OpenAIError                  (OpenAI's error shape, under /v1/: chat, files, fine-tuning jobs)
    |   +-- ModelNotFound            (404) no model, or a job with nothing to serve yet
    |   +-- InvalidChatRequest       (400) a bad parameter, named by `param`
    |   +-- InferenceUnavailable     (503) the inference process died or could not start
    |   +-- InvalidFile              (400) an uploaded file unfit for its purpose, naming its bad lines
    |   |   +-- FileTooLarge         (413) an uploaded file over max_file_bytes
    |   +-- FileNotFound             (404) no stored file has this id
    |   +-- NotPausable              (409) pause or resume asked of a job in a phase that has none
    +-- UnsafeSettings               (never answered: the server refuses to start)
    +-- DataDirInUse                 (never answered: another server owns the data dir)
"""

from __future__ import annotations

from typing import Optional


class StudioError(Exception):
    status_code = 500


class JobNotFound(StudioError):
    status_code = 404

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class JobAlreadyFinished(StudioError):
    status_code = 409


class JobNotFinished(StudioError):
    status_code = 409


class Refused(StudioError):
    """A request refused for what it holds; `field`, when known, names the request field at
    fault, so a form can show the error beside that field. `status_code` may say more than 400
    (a target the server may not reach: 403)."""

    status_code = 400

    def __init__(self, message: str, *, field: Optional[str] = None, status_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.field = field
        if status_code is not None:
            self.status_code = status_code


class StartRefused(Refused):
    """A start refused: the answer has the shape of a start's (`job_id`, `status`, `error`)."""


class PathNotAllowed(StartRefused):
    status_code = 403


class QueueFull(StartRefused):
    status_code = 429


class SweepNotFound(StudioError):
    status_code = 404

    def __init__(self, sweep_id: str) -> None:
        super().__init__(f"no sweep with id {sweep_id!r}")


class SweepRefused(Refused):
    """A sweep the server will not create (400), naming the field at fault: a space that can
    make an invalid training request, a pruner on an objective no trial reports, ..."""


class WebhookNotFound(StudioError):
    status_code = 404

    def __init__(self, webhook_id: str) -> None:
        super().__init__(f"no webhook {webhook_id!r}: GET /webhooks lists them")


class WebhookRefused(Refused):
    """A registration this server will not take: 400, or 403 for a target the server may not
    reach (outbound.py)."""


class InvalidTransition(StudioError):
    status_code = 409


class PastLastEvent(StudioError):
    """A stream asked to resume after an event the job never had (a client that
    talked to another server, or whose data dir was replaced)."""

    status_code = 416

    def __init__(self, job_id: str, asked: int, last: int) -> None:
        super().__init__(
            f"Last-Event-ID {asked} is past the end of job {job_id}'s events: its last event is {last}."
            f" Resume with Last-Event-ID {last} or lower (0, or none, replays every event)"
        )
        self.last_event_id = last


class InspectionBusy(StudioError):
    status_code = 429


class InspectionFailed(StudioError):
    status_code = 503


class StorageFailed(StudioError):
    """A write of the server's (its database, an upload, a job's folder) failed for a
    reason outside the request: `error_code` (finetune_studio.failures) says which, the
    message what to do. A full disk is 507 Insufficient Storage; anything else 503. Answered with
    `x-should-retry: false`: a client's blind retry (the openai SDK retries every 5xx)
    would only send the same bytes again to a disk that cannot take them."""

    def __init__(self, error_code: str, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code  # disk_full | storage_unavailable
        self.status_code = 507 if error_code == "disk_full" else 503


class UnsafeSettings(StudioError):
    """Settings that would expose the server to the network without protection."""


class DataDirInUse(StudioError):
    """Another server holds the data directory's lock: two servers on one data dir
    would kill each other's children and run the same queued jobs twice."""


class OpenAIError(StudioError):
    """An error of the OpenAI-compatible routes (chat, files, fine-tuning jobs): answered as
    `{"error": {message, type, param, code}}`."""

    error_type = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class ModelNotFound(OpenAIError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model")


class InvalidChatRequest(OpenAIError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request_error"


class InferenceUnavailable(OpenAIError):
    status_code = 503
    code = "inference_unavailable"


class InvalidFile(InvalidChatRequest):
    """A file for /v1/files (or a page upload) that does not fit its purpose; the
    message names the bad lines, `param` the form field (`file` or `purpose`)."""

    code = "invalid_file"


class FileTooLarge(InvalidFile):
    """An upload over `max_file_bytes` (413), however it was noticed: by its declared
    length, by the body's size as it is read, or by the file's as it is copied."""

    status_code = 413
    code = "file_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the file is over this server's limit of {limit} bytes per file (the operator sets it with"
            " FINETUNE_STUDIO_MAX_FILE_BYTES); split the file",
            param="file",
        )


class FileNotFound(OpenAIError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "file_not_found"

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message, param=param)


class NotPausable(OpenAIError):
    """Pause of a job that is not queued or running, or resume of one that is not paused."""

    status_code = 409
    error_type = "invalid_request_error"
    code = "invalid_state"
