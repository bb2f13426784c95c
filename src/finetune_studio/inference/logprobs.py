"""Log-probabilities of tokens, from the logits a forward pass gave.

They are the model's own: `log_softmax` of the raw float32 logits, before
temperature and top_p shape the choice (what OpenAI and vLLM report). One call
takes every row that asked for them in one step (the batch's rows, or a prompt's
positions) and runs `log_softmax` once over them, then one `gather` for the chosen
tokens and one `topk` for the alternatives. The wire's shape is `TokenLogprob`
(wire.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import torch

from finetune_studio.wire import TokenLogprob, TopLogprob

# What a logprob of -inf (a token the model rules out) is reported as: JSON has no
# infinity, and OpenAI says -9999.0 for such a token too.
FLOOR = -9999.0

TokenBytes = Callable[[int], bytes]


def entries(logits: torch.Tensor, chosen: Sequence[int], tops: Sequence[int], token_bytes: TokenBytes) -> list[TokenLogprob]:
    """Row i of `logits` (`[rows, vocab]`, float32) chose `chosen[i]` and lists
    `tops[i]` alternatives: one TokenLogprob per row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(list(chosen), dtype=torch.long, device=logprobs.device).view(-1, 1)
    picked = logprobs.gather(1, index).view(-1).tolist()
    most = max(tops, default=0)
    top_values: list[list[float]] = []
    top_ids: list[list[int]] = []
    if most > 0:
        values, ids = torch.topk(logprobs, min(most, logprobs.shape[-1]), dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    found: list[TokenLogprob] = []
    for row, token in enumerate(chosen):
        alternatives = [alternative(top_ids[row][j], top_values[row][j], token_bytes) for j in range(tops[row])] if tops[row] else []
        found.append(entry(token, picked[row], alternatives, token_bytes))
    return found


def prompt_entries(logits: torch.Tensor, prompt: Sequence[int], top: int, token_bytes: TokenBytes) -> list[TokenLogprob]:
    """The prompt's tokens, each with the logprob the positions before it gave it
    (`logits[j]` predicts `prompt[j + 1]`); the first has none."""
    first = entry(prompt[0], None, [], token_bytes)
    if len(prompt) == 1:
        return [first]
    rest = entries(logits[: len(prompt) - 1], prompt[1:], [top] * (len(prompt) - 1), token_bytes)
    return [first, *rest]


def entry(token: int, logprob: Optional[float], top: list[TopLogprob], token_bytes: TokenBytes) -> TokenLogprob:
    raw = token_bytes(token)
    value = None if logprob is None else max(FLOOR, logprob)
    return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": value,
            "top_logprobs": top}


def alternative(token: int, logprob: float, token_bytes: TokenBytes) -> TopLogprob:
    raw = token_bytes(token)
    return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": max(FLOOR, logprob)}
