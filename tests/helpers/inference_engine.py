"""The inference engine driven in this process, and what it is compared with
(tests/unit/test_inference_engine.py, test_batched_engine.py): the tiny model with
its weights stirred (`make_lively_model`), adapters with random LoRA weights, the
answers of transformers' own `generate` (`reference`), and a `Recorder` that runs an
Engine until every request is answered."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from finetune_studio.inference.engine import Engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def make_lively_model(tiny_model: Path, directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.2)
    model.save_pretrained(str(directory))
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(str(directory))
    return directory


def make_adapter(base: Path, directory: Path, seed: int) -> Path:
    """A LoRA adapter with random, non-zero weights (peft's init_lora_weights=False)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    with warnings.catch_warnings():  # peft reads a property transformers marks deprecated
        warnings.simplefilter("ignore", FutureWarning)
        get_peft_model(model, config).save_pretrained(str(directory))
    return directory


def reference(base: Path, adapter: Optional[Path], messages: list[dict[str, str]], max_new_tokens: int) -> dict[str, Any]:
    """transformers + peft on their own: generate(do_sample=False) over the same chat template,
    on the device the child uses, in fp32 (the engine is pinned to it here: `fp32`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    dtype = torch.float32
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype).to("cuda" if cuda else "cpu")
    if adapter is not None:
        from peft import PeftModel

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(model, str(adapter))
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = prompt.to(model.device)
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)
    ids = output[0, prompt["input_ids"].shape[1]:].tolist()
    return {
        "text": tokenizer.decode(ids, skip_special_tokens=True),
        "prompt_tokens": prompt["input_ids"].shape[1],
        "completion_tokens": len(ids),
        "finish_reason": "stop" if ids[-1] == tokenizer.eos_token_id else "length",
    }


def command(request_id: str, base: Path, adapter: Optional[Path] = None, **params: Any) -> dict[str, Any]:
    return {
        "type": "generate",
        "id": request_id,
        "model": {"base": {"kind": "folder", "location": str(base)},
                  "adapter": str(adapter) if adapter else None, "trust_remote_code": False},
        "messages": params.pop("messages", QUESTION),
        "params": {"temperature": 0, "top_p": 1, "max_tokens": 16, "stop": [], "seed": None, **params},
    }


class Recorder:
    """An engine with its messages kept, run until every request is answered."""

    def __init__(self, **options: Any) -> None:
        self.messages: list[dict[str, Any]] = []
        self.engine = Engine(self.messages.append, **options)

    def run(self, *commands: dict[str, Any], max_steps: int = 10_000) -> dict[str, dict[str, Any]]:
        for item in commands:
            self.engine.handle(item)
        for _ in range(max_steps):
            if not self.engine.busy:
                return self.results()
            self.step()
        raise AssertionError(f"still busy after {max_steps} steps")

    def step(self) -> None:
        """One step of the engine (a subclass may record what it did)."""
        self.engine.step()

    def results(self) -> dict[str, dict[str, Any]]:
        """Per request: its text (the deltas joined) and its last message's fields."""
        found: dict[str, dict[str, Any]] = {}
        for message in self.messages:
            result = found.setdefault(message["id"], {"text": "", "deltas": 0}) if "id" in message else {}
            if message["type"] == "delta":
                result["text"] += message["text"]
                result["deltas"] += 1
            elif message["type"] == "started":
                result["prompt_tokens"] = message["prompt_tokens"]
            elif message["type"] == "done":
                result.update(finish_reason=message["finish_reason"], **message["usage"])
            elif message["type"] == "failed":
                result.update(failed=message["code"], param=message["param"], message=message["message"])
        return found


def answer_of(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result[key] for key in ("text", "prompt_tokens", "completion_tokens", "finish_reason")}
