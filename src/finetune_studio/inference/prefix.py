"""Prompts kept: the keys and values of recent prompts, so that a prompt that begins as one
of them prefills only what comes after.

Two of the studio's own clients send such prompts. A `heldout` evaluation row asks first
for the log-probabilities of its conversation with the reference answer (a completion with
prompt logprobs and no new token) and then for the model's own answer to the conversation:
the answer's prompt is the start of the text just scored, up to the assistant's turn. A
chat's next turn sends the whole conversation again: its start is the previous turn's prompt.

- **Kept.** After each prefill on a model that batches (its cache is plain per-layer
  tensors, batch.py), each prompt's keys and values: its own columns (no padding), one row,
  with its tokens, under its model and adapter. At most MAX_KEPT_BYTES of them; the least
  recently used go first, and those of a model that is no longer loaded.
- **Used.** A prompt looks for the kept one that shares its longest start, of at least
  MIN_SHARED tokens; its tokens after that start are then run on top of a copy of those
  columns (at least its last token is run: its logits choose the first new token). Such
  prompts that start in one step with as many tokens after their kept starts (a chat's
  next turns with one follow-up) prefill together, on a cache seeded with each one's
  columns (`seed_rows`); the others alone. One with only its last token after the kept
  start (an evaluation's answer, asked after its row's loss pass) joins its batch on the
  copy, and that token runs in the batch's next decode step (engine.py).
  A prompt that wants every position's logits (prompt logprobs) never uses one: the
  positions it would skip are positions it asked about.

The answer is the one it would be without: the same tokens at the same positions through
the same weights give the same keys and values, up to the float rounding by which a batched
prefill's rows already differ from a lone one's.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import torch

from finetune_studio.inference.batch import cache_layers, left_pad

# The kept prompts' tensors, at most (the least recently used are dropped past it): room for
# a batch's worth of evaluation prompts of a small model, a fraction of a large one's memory.
MAX_KEPT_BYTES = 256 * 1024 * 1024
# A shared start shorter than this is prefilled again: copying the columns would save little.
MIN_SHARED = 16


@dataclass
class Kept:
    """One prompt's keys and values: per layer, `[1, heads, tokens, head_dim]`."""

    owner: weakref.ref[Any]  # the loaded model (a ChatModel) whose weights made them: not kept alive by this
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PrefixCache:
    """The kept prompts of every loaded model (see the module's docstring)."""

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES, min_shared: int = MIN_SHARED) -> None:
        self.max_bytes = max_bytes
        self.min_shared = min_shared
        self._kept: OrderedDict[tuple[int, Optional[str], tuple[int, ...]], Kept] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # prompts that used a kept start
        self.reused_tokens = 0  # the tokens those starts saved prefilling

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes(self) -> int:
        return self._bytes

    def keep(self, owner: Any, adapter: Optional[str], tokens: list[int], cache: Any, row: int = 0, pad: int = 0) -> None:
        """Keep row `row` of `cache` (its prompt `tokens`, after `pad` columns of padding)."""
        if len(tokens) < self.min_shared:
            return
        key = (id(owner), adapter, tuple(tokens))
        if key in self._kept:
            self._kept.move_to_end(key)
            return
        layers = cache_layers(cache)
        if not layers:
            return
        end = pad + len(tokens)
        kept = Kept(weakref.ref(owner), tuple(tokens), [layer.keys[row:row + 1, :, pad:end].clone() for layer in layers],
                    [layer.values[row:row + 1, :, pad:end].clone() for layer in layers])
        size = kept.bytes
        if size > self.max_bytes:
            return
        self._kept[key] = kept
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._kept)))

    def longest(self, owner: Any, adapter: Optional[str], tokens: list[int]) -> Optional[tuple[Kept, int]]:
        """The kept prompt of `owner` and `adapter` that shares the longest start with `tokens`,
        and how many of its tokens to reuse (at most all but the last of `tokens`); None when
        no start of MIN_SHARED tokens is shared."""
        best: Optional[tuple[Kept, int]] = None
        limit = len(tokens) - 1
        for key, kept in self._kept.items():
            if key[0] != id(owner) or key[1] != adapter or kept.owner() is not owner:
                continue
            shared = _shared_start(kept.tokens, tokens, limit)
            if shared >= self.min_shared and (best is None or shared > best[1]):
                best = (kept, shared)
        if best is not None:
            self._kept.move_to_end((id(owner), adapter, best[0].tokens))
            self.hits += 1
            self.reused_tokens += best[1]
        return best

    def forget(self, loaded: list[Any]) -> None:
        """Drop what was kept for a model that is not among `loaded` (unloaded, or replaced)."""
        for key in [key for key, kept in self._kept.items() if not any(kept.owner() is entry for entry in loaded)]:
            self._drop(key)

    def _drop(self, key: tuple[int, Optional[str], tuple[int, ...]]) -> None:
        kept = self._kept.pop(key)
        self._bytes -= kept.bytes


def seed_rows(cache: Any, starts: list[tuple[Kept, int]]) -> list[int]:
    """Fill the empty `cache` with one row per start: row i the first `starts[i][1]` columns
    of `starts[i][0]`, left-padded to the widest (as batch.py lays a batch out), as copies (the
    kept tensors stay as they are). Each row's tokens held (`prefill(..., seeded=)`)."""
    held = [tokens for _, tokens in starts]
    width = max(held)
    for layer in range(len(starts[0][0].keys)):
        keys = torch.cat([left_pad(kept.keys[layer][:, :, :tokens], width - tokens) for kept, tokens in starts], dim=0)
        values = torch.cat([left_pad(kept.values[layer][:, :, :tokens], width - tokens) for kept, tokens in starts], dim=0)
        cache.update(keys, values, layer)
    return held


def _shared_start(a: tuple[int, ...], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
