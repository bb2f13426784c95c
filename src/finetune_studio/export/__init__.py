"""The export child: merge an adapter, convert to GGUF and quantize with llama.cpp's own tools.

Modules, each one idea:

- `tools`: where llama.cpp's converter scripts live, and how to install them (cheap to
  import: the server asks `tools_problem()` at admission).
- `merge`: an adapter merged into its base, saved as 16-bit safetensors.
- `convert`: llama.cpp's `convert_hf_to_gguf.py` / `convert_lora_to_gguf.py`, run as
  subprocesses, their per-tensor log read as progress.
- `quantize`: `llama_model_quantize` in a subprocess of its own (stoppable), its
  per-tensor log read as progress.
- `modelfile`: the Ollama `Modelfile` written beside a GGUF file.
- `files`: single files written under a partial name and renamed; their listing.
- `child`: `python -m finetune_studio.export.child --job-id ID`, the wire and the phases.
"""
