"""The bases the chat child keeps loaded, and the loader that picks each one's backend.

`load_base` loads a base as its key says: with llama.cpp (`gguf.load_gguf`) for a
`.gguf` file that a ModelRef gives to llama.cpp (`backend: "llama_cpp"`, an
export), else with transformers (`models.load_transformers`); both kinds are a
`ChatModel` (chat_model.py) to the engine and the pool. `ModelPool` keeps at most
`max_loaded` bases warm (of either backend), least recently used first out, and
unloads a base that nobody used for `idle_seconds`. A base that an unfinished
request uses is never unloaded under it: it goes as soon as its last request ends.

This is the one module that imports both backends; they import only chat_model.py
(and neither imports the other, nor this module). llama_cpp itself is imported by
gguf.py on the first GGUF load, not here.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Optional

import torch

from finetune_studio.inference.chat_model import BaseKey, ChatModel
from finetune_studio.inference.gguf import load_gguf
from finetune_studio.inference.models import load_transformers


def load_base(key: BaseKey) -> ChatModel:
    """Load a base model for answering: with llama.cpp when the key says so, else
    with transformers (in the child's --precision: models.PRECISION)."""
    if key.backend == "llama_cpp":
        return load_gguf(key)
    return load_transformers(key)


class ModelPool:
    """The bases loaded, least recently used first; see the module's docstring."""

    def __init__(
        self,
        max_loaded: int,
        idle_seconds: float,
        *,
        loader: Callable[[BaseKey], ChatModel] = load_base,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_loaded = max_loaded
        self.idle_seconds = idle_seconds  # 0 or less: never unload for idleness
        self._loader = loader
        self._clock = clock
        self._loaded: OrderedDict[BaseKey, ChatModel] = OrderedDict()

    @property
    def loaded(self) -> list[BaseKey]:
        return list(self._loaded)

    def get(self, key: BaseKey) -> Optional[ChatModel]:
        """The loaded base, if it is loaded (without using it)."""
        return self._loaded.get(key)

    def acquire(self, key: BaseKey) -> ChatModel:
        """The loaded base (loading it if needed), held until `release`."""
        entry = self._loaded.get(key)
        if entry is None:
            self._trim(room_for=1)
            print(f"loading {key.describe()}", file=sys.stderr)
            entry = self._loader(key)
            self._loaded[key] = entry
        self._loaded.move_to_end(key)
        entry.users += 1
        entry.draining = False
        entry.last_used = self._clock()
        return entry

    def release(self, entry: ChatModel) -> None:
        entry.users = max(0, entry.users - 1)
        entry.last_used = self._clock()
        if entry.users == 0 and entry.draining:
            self._drop(entry.key)
            self._free_memory()
        self._trim()

    def unload_all(self) -> None:
        """Free every base now; one still answering goes when its answers end."""
        for entry in list(self._loaded.values()):
            if entry.users:
                entry.draining = True
            else:
                self._drop(entry.key)
        self._free_memory()

    def unload_idle(self) -> None:
        if self.idle_seconds <= 0:
            return
        now = self._clock()
        idle = [e.key for e in self._loaded.values() if not e.users and now - e.last_used >= self.idle_seconds]
        for key in idle:
            self._drop(key)
        if idle:
            self._free_memory()

    def seconds_until_idle(self) -> Optional[float]:
        """How long until `unload_idle` has something to do; None: never (as things stand)."""
        if self.idle_seconds <= 0:
            return None
        waiting = [e.last_used + self.idle_seconds for e in self._loaded.values() if not e.users]
        return max(0.0, min(waiting) - self._clock()) if waiting else None

    def _trim(self, room_for: int = 0) -> None:
        # Bases in use stay even over the limit (a compare of two bases holds both);
        # the limit is met again as they fall idle.
        dropped = False
        for key, entry in list(self._loaded.items()):
            if len(self._loaded) + room_for <= self.max_loaded:
                break
            if not entry.users:
                self._drop(key)
                dropped = True
        if dropped:
            self._free_memory()

    def _drop(self, key: BaseKey) -> None:
        entry = self._loaded.pop(key, None)
        if entry is not None:
            entry.close()
            print(f"unloaded {key.describe()}", file=sys.stderr)

    @staticmethod
    def _free_memory() -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
