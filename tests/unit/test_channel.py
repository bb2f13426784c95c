"""The child's Channel and ProgressCallback: every message keeps to the wire's limits,
and a step whose loss is not finite is still reported."""

from __future__ import annotations

import io
import json
import math
from types import SimpleNamespace
from typing import Any

from finetune_studio.bounds import MAX_ERROR_CHARS, MAX_WARNINGS
from finetune_studio.training.channel import Channel, StopSignal
from finetune_studio.wire import MAX_MESSAGE_BYTES


def channel() -> tuple[Channel, io.StringIO]:
    out = io.StringIO()
    return Channel(out, StopSignal()), out


def sent(out: io.StringIO) -> list[dict[str, Any]]:
    lines = out.getvalue().splitlines()
    assert all(len(line) < MAX_MESSAGE_BYTES for line in lines)
    return [json.loads(line) for line in lines]  # json.loads would take NaN: checked below that none is sent


def test_a_non_finite_loss_is_sent_as_null_with_loss_finite_false() -> None:
    chan, out = channel()
    chan.progress(step=1, total_steps=3, loss=math.nan, learning_rate=1e-3, progress_percent=33.3, grad_norm=math.inf)
    chan.progress(step=2, total_steps=3, loss=-math.inf, learning_rate=1e-3, progress_percent=66.7)
    chan.progress(step=3, total_steps=3, loss=0.5, learning_rate=1e-3, progress_percent=100.0, eval_loss=None)
    assert "NaN" not in out.getvalue() and "Infinity" not in out.getvalue()
    first, second, third = (message["progress"] for message in sent(out))
    assert first["loss"] is None and first["loss_finite"] is False and "grad_norm" not in first
    assert second["loss"] is None and second["loss_finite"] is False
    assert third["loss"] == 0.5 and "loss_finite" not in third and "eval_loss" not in third


def test_the_callback_reports_a_diverged_step_and_the_next_one() -> None:
    from finetune_studio.training.callbacks import ProgressCallback  # imports transformers

    chan, out = channel()
    callback = ProgressCallback(chan, StopSignal(), on_begin=lambda total, first: None)
    state = SimpleNamespace(global_step=0, max_steps=2)
    control = SimpleNamespace(should_evaluate=False, should_training_stop=False, should_save=False)
    callback.on_train_begin(None, state, control)
    for step, loss in ((1, math.nan), (2, 1.5)):
        state.global_step = step
        callback.on_log(None, state, control, logs={"loss": loss, "learning_rate": 1e-3, "grad_norm": math.nan})
    callback.on_train_end(None, state, control)
    steps = [message["progress"] for message in sent(out)]
    assert [p["step"] for p in steps] == [1, 2]
    assert steps[0]["loss"] is None and steps[0]["loss_finite"] is False and "grad_norm" not in steps[0]
    assert steps[1]["loss"] == 1.5 and "loss_finite" not in steps[1]


def test_warnings_are_capped_and_counted() -> None:
    chan, out = channel()
    for n in range(30):
        chan.warn(f"warning {n}")
    chan.warn("warning 0")  # a repeat is not a new warning
    chan.warn("w" * 5_000_000)
    chan.status("loading_model", "Loading")
    warnings = sent(out)[0]["details"]["warnings"]
    assert len(warnings) == MAX_WARNINGS
    assert warnings[:3] == ["warning 0", "warning 1", "warning 2"]
    assert warnings[-1] == "... and 12 more warnings (see the job's worker.log)"


def test_a_status_is_bounded_before_it_is_sent() -> None:
    chan, out = channel()
    key = "k" * 20_000_000  # a dataset's column name, quoted by an error
    chan.status("error", "Training failed", error=f"missing the column 'output' (found: {key})",
                details={"error_code": "dataset_invalid", "columns": {key: 1}, "loss": math.nan})
    (message,) = sent(out)
    assert message["phase"] == "error" and message["details"]["error_code"] == "dataset_invalid"
    assert len(message["error"]) < MAX_ERROR_CHARS + 40 and "(20,000,037 characters)" in message["error"]
    assert message["details"]["loss"] is None
    assert len(out.getvalue()) < 100_000


def test_a_message_over_the_pipe_limit_is_shrunk_rather_than_lost() -> None:
    chan, out = channel()
    chan.progress(step=1, total_steps=1, loss=1.0, learning_rate=1e-3, progress_percent=100.0, note="n" * (MAX_MESSAGE_BYTES + 10))
    (message,) = sent(out)
    assert message["progress"]["step"] == 1 and message["progress"]["loss"] == 1.0
    assert message["progress"]["note"].endswith(f"({MAX_MESSAGE_BYTES + 10:,} characters)")
