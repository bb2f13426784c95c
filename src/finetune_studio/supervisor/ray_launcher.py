"""The launcher of training jobs on a Ray cluster (`serve --ray-address`, docs/SCALE-OUT.md).

It starts the job's Ray driver (`python -m finetune_studio.ray_train.driver`) as a
child process on this machine, exactly as the local launcher starts a training
child, and hands the supervisor the same kind of handle: the driver speaks the same
wire (spec and `stop` on stdin; status and progress lines on stdout), so stop,
escalation, a driver's death and restart recovery work unchanged. The driver, not
this process, imports ray and torch.
"""

from __future__ import annotations

from typing import Optional

from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import RAY_DRIVER_MODULE, LocalProcessLauncher


def ray_launcher(settings: Settings, python: Optional[str] = None) -> LocalProcessLauncher:
    """The launcher for `settings.ray_address` (which must be set)."""
    if not settings.ray_address:
        raise ValueError("ray_launcher needs settings.ray_address")
    args = (
        "--address", settings.ray_address,
        "--max-failures", str(settings.ray_max_failures),
        "--storage", settings.ray_storage,
    )
    return LocalProcessLauncher(python or settings.worker_python, module=RAY_DRIVER_MODULE, args=args)
