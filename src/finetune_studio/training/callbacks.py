"""The trainer callback that reports every optimizer step and honours stop requests."""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Optional

from transformers import TrainerCallback

from finetune_studio.child.channel import Channel, StopSignal
from finetune_studio.training.throughput import Utilization
from finetune_studio.training.trackers import Trackers

# The tokens-per-second rate is taken over this many of the latest steps: recent
# enough to follow a change of speed, long enough not to jump with every batch.
RATE_WINDOW_STEPS = 10

try:
    _PAGE_SIZE: Optional[int] = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):  # not a POSIX system
    _PAGE_SIZE = None


def _number(logs: dict[str, Any], key: str) -> Optional[float]:
    value = logs.get(key)
    return float(value) if value is not None else None


# What a trainer logs that has a field of its own in TrainingProgress, or says nothing of the
# training (timings): every other number it logs at a step is the method's (`metrics`).
_OWN_FIELDS = frozenset(
    {"loss", "learning_rate", "grad_norm", "epoch", "num_tokens", "mean_token_accuracy", "step", "step_time",
     "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}
)
_EVAL_OWN_FIELDS = frozenset({"eval_loss", "eval_mean_token_accuracy", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"})
MAX_METRICS = 64  # a step's event stays small whatever a trainer logs
MAX_METRIC_NAME = 80


def method_metrics(logs: dict[str, Any], prefix: str = "") -> Optional[dict[str, float]]:
    """The finite numbers of a step's log beyond TrainingProgress's own fields, by TRL's
    names (`rewards/margins`, `reward`, `rewards/exact_match/mean`...); with `prefix`
    ("eval_"), those of an evaluation's log that start with it. None when there are none."""
    found: dict[str, float] = {}
    for key, value in logs.items():
        if len(found) >= MAX_METRICS:
            break
        if prefix and (not key.startswith(prefix) or key in _EVAL_OWN_FIELDS):
            continue
        if not prefix and (key in _OWN_FIELDS or key.startswith("eval_")):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or len(key) > MAX_METRIC_NAME:
            continue
        if math.isfinite(value):
            found[key] = float(value)
    return found or None


class ResidentMemory:
    """This process's resident memory (RSS) in bytes, from /proc/self/statm (Linux);
    None where there is no such file. The file is opened once and re-read in place
    (a few µs), so that it costs next to nothing on every step."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._unavailable = _PAGE_SIZE is None

    def __call__(self) -> Optional[int]:
        if self._unavailable or _PAGE_SIZE is None:
            return None
        try:
            if self._fd is None:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            return int(os.pread(self._fd, 256, 0).split()[1]) * _PAGE_SIZE
        except (OSError, ValueError, IndexError, AttributeError):  # no /proc (or no pread): stop asking
            self._unavailable = True
            return None


resident_bytes = ResidentMemory()  # one descriptor for the process's life (a training child)


def _gpu_memory_reader() -> Optional[Callable[[], int]]:
    """The reader of the GPU memory this process holds, or None without a CUDA GPU.
    Asked once per run: torch is imported here, lazily (the trainer has already
    imported it by then)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.memory_reserved


# eval_samples: how long an answer may be, and how much of a prompt and an answer an event carries.
EVAL_SAMPLE_NEW_TOKENS = 48
EVAL_SAMPLE_CHARS = 1_000


def eval_prompts(tokenizer: Any, rows: list[dict[str, Any]], count: int) -> list[str]:
    """The prompts of the first `count` evaluation rows, as the model sees them: a
    conversation up to its last answer, rendered with the chat template and its
    generation prompt; raw text cut to its first half (at most EVAL_SAMPLE_CHARS)."""
    prompts = []
    for row in rows[:count]:
        if "messages" in row:
            messages = row["messages"]
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
            prompts.append(str(tokenizer.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True)))
        elif "prompt" in row:  # a dpo, orpo, kto or grpo row (datasets/methods.py): its prompt's messages
            prompts.append(str(tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)))
        else:
            text = str(row["text"])
            prompts.append(text[: min(len(text) // 2 or len(text), EVAL_SAMPLE_CHARS)])
    return prompts


class EvalSampler:
    """The model's greedy answers to a few evaluation prompts: `eval_samples` of an evaluated step."""

    def __init__(self, prompts: list[str], max_new_tokens: int = EVAL_SAMPLE_NEW_TOKENS) -> None:
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens

    def __call__(self, model: Any, tokenizer: Any) -> list[dict[str, str]]:
        import torch

        from finetune_studio.bounds import excerpt

        was_training = model.training
        model.eval()  # no dropout: the answer the weights give now
        samples = []
        try:
            device = next(model.parameters()).device
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            with torch.no_grad():
                for prompt in self.prompts:
                    # The template already holds the special tokens the model expects.
                    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
                    output = model.generate(
                        **encoded, max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=pad
                    )
                    answer = tokenizer.decode(output[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
                    samples.append({"prompt": excerpt(prompt, EVAL_SAMPLE_CHARS), "completion": excerpt(answer, EVAL_SAMPLE_CHARS)})
        finally:
            if was_training:
                model.train()
        return samples


class ProgressCallback(TrainerCallback):
    """One progress event per optimizer step.

    The trainer logs a step's loss, then (on evaluation steps) evaluates and logs
    `eval_loss` separately. A step that will be evaluated is held back until its
    evaluation arrives, so that its one event carries both losses.
    """

    def __init__(self, channel: Channel, stop: StopSignal, on_begin: Callable[[int, int], None]) -> None:
        """`on_begin(total_steps, first_step)` runs when the trainer starts its loop
        (the recipe announces `training` there, once the trainer knows its steps)."""
        self.channel = channel
        self.stop = stop
        self.on_begin = on_begin
        self.started = time.monotonic()
        self.first_step = 0
        self.pending: Optional[dict[str, Any]] = None
        # The first step whose loss or gradient norm was not finite, and what it was
        # (e.g. "loss nan"): the recipe ends the job as `diverged` once the trainer returns.
        self.diverged: Optional[tuple[int, str]] = None
        # (time, tokens trained) at the latest steps, for `tokens_per_second`. TRL
        # counts `num_tokens` from 0 in each process, resumed or not.
        self.token_marks: deque[tuple[float, int]] = deque([(self.started, 0)], maxlen=RATE_WINDOW_STEPS + 1)
        self.gpu_memory: Optional[Callable[[], int]] = None
        # Set by the recipe when the job evaluates and asks for eval_samples (eval_sample_count > 0).
        self.eval_sampler: Optional[Callable[[Any, Any], list[dict[str, str]]]] = None
        # Set by the recipe for dpo, orpo, kto and grpo: their own figures go in `metrics`.
        self.method_metrics = False
        # Set by the recipe once it knows the device's peak: each step's `mfu`.
        self.utilization: Optional[Utilization] = None
        self.rows_per_step = 1  # rows trained in an optimizer step (all workers): for the mean row length
        # Set by the recipe when report_to names MLflow or Trackio: each event's metrics go to them too.
        self.trackers: Optional[Trackers] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()
        self.first_step = int(state.global_step)  # above 0 when resuming from a checkpoint
        self.token_marks = deque([(self.started, 0)], maxlen=RATE_WINDOW_STEPS + 1)
        self.gpu_memory = _gpu_memory_reader()
        workers = max(1, int(getattr(args, "world_size", 1) or 1))
        self.rows_per_step = max(1, int(getattr(args, "per_device_train_batch_size", 1) or 1)
                                 * int(getattr(args, "gradient_accumulation_steps", 1) or 1) * workers)
        if self.utilization is not None:
            try:
                self.utilization.begin(kwargs.get("model"), workers)
            except Exception:  # noqa: BLE001 - a figure of the run, never a reason to stop it
                self.utilization = None
        self.on_begin(int(state.max_steps), self.first_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Checked after every optimizer step: the trainer then logs this step,
        # saves a checkpoint (so the job can be resumed from here), and leaves its loop.
        if self.stop.stops_at(int(state.global_step)):
            control.should_training_stop = True
            control.should_save = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" in logs:
            self._flush()
            self.pending = self._progress(state, logs)
            self._check_divergence(logs, control)
            if not control.should_evaluate:
                self._flush()
        elif "eval_loss" in logs:
            if self.pending is not None and self.pending["step"] == int(state.global_step):
                self.pending["eval_loss"] = float(logs["eval_loss"])
                accuracy = _number(logs, "eval_mean_token_accuracy")
                if accuracy is not None:
                    self.pending["eval_mean_token_accuracy"] = accuracy
                if self.method_metrics:
                    evaluated = method_metrics(logs, prefix="eval_")
                    if evaluated:
                        self.pending["metrics"] = {**(self.pending.get("metrics") or {}), **evaluated}
                if self.eval_sampler is not None and getattr(state, "is_world_process_zero", True):
                    self.pending["eval_samples"] = self._eval_samples(kwargs.get("model"), kwargs.get("processing_class"))
                self._flush()

    def _eval_samples(self, model: Any, tokenizer: Any) -> Optional[list[dict[str, str]]]:
        """The sampler's answers; a failure to generate costs the samples (said once), never the job."""
        if self.eval_sampler is None or model is None or tokenizer is None:
            return None
        try:
            return self.eval_sampler(model, tokenizer)
        except Exception as exc:  # noqa: BLE001 - training goes on without samples
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.channel.warn(f"eval_samples: the model could not generate ({type(exc).__name__}: {text}); no more samples")
            self.eval_sampler = None
            return None

    def _check_divergence(self, logs: dict[str, Any], control: Any) -> None:
        """Stop training at the first NaN or infinite loss or gradient norm: every
        step after it would train on garbage. No checkpoint is saved here, so the
        last one before the divergence stays the newest."""
        if self.diverged is not None or self.pending is None:
            return
        for key in ("loss", "grad_norm"):
            value = _number(logs, key)
            if value is not None and not math.isfinite(value):
                self.diverged = (int(self.pending["step"]), f"{key.replace('_', ' ')} {value}")
                control.should_training_stop = True
                control.should_save = False
                control.should_evaluate = False
                return

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self.channel.progress(**self.pending)
            if self.trackers is not None:
                self.trackers.log_step(self.pending)
            self.pending = None

    def _tokens_per_second(self, now: float, tokens: Optional[int]) -> Optional[float]:
        """Tokens trained per second over the last `RATE_WINDOW_STEPS` steps (fewer at the start)."""
        if tokens is None:
            return None
        if tokens < self.token_marks[-1][1]:  # a counter that started again: start the window again
            self.token_marks.clear()
            self.token_marks.append((self.started, 0))
        self.token_marks.append((now, tokens))
        then, before = self.token_marks[0]
        seconds = now - then
        return (tokens - before) / seconds if seconds > 0 and tokens > before else None

    def _mean_row_tokens(self) -> Optional[float]:
        """The mean length of the rows trained over the rate's window (its steps' tokens
        over their rows): the attention's context in the FLOPs per token."""
        steps = len(self.token_marks) - 1
        tokens = self.token_marks[-1][1] - self.token_marks[0][1]
        return tokens / (steps * self.rows_per_step) if steps > 0 and tokens > 0 else None

    def _mfu(self, rate: Optional[float]) -> Optional[float]:
        if self.utilization is None or rate is None:
            return None
        try:
            return self.utilization.mfu(rate, self._mean_row_tokens())
        except Exception:  # noqa: BLE001 - a figure of the run, never a reason to stop it
            self.utilization = None
            return None

    def _progress(self, state: Any, logs: dict[str, Any]) -> dict[str, Any]:
        step = int(state.global_step)
        total = max(int(state.max_steps), 1)
        now = time.monotonic()
        elapsed = now - self.started
        done = step - self.first_step
        eta = elapsed / done * (total - step) if done > 0 else None
        # A diverged step (NaN or infinite loss) is reported all the same: JSON has no
        # NaN, so the loss goes as null and the flag says why.
        loss = _number(logs, "loss")
        finite = loss is not None and math.isfinite(loss)
        tokens = int(logs["num_tokens"]) if logs.get("num_tokens") is not None else None
        rate = self._tokens_per_second(now, tokens)
        return {
            "step": step,
            "total_steps": total,
            "loss": loss if finite else None,
            "loss_finite": finite,
            "learning_rate": float(logs.get("learning_rate", 0.0)),
            "progress_percent": round(100.0 * step / total, 2),
            "epoch": _number(logs, "epoch"),
            "elapsed_seconds": round(elapsed, 3),
            "eta_seconds": round(eta, 3) if eta is not None else None,
            "grad_norm": _number(logs, "grad_norm"),
            "num_tokens": tokens,
            "tokens_per_second": round(rate, 1) if rate is not None else rate,
            "mfu": self._mfu(rate),
            "mean_token_accuracy": _number(logs, "mean_token_accuracy"),
            "memory_bytes": resident_bytes(),
            "gpu_memory_bytes": self.gpu_memory() if self.gpu_memory is not None else None,
            "timestamp": round(time.time(), 6),
            "metrics": method_metrics(logs) if self.method_metrics else None,
        }
