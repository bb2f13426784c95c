"""The trainer callback that reports every optimizer step and honours stop requests."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from transformers import TrainerCallback

if TYPE_CHECKING:
    from finetune_studio.training.recipe import Recipe


def _number(logs: dict[str, Any], key: str) -> Optional[float]:
    value = logs.get(key)
    return float(value) if value is not None else None


class ProgressCallback(TrainerCallback):  # type: ignore[misc]
    """One progress event per optimizer step.

    The trainer logs a step's loss, then (on evaluation steps) evaluates and logs
    `eval_loss` separately. A step that will be evaluated is held back until its
    evaluation arrives, so that its one event carries both losses.
    """

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.started = time.monotonic()
        self.first_step = 0
        self.pending: Optional[dict[str, Any]] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()
        self.first_step = int(state.global_step)  # above 0 when resuming from a checkpoint
        self.recipe.start_training(int(state.max_steps), self.first_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Checked after every optimizer step: the trainer then logs this step,
        # saves a checkpoint (so the job can be resumed from here), and leaves its loop.
        if self.recipe.stop.is_set():
            control.should_training_stop = True
            control.should_save = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" in logs:
            self._flush()
            self.pending = self._progress(state, logs)
            if not control.should_evaluate:
                self._flush()
        elif "eval_loss" in logs:
            if self.pending is not None and self.pending["step"] == int(state.global_step):
                self.pending["eval_loss"] = float(logs["eval_loss"])
                self._flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self.recipe.channel.progress(**self.pending)
            self.pending = None

    def _progress(self, state: Any, logs: dict[str, Any]) -> dict[str, Any]:
        step = int(state.global_step)
        total = max(int(state.max_steps), 1)
        elapsed = time.monotonic() - self.started
        done = step - self.first_step
        eta = elapsed / done * (total - step) if done > 0 else None
        return {
            "step": step,
            "total_steps": total,
            "loss": float(logs["loss"]),
            "learning_rate": float(logs.get("learning_rate", 0.0)),
            "progress_percent": round(100.0 * step / total, 2),
            "epoch": _number(logs, "epoch"),
            "elapsed_seconds": round(elapsed, 3),
            "eta_seconds": round(eta, 3) if eta is not None else None,
            "grad_norm": _number(logs, "grad_norm"),
            "num_tokens": int(logs["num_tokens"]) if logs.get("num_tokens") is not None else None,
            "timestamp": round(time.time(), 6),
        }
