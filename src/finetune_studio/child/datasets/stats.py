"""What users want to know before they spend compute: rows, shape, token lengths, truncation.

`measure` takes the tokenizer the trainer will use (this module never imports torch
or transformers). Conversations are tokenized with the tokenizer's chat template,
raw text with the tokenizer itself plus the end-of-sequence token that the trainer
appends. Rows go to the tokenizer in batches, so 100k rows cost one template render
per row and one fast-tokenizer call per batch.
"""

from __future__ import annotations

import statistics
from typing import Any

from finetune_studio.child.datasets.load import LoadedData

BATCH_ROWS = 512


def token_lengths(data: LoadedData, tokenizer: Any, *, batch_rows: int = BATCH_ROWS) -> list[int]:
    """The length in tokens of every row, as the trainer will see it before truncation."""
    lengths: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for first in range(0, len(data.rows), batch_rows):
        batch = data.rows[first : first + batch_rows]
        if batch and "messages" not in batch[0] and "prompt" in batch[0]:
            lengths.extend(_method_lengths(batch, tokenizer))
        elif data.is_conversational:
            ids = tokenizer.apply_chat_template([row["messages"] for row in batch], tokenize=True, return_dict=False)
            lengths.extend(len(row) for row in ids)
        else:
            ids = tokenizer([row["text"] for row in batch], return_attention_mask=False)["input_ids"]
            lengths.extend(len(row) + (eos is not None and (not row or row[-1] != eos)) for row in ids)
    return lengths


def _method_lengths(batch: list[dict[str, Any]], tokenizer: Any) -> list[int]:
    """A training method's rows (datasets/methods.py): the prompt with its longest answer
    (chosen or rejected; the completion), or, for grpo, the prompt as the model sees it."""

    def lengths(conversations: list[list[dict[str, str]]], **options: Any) -> list[int]:
        ids = tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=False, **options)
        return [len(row) for row in ids]

    answers = [key for key in ("chosen", "rejected", "completion") if key in batch[0]]
    if not answers:
        return lengths([row["prompt"] for row in batch], add_generation_prompt=True)
    per_answer = [lengths([row["prompt"] + row[key] for row in batch]) for key in answers]
    return [max(row) for row in zip(*per_answer, strict=True)]


def measure(data: LoadedData, tokenizer: Any, max_seq_length: int) -> dict[str, Any]:
    """Rows, shape, token length min/median/max/total, and the rows longer than max_seq_length.

    Conversational data needs a chat template on the tokenizer: set the fallback
    template before calling this.
    """
    lengths = token_lengths(data, tokenizer)
    return {
        "rows": len(data.rows),
        "shape": data.shape,
        "tokens_min": min(lengths, default=0),
        "tokens_median": statistics.median(lengths) if lengths else 0,
        "tokens_max": max(lengths, default=0),
        "tokens_total": sum(lengths),
        "max_seq_length": max_seq_length,
        "truncated_rows": sum(1 for n in lengths if n > max_seq_length),
    }
