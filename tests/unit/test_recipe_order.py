"""Bad data is found before the model: the child reads and checks every row before it
loads any weights, and the seed's phase order is kept on the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune_studio.child.channel import JobFailure
from tests.data.corpus import BAD_FILES, GOOD
from tests.helpers.recipes import ModelLoaderEntered, run_recipe


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
