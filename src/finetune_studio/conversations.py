"""The rules of a conversation, for the file store and the dataset reader alike.

An upload is checked by the server (files/checks.py), a dataset by the training
child (child/datasets/); the server may not import training/, so the rules both
apply live here, in plain Python, and each side words its own answers:

- `CHAT_ROLES`: OpenAI's chat roles as the trainer names them (`developer` is the
  system); the file store refuses tool turns before it looks a role up.
- `is_text_part`: the one kind of content part trained on, `{"type": "text", "text": ...}`.
- `order_problem`: the turn order. An optional system turn, first only; then a user
  turn; user and assistant turns take turns, except that tool turns may follow an
  assistant turn (one or several), and the assistant answers after them; the last
  turn is `last`'s (the assistant's for a conversation, the user's for a prompt).
- `DATASET_SUFFIXES`: the files the dataset reader takes.
- `dpo_row`: OpenAI's preference row as the DPO trainer's (`prompt`, `chosen`, `rejected`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

Messages = list[dict[str, str]]

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

# The dataset files the training child reads (child/datasets/files.py), and so the studio's uploads.
DATASET_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")

OrderKind = Literal[
    "system_not_first",  # a system turn after the first
    "two_user_turns",  # two user turns in a row
    "two_assistant_turns",  # two assistant turns in a row
    "user_after_tool",  # the assistant answers a tool turn first
    "assistant_before_user",  # an assistant turn before any user turn
    "tool_without_assistant",  # a tool turn that follows no assistant turn
    "no_assistant",  # a conversation without an assistant turn
    "wrong_last",  # the last turn is not `last`'s
]


@dataclass(frozen=True)
class OrderProblem:
    """How the turns break the order: `kind`, at the turn `index`, whose role is `role`."""

    kind: OrderKind
    index: int
    role: str

    def text(self, words: Mapping[OrderKind, str], name: Callable[[int], str]) -> str:
        """The problem in a side's own words: `words[kind]`, a template of {here} (the turn's
        name, `name(index)`), {before} (the name of the turn before it) and {role}."""
        here = name(self.index) if self.index >= 0 else ""  # -1: no turns at all
        before = name(self.index - 1) if self.index > 0 else ""
        return words[self.kind].format(here=here, before=before, role=self.role)


def order_problem(roles: Sequence[str], last: Optional[str] = "assistant") -> Optional[OrderProblem]:
    """The first way the turns' `roles` break the order (module docstring), or None;
    `last`: the role the turns must end with (None: any)."""
    previous: Optional[str] = None
    for index, role in enumerate(roles):
        kind: Optional[OrderKind] = None
        if role == "system" and index:
            kind = "system_not_first"
        elif role == "user" and previous == "user":
            kind = "two_user_turns"
        elif role == "assistant" and previous == "assistant":
            kind = "two_assistant_turns"
        elif role == "user" and previous == "tool":
            kind = "user_after_tool"
        elif role == "assistant" and previous in (None, "system"):
            kind = "assistant_before_user"
        elif role == "tool" and previous not in ("assistant", "tool"):
            kind = "tool_without_assistant"
        if kind is not None:
            return OrderProblem(kind, index, role)
        previous = role
    if last == "assistant" and "assistant" not in roles:
        return OrderProblem("no_assistant", len(roles) - 1, previous or "")
    if last is not None and roles and previous != last:
        return OrderProblem("wrong_last", len(roles) - 1, previous or "")
    return None


def is_text_part(part: Any) -> bool:
    """Whether a content part is text (`{"type": "text", "text": ...}`), the only kind trained on."""
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def plain_messages(value: Any, at: str) -> Messages:
    """Checked messages as the trainer reads them: each role by `CHAT_ROLES`, text parts joined."""
    messages = []
    for message in value:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(str(part["text"]) for part in content)
        messages.append({"role": CHAT_ROLES[str(message["role"])], "content": str(content)})
    return messages


def dpo_row(row: Mapping[str, Any], messages: Callable[[Any, str], Messages] = plain_messages) -> dict[str, Messages]:
    """OpenAI's preference row, `{"input": {"messages": [...]}, "preferred_output": [{assistant}],
    "non_preferred_output": [{assistant}]}`, as the DPO trainer's (TRL's conversational
    preference rows): `{"prompt": [...], "chosen": [...], "rejected": [...]}`. Each part is
    read by `messages(value, where)` (where: OpenAI's name for it; an answer missing from
    the row is read as None), which may check it; the prompt is read first."""
    return {
        "prompt": messages(row["input"]["messages"], "input.messages"),
        "chosen": messages(row.get("preferred_output"), "preferred_output"),
        "rejected": messages(row.get("non_preferred_output"), "non_preferred_output"),
    }
