"""GET /system: what this machine can train with, for the page's defaults.

CPU count, memory, whether a GPU and CUDA are there, whether bitsandbytes is
installed, and the versions of the training libraries. All of it is found without
importing torch (the server never does): package metadata (`importlib.metadata`:
versions, and the CUDA build in torch's version label or its `nvidia-*`
requirements), NVIDIA's driver files under /proc/driver/nvidia, and `nvidia-smi`
on PATH. Found once per server, on the first request, and kept: none of it
changes while the server runs.

`recommended` is what the start form should ask for here: no 4-bit loading and no
8-bit optimizer where CUDA and bitsandbytes are not both present (the training
child would fall back and warn about options the user never chose).

`cpu` says whether the CPU computes bf16 natively (AMX or AVX512-BF16, from the
flags in /proc/cpuinfo: `finetune_studio.hardware`, the rule the training and chat
children decide their precision by).

`ray` says whether jobs run on a Ray cluster (the server's settings, not the
machine): the page offers `num_workers` and `resources_per_worker` only then.
Nothing of Ray is imported to say so.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Optional

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import studio_of
from finetune_studio.config import Settings
from finetune_studio.cuda_features import recommended_settings
from finetune_studio.hardware import CpuBf16Kind, detect_cpu_bf16
from finetune_studio.uris import is_uri, redacted

router = APIRouter(prefix="/system", tags=["system"], route_class=AuthorizedRoute)

LIBRARIES = ("torch", "transformers", "peft", "trl", "bitsandbytes")
NVIDIA_DRIVER = Path("/proc/driver/nvidia")
MEMINFO = Path("/proc/meminfo")


class GpuInfo(BaseModel):
    name: str
    bus: Optional[str] = None


class Recommended(BaseModel):
    """Request fields the page should default to on this machine."""

    load_in_4bit: bool
    optim: str


class CpuInfo(BaseModel):
    """The CPU's bf16, as the training child's `precision: auto` reads it."""

    model: Optional[str] = Field(default=None, description="The CPU's model name from /proc/cpuinfo; null where unknown.")
    bf16: CpuBf16Kind = Field(
        description="amx (amx_bf16), avx512_bf16, or none: what gives this CPU native bf16 (AMX is preferred when both are there)."
    )
    bf16_flags: list[str] = Field(description="The bf16 flags found: amx_bf16, avx512_bf16 (empty: neither).")
    native_bf16: bool = Field(
        description="bf16 is native here: precision auto trains (and the chat child answers) in bf16 on this CPU."
    )


class RayInfo(BaseModel):
    """The Ray cluster this server runs training jobs on."""

    address: str = Field(description="The cluster's address as the server was given it (`auto`, ray://HOST:10001, HOST:6379).")
    max_failures: int = Field(description="Times Ray Train restarts a job from its last checkpoint after losing a worker.")
    storage: Optional[str] = Field(
        default=None,
        description="The URI a job's files travel through (without keys or query), when the setting is one; null: a"
        " folder every node shares.",
    )


class SystemInfo(BaseModel):
    platform: str = Field(description="The operating system and machine, e.g. Linux x86_64.")
    python: str
    cpu_count: int = Field(description="CPUs this server may use.")
    cpu: CpuInfo = Field(description="The CPU's model and its bf16 (AMX, AVX512-BF16 or neither).")
    memory_bytes: Optional[int] = Field(default=None, description="The machine's memory; null where unknown.")
    memory_available_bytes: Optional[int] = None
    nvidia_driver: Optional[str] = Field(default=None, description="The NVIDIA kernel driver's version, when loaded.")
    nvidia_smi: bool = Field(description="Whether nvidia-smi is on PATH.")
    gpus: list[GpuInfo] = Field(default_factory=list, description="GPUs the NVIDIA driver lists.")
    torch_cuda: Optional[str] = Field(
        default=None, description='The CUDA build of the installed torch ("cu128"), null for a CPU build or no torch.'
    )
    cuda: bool = Field(description="A GPU with its driver and a CUDA build of torch: training can use CUDA.")
    bitsandbytes: bool = Field(description="bitsandbytes is installed (4-bit loading, 8-bit optimizers).")
    versions: dict[str, Optional[str]] = Field(description="Installed versions of the training libraries (null: absent).")
    recommended: Recommended
    ray: Optional[RayInfo] = Field(
        default=None,
        description="The Ray cluster training jobs run on (num_workers and resources_per_worker are taken only then);"
        " null: jobs train in a process on this machine.",
    )


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _memory() -> tuple[Optional[int], Optional[int]]:
    """(total, available) bytes from /proc/meminfo, else from sysconf (total only)."""
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
        available = fields.get("MemAvailable")
        return total, int(available.split()[0]) * 1024 if available else None
    except (OSError, KeyError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    except (AttributeError, OSError, ValueError):
        return None, None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _driver() -> tuple[Optional[str], list[GpuInfo]]:
    """The NVIDIA driver's version and its GPUs, from the driver's own files."""
    try:
        text = (NVIDIA_DRIVER / "version").read_text(errors="replace")
    except OSError:
        return None, []
    found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
    version = found.group(1) if found else text.splitlines()[0].strip()[:80] if text.strip() else "unknown"
    gpus = []
    for info in sorted((NVIDIA_DRIVER / "gpus").glob("*/information")):
        try:
            lines = dict(line.split(":", 1) for line in info.read_text(errors="replace").splitlines() if ":" in line)
        except OSError:
            continue
        gpus.append(GpuInfo(name=lines.get("Model", "NVIDIA GPU").strip(), bus=info.parent.name))
    return version, gpus


def _torch_cuda() -> Optional[str]:
    """The CUDA build of torch from its metadata: "+cu128" in the version, or (PyPI's
    Linux wheels carry no label) the nvidia-* CUDA runtime among its requirements."""
    version = _version("torch")
    if version is None:
        return None
    label = version.partition("+")[2]
    if label:
        return label if label.startswith("cu") else None
    requirements = metadata.requires("torch") or []
    runtime = next((r for r in requirements if r.startswith("nvidia-cuda-runtime")), None)
    if runtime is None:
        return None
    found = re.search(r"cu(\d+)", runtime)
    return f"cu{found.group(1)}" if found else "cuda"


def ray_info(settings: Settings) -> Optional[RayInfo]:
    """The cluster from the settings; null without one."""
    if not settings.ray_address:
        return None
    path = settings.ray_storage_path
    # A folder (the default, a shared mount, file://) is shown as nothing; a URI without its keys.
    storage = redacted(path) if path and is_uri(path) else None
    return RayInfo(address=settings.ray_address, max_failures=settings.ray_max_failures, storage=storage)


def detect() -> SystemInfo:
    """Look at the machine (a few small file reads and metadata look-ups)."""
    total, available = _memory()
    driver, gpus = _driver()
    bf16 = detect_cpu_bf16()
    torch_cuda = _torch_cuda()
    cuda = driver is not None and torch_cuda is not None
    bnb = _version("bitsandbytes") is not None
    return SystemInfo(
        platform=f"{platform.system()} {platform.machine()}",
        python=platform.python_version(),
        cpu_count=_cpu_count(),
        cpu=CpuInfo(model=bf16.model, bf16=bf16.kind, bf16_flags=list(bf16.flags), native_bf16=bf16.native),
        memory_bytes=total,
        memory_available_bytes=available,
        nvidia_driver=driver,
        nvidia_smi=shutil.which("nvidia-smi") is not None,
        gpus=gpus,
        torch_cuda=torch_cuda,
        cuda=cuda,
        bitsandbytes=bnb,
        versions={name: _version(name) for name in LIBRARIES},
        recommended=Recommended.model_validate(recommended_settings(cuda, bnb)),
    )


@router.get("")
async def system_info(request: Request) -> SystemInfo:
    """This machine for training: CPUs (and their bf16), memory, GPUs and CUDA, bitsandbytes, library
    versions, the request defaults that suit it (`recommended`), and the Ray cluster jobs
    run on (`ray`, null without one). Found once, then kept."""
    state = request.app.state
    cached: Optional[SystemInfo] = getattr(state, "system_info", None)
    if cached is None:
        # Metadata look-ups read many small files: off the event loop.
        found = await asyncio.to_thread(detect)
        found.ray = ray_info(studio_of(request).settings)
        cached = state.system_info = found
    return cached
