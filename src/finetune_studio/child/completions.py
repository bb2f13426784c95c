"""Loss on the assistant's answers only (`train_on_completions`).

A conversation is rendered with the model's chat template; each assistant turn's
span in the text is found by rendering the conversation up to that turn (with the
generation prompt) and through it; an assistant turn with `weight: 0` (OpenAI's
chat format: context, not trained on) gets no span. Tokens whose characters fall in an assistant
span get mask 1, all others 0 (system, user, the role headers). The trainer turns
mask-0 tokens into label -100, so they cost no loss. The end-of-turn marker that
closes each answer is part of the span: the model learns when to stop.

Works with any chat template that renders a conversation's prefix as a prefix of
the whole, which every common template does; one that does not is refused with a
clear error rather than trained wrongly.
"""

from __future__ import annotations

from typing import Any

from finetune_studio.child.channel import JobFailure


def render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt))


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    text = render(tokenizer, messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or message.get("weight") == 0:
            continue  # not an answer, or one OpenAI's format marks as context (weight 0)
        start_text = render(tokenizer, messages[:index], add_generation_prompt=True) if index else ""
        end_text = render(tokenizer, messages[: index + 1])
        if not (text.startswith(start_text) and text.startswith(end_text)):
            raise JobFailure(
                "config_invalid",
                "train_on_completions: this model's chat template does not render a conversation's beginning as the"
                " beginning of the whole, so the answers cannot be located; set train_on_completions to false",
            )
        spans.append((len(start_text), len(end_text)))
    return text, spans


def tokenize_with_assistant_mask(tokenizer: Any, messages: list[dict[str, Any]]) -> dict[str, list[int]]:
    """`input_ids` and `assistant_masks` (1 on answer tokens) for one conversation."""
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for start, end in encoded["offset_mapping"]:
        inside = end > start and any(a <= start and end <= b for a, b in spans)
        mask.append(1 if inside else 0)
    return {"input_ids": list(encoded["input_ids"]), "assistant_masks": mask}
