"""Choosing the next token from the last position's logits.

`temperature` 0 is greedy: the argmax, exactly as transformers' `generate(do_sample=False)`
picks it (over float32 logits); so is a temperature too small to divide the logits by. Otherwise softmax(logits / temperature), kept to the
smallest set of most likely tokens whose probabilities reach `top_p` (nucleus
sampling; the most likely token always stays), and drawn with the request's own
`torch.Generator`, so a seed gives the same answer whatever else runs beside it.
"""

from __future__ import annotations

from typing import Optional

import torch


def make_generator(device: torch.device, seed: Optional[int]) -> torch.Generator:
    """A generator on the logits' device, seeded with `seed`, or from the OS when None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """The next token id; `logits` is the float32 vector of the last position.

    A temperature too small to divide by is greedy: below about max|logit| / 3.4e38
    (float32's largest number; 1e-45, say) the scaled logits overflow to infinity (or to
    NaN, where a kernel multiplies by 1 / temperature), and their softmax is NaN,
    which torch.multinomial refuses. The limit of such a softmax is the argmax, so the
    argmax is what it picks. A top_p too small for float32 (1e-320 is 0 there) keeps
    the most likely token only, as every top_p does: greedy too."""
    if temperature == 0:
        return greedy(logits)
    scaled = logits / temperature
    if not bool(torch.isfinite(scaled.max())):
        return greedy(logits)
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        # A token is dropped when the more likely ones before it already reach top_p;
        # the most likely one never is (a top_p that rounds to 0 would drop it too).
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        dropped = before >= top_p
        dropped[..., 0] = False
        sorted_probs = sorted_probs.masked_fill(dropped, 0.0)
        choice = torch.multinomial(sorted_probs, num_samples=1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits).item())
