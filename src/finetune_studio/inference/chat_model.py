"""What every loaded base is to the engine and the pool, whoever runs it.

`BaseKey` names a base (where it comes from, whether its code may run, which
backend runs it); `ChatModel` is what the engine and the pool need of one. The two
backends implement it (`models.LoadedModel`: transformers; `gguf.GgufModel`:
llama.cpp), and `pool.py` picks between them. This module imports neither backend,
so both can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from finetune_studio.inference.failures import RequestFailed
from finetune_studio.wire import INFERENCE_BACKENDS, ModelRef

if TYPE_CHECKING:  # annotations only: a key is read and checked without torch
    import torch

SOURCE_KINDS = ("folder", "gguf", "hub")


@dataclass(frozen=True)
class BaseKey:
    """One loaded base model: where it comes from, whether its code may run, and who
    runs it (the same .gguf file given to transformers and to llama.cpp is two bases)."""

    kind: str
    location: str
    trust_remote_code: bool
    backend: str = "transformers"

    @classmethod
    def of(cls, ref: ModelRef) -> BaseKey:
        base = ref.get("base")
        if not isinstance(base, dict) or base.get("kind") not in SOURCE_KINDS or not isinstance(base.get("location"), str):
            raise RequestFailed("invalid_request", f"model.base must be {{'kind': one of {SOURCE_KINDS}, 'location': a string}}", "model")
        backend = ref.get("backend", "transformers")
        if backend not in INFERENCE_BACKENDS:
            raise RequestFailed("invalid_request", f"model.backend must be one of {INFERENCE_BACKENDS}, not {backend!r}", "model")
        if backend == "llama_cpp" and base["kind"] != "gguf":
            raise RequestFailed("invalid_request", "llama.cpp runs .gguf files only: model.base.kind must be 'gguf'", "model")
        return cls(base["kind"], base["location"], bool(ref.get("trust_remote_code", False)), backend)

    def describe(self) -> str:
        return f"{self.location} (llama.cpp)" if self.backend == "llama_cpp" else self.location


class ChatModel(Protocol):
    """What the engine and the pool need of a loaded base, whoever runs it
    (`models.LoadedModel`: transformers; `gguf.GgufModel`: llama.cpp)."""

    key: BaseKey
    device: torch.device  # where its logits are (the generators are made there)
    users: int  # unfinished requests on this base
    last_used: float
    draining: bool  # unload when the last user is done
    context_length: int  # the prompt and the answer together, in tokens
    eos_ids: frozenset[int]  # tokens that end an answer
    vocab_size: int  # token ids are below it

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]: ...

    def encode(self, text: str) -> list[int]:
        """A completion's prompt text as tokens: special tokens written in it parsed, and a BOS put
        first where the model's tokenizer adds one and the text does not begin with it."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (what a logprob names; special tokens as their text)."""
        ...

    def use_adapter(self, folder: str) -> str: ...

    def release_adapter(self, name: str) -> None: ...

    def batch_lane(self, adapter: Optional[str]) -> Optional[str]:
        """Which decode batch (engine.py) a request for `adapter` (None: the base) joins:
        requests of one base with the same lane decode together, and the model then
        implements `batch.BatchedModel`; None: each such request decodes alone."""
        ...

    def new_cache(self, tokens: int) -> Any:
        """An empty KV cache for one request of at most `tokens` tokens (prompt and answer)."""
        ...

    def forward(self, ids: list[int], cache: Any, seen: int, adapter: Optional[str], all_positions: bool = False) -> torch.Tensor:
        """Run `ids` on top of `cache`, which holds `seen` tokens: the float32 logits of the
        last position (`[vocab]`), or of every position of `ids` (`[len(ids), vocab]`)."""
        ...

    def close(self) -> None:
        """Free what it holds now (the pool has dropped it; no request uses it)."""
        ...
