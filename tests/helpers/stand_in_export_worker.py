"""A stand-in export child: speaks the export wire (docs/PROCESSES.md, The job wire), converts nothing.

    python -m tests.helpers.stand_in_export_worker --job-id EXPORT_ID

It walks the phases its request's format takes (jobs/phases.py), writes each file
it would write as `.NAME.partial` in FAKE_EXPORT_CHUNKS chunks (one progress event
each) and renames it when complete, then reports `completed` with `details.files`
(name, format, quantization, bytes, sha256), a GGUF export's Modelfile included.
Asked to stop (or on EOF), it removes what it wrote and reports `stopped`. The
environment shapes it:

    FAKE_EXPORT_STEP_S   seconds per chunk (default 0)
    FAKE_EXPORT_CHUNKS   chunks per file (default 4)
    FAKE_EXPORT_CHUNK    bytes per chunk (default 4096)
    FAKE_EXPORT_GO       a file: the worker waits for it to exist before its first chunk
    FAKE_EXPORT_FAIL     an error code (disk_full, say): it fails so after its first chunk
    FAKE_EXPORT_DIE      when set, it exits with code 3 after its first chunk, reporting nothing
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from finetune_studio.atomic import partial_path
from tests.helpers.stand_in_wire import begin, send


def status(phase: str, message: str = "", error: str | None = None, **details: Any) -> None:
    send({"type": "status", "phase": phase, "message": message or phase, "error": error, "details": details})


def plan(request: dict[str, Any]) -> tuple[list[tuple[str, str, str | None]], set[str]]:
    """(stage, file name, quantization) for each file the export writes, in order, and
    the names of those that are only steps on the way (removed before it completes)."""
    fmt = request["format"]
    if fmt == "merged_16bit":
        return [("merging", "merged/model.safetensors", None), ("merging", "merged/config.json", None)], set()
    if fmt == "lora_gguf":
        quant = request["quantizations"][0]
        return [("converting", f"adapter-{quant}.gguf", quant)], set()
    # gguf: merge, convert to f16 (kept only if asked for), then the other conversions and quantizations.
    files: list[tuple[str, str, str | None]] = [("merging", "merged/model.safetensors", None)]
    files.append(("converting", "model-f16.gguf", "f16"))
    steps = {"merged/model.safetensors"} | ({"model-f16.gguf"} if "f16" not in request["quantizations"] else set())
    for quant in request["quantizations"]:
        if quant != "f16":
            files.append(("converting" if quant == "bf16" else "quantizing", f"model-{quant}.gguf", quant))
    # Conversions first (the phase table has no edge back from quantizing).
    order = ["merging", "converting", "quantizing"]
    return sorted(files, key=lambda item: order.index(item[0])), steps


def main() -> int:
    spec, stop = begin()
    request = spec["request"]
    folder = Path(spec["output_dir"])
    pause = float(os.environ.get("FAKE_EXPORT_STEP_S", "0"))
    chunks = int(os.environ.get("FAKE_EXPORT_CHUNKS", "4"))
    chunk = int(os.environ.get("FAKE_EXPORT_CHUNK", "4096"))
    go = os.environ.get("FAKE_EXPORT_GO")
    status("loading_model", source_dir=request["source_dir"])
    while go and not Path(go).exists() and not stop.is_set():
        time.sleep(0.01)
    files, steps = plan(request)
    written: list[dict[str, Any]] = []
    stage = ""
    total = len(files) * chunks
    for index, (file_stage, name, quant) in enumerate(files):
        if file_stage != stage:
            stage = file_stage
            status(stage)
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(target)
        digest = hashlib.sha256()
        with open(partial, "wb") as handle:
            for n in range(chunks):
                if stop.is_set():
                    break
                data = bytes((index * 31 + n * 7 + i) % 251 for i in range(chunk))
                handle.write(data)
                handle.flush()
                digest.update(data)
                done = index * chunks + n + 1
                send({"type": "progress", "progress": {"stage": stage, "file": name, "done": n + 1, "total": chunks,
                                                       "progress_percent": 100.0 * done / total}})
                if os.environ.get("FAKE_EXPORT_DIE"):
                    os._exit(3)
                if os.environ.get("FAKE_EXPORT_FAIL"):
                    partial.unlink()
                    code = os.environ["FAKE_EXPORT_FAIL"]
                    status("error", "Export failed", error=f"fake failure: {code}", error_code=code)
                    return 0
                time.sleep(pause)
        if stop.is_set():
            partial.unlink(missing_ok=True)
            break
        partial.rename(target)
        if name in steps:
            continue
        written.append({"name": name, "format": request["format"], "quantization": quant,
                        "bytes": target.stat().st_size, "sha256": digest.hexdigest()})
    for name in steps:
        (folder / name).unlink(missing_ok=True)
    if stop.is_set():
        for entry in written:
            (folder / entry["name"]).unlink(missing_ok=True)
        status("stopped", "Stopped; unfinished files removed")
        return 0
    if request["format"] == "gguf":
        first = next(entry["name"] for entry in written)
        modelfile = folder / "Modelfile"
        modelfile.write_text(f"FROM ./{first}\nPARAMETER stop \"<|im_end|>\"\n")
        data = modelfile.read_bytes()
        written.append({"name": "Modelfile", "format": "gguf", "quantization": None, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    status("completed", "Exported", files=written, export_dir=str(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
