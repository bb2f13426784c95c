"""The training recipe run in this process up to its model loader (tests/unit/test_recipe_order.py,
test_bad_rows.py, tests/integration/test_early_stopping.py): what it checks before loading weights."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.child.channel import Channel, JobFailure, StopSignal
from finetune_studio.training.recipe import Recipe
from finetune_studio.wire import WorkerSpec


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
