"""The baseline of bench/export.py: a GGUF export done by hand, as a user would script it.

    python bench/export_by_hand.py JOB_DIR OUT_DIR q8_0,q4_k_m

peft's merge_and_unload, save_pretrained in float16, llama.cpp's convert_hf_to_gguf.py
to f16, then llama_model_quantize once per type, in this process. No events, no
progress, no checks, no atomic renames: the least a working script does.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path


def main() -> None:
    job, out, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
    import llama_cpp
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_studio.export.quantize import FTYPES
    from finetune_studio.export.tools import find_tools

    record = json.loads((job / "job.json").read_text())
    base_dir = record["base_model"]["location"]  # a model folder (the bench trains from one)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(job / "adapter")).merge_and_unload()
    merged = out / "merged"
    model.to(torch.float16).save_pretrained(str(merged), safe_serialization=True)
    tokenizer.save_pretrained(str(merged))

    tools = find_tools()
    f16 = out / "model-f16.gguf"
    subprocess.run(
        [sys.executable, str(tools.convert_hf), str(merged), "--outtype", "f16", "--outfile", str(f16)],
        check=True, env={**os.environ, "PYTHONPATH": str(tools.gguf_py)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    silence = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(silence, ctypes.c_void_p(0))
    for name in names:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[name]
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(out / f"model-{name}.gguf").encode(), ctypes.byref(params)) != 0:
            raise SystemExit(f"quantizing to {name} failed")


if __name__ == "__main__":
    main()
