"""bf16 where the machine computes it natively, and MFU (issue 26, items 2 and 4), in this process.

- The one detection rule (`finetune_studio.hardware`): a CPU whose flags name AMX or
  AVX512-BF16 has native bf16; `GET /system` reports it.
- `precision: auto` picks bf16 there and fp32 elsewhere (a CPU without them simulated
  by a fake /proc/cpuinfo): the recipe's base weights, its trainer's autocast and
  `details.precision`; the chat child's dtype too. `bf16` and `fp32` force it.
- MFU's parts: FLOPs per token counted from the model, the peak probed once and cached
  by device and dtype, probed again when a run outdoes it.

The real training jobs are in tests/integration/test_precision.py.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio import hardware
from finetune_studio.api.app import create_app
from finetune_studio.api.routes import system
from finetune_studio.config import Settings
from finetune_studio.hardware import CpuBf16, choose_precision, detect_cpu_bf16
from finetune_studio.schemas import TrainingStartRequest
from tests.helpers.jobs import InstantLauncher
from tests.helpers.paths import DEMO_DATA

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: {model}
flags\t\t: fpu vme de pse tsc msr {flags}

processor\t: 1
model name\t: {model}
flags\t\t: fpu
"""
AMX = "avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8"
AVX512_BF16 = "avx512f avx512bw avx512_bf16"
NEITHER = "sse4_2 avx2 avx512f avx512bw"
NATIVE_HERE = detect_cpu_bf16().native


def fake_cpuinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: str, model: str = "Test CPU 9000") -> Path:
    """/proc/cpuinfo as `detect_cpu_bf16` reads it, with these flags."""
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(model=model, flags=flags))
    monkeypatch.setattr(hardware, "CPUINFO", path)
    # The flags decide, as on a CPU whose torch build does not say (this machine's oneDNN may refuse bf16).
    from finetune_studio.child import precision

    monkeypatch.setattr(precision, "torch_cpu_bf16", lambda: None)
    return path


# -- the detection rule ------------------------------------------------------------


@pytest.mark.parametrize(("flags", "kind", "found"), [
    (AMX, "amx", ("amx_bf16", "avx512_bf16")),
    (AVX512_BF16, "avx512_bf16", ("avx512_bf16",)),
    (NEITHER, "none", ()),
])
def test_the_cpu_flags_say_whether_bf16_is_native(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: str, kind: str, found: tuple[str, ...]
) -> None:
    fake_cpuinfo(monkeypatch, tmp_path, flags)
    cpu = detect_cpu_bf16()
    assert (cpu.kind, cpu.flags, cpu.model) == (kind, found, "Test CPU 9000")
    assert cpu.native is (kind != "none")
    if kind == "amx":
        assert cpu.describe() == "the CPU has AMX (amx_bf16) and AVX512-BF16 (avx512_bf16)"


def test_no_cpuinfo_means_no_native_bf16(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "absent")
    assert detect_cpu_bf16() == CpuBf16("none", (), None)


def test_the_rule_of_precision() -> None:
    amx = CpuBf16("amx", ("amx_bf16",), "x")
    plain = CpuBf16("none", (), "x")
    auto_native = choose_precision("auto", cuda=False, cpu=amx)
    assert (auto_native.dtype, auto_native.reason, auto_native.warning) == ("bf16", "the CPU has AMX (amx_bf16)", None)
    assert auto_native.to_json() == {"dtype": "bf16", "asked": "auto", "reason": "the CPU has AMX (amx_bf16)"}
    assert choose_precision("auto", cuda=False, cpu=plain).dtype == "fp32"
    # A torch without bf16 kernels for the CPU: the flags are not enough.
    assert choose_precision("auto", cuda=False, cpu=amx, torch_cpu_bf16=False).dtype == "fp32"
    assert choose_precision("fp32", cuda=False, cpu=amx).dtype == "fp32"
    forced = choose_precision("bf16", cuda=False, cpu=plain)
    assert forced.dtype == "bf16" and forced.warning is not None and "slower than fp32" in forced.warning
    assert choose_precision("bf16", cuda=False, cpu=amx).warning is None
    # A GPU: CUDA's bf16 decides, whatever the CPU.
    assert choose_precision("auto", cuda=True, cuda_bf16=True, cpu=plain).dtype == "bf16"
    assert choose_precision("auto", cuda=True, cuda_bf16=False, cpu=amx).dtype == "fp32"
    no_gpu_bf16 = choose_precision("bf16", cuda=True, cuda_bf16=False)
    assert no_gpu_bf16.dtype == "fp32" and no_gpu_bf16.warning is not None


def test_the_request_takes_auto_bf16_or_fp32_only() -> None:
    body = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": ["d.jsonl"]}
    assert TrainingStartRequest.model_validate(body).precision == "auto"
    assert TrainingStartRequest.model_validate({**body, "precision": None}).precision == "auto"  # the Studio's null
    assert TrainingStartRequest.model_validate({**body, "precision": "fp32"}).precision == "fp32"
    with pytest.raises(ValueError, match="precision"):
        TrainingStartRequest.model_validate({**body, "precision": "fp16"})


# -- GET /system ---------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"), launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        yield client


def test_system_reports_the_cpus_bf16_flags(client: TestClient) -> None:
    here = detect_cpu_bf16()
    assert client.get("/system").json()["cpu"] == {
        "model": here.model, "bf16": here.kind, "bf16_flags": list(here.flags), "native_bf16": here.native,
    }


@pytest.mark.parametrize(("flags", "expected"), [
    (AMX, {"bf16": "amx", "bf16_flags": ["amx_bf16", "avx512_bf16"], "native_bf16": True}),
    (AVX512_BF16, {"bf16": "avx512_bf16", "bf16_flags": ["avx512_bf16"], "native_bf16": True}),
    (NEITHER, {"bf16": "none", "bf16_flags": [], "native_bf16": False}),
])
def test_system_reads_the_flags_from_cpuinfo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: str, expected: dict[str, Any]
) -> None:
    fake_cpuinfo(monkeypatch, tmp_path, flags, model="Intel(R) Xeon(R) Platinum 8480+")
    assert system.detect().cpu.model_dump() == {"model": "Intel(R) Xeon(R) Platinum 8480+", **expected}


# -- the training recipe's choice, in this process ---------------------------------------


def configured(tmp_path: Path, tiny_model: Path, **fields: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A recipe that has read the data, loaded the model and built its trainer (no step
    trained): (recipe, trainer, the statuses and warnings it sent)."""
    from finetune_studio.child.channel import Channel, StopSignal
    from finetune_studio.child.models import resolve_source
    from finetune_studio.training.recipe import Recipe
    from finetune_studio.wire import WorkerSpec

    request = {"model_name": str(tiny_model), "training_type": "LoRA/QLoRA", "format_type": "alpaca",
               "local_datasets": [str(DEMO_DATA)], "max_steps": 2, "max_seq_length": 64, "lora_r": 4,
               "optim": "adamw_torch", "load_in_4bit": False, "save_steps": 0, **fields}
    out = io.StringIO()
    stop = StopSignal()
    recipe = Recipe(WorkerSpec("job1", tmp_path / "jobs" / "job1", request), Channel(out, stop), stop)
    data, _ = recipe.read_data()
    tokenizer, model = recipe.load_model(resolve_source(str(tiny_model)))
    trainer = recipe.build_trainer(model, tokenizer, data, None)
    return recipe, trainer, [json.loads(line) for line in out.getvalue().splitlines()]


def base_dtypes(trainer: Any) -> tuple[set[str], set[str]]:
    """The dtypes of the trainer's model's (frozen, trained) weights."""
    parameters = list(trainer.model.named_parameters())
    return ({str(p.dtype) for _, p in parameters if not p.requires_grad},
            {str(p.dtype) for _, p in parameters if p.requires_grad})


# peft asks transformers a question it has renamed (a FutureWarning, not ours).
PEFT_NOISE = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture
def cached_peak(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The recipe's peak probe writes to a cache of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@PEFT_NOISE
@pytest.mark.parametrize(("flags", "dtype", "reason", "frozen"), [
    (AMX, "bf16", "the CPU has AMX (amx_bf16) and AVX512-BF16 (avx512_bf16)", "torch.bfloat16"),
    (NEITHER, "fp32", "neither AMX nor AVX512-BF16", "torch.float32"),
], ids=["native-bf16", "no-native-bf16"])
def test_auto_trains_lora_in_bf16_only_where_the_cpu_has_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: Path, cached_peak: None,
    flags: str, dtype: str, reason: str, frozen: str,
) -> None:
    fake_cpuinfo(monkeypatch, tmp_path, flags)
    recipe, trainer, _ = configured(tmp_path, tiny_model)
    precision = recipe.facts["precision"]
    assert precision["dtype"] == dtype and precision["asked"] == "auto" and reason in precision["reason"]
    assert trainer.args.bf16 is (dtype == "bf16")  # autocast (accelerate's torch.autocast("cpu", bfloat16))
    assert base_dtypes(trainer) == ({frozen}, {"torch.float32"})  # the frozen base follows; the adapter stays fp32
    assert recipe.facts["peak"]["dtype"] == dtype and recipe.facts["peak"]["flops_per_second"] > 0
    assert not any("precision" in w for w in recipe.channel.warnings)


@PEFT_NOISE
def test_bf16_can_be_forced_without_native_support_and_is_said_to_cost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: Path, cached_peak: None
) -> None:
    fake_cpuinfo(monkeypatch, tmp_path, NEITHER)
    recipe, trainer, _ = configured(tmp_path, tiny_model, precision="bf16", training_type="Full Finetuning")
    assert recipe.facts["precision"]["dtype"] == "bf16" and trainer.args.bf16 is True
    assert base_dtypes(trainer) == (set(), {"torch.float32"})  # full fine-tuning: fp32 weights, bf16 autocast
    assert any("precision bf16" in w and "slower than fp32" in w for w in recipe.channel.warnings)


@PEFT_NOISE
def test_fp32_is_fp32_on_any_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: Path, cached_peak: None) -> None:
    fake_cpuinfo(monkeypatch, tmp_path, AMX)
    recipe, trainer, _ = configured(tmp_path, tiny_model, precision="fp32")
    assert recipe.facts["precision"] == {"dtype": "fp32", "asked": "fp32", "reason": "precision fp32 was asked for"}
    assert trainer.args.bf16 is False and base_dtypes(trainer) == ({"torch.float32"}, {"torch.float32"})


# -- the chat child's dtype ------------------------------------------------------------


@pytest.mark.parametrize(("flags", "precision", "dtype"), [
    (AMX, "auto", "torch.bfloat16"), (NEITHER, "auto", "torch.float32"), (AMX, "fp32", "torch.float32"),
    (NEITHER, "bf16", "torch.bfloat16"),
])
def test_the_chat_child_answers_in_its_precision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: Path, flags: str, precision: str, dtype: str
) -> None:
    from finetune_studio.inference import models
    from finetune_studio.inference.chat_model import BaseKey

    fake_cpuinfo(monkeypatch, tmp_path, flags)
    monkeypatch.setattr(models, "PRECISION", precision)
    loaded = models.load_transformers(BaseKey("folder", str(tiny_model), False))
    assert str(loaded.model.dtype) == dtype
    logits = loaded.forward(loaded.prompt_ids([{"role": "user", "content": "Hi"}]), loaded.new_cache(16), 0, None)
    assert str(logits.dtype) == "torch.float32" and bool(logits.isfinite().all())


def test_the_chat_child_takes_its_precision_from_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import asyncio
    import subprocess
    import sys

    from finetune_studio.supervisor import inference

    class NotStarted(Exception):
        """The test only reads the command line."""

    started: list[list[str]] = []

    async def spawn(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        started.append(argv)
        raise NotStarted

    monkeypatch.setattr(inference, "spawn_child", spawn)
    monkeypatch.setenv("FINETUNE_STUDIO_INFERENCE_PRECISION", "fp32")
    settings = Settings(data_dir=tmp_path)
    assert settings.inference_precision == "fp32"
    with pytest.raises(NotStarted):
        asyncio.run(inference.InferenceManager(settings)._start())
    assert started[0][started[0].index("--precision") + 1] == "fp32"
    monkeypatch.delenv("FINETUNE_STUDIO_INFERENCE_PRECISION")
    assert Settings().inference_precision == "auto"
    with pytest.raises(ValueError):
        Settings(inference_precision="fp16")
    # The child refuses what it does not know, before it says ready.
    refused = subprocess.run([sys.executable, "-m", "finetune_studio.inference.child", "--precision", "fp16"],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert refused.returncode == 2 and "--precision" in refused.stderr and refused.stdout == ""


# -- MFU's parts -------------------------------------------------------------------------


@PEFT_NOISE
def test_flops_per_token_count_the_matmuls(tiny_model: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from finetune_studio.training.throughput import model_flops

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    config = model.config
    d, inner, layers, kv = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_key_value_heads
    per_layer = d * d * 2 + 2 * d * kv * config.head_dim + 3 * d * inner  # q, o; k, v; gate, up, down
    n = layers * per_layer + d * config.vocab_size  # the tied LM head once; the embedding lookup is no matmul
    full = model_flops(model)
    assert (full.matmul_parameters, full.trainable_matmul_parameters) == (n, n)
    assert full.layers == layers and full.attention_width == config.num_attention_heads * config.head_dim
    assert full.per_token(100) == 6 * n + 12 * layers * full.attention_width * 100

    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapter = layers * (4 * (d + d) + 4 * (d + kv * config.head_dim))
    counted = model_flops(lora)
    assert (counted.matmul_parameters, counted.trainable_matmul_parameters) == (n + adapter, adapter)
    assert counted.per_token(0) == 4 * (n + adapter) + 2 * adapter  # = 4N + 6N_adapter over the base's N


def test_the_peak_is_probed_once_per_device_and_dtype(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from finetune_studio.training import throughput

    probes: list[str] = []
    monkeypatch.setattr(throughput, "probe", lambda cuda, dtype, seconds=0.3: probes.append(dtype) or 1e11)
    cache = tmp_path / "cache" / "peak-flops.json"
    first = throughput.peak_flops(False, "bf16", cache)
    again = throughput.peak_flops(False, "bf16", cache)
    other = throughput.peak_flops(False, "fp32", cache)
    assert probes == ["bf16", "fp32"]
    assert (first.measured, again.measured, other.measured) == ("probe", "cache", "probe")
    assert again.flops == 1e11 and "threads" in again.device
    stored = json.loads(cache.read_text())
    assert sorted(key.rsplit(" | ", 1)[1] for key in stored) == ["bf16", "fp32"]


def test_a_real_probe_measures_a_plausible_peak(tmp_path: Path) -> None:
    import time

    from finetune_studio.training.throughput import peak_flops

    started = time.monotonic()
    peak = peak_flops(False, "bf16" if NATIVE_HERE else "fp32", tmp_path / "peak.json")
    assert time.monotonic() - started < 10  # a few hundred ms; generous for a busy machine
    assert 1e8 < peak.flops < 1e15 and peak.measured == "probe"


def test_a_run_faster_than_the_cached_peak_probes_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from finetune_studio.training import throughput
    from finetune_studio.training.throughput import ModelFlops, Peak, Utilization

    cache = tmp_path / "peak.json"
    monkeypatch.setattr(throughput, "probe", lambda cuda, dtype, seconds=0.3: 4e9)
    low = Peak(1e9, "bf16", throughput.device_name(False), "cache")  # taken on a busy machine
    cache.write_text(json.dumps({f"{low.device} | bf16": low.flops}))
    utilization = Utilization(low, cache)
    utilization.flops = ModelFlops(1_000_000, 1_000_000, 0, 0)  # 6 MFLOP a token
    assert utilization.mfu(500.0, 10.0) == pytest.approx(3e9 / 4e9)  # 3 GFLOP/s: above 1e9, so probed again
    assert utilization.peak.flops == 4e9 and json.loads(cache.read_text())[f"{low.device} | bf16"] == 4e9
    assert utilization.mfu(None, 10.0) is None and utilization.mfu(500.0, None) is None


def test_mfu_is_none_until_the_model_is_known() -> None:
    from finetune_studio.training.throughput import Peak, Utilization

    utilization = Utilization(Peak(1e12, "fp32", "cpu x", "cache"))
    assert utilization.mfu(1000.0, 128.0) is None
    assert not math.isnan(utilization.peak.flops)
