"""The trainer callback that reports every optimizer step and honours stop requests."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from finetune_studio.worker.recipe import Recipe


class ProgressCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.started = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()
        self.recipe.start_training(int(state.max_steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Checked after every optimizer step: the trainer then logs this step,
        # leaves its loop, and the recipe saves what was trained.
        if self.recipe.stop.is_set():
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return  # the end-of-training summary, or an evaluation
        step = int(state.global_step)
        total = max(int(state.max_steps), 1)
        elapsed = time.monotonic() - self.started
        eta = elapsed / step * (total - step) if step else None
        self.recipe.channel.progress(
            step=step,
            total_steps=total,
            loss=float(logs["loss"]),
            learning_rate=float(logs.get("learning_rate", 0.0)),
            progress_percent=round(100.0 * step / total, 2),
            epoch=float(logs["epoch"]) if logs.get("epoch") is not None else None,
            elapsed_seconds=round(elapsed, 3),
            eta_seconds=round(eta, 3) if eta is not None else None,
            grad_norm=float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
            num_tokens=int(logs["num_tokens"]) if logs.get("num_tokens") is not None else None,
        )
