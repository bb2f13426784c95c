"""GRPO's built-in rewards: what a request's `reward_functions` name, as the callables TRL calls.

Each reward scores every sampled completion; the completion's reward is the sum of
the rewards times their `weight`, and GRPO moves the model towards the completions
that scored above the others for the same prompt. A completion is the model's text
(the assistant message's content, for conversational prompts).

- `exact_match` {column="answer", extract=None, ignore_case=true}: 1 when the
  completion, or its first match of the regular expression `extract` (group 1 if the
  expression has a group), equals the row's `column`; spaces at the ends never count.
  Else 0.
- `numeric_match` {column="answer", extract=None, tolerance=1e-6}: 1 when the
  completion's number (the last number in it, or the one in `extract`'s match) is
  within `tolerance` of the row's `column`; "1,000" reads as 1000. Else 0.
- `regex` {pattern, full_match=false, match_reward=1, miss_reward=0}: a format reward.
  The pattern is searched in the completion (matched against all of it with
  `full_match`); `.` matches line breaks too.
- `length` {target, unit="characters"|"words"|"tokens", tolerance=0}:
  1 / (1 + |length - target| / tolerance): 1 at the target, 0.5 at `tolerance` away
  (0 means half the target), falling smoothly beyond, so that every step closer counts.

Only these run: a request cannot name code of its own, since a reward runs inside the
training process with the user's rights.

TRL logs each reward under its name (`rewards/<name>/mean`, `.../std`); a second
reward of the same kind is named `<name>_2`, and so on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Optional, Union

from finetune_studio.child.numbers import parse_number
from finetune_studio.schemas import ExactMatchReward, LengthReward, NumericMatchReward, RegexReward

Completion = Union[str, list[dict[str, Any]]]
Reward = Union[ExactMatchReward, NumericMatchReward, RegexReward, LengthReward]


def completion_text(completion: Completion) -> str:
    """The text of a completion: itself, or the content of its messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)



def _extracted(pattern: Optional[re.Pattern[str]], text: str) -> Optional[str]:
    if pattern is None:
        return text
    match = pattern.search(text)
    if match is None:
        return None
    return match.group(1) if pattern.groups else match.group(0)


class BuiltinReward:
    """One configured reward: called by TRL with the batch's prompts and completions,
    the dataset's other columns as keyword lists, and `completion_ids`."""

    def __init__(self, config: Reward, name: str) -> None:
        self.config = config
        self.__name__ = name  # TRL names the reward's metrics after it
        pattern = getattr(config, "extract", None) if not isinstance(config, RegexReward) else config.pattern
        self.pattern = re.compile(pattern, re.DOTALL) if pattern else None

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Completion],
        completion_ids: Optional[Sequence[Sequence[int]]] = None,
        **columns: Any,
    ) -> list[Optional[float]]:
        texts = [completion_text(completion) for completion in completions]
        config = self.config
        if isinstance(config, (ExactMatchReward, NumericMatchReward)):
            references = columns.get(config.column)
            if references is None:  # the loader checks every row for the column; this is a guard
                raise KeyError(f"the reward {self.__name__} reads the column {config.column!r}, which the data lacks")
            return [self.match(text, str(reference)) for text, reference in zip(texts, references, strict=True)]
        if isinstance(config, RegexReward):
            return [self.format(text) for text in texts]
        ids = completion_ids or [[] for _ in texts]
        return [self.length(text, len(tokens)) for text, tokens in zip(texts, ids, strict=True)]

    def match(self, text: str, reference: str) -> float:
        config = self.config
        answer = _extracted(self.pattern, text)
        if answer is None:
            return 0.0
        if isinstance(config, NumericMatchReward):
            got, wanted = parse_number(answer), parse_number(reference)
            return 1.0 if got is not None and wanted is not None and abs(got - wanted) <= config.tolerance else 0.0
        if isinstance(config, ExactMatchReward) and config.ignore_case:
            return 1.0 if answer.strip().casefold() == reference.strip().casefold() else 0.0
        return 1.0 if answer.strip() == reference.strip() else 0.0

    def format(self, text: str) -> float:
        config = self.config
        if not isinstance(config, RegexReward) or self.pattern is None:
            raise TypeError("format() is the regex reward's")
        found = self.pattern.fullmatch(text) if config.full_match else self.pattern.search(text)
        return config.match_reward if found else config.miss_reward

    def length(self, text: str, tokens: int) -> float:
        config = self.config
        if not isinstance(config, LengthReward):
            raise TypeError("length() is the length reward's")
        size = {"characters": len(text), "words": len(text.split()), "tokens": tokens}[config.unit]
        tolerance = config.tolerance or max(config.target, 1) / 2
        return 1.0 / (1.0 + abs(size - config.target) / tolerance)


def build_rewards(configs: Sequence[Reward]) -> tuple[list[BuiltinReward], list[float]]:
    """The reward callables for GRPOTrainer's `reward_funcs`, and their weights (`reward_weights`)."""
    seen: dict[str, int] = {}
    rewards = []
    for config in configs:
        seen[config.name] = seen.get(config.name, 0) + 1
        name = config.name if seen[config.name] == 1 else f"{config.name}_{seen[config.name]}"
        rewards.append(BuiltinReward(config, name))
    return rewards, [config.weight for config in configs]
