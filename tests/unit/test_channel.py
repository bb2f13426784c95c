"""The child's Channel and ProgressCallback: every message keeps to the wire's limits,
and a step whose loss is not finite is still reported."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from finetune_studio.bounds import MAX_ERROR_CHARS, MAX_WARNINGS
from finetune_studio.child.channel import Channel, StopSignal
from finetune_studio.wire import MAX_MESSAGE_BYTES, WorkerSpec


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


def test_the_callback_reports_throughput_accuracy_and_memory(monkeypatch: Any) -> None:
    from finetune_studio.schemas import TrainingProgress
    from finetune_studio.training import callbacks

    clock = iter([0.0, 100.0, 102.0, 104.0])  # made, training begins, then two steps two seconds apart
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    chan, out = channel()
    callback = callbacks.ProgressCallback(chan, StopSignal(), on_begin=lambda total, first: None)
    state = SimpleNamespace(global_step=0, max_steps=2)
    control = SimpleNamespace(should_evaluate=False, should_training_stop=False, should_save=False)
    callback.on_train_begin(None, state, control)
    for step, tokens, accuracy in ((1, 1000, 0.25), (2, 3000, math.nan)):
        state.global_step = step
        logs = {"loss": 1.0, "learning_rate": 1e-3, "num_tokens": tokens, "mean_token_accuracy": accuracy}
        callback.on_log(None, state, control, logs=logs)
    first, second = (message["progress"] for message in sent(out))
    assert first["tokens_per_second"] == 500.0 and first["mean_token_accuracy"] == 0.25
    assert second["tokens_per_second"] == 750.0  # 3000 tokens over the 4 s of both steps
    assert "mean_token_accuracy" not in second  # NaN is left out, not sent
    assert first["memory_bytes"] > 10_000_000  # this test process: Python and transformers
    assert "gpu_memory_bytes" not in first or first["gpu_memory_bytes"] >= 0
    assert TrainingProgress.model_validate(second).tokens_per_second == 750.0


def test_the_schema_drops_non_finite_optional_metrics() -> None:
    from finetune_studio.schemas import TrainingProgress

    event = {"step": 1, "total_steps": 2, "loss": 1.0, "learning_rate": 1e-3, "progress_percent": 50.0,
             "tokens_per_second": math.inf, "mean_token_accuracy": math.nan, "memory_bytes": 20_000_000}
    progress = TrainingProgress.model_validate(event)
    assert progress.tokens_per_second is None and progress.mean_token_accuracy is None
    assert progress.memory_bytes == 20_000_000 and progress.gpu_memory_bytes is None


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


# A child's start, in a process of its own: open_child_wire repoints its fd 1.
_CHILD = """
import sys
from finetune_studio.child.channel import open_child_wire, plain_channel

made = []

def make(events, stop, spec):
    made.append(spec.job_id)
    return plain_channel(events, stop, spec)

spec, channel, stop, events = open_child_wire(make)
print("a library's noise")
sys.stdout.flush()
channel.status("idle", f"spec {spec.job_id}, made for {made}")
stop.wait(300)  # a bound only: the stop line is already on stdin
channel.status("stopped", stop.reason)
"""


def test_open_child_wire_reads_the_spec_then_listens_for_stop_and_keeps_stdout_for_messages(tmp_path: Path) -> None:
    spec = WorkerSpec(job_id="job-7", output_dir=tmp_path, request={"model_name": "m"})
    wire_in = spec.to_line().decode() + "stop\n"
    result = subprocess.run(
        [sys.executable, "-c", _CHILD], input=wire_in, capture_output=True, text=True, check=True, timeout=300
    )
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["phase"] == "idle" and first["message"] == "spec job-7, made for ['job-7']"
    # The stop line, not the EOF after it, set the signal: the listener got the line after the spec.
    assert second["phase"] == "stopped" and second["message"] == "a stop was requested"
    assert "a library's noise" in result.stderr and "noise" not in result.stdout
