"""Whether this machine computes in bf16 natively, and which precision a job runs in.

Plain Python, for both sides: the server's `GET /system` reports what the CPU has
(it never imports torch), and the training and chat children decide their dtype
by the same rule (`choose_precision`), so the page and the job cannot disagree.

The CPU's bf16 is native when its flags (/proc/cpuinfo) name AMX (`amx_bf16`, Intel
Sapphire Rapids and later) or AVX512-BF16 (`avx512_bf16`, Intel Cooper Lake and
later, AMD Zen 4 and later): there a bf16 matmul runs several times faster than an
fp32 one. Elsewhere torch emulates bf16 and autocast is slower than fp32 (pytorch
#86270), so `auto` trains in fp32 there. A GPU's bf16 is CUDA's to say (the child
asks torch: compute capability 8.0 and later).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

# The one spelling of the precision a job or the chat child asks for (docs/API.md, docs/SETTINGS.md).
Precision = Literal["auto", "bf16", "fp32"]
Dtype = Literal["bf16", "fp32"]
CpuBf16Kind = Literal["amx", "avx512_bf16", "none"]

CPUINFO = Path("/proc/cpuinfo")
# The flags that make bf16 native, best first, and how a person reads each.
BF16_FLAGS: tuple[tuple[str, CpuBf16Kind, str], ...] = (
    ("amx_bf16", "amx", "AMX"),
    ("avx512_bf16", "avx512_bf16", "AVX512-BF16"),
)


@dataclass(frozen=True)
class CpuBf16:
    """What the CPU offers for bf16: `kind` (amx, avx512_bf16 or none), the flags found
    that say so, and the CPU's model name (None where /proc/cpuinfo does not say)."""

    kind: CpuBf16Kind
    flags: tuple[str, ...]
    model: Optional[str]

    @property
    def native(self) -> bool:
        return self.kind != "none"

    def describe(self) -> str:
        """'the CPU has AMX (amx_bf16)', or why it has no native bf16."""
        if not self.native:
            return "the CPU has neither AMX nor AVX512-BF16 (no amx_bf16 or avx512_bf16 flag)"
        words = {flag: name for flag, _, name in BF16_FLAGS}
        return "the CPU has " + " and ".join(f"{words[flag]} ({flag})" for flag in self.flags)


def read_cpuinfo(path: Optional[Path] = None) -> tuple[frozenset[str], Optional[str]]:
    """(the first processor's flags, its model name) from /proc/cpuinfo (or `path`);
    empty and None where the file cannot be read (not Linux)."""
    try:
        text = (path or CPUINFO).read_text(errors="replace")
    except OSError:
        return frozenset(), None
    flags: frozenset[str] = frozenset()
    model: Optional[str] = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:  # x86's flags, ARM's features
            flags = frozenset(value.split())
        elif key == "model name" and model is None:
            model = value.strip() or None
        if flags and model is not None:
            break
    return flags, model


def detect_cpu_bf16(path: Optional[Path] = None) -> CpuBf16:
    """The one rule for a CPU's native bf16: its flags name AMX or AVX512-BF16."""
    flags, model = read_cpuinfo(path)
    found = [(flag, kind) for flag, kind, _ in BF16_FLAGS if flag in flags]
    kind: CpuBf16Kind = found[0][1] if found else "none"
    return CpuBf16(kind=kind, flags=tuple(flag for flag, _ in found), model=model)


@dataclass(frozen=True)
class PrecisionChoice:
    """The dtype a job computes in, what was asked, and why (`details.precision`);
    `warning` when what was asked is done but costs (bf16 without native support)
    or cannot be done (bf16 on a GPU without it)."""

    dtype: Dtype
    asked: Precision
    reason: str
    warning: Optional[str] = None

    def to_json(self) -> dict[str, str]:
        return {"dtype": self.dtype, "asked": self.asked, "reason": self.reason}


def choose_precision(
    asked: Precision,
    *,
    cuda: bool,
    cuda_bf16: bool = False,
    cpu: Optional[CpuBf16] = None,
    torch_cpu_bf16: Optional[bool] = None,
) -> PrecisionChoice:
    """The precision to compute in. `auto`: bf16 where it is native (a GPU with bf16, a
    CPU with AMX or AVX512-BF16 whose torch can use it), else fp32; `bf16` and `fp32`
    force it (bf16 on a CPU without native support is slower, and said so; a GPU
    without bf16 falls back to fp32). `cpu` defaults to this machine's
    (`detect_cpu_bf16`); `torch_cpu_bf16` is torch's own answer where the caller has
    one (False: this torch build has no fast bf16 kernels for the CPU)."""
    if asked == "fp32":
        return PrecisionChoice("fp32", asked, "precision fp32 was asked for")
    if cuda:
        if cuda_bf16:
            why = "precision bf16 was asked for" if asked == "bf16" else "the GPU supports bf16"
            return PrecisionChoice("bf16", asked, why)
        if asked == "bf16":
            return PrecisionChoice("fp32", asked, "the GPU does not support bf16",
                                   warning="precision bf16: this GPU does not support bf16; the job computes in fp32")
        return PrecisionChoice("fp32", asked, "the GPU does not support bf16")
    found = cpu if cpu is not None else detect_cpu_bf16()
    native = found.native and torch_cpu_bf16 is not False
    if found.native and torch_cpu_bf16 is False:
        what = f"{found.describe()}, but this torch build has no bf16 kernels for it"
    else:
        what = found.describe()
    if asked == "bf16":
        warning = None if native else (
            f"precision bf16: {what}, so bf16 is emulated and slower than fp32 here; precision auto would use fp32")
        return PrecisionChoice("bf16", asked, f"precision bf16 was asked for ({what})", warning=warning)
    return PrecisionChoice("bf16" if native else "fp32", asked, what if native else f"{what}: fp32 is faster here")
