"""Bad data is found before the model: the child reads and checks every row before it
loads any weights, and the seed's phase order is kept on the wire."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.training.channel import Channel, JobFailure, StopSignal
from finetune_studio.training.recipe import Recipe
from finetune_studio.wire import WorkerSpec
from tests.data.corpus import BAD_FILES, GOOD


class ModelLoaderEntered(Exception):
    pass


def run_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: Path, fields: dict[str, Any]) -> tuple[list[dict[str, Any]], BaseException]:
    """Run the recipe in this process with a model loader that must not be reached
    before the data is checked; returns the statuses sent and what ended the run."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # resolves as a model folder; its weights are never read

    def load_model(self: Recipe, source: Any) -> Any:
        raise ModelLoaderEntered(source.location)

    monkeypatch.setattr(Recipe, "load_model", load_model)
    out = io.StringIO()
    stop = StopSignal()
    request = {"model_name": str(model), "training_type": "LoRA/QLoRA", "local_datasets": [str(data)], **fields}
    recipe = Recipe(WorkerSpec("job1", tmp_path / "job1", request), Channel(out, stop), stop)
    with pytest.raises((JobFailure, ModelLoaderEntered)) as ended:
        recipe.run()
    statuses = [json.loads(line) for line in out.getvalue().splitlines()]
    return statuses, ended.value


@pytest.mark.parametrize("bad", BAD_FILES[:6], ids=lambda bad: bad.name)
def test_a_bad_file_is_reported_before_the_model_loader_is_entered(
    bad: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    statuses, ended = run_recipe(tmp_path, monkeypatch, bad.path, bad.fields)
    assert isinstance(ended, JobFailure), f"the model loader was entered for {bad.name}"
    assert ended.error_code == "dataset_invalid"
    assert bad.where in ended.message
    assert [s["phase"] for s in statuses] == ["loading_model", "loading_dataset"]


def test_good_data_goes_on_to_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: the same run with a good file does reach the loader.
    statuses, ended = run_recipe(tmp_path, monkeypatch, GOOD / "chatml.jsonl", {"format_type": "chatml"})
    assert isinstance(ended, ModelLoaderEntered)
    assert [s["phase"] for s in statuses] == ["loading_model"]
