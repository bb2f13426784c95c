"""`finetune-studio export JOB_ID --merged DIR`: a merged 16-bit model that loads anywhere.

The merge itself lives with the export child (`finetune_studio.export.merge`), so the
command and the server's exports merge the same way; this module finds the job.
"""

from __future__ import annotations

from pathlib import Path

from finetune_studio.export.merge import MergeError as ExportError
from finetune_studio.export.merge import export_merged
from finetune_studio.wire import DataDir, JobFolder

__all__ = ["ExportError", "export_merged", "find_job_dir"]


def find_job_dir(job: str, data_dir: Path) -> Path:
    """A job id under data_dir/jobs, or a job folder given by path."""
    for candidate in (Path(job).expanduser(), DataDir(data_dir).job(job)):
        if JobFolder(candidate).job_file.is_file():
            return candidate
    raise ExportError(
        f"no trained job {job!r}: expected {JobFolder(DataDir(data_dir).job(job)).job_file} (a job writes it once it starts"
        " training); pass --data-dir if the server uses another data directory"
    )
