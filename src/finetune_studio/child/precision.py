"""The precision a child computes in, decided by `hardware.choose_precision` with what
torch says of this process's devices: the training recipe's dtype and autocast, and
the chat child's dtype (inference/models.py).

The flags rule (AMX or AVX512-BF16 in /proc/cpuinfo) lives in `finetune_studio.hardware`,
shared with `GET /system`; torch only adds what the flags cannot know: whether CUDA is
there and has bf16, and whether this torch build has bf16 kernels for the CPU at all.
"""

from __future__ import annotations

from typing import Any, Optional

from finetune_studio.hardware import Precision, PrecisionChoice, choose_precision


def torch_cpu_bf16() -> Optional[bool]:
    """False when this torch build cannot run bf16 fast on the CPU (no oneDNN, or oneDNN
    without bf16 for this CPU); None when it does not say. True is not proof of native
    bf16 (oneDNN emulates it on any AVX512 CPU): the flags decide that."""
    import torch

    try:
        if not torch.backends.mkldnn.is_available():
            return False
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def decide_precision(asked: Precision) -> PrecisionChoice:
    """The precision for this process: on CUDA when torch sees a GPU, else on the CPU."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        return choose_precision(asked, cuda=True, cuda_bf16=bool(torch.cuda.is_bf16_supported()))
    return choose_precision(asked, cuda=False, torch_cpu_bf16=torch_cpu_bf16())


def torch_dtype(choice: PrecisionChoice) -> Any:
    """torch's dtype of a choice."""
    import torch

    return torch.bfloat16 if choice.dtype == "bf16" else torch.float32
