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
import re
import sys
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import torch

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.chat_template import NO_TEMPLATE_WARNING, ensure_chat_template
from finetune_studio.child.models import ModelSource, load_tokenizer_and_model
from finetune_studio.child.precision import decide_precision, torch_dtype
from finetune_studio.hardware import Precision
from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.failures import RequestFailed

MAX_ADAPTERS_PER_BASE = 8
# A SentencePiece byte token; and GPT-2's table of the characters byte-level BPE writes bytes as.
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_table() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table = {chr(byte): byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


_UNICODE_TO_BYTE = _byte_table()
# The context of a model whose config states none (max_position_embeddings).
UNSTATED_CONTEXT = 4096
# What the chat child answers in: its --precision (the server's FINETUNE_STUDIO_INFERENCE_PRECISION),
# set by child.py; auto is bf16 where it is native (hardware.choose_precision), else fp32.
PRECISION: Precision = "auto"


def set_precision(precision: Precision) -> None:
    global PRECISION
    PRECISION = precision


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
        self._layers_on: Optional[bool] = None  # whether the adapter layers are switched on (None: not known)
        self._names = 0
        self.context_length = self._context_length()
        self.eos_ids = self._eos_ids()
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._batchable = self._can_batch()
        self._byte_level = "ByteLevel" in str(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", ""))
        self._bytes: dict[int, bytes] = {}

    # -- the prompt and the text ------------------------------------------------

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's token ids: the chat template with the generation prompt."""
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return [int(token) for token in encoded["input_ids"]]

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens as training tokenizes a rendered template (no special tokens added),
        with the tokenizer's BOS first when it adds one by itself and the text has none."""
        ids = [int(token) for token in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        bos = self.tokenizer.bos_token_id
        adds_bos = isinstance(bos, int) and self.tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos]
        return [bos, *ids] if adds_bos and ids[:1] != [bos] else ids

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token: a byte-level BPE token's characters mapped back to
        the bytes they stand for (GPT-2's table), a SentencePiece byte token (`<0xE2>`)
        as its byte, any other token as its text (`▁` a space)."""
        found = self._bytes.get(token)
        if found is None:
            piece = str(self.tokenizer.convert_ids_to_tokens(token))
            byte = _BYTE_TOKEN.fullmatch(piece)
            if byte is not None:
                found = bytes([int(byte.group(1), 16)])
            elif self._byte_level and all(char in _UNICODE_TO_BYTE for char in piece):
                found = bytes(_UNICODE_TO_BYTE[char] for char in piece)
            else:
                found = piece.replace("\u2581", " ").encode("utf-8")
            self._bytes[token] = found
        return found

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
        self._layers_on = None  # as peft left them
        self._adapters[folder] = name
        self._adapter_users[name] = 0
        self._forget_spare_adapters()

    def _forget_spare_adapters(self) -> None:
        for folder, name in list(self._adapters.items())[:-1]:  # the newest is about to be used
            if len(self._adapters) <= MAX_ADAPTERS_PER_BASE:
                return
            if self._adapter_users.get(name, 0) == 0:
                self.model.delete_adapter(name)
                self._layers_on = None
                del self._adapters[folder], self._adapter_users[name]
                if self._active == name:
                    self._active = None

    @contextlib.contextmanager
    def _adapter(self, name: Optional[str]) -> Iterator[None]:
        if not self._adapters:
            yield  # a plain model: nothing to switch
        elif name is None:
            self._switch_layers(on=False)
            yield
        else:
            self._switch_layers(on=True)
            if self._active != name:
                self.model.set_adapter(name)
                self._active = name
            yield

    def _switch_layers(self, *, on: bool) -> None:
        """Switch every adapter layer on (an adapter answers) or off (the base answers),
        when they are not so already. The state is kept between forward passes: peft's
        `disable_adapter()` context walks every module three times a pass (its status,
        off, on again), which cost a base's answer a third of its speed once an adapter
        was loaded."""
        if self._layers_on is not on:
            if on:
                self.model.base_model.enable_adapter_layers()
            else:
                self.model.base_model.disable_adapter_layers()
            self._layers_on = on

    # -- forward passes ---------------------------------------------------------

    def new_cache(self, tokens: int) -> Any:
        """An empty KV cache for one request, as generate() makes it (it grows as
        needed, so `tokens` is not needed here)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._config().get_text_config(decoder=True))
        except TypeError:  # transformers before the cache took the config
            return DynamicCache()

    def forward(self, ids: list[int], cache: Any, seen: int, adapter: Optional[str], all_positions: bool = False) -> torch.Tensor:
        """Run `ids` (the prompt, or the last token) on top of `cache`, which holds
        `seen` tokens, and return the float32 logits of the last position (of every
        position of `ids` with `all_positions`: a prompt's logprobs)."""
        kwargs: dict[str, Any] = {self._cache_argument: cache, "use_cache": True}
        if self._keeps_logits and not all_positions:
            kwargs["logits_to_keep"] = 1
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        attention_mask = torch.ones((1, seen + len(ids)), dtype=torch.long, device=self.device)
        with torch.inference_mode(), self._adapter(adapter):
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits: torch.Tensor = output.logits[0] if all_positions else output.logits[0, -1]
        return logits.to(dtype=torch.float32)

    # -- decode batches (batch.py) ------------------------------------------------

    def batch_lane(self, adapter: Optional[str]) -> Optional[str]:
        """The base and its LoRA adapters share one batch (peft's mixed-adapter batches:
        `adapter_names`, one per row); a DoRA adapter, which peft refuses there, has a
        batch of its own. None: a model whose cache is not plain per-layer tensors
        (sliding windows, recurrent state) decodes each request alone."""
        if not self._batchable:
            return None
        if adapter is not None and getattr(self.model.peft_config.get(adapter), "use_dora", False):
            return f"dora:{adapter}"
        return ""

    def forward_rows(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any,
        adapters: list[Optional[str]], all_positions: bool = False,
    ) -> torch.Tensor:
        """One forward pass of a batch: `input_ids` `[rows, columns]` (a decode step's one
        token per row, or the prompts of a prefill, left-padded) at `position_ids` on top
        of the left-padded `cache` (`attention_mask` hides the padding); row i through
        `adapters[i]` (None: the base). The float32 logits `[rows, vocab]` of the last
        column (`[rows, columns, vocab]` of every column with `all_positions`)."""
        kwargs: dict[str, Any] = {self._cache_argument: cache, "use_cache": True, "position_ids": position_ids}
        if self._keeps_logits and not all_positions:
            kwargs["logits_to_keep"] = 1
        chosen = set(adapters)
        with torch.inference_mode():
            if len(chosen) == 1:  # one adapter (or the base) for every row: as a request alone runs
                with self._adapter(adapters[0]):
                    output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            else:
                self._switch_layers(on=True)  # peft's mixed batch: each row's adapter, "__base__" for none
                names = [name if name is not None else "__base__" for name in adapters]
                output = self.model(input_ids=input_ids, attention_mask=attention_mask, adapter_names=names, **kwargs)
        logits: torch.Tensor = output.logits if all_positions else output.logits[:, -1]
        return logits.to(dtype=torch.float32)

    def _can_batch(self) -> bool:
        """Whether this model's KV cache is plain tensors per layer, `[rows, heads,
        tokens, head_dim]`, that a batch may pad, stack and select (batch.py), and its
        forward pass takes each row's positions."""
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:  # a transformers whose cache has no layers
            return False
        if "position_ids" not in inspect.signature(self.model.forward).parameters:
            return False
        cache = self.new_cache(0)
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            return False
        if not layers:  # built as the layers are used: plain ones, unless the cache says otherwise
            return getattr(cache, "layer_class_to_replicate", None) is DynamicLayer
        return all(type(layer) is DynamicLayer for layer in layers)

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
    """Load a base model for answering with transformers, in PRECISION: with auto, bf16 on
    a GPU that has it and on a CPU with AMX or AVX512-BF16, else float32."""
    cuda = torch.cuda.is_available()
    precision = decide_precision(PRECISION)
    dtype = torch_dtype(precision)
    print(f"{key.location}: answering in {precision.dtype} ({precision.reason})", file=sys.stderr)
    if precision.warning:
        print(precision.warning, file=sys.stderr)
    source = ModelSource(key.kind, key.location)
    try:
        tokenizer, model = load_tokenizer_and_model(source, dtype=dtype, trust_remote_code=key.trust_remote_code)
    except JobFailure as exc:
        raise RequestFailed("model_not_found", exc.message, "model") from None
    device = torch.device("cuda") if cuda else torch.device("cpu")
    model.to(device)
    model.eval()
    if ensure_chat_template(tokenizer):  # as training did, so its adapters were trained on it
        print(f"{key.location}: {NO_TEMPLATE_WARNING}", file=sys.stderr)
    return LoadedModel(key, tokenizer, model, device)
