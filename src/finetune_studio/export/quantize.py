"""Quantizing a GGUF file with llama.cpp's own `llama_model_quantize`, in a process of its own.

`quantize_file` (the export child's side) runs
`python -m finetune_studio.export.quantize SOURCE TARGET NAME`, whose `main` calls
`llama_model_quantize` with llama.cpp's log sent to stdout (`llama_log_set`): one
line per tensor, `[  12/ 272] blk.0.attn_q.weight - [...], type = f16, converting to
q5_0 .. size = ...`, which the child reads as progress. Run apart so that a stop
ends it at once; the C call itself cannot be interrupted. Its process imports nothing
of the studio but this module.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from finetune_studio.child.channel import StopSignal

# llama.cpp's `llama_ftype` for each name of schemas.GgufQuantization (llama.h).
FTYPES = {"f16": 1, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "bf16": 32}

_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize_file(
    source: Path,
    target: Path,
    name: str,
    *,
    stop: StopSignal,
    on_tensor: Callable[[int, int, str], None],
) -> None:
    """Write target, source quantized to `name`; on_tensor(done, total, tensor) per tensor."""
    # Imported here: the quantizer's own process (`main`) needs only llama_cpp, and starts
    # once per file, so it spares itself pydantic's models (0.2 s a start).
    from finetune_studio.atomic import write_atomically
    from finetune_studio.export.process import run_tool

    def on_line(line: str) -> None:
        match = _TENSOR_LINE.match(line)
        if match:
            on_tensor(int(match.group(1)), int(match.group(2)), match.group(3))

    with write_atomically(target) as partial:
        run_tool(
            f"llama_model_quantize ({name})",
            [sys.executable, "-m", "finetune_studio.export.quantize", str(source), str(partial), name],
            output=partial,
            stop=stop,
            on_line=on_line,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


# -- the quantizer process -------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[2] not in FTYPES:
        print(f"usage: python -m finetune_studio.export.quantize SOURCE TARGET {{{','.join(FTYPES)}}}", file=sys.stderr)
        return 2
    source, target, name = args
    import llama_cpp

    def log(level: int, text: bytes, user_data: Any) -> None:
        sys.stdout.write(text.decode("utf-8", "replace"))
        sys.stdout.flush()

    callback = llama_cpp.llama_log_callback(log)  # kept referenced while llama.cpp may call it
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[name]
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if status != 0:
        # llama.cpp says little about a failed write: name the likely cause when it is that.
        free = shutil.disk_usage(Path(target).parent).free
        if free < 16 * 1024 * 1024:
            print(f"No space left on device ({free} bytes free in {Path(target).parent})", flush=True)
        print(f"llama_model_quantize returned {status}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
