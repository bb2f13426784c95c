"""Issue 16 end to end: DPO, ORPO, KTO and GRPO jobs on the tiny model through a real
server and real training children, with what each method learns measured independently."""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import collect, phases
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train

# A preference the tiny model can learn whatever the prompt: one answer over another.
GOOD, BAD = "Yes, gladly.", "No way!"
QUESTIONS = [
    "What is the capital of France?", "What is two plus two?", "Translate hello into Spanish.",
    "Write a haiku about the sea.", "Summarize the meeting.", "What is LoRA?", "Name a colour.",
    "Count to three.", "Say something kind.", "What day is the meeting?", "Describe the fox.",
    "What is fine-tuning?",
]
HELD_OUT = ["What is the batch size?", "Describe the tide.", "Why is the room booked?", "What is a matrix?"]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def method_job(model: Path, data: Path, **fields: Any) -> dict[str, Any]:
    return {
        "model_name": str(model), "training_type": "LoRA/QLoRA", "format_type": "auto",
        "local_datasets": [str(data)], "batch_size": 2, "lora_r": 8, "lora_alpha": 16,
        "max_seq_length": 128, "save_steps": 0, "random_seed": 7, **fields,
    }


def run(server: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's final status details, and its progress events."""
    with server.client() as client:
        events = collect(client, client.start(body))
    assert phases(events)[-1] == "completed", events[-1].data
    return events[-1].data["details"], [e.data for e in events if e.kind == "progress"]


def completion_logps(model: Any, tokenizer: Any, prompt: str, answer: str) -> float:
    """log p(answer | prompt) under `model`, the chat template applied as in training."""
    import torch

    messages = [{"role": "user", "content": prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    full_ids = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": answer}], tokenize=True, return_dict=False
    )
    assert full_ids[: len(prompt_ids)] == prompt_ids
    ids = torch.tensor([full_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
    return float(logps[len(prompt_ids) - 1 :].sum())


def test_dpo_raises_the_held_out_margin_of_chosen_over_rejected(shared_server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": q, "chosen": GOOD, "rejected": BAD} for q in QUESTIONS])
    details, steps = run(shared_server, method_job(
        tiny_model, data, training_method="dpo", beta=0.1, max_steps=12, learning_rate="5e-3", batch_size=4,
    ))
    assert details["training_method"] == "dpo" and details["dataset"]["format"] == "preference"
    assert details["reference_model"] == "the base model (the adapter switched off)"
    assert [p["step"] for p in steps] == list(range(1, 13))
    for progress in steps:  # DPO's own figures on every step, beside the loss
        assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(progress["metrics"])

    # The margin measured by our own forward pass, not the trainer's logs, on prompts it never saw.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    with warnings.catch_warnings():  # peft reads a property transformers marks deprecated
        warnings.filterwarnings("ignore", category=FutureWarning)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), details["adapter_dir"]).eval()

    def margin() -> float:
        return statistics.mean(
            completion_logps(model, tokenizer, q, GOOD) - completion_logps(model, tokenizer, q, BAD) for q in HELD_OUT
        )

    trained = margin()
    with model.disable_adapter():
        base = margin()
    assert trained > base + 1.0, (base, trained)


def test_grpo_raises_the_mean_reward_from_the_first_steps_to_the_last(shared_server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    # The task: answer starting with a digit (a format reward). The random tiny model does so
    # about one time in forty; full fine-tuning lets it learn within a few dozen steps.
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": q} for q in QUESTIONS])
    details, steps = run(shared_server, method_job(
        tiny_model, data, training_type="Full Finetuning", training_method="grpo",
        reward_functions=[{"name": "regex", "pattern": r"^\s*[0-9]"}], num_generations=8, batch_size=8,
        max_completion_length=4, max_steps=30, learning_rate="3e-2", lr_scheduler_type="constant", random_seed=1,
    ))
    assert details["reference_model"] == "none (beta 0: no KL penalty)" and details["reward_functions"] == ["regex"]
    assert len(steps) == 30
    for progress in steps:
        assert {"reward", "reward_std", "rewards/regex/mean", "completions/mean_length"} <= set(progress["metrics"])
    rewards = [p["metrics"]["reward"] for p in steps]
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert last > first + 0.4, rewards


def test_orpo_kto_and_the_full_fine_tuning_paths_complete_and_stream_their_metrics(
    shared_server: ServerProcess, tiny_model: Path, tmp_path: Path
) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": q, "chosen": GOOD, "rejected": BAD} for q in QUESTIONS])
    details, steps = run(shared_server, method_job(tiny_model, pairs, training_method="orpo", max_steps=3))
    assert details["reference_model"] == "none (orpo is reference-free)" and Path(details["adapter_dir"]).is_dir()
    assert all({"log_odds_ratio", "nll_loss", "rewards/margins"} <= set(p["metrics"]) for p in steps), steps

    unpaired = write_jsonl(tmp_path / "unpaired.jsonl", [
        {"prompt": q, "completion": answer, "label": answer == GOOD} for q in QUESTIONS for answer in (GOOD, BAD)
    ])
    details, steps = run(shared_server, method_job(tiny_model, unpaired, training_method="kto", max_steps=3, batch_size=4))
    assert details["dataset"]["format"] == "unpaired" and details["beta"] == 0.1
    assert all("kl" in p["metrics"] for p in steps), steps
    assert any({"rewards/chosen", "rewards/rejected"} <= set(p["metrics"]) for p in steps), steps

    # Full fine-tuning: DPO measures against reference log-probabilities computed before the first step.
    details, steps = run(shared_server, method_job(
        tiny_model, pairs, training_type="Full Finetuning", training_method="dpo", max_steps=2,
    ))
    assert details["reference_model"] == "the base model's log-probabilities, computed before the first step"
    assert Path(details["model_dir"]).is_dir() and "rewards/margins" in steps[-1]["metrics"]

    # GRPO with LoRA, a reward that reads a column, and a batch that holds no whole group.
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": q, "answer": "4"} for q in QUESTIONS])
    details, steps = run(shared_server, method_job(
        tiny_model, prompts, training_method="grpo", batch_size=2, max_steps=2, max_completion_length=4,
        reward_functions=[{"name": "exact_match"}, {"name": "length", "target": 6, "weight": 0.5}],
    ))
    assert details["num_generations"] == 4
    assert any("grpo samples 4 completions a round" in w for w in details["warnings"]), details["warnings"]
    # Rewards are logged on the steps that sample (here every other one: a round feeds two steps).
    assert {"rewards/exact_match/mean", "rewards/length/mean"} <= set(steps[0]["metrics"]), steps


def test_bad_preference_data_fails_the_job_naming_file_and_line(shared_server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
    with shared_server.client() as client:
        events = collect(client, client.start(method_job(tiny_model, data, training_method="dpo", max_steps=2)))
    final = events[-1].data
    assert final["phase"] == "error" and final["details"]["error_code"] == "dataset_invalid"
    assert final["error"].startswith(f"{data}, line 2: missing the column 'chosen' (found: prompt)")
