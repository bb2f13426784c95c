"""A decode batch: the running answers of one base (and lane) that advance together,
one forward pass per step for all of them.

The rows share one KV cache (transformers' `DynamicCache`, its key and value tensors
`[rows, heads, columns, head_dim]` per layer), left-padded: row i's tokens are the
last `columns - pads[i]` columns, and the columns before them are zeros that the
attention mask hides. Each step feeds every row's last token at once, with the
mask and each row's own position (the tokens it has), so a row computes what it
would compute alone.

- **Joining.** Requests that start in the same step are prefilled together, in a
  cache of their own, left-padded as a batch is (`Batch.of_rows`; one request alone,
  one row). Prompts that begin as kept ones (prefix.py) start from a cache seeded with
  those columns, left-padded to the widest, and their tokens after them, as many in
  every row, run on top. Then they join: the narrower of the two (the batch, or the newcomers) is padded
  on the left to the other's width and the rows are stacked (one copy of the cache;
  transformers' cache copies itself on every step anyway).
- **Leaving.** A row that ends, fails or is cancelled is marked, and `compact()`
  keeps the others (`index_select` on every layer's tensors), cutting the columns
  that have become padding in every row; an empty batch holds no cache at all.

This module knows the cache's layout only; what runs the forward pass is the
model's (`BatchedModel.forward_rows`, models.py), and which requests share a batch
is the engine's.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch


class BatchedModel(Protocol):
    """What a batch needs of its model (models.LoadedModel)."""

    device: torch.device

    def forward_rows(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any,
        adapters: list[Optional[str]], all_positions: bool = False,
    ) -> torch.Tensor:
        """The float32 logits `[rows, vocab]` of each row's last column (`[rows, columns,
        vocab]`, every column's, with `all_positions`)."""
        ...


def cache_layers(cache: Any) -> list[Any]:
    """The layers of a cache whose keys and values are plain tensors (every layer of a
    batchable model's cache, once it holds tokens)."""
    return [layer for layer in getattr(cache, "layers", []) if isinstance(getattr(layer, "keys", None), torch.Tensor)]


def prefill(model: BatchedModel, request_ids: list[str], adapters: list[Optional[str]], prompts: list[list[int]],
            cache: Any, all_positions: bool = False, seeded: Optional[list[int]] = None) -> tuple[Batch, torch.Tensor]:
    """Prefill `prompts` (one per request, row i through `adapters[i]`) in one forward pass,
    left-padded into `cache` (empty): the batch of their rows, and the float32 logits of
    each row's last token `[rows, vocab]` (of every column, `[rows, columns, vocab]`, with
    `all_positions`: row i's prompt is its last `len(prompts[i])` columns).

    `seeded`: the cache already holds row i's first `seeded[i]` tokens, left-padded to the
    widest (prefix.seed_rows), and `prompts` are each row's tokens after them, all of one length."""
    device = model.device
    width = max(len(prompt) for prompt in prompts)
    pads = [width - len(prompt) for prompt in prompts]  # within the new columns
    held = max(seeded) if seeded else 0  # the columns the cache holds already
    before = [0] * len(prompts) if not seeded else [held - tokens for tokens in seeded]  # their padding, per row
    if seeded and any(pads):
        raise ValueError("prompts on a seeded cache must be of one length, so that no row has a gap")
    # The padding's ids are any token's (0): the mask hides them, and no row reads their logits.
    input_ids = torch.tensor([[0] * pad + prompt for prompt, pad in zip(prompts, pads, strict=True)], dtype=torch.long, device=device)
    new = torch.arange(width, device=device).view(1, -1)
    padding = torch.tensor([b + p for b, p in zip(before, pads, strict=True)], dtype=torch.long, device=device).view(-1, 1)
    attention_mask = (torch.arange(held + width, device=device).view(1, -1) >= padding).long()
    position_ids = (new + held - padding).clamp(min=0)  # row i's first new token is its (held - padding)th
    logits = model.forward_rows(input_ids, position_ids, attention_mask, cache, adapters, all_positions)
    return Batch.of_rows(model, request_ids, adapters, cache, padding.view(-1).tolist(), held + width), logits


def left_pad(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    """`tensor` (`[rows, heads, tokens, head_dim]`) with `columns` zero columns before its tokens."""
    if columns == 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], columns, tensor.shape[3])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)


class Batch:
    """The rows decoded together; see the module's docstring."""

    def __init__(self, model: BatchedModel) -> None:
        self.model = model
        self.ids: list[str] = []  # the request of each row, in row order
        self.adapters: list[Optional[str]] = []  # each row's adapter (None: the base)
        self.pads: list[int] = []  # each row's padding columns, on the left
        self.width = 0  # the cache's columns
        self.cache: Any = None
        self._leaving: set[str] = set()

    def __len__(self) -> int:
        return len(self.ids) - len(self._leaving)

    @property
    def members(self) -> list[str]:
        """The requests in the batch (not those that left), row by row."""
        return [request_id for request_id in self.ids if request_id not in self._leaving]

    @classmethod
    def of_rows(cls, model: BatchedModel, request_ids: list[str], adapters: list[Optional[str]], cache: Any,
                pads: list[int], width: int) -> Batch:
        """The rows of a prefill: `cache` holds one row per request, `width` columns, row i's
        first `pads[i]` of them padding."""
        batch = cls(model)
        batch.ids, batch.adapters, batch.pads, batch.width, batch.cache = list(request_ids), list(adapters), list(pads), width, cache
        return batch

    def join(self, request_id: str, adapter: Optional[str], cache: Any, tokens: int) -> None:
        """Add one prefilled request: `cache` holds its `tokens` tokens (one row)."""
        self.merge(Batch.of_rows(self.model, [request_id], [adapter], cache, [0], tokens))

    def merge(self, other: Batch) -> None:
        """Add the rows of `other` (which is left empty) after this batch's own."""
        self.compact()
        other.compact()
        if not other.ids:
            return
        if self.cache is None:
            self.cache, self.width, self.pads = other.cache, other.width, other.pads
        else:
            grow = max(0, other.width - self.width)  # the batch's rows get this many more padding columns
            pad = max(0, self.width - other.width)  # and the newcomers this many
            for mine, theirs in zip(cache_layers(self.cache), cache_layers(other.cache), strict=True):
                mine.keys = torch.cat([left_pad(mine.keys, grow), left_pad(theirs.keys, pad)], dim=0)
                mine.values = torch.cat([left_pad(mine.values, grow), left_pad(theirs.values, pad)], dim=0)
            self.pads = [p + grow for p in self.pads] + [p + pad for p in other.pads]
            self.width = max(self.width, other.width)
        self.ids.extend(other.ids)
        self.adapters.extend(other.adapters)
        other.ids, other.adapters, other.pads, other.width, other.cache = [], [], [], 0, None

    def leave(self, request_id: str) -> None:
        """Take a row out of the batch (its memory goes at the next `compact`)."""
        if request_id in self.ids:
            self._leaving.add(request_id)

    def compact(self) -> None:
        """Drop the rows that left, and the padding columns every remaining row has."""
        if not self._leaving:
            return
        keep = [i for i, request_id in enumerate(self.ids) if request_id not in self._leaving]
        self._leaving.clear()
        if not keep:
            self.ids, self.adapters, self.pads, self.width, self.cache = [], [], [], 0, None
            return
        cut = min(self.pads[i] for i in keep)
        index = torch.tensor(keep, dtype=torch.long, device=self.model.device)
        for layer in cache_layers(self.cache):
            layer.keys = layer.keys[:, :, cut:].index_select(0, index)
            layer.values = layer.values[:, :, cut:].index_select(0, index)
        self.ids = [self.ids[i] for i in keep]
        self.adapters = [self.adapters[i] for i in keep]
        self.pads = [self.pads[i] - cut for i in keep]
        self.width -= cut

    def forward(self, tokens: list[int]) -> torch.Tensor:
        """One step: `tokens[i]` (row i's last token) on top of each row; the float32
        logits `[rows, vocab]` of the next token of every row."""
        self.compact()
        device = self.model.device
        rows = len(self.ids)
        input_ids = torch.tensor(tokens, dtype=torch.long, device=device).view(rows, 1)
        position_ids = torch.tensor([self.width - pad for pad in self.pads], dtype=torch.long, device=device).view(rows, 1)
        if any(self.pads):
            columns = torch.arange(self.width + 1, device=device).view(1, -1)
            attention_mask = (columns >= torch.tensor(self.pads, device=device).view(-1, 1)).long()
        else:
            attention_mask = torch.ones((rows, self.width + 1), dtype=torch.long, device=device)
        logits = self.model.forward_rows(input_ids, position_ids, attention_mask, self.cache, self.adapters)
        self.width += 1
        return logits
