"""The request model: Studio defaults, the learning-rate string, the rules, and redaction."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from finetune_studio.schemas import TrainingProgress, TrainingStartRequest, TrainingStatus

BASE = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "alpaca", "local_datasets": ["d.jsonl"]}


def test_studio_defaults() -> None:
    request = TrainingStartRequest.model_validate(BASE)
    assert (request.num_epochs, request.learning_rate, request.batch_size) == (1, 2e-4, 1)
    assert (request.lora_r, request.lora_alpha, request.lora_dropout) == (16, 16, 0.0)
    assert (request.max_seq_length, request.load_in_4bit, request.save_steps, request.random_seed) == (2048, True, 100, 3407)
    assert request.optim == "adamw_8bit" and request.target_modules == [] and request.use_lora is True


@pytest.mark.parametrize("value, expected", [("2e-4", 2e-4), (" 0.001 ", 1e-3), (5e-5, 5e-5)])
def test_learning_rate_accepts_strings_and_numbers(value: object, expected: float) -> None:
    assert TrainingStartRequest.model_validate({**BASE, "learning_rate": value}).learning_rate == expected


@pytest.mark.parametrize(
    "change, message",
    [
        ({"learning_rate": "fast"}, "learning_rate must be a number"),
        ({"num_epochs": 0, "max_steps": 0}, "num_epochs and max_steps are both 0"),
        ({"use_rslora": True, "use_dora": True}, "exclusive"),
        ({"local_datasets": []}, "no training data"),
        ({"training_type": "RLHF"}, "training_type"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_requests_say_what_to_fix(change: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainingStartRequest.model_validate({**BASE, **change})


def test_unknown_fields_are_kept_aside_and_secrets_never_stored() -> None:
    request = TrainingStartRequest.model_validate({**BASE, "hf_token": "hf_secret", "wandb_token": "w", "mystery": 1})
    assert request.unknown_fields() == ["mystery"]
    stored = request.redacted()
    assert "hf_token" not in stored and "wandb_token" not in stored and "mystery" not in stored
    assert "hf_secret" not in str(stored)


def test_the_seed_models_keep_the_seed_fields() -> None:
    assert set(TrainingStatus.model_fields) == {"job_id", "phase", "is_training_running", "message", "error", "details"}
    seed_progress = {"step", "total_steps", "loss", "learning_rate", "progress_percent", "epoch", "elapsed_seconds", "eta_seconds"}
    assert seed_progress <= set(TrainingProgress.model_fields)


def test_a_null_for_a_setting_with_a_default_means_the_default() -> None:
    # What the Studio's UI sends for settings it leaves alone with local files.
    body = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": ["d.jsonl"],
            "train_split": None, "subset": None, "eval_split": None, "batch_size": None, "target_modules": None,
            "max_steps": None}
    request = TrainingStartRequest.model_validate(body)
    assert (request.train_split, request.batch_size, request.target_modules) == ("train", 1, [])
    assert request.subset is None and request.max_steps is None
    with pytest.raises(ValueError, match="model_name"):
        TrainingStartRequest.model_validate({**body, "model_name": None})  # required: null is still an error
