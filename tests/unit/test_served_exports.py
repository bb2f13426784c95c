"""Which files of which exports the chat routes serve, and what they say when they
cannot (api/served_exports.py through api/served_models.py), over a real store
and real files (stand-ins for GGUF bytes: nothing is loaded here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_studio.api.served_models import resolve_model, served_models
from finetune_studio.errors import ModelNotFound
from finetune_studio.jobs.store import JobStore
from tests.helpers.export_records import export_of, trained_job


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "studio.db")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {}
    for name, content in (("base.gguf", b"GGUF base"), ("q8.gguf", b"GGUF q8_0"), ("lora.gguf", b"GGUF lora"),
                          ("Modelfile", b"FROM ./model-q8_0.gguf\n"), ("model.safetensors", b"weights")):
        made[name] = tmp_path / "sources" / name
        made[name].parent.mkdir(exist_ok=True)
        made[name].write_bytes(content)
    return made


def not_found(store: JobStore, model_id: str) -> str:
    with pytest.raises(ModelNotFound) as caught:
        resolve_model(store, model_id)
    return str(caught.value)


def test_a_completed_gguf_export_is_served_by_llama_cpp(store: JobStore, tmp_path: Path, files: dict[str, Path]) -> None:
    job = trained_job(store, tmp_path, {"kind": "folder", "location": str(tmp_path / "base-model")})
    export = export_of(store, tmp_path, job, {
        "model-q8_0.gguf": (files["q8.gguf"], "gguf", "q8_0"),
        "Modelfile": (files["Modelfile"], "gguf", None),
    })
    ids = [model.id for model in served_models(store)]
    assert f"{export}/model-q8_0.gguf" in ids
    assert f"{export}/Modelfile" not in ids

    ref = resolve_model(store, f"{export}/model-q8_0.gguf")
    served = tmp_path / "exports" / export / "model-q8_0.gguf"
    assert ref == {"base": {"kind": "gguf", "location": str(served.resolve())}, "adapter": None,
                   "trust_remote_code": False, "backend": "llama_cpp"}
    assert served.read_bytes() == b"GGUF q8_0"


def test_a_lora_gguf_is_served_on_its_gguf_base_only(store: JobStore, tmp_path: Path, files: dict[str, Path]) -> None:
    on_gguf = trained_job(store, tmp_path, {"kind": "gguf", "location": str(files["base.gguf"])})
    on_folder = trained_job(store, tmp_path, {"kind": "folder", "location": str(tmp_path / "base-model")})
    served = export_of(store, tmp_path, on_gguf, {"adapter-f16.gguf": (files["lora.gguf"], "lora_gguf", "f16")},
                       export_format="lora_gguf")
    left_out = export_of(store, tmp_path, on_folder, {"adapter-f16.gguf": (files["lora.gguf"], "lora_gguf", "f16")},
                         export_format="lora_gguf")

    ids = [model.id for model in served_models(store)]
    assert f"{served}/adapter-f16.gguf" in ids
    assert f"{left_out}/adapter-f16.gguf" not in ids

    ref = resolve_model(store, f"{served}/adapter-f16.gguf")
    assert ref["base"] == {"kind": "gguf", "location": str(files["base.gguf"])}
    assert ref["adapter"] == str((tmp_path / "exports" / served / "adapter-f16.gguf").resolve())
    assert ref.get("backend") == "llama_cpp"

    message = not_found(store, f"{left_out}/adapter-f16.gguf")
    assert "only on a GGUF base" in message and "export format gguf" in message


def test_what_cannot_be_served_is_said(store: JobStore, tmp_path: Path, files: dict[str, Path]) -> None:
    job = trained_job(store, tmp_path, {"kind": "folder", "location": str(tmp_path / "base-model")})
    done = export_of(store, tmp_path, job, {
        "model-q8_0.gguf": (files["q8.gguf"], "gguf", "q8_0"),
        "Modelfile": (files["Modelfile"], "gguf", None),
    })
    merged = export_of(store, tmp_path, job, {"model.safetensors": (files["model.safetensors"], "merged_16bit", None)},
                       export_format="merged_16bit")
    running = export_of(store, tmp_path, job, {}, phase="converting")
    queued = export_of(store, tmp_path, job, {}, phase="idle")
    failed = export_of(store, tmp_path, job, {}, phase="error")
    stopped = export_of(store, tmp_path, job, {}, phase="stopped")

    assert not_found(store, done).startswith(f"{done} is an export, not a model: name one of its GGUF files: {done}/model-q8_0.gguf")
    assert "not a GGUF model" in not_found(store, f"{done}/Modelfile")
    assert f"has no file 'other.gguf'; name one of its GGUF files: {done}/model-q8_0.gguf" in not_found(store, f"{done}/other.gguf")
    assert "has no GGUF file to chat with" in not_found(store, f"{merged}/model.safetensors")
    assert f"export {running} is still running (phase converting)" in not_found(store, f"{running}/model-q8_0.gguf")
    assert f"GET /export/status/{running}" in not_found(store, running)
    assert f"export {queued} is queued" in not_found(store, f"{queued}/model-q8_0.gguf")
    assert "failed (the converter failed: it ran out of disk)" in not_found(store, f"{failed}/model-q8_0.gguf")
    assert "was stopped before it finished" in not_found(store, f"{stopped}/model-q8_0.gguf")

    ids = [model.id for model in served_models(store)]
    exports = (done, merged, running, queued, failed, stopped)
    assert [i for i in ids if i.startswith(exports)] == [f"{done}/model-q8_0.gguf"]

    (tmp_path / "exports" / done / "model-q8_0.gguf").unlink()
    assert "is no longer on disk" in not_found(store, f"{done}/model-q8_0.gguf")
    assert f"{done}/model-q8_0.gguf" not in [model.id for model in served_models(store)]


def test_a_listed_name_outside_the_export_folder_is_not_served(store: JobStore, tmp_path: Path, files: dict[str, Path]) -> None:
    job = trained_job(store, tmp_path, {"kind": "folder", "location": str(tmp_path / "base-model")})
    export = export_of(store, tmp_path, job, {"model-q8_0.gguf": (files["q8.gguf"], "gguf", "q8_0")})
    record = store.get_job(export)
    outside = tmp_path / "exports" / "elsewhere.gguf"
    outside.write_bytes(b"GGUF elsewhere")
    entry = {"name": "../elsewhere.gguf", "format": "gguf", "quantization": "q8_0", "bytes": 14, "sha256": "0" * 64}
    # A record that lists a file outside its folder (never written by the child): it must not reach it.
    store._db.execute("UPDATE jobs SET status_json = ? WHERE id = ?",
                      (json.dumps({**record.status, "details": {"files": [entry]}}), export))
    assert "is no longer on disk" in not_found(store, f"{export}/../elsewhere.gguf")
    assert not [model.id for model in served_models(store) if model.id.startswith(export)]


def test_a_hub_id_with_a_slash_is_still_a_base_model_name(store: JobStore, tmp_path: Path) -> None:
    message = not_found(store, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "does not exist" in message
