"""What needs CUDA and bitsandbytes: 4-bit loading (QLoRA) and the 8-bit optimizers.

Plain Python, for both sides, so that what the server recommends and what the child
does cannot disagree: `GET /system` recommends the fields that suit the server's
machine (`recommended_settings`), the CLI sends `CPU_SETTINGS` to a server on a
machine without an NVIDIA GPU, and the training child falls back from what its
machine cannot run (`bitsandbytes_works`, `usable_optim`), with a warning.
"""

from __future__ import annotations

from typing import Any

# torch's own AdamW: runs on any machine.
FALLBACK_OPTIM = "adamw_torch"
# bitsandbytes' 8-bit AdamW: less memory for the optimizer's state, on CUDA only.
EIGHT_BIT_OPTIM = "adamw_8bit"


def bitsandbytes_works(cuda: bool, bitsandbytes: bool) -> bool:
    """Whether bitsandbytes' 4-bit loading and 8-bit optimizers run here: CUDA, and the package installed."""
    return cuda and bitsandbytes


def usable_optim(optim: str, cuda: bool, bitsandbytes: bool) -> str:
    """`optim`, or torch's AdamW where `optim` is an 8-bit optimizer this machine cannot run."""
    if "8bit" in optim and not bitsandbytes_works(cuda, bitsandbytes):
        return FALLBACK_OPTIM
    return optim


def recommended_settings(cuda: bool, bitsandbytes: bool) -> dict[str, Any]:
    """The request fields that suit a machine: 4-bit loading and the 8-bit optimizer only where they run."""
    works = bitsandbytes_works(cuda, bitsandbytes)
    return {"load_in_4bit": works, "optim": EIGHT_BIT_OPTIM if works else FALLBACK_OPTIM}


# What a machine without CUDA should send, so that its job has no fallback warnings.
CPU_SETTINGS: dict[str, Any] = recommended_settings(cuda=False, bitsandbytes=False)
