"""One rule for "path or hub id", and the server's admission and the child agree on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_studio.api.admission import named_paths
from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets.errors import HUB_UNREACHABLE
from finetune_studio.child.datasets.hub import open_hf_dataset
from finetune_studio.child.models import ModelSource, from_local_cache, resolve_source
from finetune_studio.paths import is_local
from finetune_studio.schemas import TrainingStartRequest

LOCAL_BY_FORM = ["/abs/model", "./model", "../model", "~/model", ".", "..", "a/b/c", "model.gguf", "Model.GGUF", "x\x00y"]
HUB_IDS = ["gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct"]


@pytest.mark.parametrize("name", LOCAL_BY_FORM)
def test_names_that_can_only_be_paths(name: str) -> None:
    assert is_local(name)


@pytest.mark.parametrize("name", HUB_IDS)
def test_hub_ids_are_local_only_when_they_exist_here(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert not is_local(name)
    (tmp_path / name).mkdir(parents=True)
    assert is_local(name)


def request(**fields: str) -> TrainingStartRequest:
    return TrainingStartRequest.model_validate(
        {"training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": ["d.jsonl"], **fields}
    )


@pytest.mark.parametrize("name", ["a/b/c", "missing.gguf", "./nowhere"])
def test_a_missing_path_is_checked_by_admission_and_refused_by_the_child(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ("model_name", name) in set(named_paths(request(model_name=name, hf_dataset=name)))
    assert ("hf_dataset", name) in set(named_paths(request(model_name=name, hf_dataset=name)))
    with pytest.raises(JobFailure) as model_failure:
        resolve_source(name)
    assert model_failure.value.error_code == "model_not_found"
    with pytest.raises(JobFailure) as data_failure:  # never asks the hub: it is a path
        open_hf_dataset(name, subset=None, split="train", split_field="train_split", token=None)
    assert data_failure.value.error_code == "dataset_not_found"


@pytest.mark.parametrize("name", HUB_IDS)
def test_a_hub_id_is_not_a_path_on_either_side(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fields = {field for field, _ in named_paths(request(model_name=name, hf_dataset=name))}
    assert not fields & {"model_name", "hf_dataset"}
    assert resolve_source(name).kind == "hub"


def test_a_hub_model_comes_from_the_cache_first_and_fails_fast_without_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub does not answer
    asked: list[dict[str, object]] = []

    def not_cached(kwargs: dict[str, object]) -> None:
        asked.append(kwargs)
        raise OSError("not in the local cache")

    hub = ModelSource("hub", "someone/model")
    assert from_local_cache(hub, lambda kwargs: kwargs, {"token": "t"}) == {"token": "t", "local_files_only": True}
    with pytest.raises(JobFailure) as failure:
        from_local_cache(hub, not_cached, {"token": "t"})
    assert asked == [{"token": "t", "local_files_only": True}]
    assert failure.value.error_code == "model_not_found"
    assert failure.value.message == f"{HUB_UNREACHABLE} (asked for 'someone/model')"
    assert from_local_cache(ModelSource("folder", "/models/m"), not_cached, {}) is None and len(asked) == 1
