"""The llama.cpp backend of the chat child: a `.gguf` file answered by llama.cpp itself.

An export's GGUF is served as llama.cpp (and Ollama, LM Studio) will run it, so
that a user can check that the exported file answers as the adapter did. It is
one more kind of base in the pool (`ChatModel`, see chat_model.py), and the engine
drives it as it drives a transformers model, but for batching: each of its answers
takes one forward pass of its own per step (`batch_lane` is None), where a
transformers base decodes its answers in one batch. The rest is the same: the
sampling from the logits (sampling.py: greedy is the argmax, a seed repeats an
answer), the logprobs of the chosen tokens and of the prompt's (logprobs.py), the text
deltas, stop strings, finish reasons and usage counts (text.py, engine.py).

- **Loading.** The model is loaded once with llama.cpp's C API (`llama_cpp`, the
  `[gguf]` extra; imported only here, on the first GGUF load)
  and its weights are shared by every answer. `Llama`, the library's high-level
  class, owns a single context, that is a single KV cache; answers here interleave
  token by token, so each gets a context of its own (`Session`), sized for its
  prompt and `max_tokens` (rounded up to 256 tokens, at most `context_length`),
  and freed when it ends. llama.cpp's log goes to the child's stderr (the server's
  inference.log), errors only.
- **The prompt.** The chat template the GGUF carries (`tokenizer.chat_template`),
  rendered by transformers' own Jinja renderer, the one that shapes the
  transformers backend's prompts (ChatML when the file has none, as there), and
  tokenized by llama.cpp with special tokens parsed. A BOS is put first when the
  file asks for one (`tokenizer.ggml.add_bos_token`) and the template did not
  write it, as llama.cpp's own server does.
- **The context.** `context_length` is the model's training context, capped at
  MAX_CONTEXT: a llama.cpp context is allocated whole, and an answer with no
  `max_tokens` gets all of it.
- **The end of an answer.** Every end-of-generation token of the vocabulary
  (`llama_vocab_is_eog`: eos, eot and the like); text is decoded without control
  tokens, as the transformers backend skips special tokens.
- **Adapters.** A LoRA GGUF (llama.cpp's `--lora` file, an export's `lora_gguf`)
  on this base: loaded once per file, and set on the contexts of the answers that
  ask for it; the base alone has none. They stay loaded until the base unloads.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from finetune_studio.child.chat_template import template_or_chatml
from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.failures import RequestFailed
from finetune_studio.wire import GGUF_INSTALL

# The longest context a GGUF answer is given (the model's own, when shorter).
MAX_CONTEXT = 8192
# Contexts are sized in steps of this many tokens (llama.cpp pads to it as well).
CONTEXT_STEP = 256
# The most prompt tokens one llama_decode call takes.
BATCH = 512
INSTALL_HINT = (
    f"Serving a GGUF file needs llama.cpp's Python binding, the [gguf] extra: {GGUF_INSTALL}"
)

_llama: Any = None  # the llama_cpp module, once imported


def llama_cpp_module() -> Any:
    """`llama_cpp`, imported (and its backend started) on first use; RequestFailed
    saying how to install it when it is missing."""
    global _llama
    if _llama is None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise RequestFailed("internal_error", f"{INSTALL_HINT} ({exc})", "model") from None
        # llama-cpp-python prints llama.cpp's log to stderr at this logger's level: errors only.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        llama_cpp.llama_backend_init()
        _llama = llama_cpp
    return _llama


def load_gguf(key: BaseKey) -> GgufModel:
    """Load `key.location` with llama.cpp, or RequestFailed saying why not."""
    path = Path(key.location)
    if not path.is_file():
        raise RequestFailed("model_not_found", f"the GGUF file {path} does not exist (any more)", "model")
    llama = llama_cpp_module()
    params = llama.llama_model_default_params()
    # Everything on the GPU when llama.cpp was built with one (the wheel of the extra is CPU-only).
    params.n_gpu_layers = 0x7FFFFFFF if llama.llama_supports_gpu_offload() else 0
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RequestFailed(
            "model_not_found",
            f"llama.cpp could not load {path} (not a GGUF model, or one of an architecture this llama.cpp does not"
            " know; the server's inference.log says more)",
            "model",
        )
    return GgufModel(key, llama, model)


class Session:
    """One answer's llama.cpp context (its own KV cache), sized when it starts."""

    def __init__(self, owner: GgufModel, tokens: int) -> None:
        llama = owner.llama
        size = min(owner.context_length, -(-tokens // CONTEXT_STEP) * CONTEXT_STEP)
        params = llama.llama_context_default_params()
        params.n_ctx = size
        params.n_batch = params.n_ubatch = min(size, BATCH)
        params.n_seq_max = 1
        params.n_threads, params.n_threads_batch = _threads()
        self.size = size
        self.ctx = llama.llama_init_from_model(owner.model, params)
        if not self.ctx:
            raise RequestFailed(
                "internal_error",
                f"llama.cpp could not make a context of {size} tokens for this answer (out of memory); ask for fewer"
                " tokens (max_tokens), or keep fewer models loaded (max_loaded_models)",
            )
        # Freed when the answer ends (the engine drops it), or at exit, while llama_cpp is still there.
        self._free = weakref.finalize(self, llama.llama_free, self.ctx)

    def close(self) -> None:
        self._free()


class GgufModel:
    """A GGUF file loaded by llama.cpp, as the pool keeps it (see the module's docstring)."""

    def __init__(self, key: BaseKey, llama: Any, model: Any) -> None:
        self.key = key
        self.llama = llama
        self.model = model
        # Freed by close() when the pool drops it, or at exit (after its contexts, made later).
        self._free = weakref.finalize(self, llama.llama_model_free, model)
        self.vocab = llama.llama_model_get_vocab(model)
        self.device = torch.device("cpu")  # the logits are copied out of llama.cpp into CPU memory
        self.users = 0
        self.last_used = 0.0
        self.draining = False
        self.n_vocab = self.vocab_size = int(llama.llama_vocab_n_tokens(self.vocab))
        self.context_length = max(1, min(int(llama.llama_model_n_ctx_train(model)) or MAX_CONTEXT, MAX_CONTEXT))
        self.eos_ids = frozenset(t for t in range(self.n_vocab) if llama.llama_vocab_is_eog(self.vocab, t))
        self.chat_template = self._chat_template()
        self._special = self._special_tokens()
        self._pieces: dict[int, bytes] = {}
        self._adapters: dict[str, tuple[str, Any]] = {}  # file -> (name, llama_adapter_lora)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()

    # -- the prompt and the text ------------------------------------------------

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's token ids: the GGUF's chat template with the generation prompt."""
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered = render_jinja_template(
            conversations=[messages], chat_template=self.chat_template, add_generation_prompt=True, **self._special
        )
        # transformers returns (texts, generation indices); older versions the texts alone.
        texts = rendered[0] if isinstance(rendered, tuple) else rendered
        return self.encode(str(texts[0]))

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens, special tokens parsed, with a BOS first when the file asks for one and
        the text has none (as llama.cpp's own server does)."""
        ids = self.tokenize(text)
        bos = int(self.llama.llama_vocab_bos(self.vocab))
        if self.llama.llama_vocab_get_add_bos(self.vocab) and bos >= 0 and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokens for `text`, special tokens (`<|im_start|>`) parsed, no BOS added."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            tokens = (self.llama.llama_token * capacity)()
            count = int(self.llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity, False, True))
            if count >= 0:
                return [int(token) for token in tokens[:count]]
            capacity = -count  # too small: llama.cpp says how many it needs

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` without control tokens; a character cut short reads U+FFFD (text.py holds it back)."""
        return b"".join(self._piece(token) for token in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return self._piece(token)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            size = 64
            while True:
                buffer = ctypes.create_string_buffer(size)
                count = int(self.llama.llama_token_to_piece(self.vocab, token, buffer, size, 0, False))
                if count >= 0:
                    break
                size = -count
            piece = self._pieces[token] = buffer.raw[:count]
        return piece

    # -- adapters ---------------------------------------------------------------

    def use_adapter(self, folder: str) -> str:
        """The name of the LoRA GGUF `folder` (a file), loaded on this base if it is not yet."""
        found = self._adapters.get(folder)
        if found is None:
            if not Path(folder).is_file():
                raise RequestFailed("model_not_found", f"the LoRA GGUF file {folder} does not exist (any more)", "model")
            adapter = self.llama.llama_adapter_lora_init(self.model, folder.encode())
            if not adapter:
                raise RequestFailed(
                    "model_not_found",
                    f"llama.cpp could not apply the LoRA GGUF {folder} to {self.key.location} (not an adapter of this"
                    " base; the server's inference.log says more)",
                    "model",
                )
            found = self._adapters[folder] = (f"lora{len(self._adapters) + 1}", adapter)
        return found[0]

    def release_adapter(self, name: str) -> None:
        """Nothing to do: an adapter stays loaded until its base unloads."""

    @property
    def adapters(self) -> list[str]:
        """The LoRA GGUF files loaded on this base."""
        return list(self._adapters)

    # -- forward passes ---------------------------------------------------------

    def batch_lane(self, adapter: Optional[str]) -> Optional[str]:
        """None: llama.cpp's answers are not batched here; each decodes in its own context."""
        return None

    def new_cache(self, tokens: int) -> Session:
        session = Session(self, tokens)
        self._sessions.add(session)
        return session

    def forward(self, ids: list[int], cache: Any, seen: int, adapter: Optional[str], all_positions: bool = False) -> torch.Tensor:
        """Decode `ids` after the `seen` tokens in the answer's context; the float32
        logits of the last position, or with `all_positions` (a prompt's logprobs) of
        every position: then each token of the batch llama.cpp decodes is an output."""
        session: Session = cache
        if seen == 0:
            self._set_adapter(session, adapter)
        if seen + len(ids) > session.size:  # never: the engine keeps prompt + max_tokens within it
            raise RequestFailed("internal_error", f"the answer outgrew its context of {session.size} tokens")
        if all_positions:
            return self._every_position(ids, session, seen)
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            tokens = (self.llama.llama_token * len(chunk))(*chunk)
            _decoded(int(self.llama.llama_decode(session.ctx, self.llama.llama_batch_get_one(tokens, len(chunk)))))
        logits = self.llama.llama_get_logits_ith(session.ctx, -1)
        if not logits:
            raise RuntimeError("llama.cpp returned no logits for the last token")
        return torch.from_numpy(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy())

    def _every_position(self, ids: list[int], session: Session, seen: int) -> torch.Tensor:
        """The logits `[len(ids), vocab]` of every position of `ids`: llama.cpp's batches with an
        output asked for at each token (its logits come back in the batch's order)."""
        llama = self.llama
        rows: list[Any] = []
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            batch = llama.llama_batch_init(len(chunk), 0, 1)
            try:
                for i, token in enumerate(chunk):
                    batch.token[i] = token
                    batch.pos[i] = seen + start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                batch.n_tokens = len(chunk)
                _decoded(int(llama.llama_decode(session.ctx, batch)))
                logits = llama.llama_get_logits(session.ctx)
                if not logits:
                    raise RuntimeError("llama.cpp returned no logits for the prompt")
                rows.append(np.ctypeslib.as_array(logits, shape=(len(chunk), self.n_vocab)).copy())
            finally:
                llama.llama_batch_free(batch)
        return torch.from_numpy(np.concatenate(rows))

    def _set_adapter(self, session: Session, adapter: Optional[str]) -> None:
        chosen = [pointer for name, pointer in self._adapters.values() if name == adapter]
        if adapter is not None and not chosen:
            raise RequestFailed("internal_error", f"the adapter {adapter} is not loaded on {self.key.location}")
        if chosen:
            pointers = (self.llama.llama_adapter_lora_p_ctypes * 1)(chosen[0])
            scales = (ctypes.c_float * 1)(1.0)
            code = int(self.llama.llama_set_adapters_lora(session.ctx, pointers, 1, scales))
        else:
            code = int(self.llama.llama_set_adapters_lora(session.ctx, None, 0, None))
        if code != 0:
            raise RequestFailed("model_not_found", f"llama.cpp could not set the LoRA adapter (code {code})", "model")

    # -- unloading --------------------------------------------------------------

    def close(self) -> None:
        """Free the contexts still open (none, when the pool drops it), then the model
        (llama.cpp frees its adapters with it)."""
        for session in list(self._sessions):
            session.close()
        self._free()

    # -- facts --------------------------------------------------------------------

    def _chat_template(self) -> str:
        raw = self.llama.llama_model_chat_template(self.model, None)
        template, fell_back = template_or_chatml(raw.decode("utf-8", errors="replace") if raw else None)
        if fell_back:  # as the transformers backend does for a tokenizer without one
            print(f"{self.key.location}: the GGUF has no chat template; ChatML is used", file=sys.stderr)
        return template

    def _special_tokens(self) -> dict[str, Any]:
        """The special tokens a template may name (`bos_token`, `eos_token`), as their text."""
        found: dict[str, Any] = {}
        for name, getter in (("bos_token", "llama_vocab_bos"), ("eos_token", "llama_vocab_eos"),
                             ("pad_token", "llama_vocab_pad")):
            token = int(getattr(self.llama, getter)(self.vocab))
            if 0 <= token < self.n_vocab:
                found[name] = str(self.llama.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace"))
        return found


_DECODE_CODES = {1: ": no room left in the context", 2: ": aborted", -1: ": invalid input"}


def _decoded(code: int) -> None:
    """Raise if llama_decode returned an error code."""
    if code != 0:
        raise RuntimeError(f"llama.cpp could not decode (llama_decode returned {code}{_DECODE_CODES.get(code, '')})")


def _threads() -> tuple[int, int]:
    """Threads for one token and for a prompt, as llama-cpp-python picks them: half the
    CPUs this process may use (about the physical cores), and all of them."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, usable // 2), max(1, usable)
