"""train_on_completions: only the assistant's answers carry loss, checked on the labels
the trainer builds."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.train

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "Six."},
]


def test_only_answer_tokens_are_trained(tiny_model: Path, tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from finetune_studio.child.completions import tokenize_with_assistant_mask

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = tokenize_with_assistant_mask(tokenizer, CONVERSATION)
    assert len(row["input_ids"]) == len(row["assistant_masks"])
    answer_ids = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(answer_ids) == "Four.<|im_end|>\nSix.<|im_end|>\n"

    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_length=512,
                       completion_only_loss=False, activation_checkpointing=False),
        train_dataset=Dataset.from_list([row]),
        processing_class=tokenizer,
    )
    labels = trainer.train_dataset[0]["labels"]
    ids = trainer.train_dataset[0]["input_ids"]
    assert ids == row["input_ids"]
    trained = [t for t, label in zip(ids, labels, strict=True) if label != -100]
    assert trained == answer_ids
    prompt_text = tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label == -100])
    assert "What is two plus two?" in prompt_text and "Be brief." in prompt_text and "Four." not in prompt_text


def test_an_answer_with_weight_0_is_context_not_trained(tiny_model: Path) -> None:
    # OpenAI's chat format: `weight: 0` on an assistant turn keeps it out of the loss,
    # from the file (the chatml reader keeps the weight) to the mask.
    from transformers import AutoTokenizer

    from finetune_studio.child.completions import tokenize_with_assistant_mask
    from finetune_studio.child.datasets.shapes import Notes, converter

    weighted = [dict(turn) for turn in CONVERSATION]
    weighted[2]["weight"] = 0  # type: ignore[assignment]
    row = converter("chatml")({"messages": weighted}, Notes())
    assert row["messages"][2]["weight"] == 0 and "weight" not in row["messages"][4]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    masked = tokenize_with_assistant_mask(tokenizer, row["messages"])
    answer_ids = [t for t, m in zip(masked["input_ids"], masked["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(answer_ids) == "Six.<|im_end|>\n"
