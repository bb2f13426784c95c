"""eval_samples, end to end: on each evaluated step of a real (tiny) run the progress
event carries the model's greedy answers to the first eval_sample_count evaluation
prompts, rendered with its chat template; other steps carry none, and 0 turns them off."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from finetune_studio.child.datasets import load_local
from finetune_studio.training.callbacks import EVAL_SAMPLE_NEW_TOKENS
from tests.data.corpus import GOOD
from tests.helpers.jobs import collect, job_request
from tests.helpers.servers import ServerProcess

EVAL_FILE = GOOD / "chatml.jsonl"


@pytest.mark.train
def test_evaluated_steps_carry_the_models_answers_to_eval_prompts(server: ServerProcess, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    rows = load_local([str(EVAL_FILE)], "auto").rows
    expected = []
    for row in rows[:3]:  # each conversation up to its last answer, as the model is prompted
        messages = row["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        expected.append(tokenizer.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True))

    # precision fp32: the samples are compared with fp32 greedy answers below (auto is bf16 on a CPU with AMX).
    common = {"local_eval_datasets": [str(EVAL_FILE)], "format_type": "auto", "max_steps": 4, "eval_steps": 0.5,
              "precision": "fp32"}
    with server.client() as client:
        sampled = client.start(job_request(tiny_model, eval_sample_count=3, **common))
        off = client.start(job_request(tiny_model, eval_sample_count=0, **common))
        events = {job: collect(client, job) for job in (sampled, off)}

    for events_of_job in events.values():
        assert events_of_job[-1].data["phase"] == "completed", events_of_job[-1].data
    steps = [e.data for e in events[sampled] if e.kind == "progress"]
    evaluated = [p for p in steps if p.get("eval_loss") is not None]
    assert [p["step"] for p in evaluated] == [2, 4]
    assert all(0 <= p["eval_mean_token_accuracy"] <= 1 for p in evaluated)  # TRL's, over the evaluation data
    for progress in evaluated:
        samples = progress["eval_samples"]
        assert [s["prompt"] for s in samples] == expected
        assert all(isinstance(s["completion"], str) for s in samples)
    # The last evaluation's answers are the greedy answers of the weights the job saved (trained to that step).
    final = events[sampled][-1].data["details"]
    assert [s["completion"] for s in evaluated[-1]["eval_samples"]] == greedy(tiny_model, final["adapter_dir"], expected)
    assert all("eval_samples" not in p for p in steps if p.get("eval_loss") is None)

    off_steps = [e.data for e in events[off] if e.kind == "progress"]
    assert [p["step"] for p in off_steps if p.get("eval_loss") is not None] == [2, 4]
    assert all("eval_samples" not in p for p in off_steps)


def greedy(base: Path, adapter: str, prompts: list[str]) -> list[str]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    with warnings.catch_warnings():  # peft asks transformers a question it has renamed (a FutureWarning, not ours)
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), adapter).eval()
    answers = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
            out = model.generate(**ids, max_new_tokens=EVAL_SAMPLE_NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            answers.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return answers
