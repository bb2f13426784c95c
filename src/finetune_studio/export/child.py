"""Entry point of an export child: `python -m finetune_studio.export.child --job-id ID`.

The same wire as a training child (`finetune_studio.wire`): stdin has one `WorkerSpec`
line, whose `output_dir` is the export's folder and whose `request` is
`ExportStartRequest.model_dump()` plus `source_dir` (the training job's folder) and
`quantizations`; then `stop` lines (EOF is a stop too). stdout has status messages with
`ExportPhase`s and progress messages carrying an `ExportProgress`.

What it does, by format:

- merged_16bit: loading_model, merging (per adapted layer), `merged/` saved in bf16.
- gguf: loading_model, merging, the merged model saved in 16 bits to a work folder,
  converting (llama.cpp's `convert_hf_to_gguf.py` to f16, or bf16 when only bf16 of the
  16-bit types is asked), quantizing (`llama_model_quantize`, one file per asked type,
  all from that one converted file, which is kept only if it was asked), a `Modelfile`.
- lora_gguf: loading_model (the adapter and the base's config), converting
  (`convert_lora_to_gguf.py`), a `Modelfile` naming the base.

The last message is always a terminal status: `completed` with `details.files`,
`stopped` or `error` (with `details.error_code`); after the last two nothing of the
export is left but the folder and its log.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Literal, Optional

from finetune_studio import failures
from finetune_studio.atomic import save_atomically, write_file
from finetune_studio.child.channel import Channel, JobFailure, StopRequested, StopSignal, start_child
from finetune_studio.export import files
from finetune_studio.export.merge import JobRecord, MergeError, load_merged, save_merged
from finetune_studio.export.process import ToolFailed
from finetune_studio.export.tools import LlamaCppTools, ToolsMissing, find_tools
from finetune_studio.schemas import ErrorCode, ExportPhase, ExportProgress, ExportStartRequest
from finetune_studio.wire import WorkerSpec

MERGED_FOLDER = "merged"
MODELFILE = "Modelfile"
Stage = Literal["merging", "converting", "quantizing"]  # ExportProgress.stage
WORK_FOLDER = ".work.partial"  # the merged model and the like, while the export runs



def gguf_name(quantization: str) -> str:
    return f"model-{quantization}.gguf"


def lora_name(quantization: str) -> str:
    return f"adapter-{quantization}.gguf"


class Export:
    """One export, top to bottom; `run` returns the finished files (as ExportFile dicts)."""

    def __init__(self, spec: WorkerSpec, channel: Channel, stop: StopSignal) -> None:
        self.channel = channel
        self.stop = stop
        self.folder = spec.output_dir
        self.work = self.folder / WORK_FOLDER
        self.phase: ExportPhase = "idle"
        self.started = time.monotonic()
        self.span = (0.0, 100.0)  # the share of the whole export the current step covers
        self.written: list[Path] = []  # final files this run wrote: removed again unless it completes
        raw = dict(spec.request)
        try:
            self.request = ExportStartRequest.model_validate({k: raw[k] for k in ("job_id", "format", "quantization") if k in raw})
            self.source = Path(str(raw["source_dir"]))
        except (ValueError, KeyError) as exc:  # the server validated it; this is a guard
            raise JobFailure("export_failed", f"the export request is not valid: {exc}") from None
        self.quantizations = [str(q) for q in raw.get("quantizations") or self.request.quantizations()]
        self.facts: dict[str, Any] = {
            "output_dir": str(self.folder),
            "job_id": self.request.job_id,
            "format": self.request.format,
            "quantizations": self.quantizations,
            "worker_pid": os.getpid(),
        }
        for warning in spec.warnings:
            channel.warn(warning)

    def details(self) -> dict[str, Any]:
        return dict(self.facts)

    def enter(self, phase: ExportPhase, message: str) -> None:
        self.stop.check()
        self.phase = phase
        self.channel.status(phase, message, details=self.details())

    def report(self, stage: Stage, done: int, total: int, fraction: float, file: Optional[str] = None) -> None:
        """A progress message: `fraction` of the current step is done."""
        self.stop.check()
        low, high = self.span
        percent = min(100.0, max(0.0, low + (high - low) * fraction))
        elapsed = time.monotonic() - self.started
        eta = elapsed * (100 - percent) / percent if percent >= 1 else None
        progress = ExportProgress(
            stage=stage,
            file=file,
            done=done,
            total=total,
            progress_percent=round(percent, 2),
            elapsed_seconds=round(elapsed, 2),
            eta_seconds=round(eta, 1) if eta is not None and math.isfinite(eta) else None,
            timestamp=time.time(),
        )
        self.channel.progress(**progress.model_dump())

    # -- the export ---------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        self.folder.mkdir(parents=True, exist_ok=True)
        files.remove_partials(self.folder)  # a run before this one may have been killed
        tools = find_tools() if self.request.format != "merged_16bit" else None
        self.enter("loading_model", f"Loading the result of training job {self.request.job_id}")
        try:
            record = JobRecord.read(self.source)
            _ = record.result  # raises when the job saved nothing to export
        except MergeError as exc:
            raise JobFailure("model_not_found", str(exc)) from None
        self.facts["base_model"] = record.base.location
        self.facts["method"] = record.method
        if self.request.format == "merged_16bit":
            return self.merged(record)
        if tools is None:  # never: find_tools raised first
            raise ToolsMissing("llama.cpp's tools were not looked for")
        if self.request.format == "lora_gguf":
            return self.lora_gguf(record, tools)
        return self.gguf(record, tools)

    def merge(self, record: JobRecord, span: tuple[float, float]) -> tuple[Any, Any]:
        self.span = span
        self.enter("merging", "Merging the adapter into the base model" if record.method == "lora" else "Loading the model")

        def on_layer(done: int, total: int) -> None:
            self.report("merging", done, max(total, 1), done / total if total else 1.0)

        try:
            return load_merged(record, on_layer=on_layer)
        except MergeError as exc:
            raise JobFailure("model_not_found", str(exc)) from None

    def merged(self, record: JobRecord) -> list[dict[str, Any]]:
        tokenizer, model = self.merge(record, (0.0, 80.0))
        self.stop.check()
        final = self.folder / MERGED_FOLDER
        save_merged(tokenizer, model, final, "bfloat16")
        self.written.append(final)
        self.stop.check()
        return [
            files.describe(self.folder, path, "merged_16bit", None)
            for path in sorted(final.rglob("*"))
            if path.is_file()
        ]

    def gguf(self, record: JobRecord, tools: LlamaCppTools) -> list[dict[str, Any]]:
        from finetune_studio.export.convert import convert_model
        from finetune_studio.export.quantize import quantize_file

        # One 16-bit GGUF is converted; every other file is quantized from it.
        base_type = "bf16" if "bf16" in self.quantizations and "f16" not in self.quantizations else "f16"
        quantized = [q for q in self.quantizations if q != base_type]
        converting_end = 60.0 if quantized else 100.0

        tokenizer, model = self.merge(record, (0.0, 20.0))
        self.stop.check()
        self.work.mkdir(parents=True, exist_ok=True)
        merged_dir = self.work / MERGED_FOLDER
        # The merged folder, and the 16-bit GGUF where it was not asked for, are work files,
        # removed below: renamed into place but not flushed to disk (atomic.py).
        save_merged(tokenizer, model, merged_dir, "bfloat16" if base_type == "bf16" else "float16", flush=False)
        del model

        self.span = (30.0, converting_end)
        self.enter("converting", f"Converting to GGUF ({base_type}) with llama.cpp's convert_hf_to_gguf.py")
        base_file = self.folder / gguf_name(base_type) if base_type in self.quantizations else self.work / gguf_name(base_type)
        name = base_file.name

        def on_convert(planned: int, total: int, written: float) -> None:
            self.report("converting", planned, total, 0.3 * planned / max(total, 1) + 0.7 * written, name)

        convert_model(tools, merged_dir, base_file, base_type, stop=self.stop, on_progress=on_convert,
                      flush=base_file.parent == self.folder)
        if base_file.parent == self.folder:
            self.written.append(base_file)
        files.remove(merged_dir)

        for index, quantization in enumerate(quantized):
            share = (100.0 - converting_end) / len(quantized)
            self.span = (converting_end + index * share, converting_end + (index + 1) * share)
            self.enter("quantizing", f"Quantizing to {quantization} with llama.cpp's llama_model_quantize")
            target = self.folder / gguf_name(quantization)
            target_name = target.name

            def on_tensor(done: int, total: int, tensor: str, file: str = target_name) -> None:
                self.report("quantizing", done, total, done / max(total, 1), file)

            quantize_file(base_file, target, quantization, stop=self.stop, on_tensor=on_tensor)
            self.written.append(target)

        self.stop.check()
        ggufs = [gguf_name(q) for q in self.quantizations]
        default = gguf_name("q4_k_m") if "q4_k_m" in self.quantizations else ggufs[0]
        self.write_modelfile(
            default,
            chat_template=getattr(tokenizer, "chat_template", None),
            end_tokens=[str(getattr(tokenizer, "eos_token", "") or "")],
            others=[g for g in ggufs if g != default],
        )
        files.remove(self.work)
        listed = [files.describe(self.folder, self.folder / gguf_name(q), "gguf", q) for q in self.quantizations]
        return [*listed, files.describe(self.folder, self.folder / MODELFILE, "gguf", None)]

    def lora_gguf(self, record: JobRecord, tools: LlamaCppTools) -> list[dict[str, Any]]:
        from finetune_studio.export.convert import convert_lora

        if record.method != "lora":
            raise JobFailure("export_failed", "lora_gguf exports a LoRA adapter, and this job trained the whole model; export gguf instead")
        quantization = self.quantizations[0]
        adapter = self.adapter_for_llama_cpp(record)
        base_config, tokenizer = self.base_config(record)

        self.span = (0.0, 100.0)
        self.enter("converting", f"Converting the adapter to GGUF ({quantization}) with llama.cpp's convert_lora_to_gguf.py")
        target = self.folder / lora_name(quantization)
        name = target.name

        def on_convert(planned: int, total: int, written: float) -> None:
            self.report("converting", planned, total, 0.3 * planned / max(total, 1) + 0.7 * written, name)

        convert_lora(tools, adapter, base_config, target, quantization, stop=self.stop, on_progress=on_convert)
        self.written.append(target)
        self.stop.check()
        base = record.base
        if base.kind == "gguf":
            from_line = base.location
        else:  # Ollama imports a safetensors folder of a supported architecture; a hub id must be fetched first
            from_line = base.location if base.kind == "folder" else f"{base.location}  # the base model: download it first"
        self.write_modelfile(
            from_line,
            chat_template=getattr(tokenizer, "chat_template", None),
            end_tokens=[str(getattr(tokenizer, "eos_token", "") or "")],
            adapter=name,
        )
        files.remove(self.work)
        return [
            files.describe(self.folder, target, "lora_gguf", quantization),
            files.describe(self.folder, self.folder / MODELFILE, "lora_gguf", None),
        ]

    def adapter_for_llama_cpp(self, record: JobRecord) -> Path:
        """The adapter as llama.cpp reads it: it scales by alpha / r, so an rsLoRA adapter
        (alpha / sqrt(r)) is given the alpha that scales the same; DoRA it cannot apply."""
        adapter = record.result
        config = json.loads((adapter / "adapter_config.json").read_text())
        if config.get("use_dora"):
            raise JobFailure("export_failed", "llama.cpp cannot apply a DoRA adapter; export gguf (the adapter merged) instead")
        if not config.get("use_rslora"):
            return adapter
        rank = float(config["r"])
        config["lora_alpha"] = float(config["lora_alpha"]) * math.sqrt(rank)
        config["use_rslora"] = False
        copy = self.work / "adapter"
        files.remove(copy)
        copy.mkdir(parents=True)
        for path in adapter.iterdir():
            if path.is_file() and path.name != "adapter_config.json":
                shutil.copy2(path, copy / path.name)
        (copy / "adapter_config.json").write_text(json.dumps(config, indent=2))
        return copy

    def base_config(self, record: JobRecord) -> tuple[Path, Any]:
        """A folder with the base model's config.json (all the LoRA converter needs of
        the base), and its tokenizer (for the Modelfile)."""
        from transformers import AutoConfig, AutoTokenizer

        location, extra = record.base.from_pretrained_args()
        kwargs: dict[str, Any] = {"trust_remote_code": record.trust_remote_code, **extra}
        if record.base.kind == "hub":
            kwargs["local_files_only"] = True  # the job loaded it, so it is in the cache
        try:
            config = AutoConfig.from_pretrained(location, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(record.result))
        except (OSError, ValueError) as exc:
            raise JobFailure("model_not_found", f"cannot read the base model's config ({record.base.location}): {exc}") from None
        if getattr(config, "quantization_config", None) is not None:
            del config.quantization_config  # a GGUF base is dequantized: the adapter applies to its plain weights
        if not getattr(config, "architectures", None):
            # A config read from a .gguf names no architecture, which the converter picks its
            # tensor names by: the causal LM class of the model type is what the job trained.
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
            if architecture is None:
                raise JobFailure("export_failed", f"cannot tell the architecture of the base model ({config.model_type})")
            config.architectures = [architecture]
        folder = self.work / "base-config"
        self.work.mkdir(parents=True, exist_ok=True)
        with save_atomically(folder) as partial:
            config.save_pretrained(str(partial))
        return folder, tokenizer

    def write_modelfile(
        self,
        from_name: str,
        *,
        chat_template: Optional[str],
        end_tokens: list[str],
        others: Optional[list[str]] = None,
        adapter: Optional[str] = None,
    ) -> None:
        from finetune_studio.export.modelfile import modelfile_text

        text = modelfile_text(
            from_name, chat_template=chat_template, end_tokens=end_tokens, others=others or (), adapter_name=adapter
        )
        final = self.folder / MODELFILE
        write_file(final, text)
        self.written.append(final)

    def clean_up(self) -> None:
        """After a stop or a failure: nothing of this export is left but the folder and its log."""
        files.remove(self.work)
        for path in self.written:
            files.remove(path)
        files.remove_partials(self.folder)


# -- failures --------------------------------------------------------------------

_NEARLY_FULL = 32 * 1024 * 1024  # bytes


def failure(exc: BaseException) -> tuple[ErrorCode, str]:
    """An error code and a sentence that says what to do, for an unexpected failure."""
    if isinstance(exc, ToolFailed):
        seen = failures.cause_in_text("\n".join(exc.tail))
        # numpy's short write ("331776 requested and 303824 written") names no errno: the
        # free space left where the tool wrote tells a full disk from other failures.
        short_of_space = exc.disk_free is not None and exc.disk_free < _NEARLY_FULL
        if short_of_space or seen == "disk_full":
            return "disk_full", f"The disk is full ({exc}). {failures.advice('disk_full', 'export')}"
        if exc.returncode == -signal.SIGKILL or seen == "out_of_memory":
            return "out_of_memory", f"Out of memory ({exc}). {failures.advice('out_of_memory', 'export')}"
        return "export_failed", f"{exc}. The export's log has llama.cpp's full output."
    known = failures.classify(exc, "export")
    if known is not None:
        return known
    return "export_failed", f"Export failed: {type(exc).__name__}: {exc}"


# -- the child -------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    spec, channel, stop, _ = start_child("finetune_studio.export.child", "export", argv)

    try:
        export = Export(spec, channel, stop)
    except JobFailure as exc:
        channel.status("error", "Export failed", error=exc.message, details={"output_dir": str(spec.output_dir), "error_code": exc.error_code})
        return 1
    try:
        done = export.run()
    except StopRequested as exc:
        export.clean_up()
        channel.status("stopped", f"Stopped during {export.phase} ({exc}); its partial files were removed", details=export.details())
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the user
        if isinstance(exc, JobFailure):
            code, text = exc.error_code, exc.message
        elif isinstance(exc, ToolsMissing):
            code, text = "export_tools_missing", str(exc)
        else:
            with contextlib.suppress(OSError, ValueError):  # the log may be on the disk that is full
                traceback.print_exc()
            code, text = failure(exc)
        export.clean_up()
        if stop.is_set() and code == "export_failed":  # a tool ended by our own stop
            channel.status("stopped", f"Stopped during {export.phase} ({stop.reason}); its partial files were removed", details=export.details())
            return 0
        channel.status("error", "Export failed", error=text, details={**export.details(), "error_code": code})
        return 1
    total = sum(int(f["bytes"]) for f in done)
    channel.status(
        "completed",
        f"Exported {len(done)} file{'s' if len(done) != 1 else ''} ({total / 1e6:,.1f} MB)",
        details={**export.details(), "files": done},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
