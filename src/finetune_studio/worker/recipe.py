"""The training recipe run by each child, top to bottom: model, data, trainer, train, save.

This is the only module (with `callbacks.py` and `tiny_model.py`) that imports torch,
transformers, peft or trl, and it does so only once the job has announced
`loading_model`, so the server hears from the child within a fraction of a second.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from finetune_studio.schemas import SECRET_FIELDS, TrainingStartRequest
from finetune_studio.worker.data import LoadedData, load_local
from finetune_studio.worker.protocol import Channel, JobFailure, StopSignal

# Request fields that this version accepts but does not act on yet, with the value
# that means "not used". A request that sets one gets a warning, never silence.
NOT_YET_SUPPORTED: dict[str, Any] = {
    "hf_dataset": None,
    "local_eval_datasets": [],
    "eval_split": None,
    "eval_steps": 0.0,
    "subset": None,
    "custom_format_mapping": None,
    "use_loftq": False,
    "train_on_completions": False,
    "enable_wandb": False,
    "enable_tensorboard": False,
    "resume_from_checkpoint": None,
    "gpu_ids": None,
}


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1 or name.endswith(".gguf")


class Recipe:
    def __init__(self, spec: dict[str, Any], channel: Channel, stop: StopSignal) -> None:
        self.channel = channel
        self.stop = stop
        self.job_id: str = spec["job_id"]
        self.output_dir = Path(spec["output_dir"])
        self.phase = "idle"
        self.facts: dict[str, Any] = {"output_dir": str(self.output_dir), "worker_pid": os.getpid()}
        for warning in spec.get("warnings", []):
            channel.warn(warning)
        raw = dict(spec["request"])
        raw.pop("withheld_secrets", None)
        try:
            self.request = TrainingStartRequest.model_validate(raw)
        except ValueError as exc:  # the server validated it already; this is a guard
            raise JobFailure("config_invalid", f"the request is not valid: {exc}") from None
        for name in self.request.unknown_fields():
            channel.warn(f"unknown field {name!r} ignored")
        for name, unused in NOT_YET_SUPPORTED.items():
            if getattr(self.request, name) not in (unused, None) and name not in SECRET_FIELDS:
                channel.warn(f"{name} is not supported yet and was ignored")

    def details(self) -> dict[str, Any]:
        return dict(self.facts)

    def enter(self, phase: str, message: str, **details: Any) -> None:
        self.stop.check()
        self.phase = phase
        self.channel.status(phase, message, details={**self.facts, **details})

    # -- the recipe ---------------------------------------------------------

    def run(self) -> None:
        request = self.request
        self.enter("loading_model", f"Loading model {request.model_name}")
        model, tokenizer = self.load_model()
        self.stop.check()

        self.enter("loading_dataset", f"Reading {len(request.local_datasets)} dataset file(s)",
                   model_parameters=sum(p.numel() for p in model.parameters()))
        data = self.load_data()
        self.facts["dataset"] = {"rows": len(data.rows), "format": data.shape, "files": data.per_file}

        self.enter("configuring", f"Read {len(data.rows)} rows ({data.shape}); preparing the trainer")
        trainer = self.build_trainer(model, tokenizer, data)
        self.stop.check()

        # The `training` status is sent by the callback once the trainer knows its steps.
        result = trainer.train()
        final = trainer.state.global_step
        self.facts["train_loss"] = result.training_loss
        self.facts["steps"] = final
        self.save(trainer, tokenizer)
        if self.stop.is_set():
            self.phase = "stopped"
            self.channel.status(
                "stopped",
                f"Stopped at step {final} of {trainer.state.max_steps} ({self.stop.reason}); what was trained is saved",
                details=self.details(),
            )
        else:
            self.phase = "completed"
            self.channel.status("completed", f"Training completed: {final} steps", details=self.details())

    # -- model --------------------------------------------------------------

    def load_model(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        request = self.request
        source = request.model_local_path or request.model_name
        path = Path(source).expanduser()
        cuda = torch.cuda.is_available()
        if path.exists():
            if path.is_file():
                raise JobFailure("model_not_found", f"{path} is a file; name a Hugging Face model folder (with config.json)")
            if not (path / "config.json").is_file():
                raise JobFailure("model_not_found", f"{path} is not a Hugging Face model folder: it has no config.json")
            source = str(path)
        elif _looks_like_path(source):
            raise JobFailure("model_not_found", f"the model path {source} does not exist; name a local model folder")

        if request.load_in_4bit and not (cuda and _has_module("bitsandbytes")):
            self.channel.warn("load_in_4bit needs CUDA and bitsandbytes; the model is loaded in full precision")
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
        kwargs: dict[str, Any] = {"trust_remote_code": request.trust_remote_code}
        if request.hf_token:
            kwargs["token"] = request.hf_token
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        except OSError as exc:
            if source == request.model_name and not Path(source).exists():
                raise JobFailure(
                    "model_not_found",
                    f"cannot load {source!r} from the Hugging Face hub ({_first_line(exc)}); if the hub cannot be"
                    " reached, name a local folder or file",
                ) from None
            raise JobFailure("model_not_found", f"cannot load the model from {source}: {_first_line(exc)}") from None
        except ValueError as exc:
            raise JobFailure("model_not_found", f"cannot load the model from {source}: {_first_line(exc)}") from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if cuda:
            model = model.to("cuda")
        return model, tokenizer

    # -- data ---------------------------------------------------------------

    def load_data(self) -> LoadedData:
        request = self.request
        if not request.local_datasets:
            raise JobFailure("config_invalid", "hf_dataset is not supported yet: name local files in local_datasets")
        data = load_local(request.local_datasets, request.format_type)
        start, end = request.dataset_slice_start, request.dataset_slice_end
        if start is not None or end is not None:
            data.rows = data.rows[slice(start, end)]
            if not data.rows:
                raise JobFailure(
                    "dataset_invalid",
                    f"dataset_slice_start={start} and dataset_slice_end={end} leave no rows (the data has"
                    f" {sum(data.per_file.values())} rows)",
                )
        return data

    # -- trainer ------------------------------------------------------------

    def build_trainer(self, model: Any, tokenizer: Any, data: LoadedData) -> Any:
        import torch
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        from finetune_studio.worker.callbacks import ProgressCallback

        request = self.request
        cuda = torch.cuda.is_available()
        if data.is_conversational and not tokenizer.chat_template:
            from finetune_studio.worker.tiny_model import CHATML_TEMPLATE

            tokenizer.chat_template = CHATML_TEMPLATE
            self.channel.warn("the tokenizer has no chat template; ChatML is used")

        optim = request.optim
        if "8bit" in optim and not (cuda and _has_module("bitsandbytes")):
            optim = "adamw_torch"
            self.channel.warn(f"optim {request.optim} needs CUDA and bitsandbytes; adamw_torch is used")
        gradient_checkpointing = request.gradient_checkpointing.strip().lower() not in ("", "false", "none", "0")

        max_steps = request.max_steps if request.max_steps and request.max_steps > 0 else -1
        warmup: float = request.warmup_steps if request.warmup_steps is not None else (request.warmup_ratio or 0)
        config = SFTConfig(
            output_dir=str(self.output_dir / "checkpoints"),
            num_train_epochs=float(request.num_epochs or 1),
            max_steps=max_steps,
            per_device_train_batch_size=request.batch_size,
            gradient_accumulation_steps=request.gradient_accumulation_steps,
            learning_rate=request.learning_rate,
            lr_scheduler_type=request.lr_scheduler_type,
            warmup_steps=warmup,
            weight_decay=request.weight_decay,
            max_grad_norm=request.max_grad_norm if request.max_grad_norm is not None else 1.0,
            optim=optim,
            seed=request.random_seed,
            data_seed=request.random_seed,
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="steps" if request.save_steps > 0 else "no",
            save_steps=max(request.save_steps, 1),
            report_to="none",
            disable_tqdm=True,
            use_cpu=not cuda,
            bf16=cuda and torch.cuda.is_bf16_supported(),
            fp16=False,
            gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False} if gradient_checkpointing else None,
            max_length=request.max_seq_length,
            packing=request.packing,
            dataloader_num_workers=0,
            completion_only_loss=False,
        )
        peft_config = None
        if request.training_type == "Continued Pretraining":
            self.channel.warn("Continued Pretraining is not supported yet; the data is trained as LoRA/QLoRA")
        if request.use_lora and request.training_type != "Full Finetuning":
            from peft import LoraConfig

            peft_config = LoraConfig(
                r=request.lora_r,
                lora_alpha=request.lora_alpha,
                lora_dropout=request.lora_dropout,
                target_modules=request.target_modules or "all-linear",
                use_rslora=request.use_rslora,
                use_dora=request.use_dora,
                bias="none",
                task_type="CAUSAL_LM",
            )
        self.facts["method"] = "lora" if peft_config else "full"
        try:
            return SFTTrainer(
                model=model,
                args=config,
                train_dataset=Dataset.from_list(data.rows),
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[ProgressCallback(self)],
            )
        except ValueError as exc:
            if "target modules" in str(exc).lower() or "target_modules" in str(exc):
                raise JobFailure(
                    "config_invalid",
                    f"target_modules {request.target_modules} do not match this model's layers: {_first_line(exc)}",
                ) from None
            raise

    # -- outputs ------------------------------------------------------------

    def save(self, trainer: Any, tokenizer: Any) -> None:
        """Write the adapter (or model) atomically: a folder appears complete or not at all."""
        name = "adapter" if self.facts.get("method") == "lora" else "model"
        final = self.output_dir / name
        partial = self.output_dir / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        trainer.model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        self.facts[f"{name}_dir"] = str(final)

    def start_training(self, total_steps: int) -> None:
        """Called by the callback when the trainer begins."""
        self.enter("training", f"Training for {total_steps} steps", total_steps=total_steps)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
