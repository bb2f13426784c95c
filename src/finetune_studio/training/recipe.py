"""The training recipe run by each child, top to bottom: model, data, trainer, train, save.

This is the only module (with `callbacks.py`, `models.py` and `tiny_model.py`) that
imports torch, transformers, peft or trl, and it does so only once the job has
announced `loading_model`, so the server hears from the child within a fraction of
a second.

Every request field either does what it says or, where this machine cannot (4-bit
loading or 8-bit optimizers without CUDA and bitsandbytes, say), falls back to what
works and says so in `details.warnings`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from finetune_studio.atomic import save_atomically, write_file
from finetune_studio.child.channel import Channel, JobFailure, StopRequested, StopSignal
from finetune_studio.child.chat_template import NO_TEMPLATE_WARNING, ensure_chat_template, needs_template
from finetune_studio.child.datasets import DatasetError, LoadedData, load_eval_data, load_training_data, measure
from finetune_studio.child.models import ModelSource, load_tokenizer_and_model, resolve_source
from finetune_studio.child.precision import decide_precision
from finetune_studio.cuda_features import bitsandbytes_works, usable_optim
from finetune_studio.hardware import PrecisionChoice
from finetune_studio.schemas import Phase, TrainingStartRequest, method_of
from finetune_studio.training.compilation import RECORDS_FILE, Compilation, CompileInterrupted
from finetune_studio.wire import COMPILE_CACHE_DIR_ENV, DataDir, JobFolder, WorkerSpec, last_checkpoint

if TYPE_CHECKING:  # transformers is imported only once the job has announced loading_model
    from transformers import EarlyStoppingCallback

    from finetune_studio.training.callbacks import ProgressCallback
    from finetune_studio.training.throughput import Utilization
    from finetune_studio.training.trackers import Trackers


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class Recipe:
    def __init__(self, spec: WorkerSpec, channel: Channel, stop: StopSignal) -> None:
        self.channel = channel
        self.stop = stop
        self.job_id = spec.job_id
        self.output_dir = spec.output_dir
        self.folder = JobFolder(spec.output_dir)
        self.jobs_dir = self.output_dir.parent
        self.phase: Phase = "idle"
        self.progress_callback: Optional[ProgressCallback] = None  # set by build_trainer
        self.early_stopping: Optional[EarlyStoppingCallback] = None  # set by build_trainer when patience is given
        self.extra_callbacks: list[Any] = []  # a launcher's own (Ray: uploading checkpoints), after the recipe's
        self.trackers: Optional[Trackers] = None  # report_to's MLflow and Trackio runs, opened by open_trackers
        self.precision: Optional[PrecisionChoice] = None  # decided by load_model
        self.facts: dict[str, Any] = {"output_dir": str(self.output_dir), "worker_pid": os.getpid()}
        for warning in spec.warnings:
            channel.warn(warning)
        raw = dict(spec.request)
        try:
            self.request = TrainingStartRequest.model_validate(raw)
        except ValueError as exc:  # the server validated it already; this is a guard
            raise JobFailure("config_invalid", f"the request is not valid: {exc}") from None
        # Carried on every status, so that any one of them names the run.
        self.facts["model_name"] = self.request.model_name
        if self.request.project_name:
            self.facts["project_name"] = self.request.project_name
        if self.request.gpu_ids:
            # Must be set before torch first looks at CUDA.
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.request.gpu_ids)
        # torch.compile's caches under the data dir (training/compilation.py), unless the user's
        # environment names its own; read by inductor when it first compiles.
        for name, value in DataDir.of_jobs(self.jobs_dir).compile_environment().items():
            os.environ.setdefault(name, value)

    @property
    def method(self) -> str:
        """"lora" or "full"."""
        return method_of(self.request.training_type, self.request.use_lora)

    def details(self) -> dict[str, Any]:
        return dict(self.facts)

    def enter(self, phase: Phase, message: str, **details: Any) -> None:
        self.stop.check()
        self.phase = phase
        self.channel.status(phase, message, details={**self.facts, **details})

    # -- the recipe ---------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except StopRequested:
            self.end_trackers("stopped")
            raise
        except BaseException:
            self.end_trackers("error")
            raise

    def _run(self) -> None:
        request = self.request
        self.enter("loading_model", f"Loading model {request.model_local_path or request.model_name}")
        resume_from = self.resume_checkpoint()
        source = resolve_source(request.model_local_path or request.model_name)
        # Every row is read and checked before any weights are, so a bad file is
        # reported in seconds whatever the model's size. The seed's phase order
        # stands: the data's findings are announced as `loading_dataset` once the
        # tokenizer (which comes with the model) has measured them.
        try:
            train_data, eval_data = self.read_data()
        except JobFailure as exc:
            if isinstance(exc, DatasetError) and exc.problems:
                # Every kind of bad row, counted, with its first examples: on this status and the error.
                self.facts["dataset_problems"] = exc.problems
            self.enter("loading_dataset", "Reading and checking the dataset")  # the phase it failed in
            raise
        self.check_early_stopping(eval_data)
        self.stop.check()
        tokenizer, model = self.load_model(source)
        self.facts["model_parameters"] = sum(p.numel() for p in model.parameters())
        self.stop.check()
        self.measure_data(tokenizer, train_data)
        stats = self.facts["dataset"]
        self.enter(
            "loading_dataset",
            f"Read {stats['rows']} rows ({train_data.shape}{', detected' if train_data.detected else ''}):"
            f" {stats['tokens_min']}/{stats['tokens_median']}/{stats['tokens_max']} tokens per row (min/median/max),"
            f" {stats['truncated_rows']} longer than max_seq_length"
            + (f"; {train_data.skipped_rows} bad rows skipped (bad_rows: skip)" if train_data.skipped_rows else ""),
        )

        self.enter("configuring", "Preparing the trainer")
        trainer = self.build_trainer(model, tokenizer, train_data, eval_data)
        compilation = self.attach_compilation(trainer)
        if trainer.is_world_process_zero():  # data-parallel workers (Ray) share one job folder: one writes
            self.write_job_file(source)
            self.open_trackers()  # one tracker run per job, too
        self.stop.check()

        # The `training` status is sent by the callback once the trainer knows its steps.
        try:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        except CompileInterrupted:  # a stop during a compiled step: saved as at the last step's end
            compilation.save_interrupted(trainer)
            result = None
        final = trainer.state.global_step
        if result is not None:
            self.facts["train_loss"] = result.training_loss
        self.facts["steps"] = final
        checkpoint = last_checkpoint(self.output_dir)
        if checkpoint is not None:
            self.facts["last_checkpoint"] = str(checkpoint)
        self.check_divergence(checkpoint)
        self.save(trainer, tokenizer)
        if self.stop.is_set():
            self.phase = "stopped"
            self.end_trackers("stopped")
            self.channel.status(
                "stopped",
                f"Stopped at step {final} of {trainer.state.max_steps} ({self.stop.reason}); what was trained is saved",
                details=self.details(),
            )
            return
        if eval_data is not None and not request.eval_steps:
            metrics = trainer.evaluate()
            self.facts["eval_loss"] = metrics.get("eval_loss")
        self.phase = "completed"
        message = self.early_stop_message(trainer.state) or f"Training completed: {final} steps"
        self.end_trackers("completed")
        self.channel.status("completed", message, details=self.details())

    def open_trackers(self) -> None:
        """report_to's MLflow and Trackio runs (training/trackers.py), fed by the progress callback;
        where they are goes in `details.trackers`."""
        from finetune_studio.training.trackers import OWN_TRACKERS, Trackers, wanted_trackers

        names = [name for name in wanted_trackers(self.request) if name in OWN_TRACKERS]
        if not names:
            return
        self.trackers = Trackers.open(self.request, self.job_id, self.channel.warn, names)
        if self.trackers.runs:
            self.facts["trackers"] = self.trackers.details()
        if self.progress_callback is not None:
            self.progress_callback.trackers = self.trackers

    def end_trackers(self, outcome: str) -> None:
        if self.trackers is not None:
            self.trackers.end(outcome)

    def check_early_stopping(self, eval_data: Optional[LoadedData]) -> None:
        """Early stopping watches the evaluation loss, so it needs evaluations: without them
        it is refused, before any weights are read."""
        request = self.request
        if request.early_stopping_patience is None:
            return
        missing = [what for what, absent in (("evaluation data (local_eval_datasets or eval_split)", eval_data is None),
                                             ("eval_steps above 0", not request.eval_steps)) if absent]
        if missing:
            raise JobFailure(
                "config_invalid",
                f"early_stopping_patience ({request.early_stopping_patience}) watches the evaluation loss and needs "
                + " and ".join(missing) + "; give them, or leave early_stopping_patience out",
            )

    def early_stop_message(self, state: Any) -> Optional[str]:
        """The `completed` message when the early-stopping callback ended training before
        max steps (a user's stop and a divergence end the job before this is asked)."""
        request = self.request
        callback = self.early_stopping
        if callback is None or request.early_stopping_patience is None:
            return None
        step = int(state.global_step)
        if step >= int(state.max_steps) or callback.early_stopping_patience_counter < request.early_stopping_patience:
            return None
        best_step = state.best_global_step
        if best_step is None and state.best_model_checkpoint:
            best_step = int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1])
        best_loss = float(state.best_metric) if state.best_metric is not None else None
        self.facts.update(early_stopped=True, best_step=best_step, best_eval_loss=best_loss)
        if state.best_model_checkpoint:
            self.facts["best_checkpoint"] = str(state.best_model_checkpoint)
        loss = f"{best_loss:.4g}" if best_loss is not None else "unknown"
        return (
            f"Training completed: stopped early at step {step}: the evaluation loss did not improve by more than"
            f" {request.early_stopping_threshold:g} for {request.early_stopping_patience} evaluations;"
            f" the result is the best checkpoint, step {best_step} (eval_loss {loss})"
        )

    def check_divergence(self, checkpoint: Optional[Path]) -> None:
        """End the job as `diverged` if the callback stopped training at a NaN or
        infinite loss or gradient norm. The diverged weights are not saved as the result."""
        callback = self.progress_callback
        if callback is None or callback.diverged is None:
            return
        step, value = callback.diverged
        self.facts["diverged_at_step"] = step
        kept = (f"the last checkpoint before it is kept ({checkpoint.name})" if checkpoint is not None
                else "there is no checkpoint from before it")
        raise JobFailure(
            "diverged",
            f"Training diverged at step {step}: {value}. It was stopped there and the diverged weights were not saved;"
            f" {kept}. Lower the learning rate (now {self.request.learning_rate:g}), keep max_grad_norm at 1.0 or"
            " below (gradient clipping), add warmup steps, or check the data for broken or extreme rows.",
        )

    def start_training(self, total_steps: int, first_step: int) -> None:
        """Called by the callback when the trainer begins."""
        extra = {"resumed_from_step": first_step} if first_step else {}
        message = f"Training for {total_steps} steps" + (f", resuming after step {first_step}" if first_step else "")
        self.enter("training", message, total_steps=total_steps, **extra)

    # -- model --------------------------------------------------------------

    def load_model(self, source: ModelSource) -> tuple[Any, Any]:
        import torch

        request = self.request
        cuda = torch.cuda.is_available()
        if request.gpu_ids and not cuda:
            self.channel.warn("gpu_ids was given but no CUDA GPU is visible; training runs on the CPU")
        quantization = None
        if request.load_in_4bit:
            if self.method == "full":
                self.channel.warn("load_in_4bit does not apply to full fine-tuning; the model is loaded in full precision")
            elif source.kind == "gguf":
                self.channel.warn("a GGUF model is dequantized on loading; load_in_4bit is not applied")
            elif bitsandbytes_works(cuda, has_module("bitsandbytes")):
                from transformers import BitsAndBytesConfig

                quantization = BitsAndBytesConfig(
                    load_in_4bit=True,
                    bnb_4bit_quant_type="nf4",
                    bnb_4bit_use_double_quant=True,
                    bnb_4bit_compute_dtype=torch.bfloat16,
                )
            else:
                self.channel.warn("load_in_4bit needs CUDA and bitsandbytes; the model is loaded in full precision (LoRA, not QLoRA)")
        # bf16 where it is native (a GPU with bf16, a CPU with AMX or AVX512-BF16), unless the
        # request's `precision` says otherwise (hardware.choose_precision). LoRA trains small
        # adapters beside frozen weights: those are held in bf16 and the adapter in fp32 (peft
        # keeps it so). Full fine-tuning keeps fp32 master weights. bf16 autocast does the math.
        precision = self.precision = decide_precision(request.precision)
        if precision.warning:
            self.channel.warn(precision.warning)
        self.facts["precision"] = precision.to_json()
        bf16 = precision.dtype == "bf16"
        dtype = torch.bfloat16 if bf16 and self.method == "lora" else torch.float32
        tokenizer, model = load_tokenizer_and_model(
            source,
            dtype=dtype,
            trust_remote_code=request.trust_remote_code,
            token=request.hf_token,
            quantization_config=quantization,
        )
        self.facts["model_source"] = source.kind
        if quantization is not None:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=self.gradient_checkpointing)
            self.facts["quantized"] = "4bit"
        elif cuda:
            model = model.to("cuda")
        return tokenizer, model

    @property
    def gradient_checkpointing(self) -> bool:
        return self.request.gradient_checkpointing.strip().lower() not in ("", "false", "none", "0", "off")

    # -- data ---------------------------------------------------------------

    def read_data(self) -> tuple[LoadedData, Optional[LoadedData]]:
        """Read and check every row of the training and evaluation data (no model needed)."""
        request = self.request
        train_data = load_training_data(request)
        eval_data = load_eval_data(request, train_data)
        for warning in train_data.warnings + (eval_data.warnings if eval_data else []):
            self.channel.warn(warning)
        self.facts["dataset"] = {"rows": len(train_data.rows), "format": train_data.shape,
                                 "detected": train_data.detected, "files": train_data.per_file}
        if train_data.skipped_rows or train_data.dropped_rows:
            # rows is what is trained on; these say what was left out, and why.
            self.facts["dataset"].update(skipped_rows=train_data.skipped_rows, problems=train_data.problems,
                                         dropped_rows=train_data.dropped_rows)
        if eval_data is not None:
            self.facts["eval_dataset"] = {"rows": len(eval_data.rows), "format": eval_data.shape}
        return train_data, eval_data

    def measure_data(self, tokenizer: Any, train_data: LoadedData) -> None:
        """Measure the training rows in tokens. The statistics ride on the
        `loading_dataset` status (and every later one), so a user sees them before
        any compute is spent on training."""
        request = self.request
        self.ensure_chat_template(tokenizer, train_data)
        stats = measure(train_data, tokenizer, request.max_seq_length)
        self.facts["dataset"] = {**stats, **self.facts["dataset"]}
        if stats["truncated_rows"] and not request.packing:
            self.channel.warn(
                f"{stats['truncated_rows']} of {stats['rows']} rows are longer than max_seq_length"
                f" ({request.max_seq_length} tokens) and will be truncated"
            )

    def ensure_chat_template(self, tokenizer: Any, data: LoadedData) -> None:
        if needs_template(data.is_conversational, self.request.training_type) and ensure_chat_template(tokenizer):
            self.channel.warn(NO_TEMPLATE_WARNING)

    def trainer_rows(self, tokenizer: Any, data: LoadedData) -> list[dict[str, Any]]:
        """Rows in the form SFTTrainer takes, per training type and loss choice."""
        request = self.request
        if request.training_type == "Continued Pretraining":
            # Raw text, loss on every token: conversations are flattened with the template.
            if not data.is_conversational:
                return data.rows
            return [{"text": tokenizer.apply_chat_template(row["messages"], tokenize=False)} for row in data.rows]
        if request.train_on_completions:
            if not data.is_conversational:
                self.channel.warn("train_on_completions needs conversations (not raw text); the loss covers every token")
                return data.rows
            from finetune_studio.child.completions import tokenize_with_assistant_mask

            return [tokenize_with_assistant_mask(tokenizer, row["messages"]) for row in data.rows]
        return data.rows

    # -- trainer ------------------------------------------------------------

    def build_trainer(self, model: Any, tokenizer: Any, data: LoadedData, eval_data: Optional[LoadedData]) -> Any:
        import torch
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        from finetune_studio.training.callbacks import EvalSampler, ProgressCallback, eval_prompts

        request = self.request
        cuda = torch.cuda.is_available()
        optim = usable_optim(request.optim, cuda, has_module("bitsandbytes"))
        if optim != request.optim:
            self.channel.warn(f"optim {request.optim} needs CUDA and bitsandbytes; {optim} is used")

        from finetune_studio.training.trackers import wanted_trackers

        wanted = wanted_trackers(request)
        report_to = []
        if "wandb" in wanted:
            if has_module("wandb"):
                report_to.append("wandb")
                if request.wandb_token:
                    os.environ["WANDB_API_KEY"] = request.wandb_token
                if request.wandb_project:
                    os.environ["WANDB_PROJECT"] = request.wandb_project
            else:
                self.channel.warn("enable_wandb: wandb is not installed (pip install wandb); not logging to W&B")
        if "tensorboard" in wanted:
            if has_module("tensorboard") or has_module("tensorboardX"):
                report_to.append("tensorboard")
                self.facts["tensorboard_dir"] = request.tensorboard_dir or str(self.output_dir / "tensorboard")
            else:
                self.channel.warn("enable_tensorboard: tensorboard is not installed (pip install tensorboard); not logging")
        if self.facts.get("tensorboard_dir"):
            os.environ["TENSORBOARD_LOGGING_DIR"] = self.facts["tensorboard_dir"]

        evaluation: dict[str, Any] = {"eval_strategy": "no"}
        saving: dict[str, Any] = {"save_strategy": "steps" if request.save_steps > 0 else "no",
                                  "save_steps": max(request.save_steps, 1)}
        if eval_data is not None and request.eval_steps:
            # Below 1, transformers reads eval_steps as a fraction of the total steps.
            evaluation = {"eval_strategy": "steps", "eval_steps": request.eval_steps, "per_device_eval_batch_size": request.batch_size}
            if request.early_stopping_patience is not None:
                # Loading the best model at the end needs a checkpoint at every evaluation
                # (transformers wants save steps a multiple of eval steps): save with each.
                evaluation.update(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
                saving = {"save_strategy": "steps", "save_steps": request.eval_steps}
                if request.save_steps != request.eval_steps:
                    self.channel.warn(
                        f"early_stopping_patience saves a checkpoint at every evaluation (eval_steps {request.eval_steps:g})"
                        f" instead of every save_steps ({request.save_steps}), so that the best one can be the result"
                    )
        elif request.eval_steps and eval_data is None:
            self.channel.warn("eval_steps is set but there is no evaluation data (local_eval_datasets or eval_split)")

        max_steps = request.max_steps if request.max_steps and request.max_steps > 0 else -1
        warmup: float = request.warmup_steps if request.warmup_steps is not None else (request.warmup_ratio or 0)
        # What every method's trainer takes; SFT's own arguments are added below, the others' in methods.py.
        common: dict[str, Any] = dict(
            output_dir=str(self.folder.checkpoints),
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
            **saving,
            report_to=report_to or "none",
            disable_tqdm=True,
            use_cpu=not cuda,
            bf16=self.precision is not None and self.precision.dtype == "bf16",  # autocast, on the GPU or the CPU
            fp16=False,
            **self.checkpointing_args(SFTConfig),
            dataloader_num_workers=0,
            # Under data parallelism (Ray): every trained weight takes part in each step, so DDP
            # need not search the graph for unused ones (and warn about it every run).
            ddp_find_unused_parameters=False,
            **evaluation,
        )
        sft = request.training_method == "sft"
        config = SFTConfig(**common, max_length=request.max_seq_length, packing=request.packing,
                           completion_only_loss=False) if sft else None
        peft_config = self.lora_config() if self.method == "lora" else None
        self.progress_callback = ProgressCallback(self.channel, self.stop, self.start_training)
        self.progress_callback.method_metrics = not sft  # dpo's reward margins, grpo's rewards...
        self.progress_callback.utilization = self.utilization(cuda)
        if eval_data is not None and request.eval_steps and request.eval_sample_count:
            prompts = eval_prompts(tokenizer, eval_data.rows, request.eval_sample_count)
            self.progress_callback.eval_sampler = EvalSampler(prompts)
        callbacks: list[Any] = [self.progress_callback, *self.extra_callbacks]
        if request.early_stopping_patience is not None:
            from transformers import EarlyStoppingCallback

            self.early_stopping = EarlyStoppingCallback(request.early_stopping_patience, request.early_stopping_threshold)
            callbacks.append(self.early_stopping)
        self.facts["method"] = self.method
        self.facts["training_type"] = request.training_type
        try:
            if not sft:
                from finetune_studio.training.methods import build_method_trainer

                return build_method_trainer(request, self.channel.warn, self.facts, common, model, tokenizer, data,
                                            eval_data, peft_config, callbacks)
            return SFTTrainer(
                model=model,
                args=config,
                train_dataset=Dataset.from_list(self.trainer_rows(tokenizer, data)),
                eval_dataset=Dataset.from_list(self.trainer_rows(tokenizer, eval_data)) if eval_data else None,
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=callbacks,
            )
        except ValueError as exc:
            text = str(exc)
            if "target_modules" in text or "target modules" in text.lower():
                raise JobFailure(
                    "config_invalid",
                    f"target_modules {request.target_modules} do not match this model's layers: {text.splitlines()[0]}",
                ) from None
            raise

    def attach_compilation(self, trainer: Any) -> Compilation:
        """The request's `compile` (training/compilation.py): decided now (true, false) or
        after the first steps (auto), in `details.compile`."""
        import torch

        from finetune_studio.training.throughput import device_name

        request = self.request
        cuda = torch.cuda.is_available()
        config = getattr(trainer.model, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        dtype = self.precision.dtype if self.precision is not None else "fp32"
        shape = (f"torch {torch.__version__} | {device_name(cuda)} | {request.model_name}"
                 f" ({self.facts.get('model_parameters')} parameters) | {request.training_method} {self.method} | {dtype}"
                 f" | batch {request.batch_size} x {request.max_seq_length}"
                 + (" | gradient checkpointing" if self.gradient_checkpointing else ""))
        compilation = Compilation(
            request.compile, cuda=cuda, layers=layers, shape_key=shape,
            records=Path(os.environ.get(COMPILE_CACHE_DIR_ENV) or DataDir.of_jobs(self.jobs_dir).compile_cache) / RECORDS_FILE,
            facts=self.facts, warn=self.channel.warn,
            say=lambda text: self.channel.status("training", text, details=self.details()),
            ranks=int(getattr(trainer.args, "world_size", 1) or 1), stop=self.stop,
        )
        compilation.attach(trainer)
        return compilation

    def utilization(self, cuda: bool) -> Optional[Utilization]:
        """What each step's `mfu` is measured against: the device's peak in the job's dtype
        (a short matmul probe, once per machine; training/throughput.py), in `details.peak`.
        A probe that fails costs the figure, never the job."""
        from finetune_studio.training.throughput import Utilization, peak_flops

        try:
            peak = peak_flops(cuda, self.precision.dtype if self.precision is not None else "fp32")
        except Exception as exc:  # noqa: BLE001 - a figure of the run, not a reason to fail it
            self.channel.warn(f"mfu: the device's peak could not be measured ({type(exc).__name__}: {exc}); no mfu is reported")
            return None
        self.facts["peak"] = peak.to_json()
        return Utilization(peak)

    def checkpointing_args(self, config_class: Any) -> dict[str, Any]:
        """Activation (gradient) checkpointing, under the name this transformers uses."""
        import dataclasses

        names = {field.name for field in dataclasses.fields(config_class)}
        prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
        on = self.gradient_checkpointing
        return {prefix: on, f"{prefix}_kwargs": {"use_reentrant": False} if on else None}

    def lora_config(self) -> Any:
        from peft import LoraConfig

        request = self.request
        extra: dict[str, Any] = {}
        if request.use_loftq and not has_module("bitsandbytes"):
            self.channel.warn("use_loftq needs bitsandbytes (peft quantizes with it); LoRA starts from the usual initialization")
        elif request.use_loftq:
            from peft import LoftQConfig

            extra = {"init_lora_weights": "loftq", "loftq_config": LoftQConfig(loftq_bits=4, loftq_iter=1)}
        return LoraConfig(
            r=request.lora_r,
            lora_alpha=request.lora_alpha,
            lora_dropout=request.lora_dropout,
            target_modules=request.target_modules or "all-linear",
            use_rslora=request.use_rslora,
            use_dora=request.use_dora,
            bias="none",
            task_type="CAUSAL_LM",
            **extra,
        )

    # -- resume -------------------------------------------------------------

    def resume_checkpoint(self) -> Optional[Path]:
        """The checkpoint named by resume_from_checkpoint: a checkpoint folder, a job folder, or a job id."""
        wanted = self.request.resume_from_checkpoint
        if not wanted:
            return None
        path = Path(wanted).expanduser()
        if not path.exists() and "/" not in wanted:
            path = self.jobs_dir / wanted  # a previous job's id
            if not path.is_dir():
                raise JobFailure("config_invalid", f"resume_from_checkpoint: {wanted!r} is neither a checkpoint folder nor a job id")
        if (path / "trainer_state.json").is_file():
            return path
        found = last_checkpoint(path) if path.is_dir() else None
        if found is None:
            raise JobFailure(
                "config_invalid",
                f"resume_from_checkpoint: no checkpoint in {path} (a job saves one every save_steps, and when it is stopped)",
            )
        self.facts["resumed_from"] = str(found)
        return found

    # -- outputs ------------------------------------------------------------

    def write_job_file(self, source: ModelSource) -> None:
        record = {"job_id": self.job_id, "base_model": source.to_json(), "method": self.method,
                  "training_type": self.request.training_type, "trust_remote_code": self.request.trust_remote_code}
        write_file(self.folder.job_file, json.dumps(record, indent=2))

    def save(self, trainer: Any, tokenizer: Any) -> None:
        """Write the adapter (or model) atomically: a folder appears complete or not at all."""
        final = self.folder.adapter if self.method == "lora" else self.folder.model
        if not trainer.is_world_process_zero():  # data-parallel workers (Ray): rank 0 writes the result
            return
        with save_atomically(final) as partial:
            trainer.model.save_pretrained(str(partial), safe_serialization=True)
            tokenizer.save_pretrained(str(partial))
        self.facts[f"{final.name}_dir"] = str(final)
