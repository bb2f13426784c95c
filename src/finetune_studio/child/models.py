"""Finding and loading a base model: a local folder, a `.gguf` file, or a hub id.

Shared by the training recipe and `finetune-studio export`, so that an adapter is
always merged into exactly the model it was trained on.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypeVar
from urllib.parse import urlsplit

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets.errors import HUB_UNREACHABLE
from finetune_studio.paths import is_local, local_path

_Loaded = TypeVar("_Loaded")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. `kind` is "folder", "gguf" or "hub"."""

    kind: str
    location: str  # the folder, the .gguf file, or the hub id

    def from_pretrained_args(self) -> tuple[str, dict[str, Any]]:
        if self.kind == "gguf":
            path = Path(self.location)
            return str(path.parent), {"gguf_file": path.name}
        return self.location, {}

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "location": self.location}


def resolve_source(name: str) -> ModelSource:
    """Decide what `name` names, or fail with what to fix. Touches no network."""
    path = local_path(name)
    if path.exists():
        path = path.resolve()
        if path.is_file():
            if path.suffix.lower() == ".gguf":
                return ModelSource("gguf", str(path))
            raise JobFailure("model_not_found", f"{path} is a file but not a .gguf; name a model folder (with config.json) or a .gguf file")
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f" (it holds {', '.join(ggufs)}: name that file)" if ggufs else ""
            raise JobFailure("model_not_found", f"{path} is not a Hugging Face model folder: it has no config.json{hint}")
        return ModelSource("folder", str(path))
    if is_local(name):
        raise JobFailure("model_not_found", f"the model path {name} does not exist; name a local model folder or .gguf file")
    return ModelSource("hub", name)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub (HF_ENDPOINT, by default huggingface.co) takes a connection, asked briefly."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def pretrained_args(
    source: ModelSource, *, trust_remote_code: bool = False, token: Optional[str] = None
) -> tuple[str, dict[str, Any]]:
    """What transformers' `from_pretrained` takes for `source`: its location and keyword arguments."""
    location, extra = source.from_pretrained_args()
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **extra}
    if token:
        kwargs["token"] = token
    return location, kwargs


def from_local_cache(
    source: ModelSource, load: Callable[[dict[str, Any]], _Loaded], kwargs: dict[str, Any]
) -> Optional[_Loaded]:
    """A hub model from the local cache, which needs no network: `load(kwargs)` told so.
    None when `source` is no hub id, or the cache lacks it and the hub answers (the
    caller loads it from there); JobFailure (model_not_found) when the hub does not."""
    if source.kind != "hub":
        return None
    try:
        return load({**kwargs, "local_files_only": True})
    except OSError:
        if not hub_reachable():
            raise JobFailure("model_not_found", f"{HUB_UNREACHABLE} (asked for {source.location!r})") from None
    return None


def load_tokenizer_and_model(
    source: ModelSource,
    *,
    dtype: Any,
    trust_remote_code: bool = False,
    token: Optional[str] = None,
    quantization_config: Any = None,
) -> tuple[Any, Any]:
    """Load (tokenizer, model) for training. A GGUF model is dequantized and made trainable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location, kwargs = pretrained_args(source, trust_remote_code=trust_remote_code, token=token)
    cached = from_local_cache(
        source, lambda given: _load(AutoTokenizer, AutoModelForCausalLM, location, dtype, quantization_config, given), kwargs
    )
    if cached is not None:
        return cached
    try:
        return _load(AutoTokenizer, AutoModelForCausalLM, location, dtype, quantization_config, kwargs)
    except ImportError as exc:  # e.g. the gguf package, for a .gguf file
        raise JobFailure("model_not_found", f"cannot load the model {source.location}: {exc}") from None
    except (OSError, ValueError, KeyError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobFailure("model_not_found", f"cannot load the model {source.location}: {text}") from None


def _load(tokenizer_cls: Any, model_cls: Any, location: str, dtype: Any, quantization: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    tokenizer = tokenizer_cls.from_pretrained(location, **kwargs)
    model_kwargs = dict(kwargs)
    if quantization is not None and "gguf_file" not in kwargs:
        model_kwargs["quantization_config"] = quantization
    model = model_cls.from_pretrained(location, dtype=dtype, **model_kwargs)
    if "gguf_file" in kwargs:
        make_trainable(model, dtype)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def make_trainable(model: Any, dtype: Any) -> None:
    """Clear the marks transformers leaves on a dequantized GGUF model.

    The weights are plain tensors after loading, but the model still says it is
    quantized, which makes the trainer refuse it and `save_pretrained` write a
    config that claims a quantization the weights do not have.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.to(dtype)
