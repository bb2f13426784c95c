"""The transformers backend of the chat child: a base model and the adapters on it.

A base model (a folder, a `.gguf` file or a hub id, loaded exactly as training
loads it, `training.models.load_tokenizer_and_model`) is loaded once and serves:

- itself: with the adapters switched off (`disable_adapter()`), or with none loaded;
- every LoRA adapter trained on it: each is loaded by name beside the others
  (peft's multi-adapter loading) and chosen per forward pass (`set_adapter`), so
  requests for different adapters of one base share its weights and interleave
  token by token. At most MAX_ADAPTERS_PER_BASE stay loaded; the least recently
  used idle one goes first.

A full fine-tuning result is a base of its own. `LoadedModel` is a `ChatModel`
(chat_model.py) to the engine and the pool (pool.py), as llama.cpp's `GgufModel`
(gguf.py) is; pool.py's `load_base` picks between the two, so this module never
imports the other backend.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import torch

from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.failures import RequestFailed
from finetune_studio.training.channel import JobFailure
from finetune_studio.training.models import ModelSource, load_tokenizer_and_model

MAX_ADAPTERS_PER_BASE = 8
# The context of a model whose config states none (max_position_embeddings).
UNSTATED_CONTEXT = 4096


class LoadedModel:
    """A base model with its tokenizer, and the adapters loaded on it."""

    def __init__(self, key: BaseKey, tokenizer: Any, model: Any, device: torch.device) -> None:
        self.key = key
        self.tokenizer = tokenizer
        self.model = model  # a PeftModel once an adapter is loaded
        self.device = device
        self.users = 0  # unfinished requests on this base
        self.last_used = 0.0
        self.draining = False  # unload when the last user is done
        forward = inspect.signature(model.forward).parameters
        # transformers 5 names the KV cache argument `cache`; earlier versions `past_key_values`.
        self._cache_argument = "cache" if "cache" in forward else "past_key_values"
        # As generate() does: the prefill computes logits for the last position only.
        self._keeps_logits = "logits_to_keep" in forward
        self._adapters: OrderedDict[str, str] = OrderedDict()  # folder -> adapter name, oldest first
        self._adapter_users: dict[str, int] = {}
        self._active: Optional[str] = None
        self._names = 0
        self.context_length = self._context_length()
        self.eos_ids = self._eos_ids()

    # -- the prompt and the text ------------------------------------------------

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's token ids: the chat template with the generation prompt."""
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return [int(token) for token in encoded["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # -- adapters ---------------------------------------------------------------

    def use_adapter(self, folder: str) -> str:
        """The name of the adapter saved in `folder`, loaded if it is not yet; the
        caller holds it until `release_adapter`."""
        if folder in self._adapters:
            self._adapters.move_to_end(folder)
        else:
            self._load_adapter(folder)
        name = self._adapters[folder]
        self._adapter_users[name] = self._adapter_users.get(name, 0) + 1
        return name

    def release_adapter(self, name: str) -> None:
        self._adapter_users[name] = max(0, self._adapter_users.get(name, 0) - 1)

    @property
    def adapters(self) -> list[str]:
        """The folders of the adapters loaded, oldest first."""
        return list(self._adapters)

    def _load_adapter(self, folder: str) -> None:
        path = Path(folder)
        if not (path / "adapter_config.json").is_file():
            raise RequestFailed("model_not_found", f"there is no LoRA adapter in {folder} (no adapter_config.json)", "model")
        from peft import PeftModel

        self._names += 1
        name = f"adapter{self._names}"
        # peft reads a property that transformers marks deprecated: noise, not news.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(folder, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, folder, adapter_name=name)
                self.model.eval()
        self._active = name if len(self._adapters) == 0 else self._active
        self._adapters[folder] = name
        self._adapter_users[name] = 0
        self._forget_spare_adapters()

    def _forget_spare_adapters(self) -> None:
        for folder, name in list(self._adapters.items())[:-1]:  # the newest is about to be used
            if len(self._adapters) <= MAX_ADAPTERS_PER_BASE:
                return
            if self._adapter_users.get(name, 0) == 0:
                self.model.delete_adapter(name)
                del self._adapters[folder], self._adapter_users[name]
                if self._active == name:
                    self._active = None

    @contextlib.contextmanager
    def _adapter(self, name: Optional[str]) -> Iterator[None]:
        if not self._adapters:
            yield  # a plain model: nothing to switch
        elif name is None:
            with self.model.disable_adapter():
                yield
        else:
            if self._active != name:
                self.model.set_adapter(name)
                self._active = name
            yield

    # -- forward passes ---------------------------------------------------------

    def new_cache(self, tokens: int) -> Any:
        """An empty KV cache for one request, as generate() makes it (it grows as
        needed, so `tokens` is not needed here)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._config().get_text_config(decoder=True))
        except TypeError:  # transformers before the cache took the config
            return DynamicCache()

    def forward(self, ids: list[int], cache: Any, seen: int, adapter: Optional[str]) -> torch.Tensor:
        """Run `ids` (the prompt, or the last token) on top of `cache`, which holds
        `seen` tokens, and return the float32 logits of the last position."""
        kwargs: dict[str, Any] = {self._cache_argument: cache, "use_cache": True}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        attention_mask = torch.ones((1, seen + len(ids)), dtype=torch.long, device=self.device)
        with torch.inference_mode(), self._adapter(adapter):
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits: torch.Tensor = output.logits[0, -1]
        return logits.to(dtype=torch.float32)

    def close(self) -> None:
        """Nothing to do: torch frees the weights with the last reference (the pool's)."""

    # -- facts --------------------------------------------------------------------

    def _config(self) -> Any:
        return self.model.get_base_model().config if self._adapters else self.model.config

    def _context_length(self) -> int:
        config = self._config().get_text_config(decoder=True)
        stated = getattr(config, "max_position_embeddings", None)
        if isinstance(stated, int) and stated > 0:
            return stated
        from_tokenizer = getattr(self.tokenizer, "model_max_length", None)
        # Tokenizers that state nothing say a huge number (int(1e30)).
        if isinstance(from_tokenizer, int) and 0 < from_tokenizer < 10**7:
            return from_tokenizer
        return UNSTATED_CONTEXT

    def _eos_ids(self) -> frozenset[int]:
        """The end of an answer: the tokenizer's eos and the generation config's (one or a list)."""
        found: set[int] = set()
        generation = getattr(self.model, "generation_config", None)
        for value in (getattr(generation, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                found.add(value)
            elif isinstance(value, (list, tuple)):
                found.update(v for v in value if isinstance(v, int))
        return frozenset(found)


def load_transformers(key: BaseKey) -> LoadedModel:
    """Load a base model for answering with transformers: float32 on the CPU, bf16
    on a GPU that has it."""
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    source = ModelSource(key.kind, key.location)
    try:
        tokenizer, model = load_tokenizer_and_model(source, dtype=dtype, trust_remote_code=key.trust_remote_code)
    except JobFailure as exc:
        raise RequestFailed("model_not_found", exc.message, "model") from None
    device = torch.device("cuda") if cuda else torch.device("cpu")
    model.to(device)
    model.eval()
    if not tokenizer.chat_template:
        from finetune_studio.training.tiny_model import CHATML_TEMPLATE

        # Training gives such a model ChatML too, so its adapters were trained on it.
        tokenizer.chat_template = CHATML_TEMPLATE
        print(f"{key.location}: the tokenizer has no chat template; ChatML is used", file=sys.stderr)
    return LoadedModel(key, tokenizer, model, device)
