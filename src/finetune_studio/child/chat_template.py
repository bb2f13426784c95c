"""The one rule for a model without a chat template: it gets ChatML.

Training gives a conversational job's tokenizer ChatML when it has none (so its
adapters learn it), the dataset inspection renders rows as that job would, and chat
(transformers or a GGUF) prompts such a model the same way: one template, one
condition, one warning, here."""

from __future__ import annotations

from typing import Any, Optional

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_TEMPLATE_WARNING = "the tokenizer has no chat template; ChatML is used"


def needs_template(conversational: bool, training_type: Optional[str] = None) -> bool:
    """Whether rows are rendered through the tokenizer's chat template: conversations,
    and every row of a Continued Pretraining job (its text is wrapped as a turn)."""
    return conversational or training_type == "Continued Pretraining"


def template_or_chatml(template: Optional[str]) -> tuple[str, bool]:
    """The template to use and whether it is the ChatML fallback (the model had none)."""
    return (template, False) if template else (CHATML_TEMPLATE, True)


def ensure_chat_template(tokenizer: Any) -> bool:
    """Give a tokenizer without a chat template ChatML; True when it had none."""
    template, fell_back = template_or_chatml(getattr(tokenizer, "chat_template", None))
    if fell_back:
        tokenizer.chat_template = template
    return fell_back
