"""A sweep's Optuna study (supervisor/sweep_study.py), asked and told as the sweep manager does."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_studio.schemas import SweepCreate

pytest.importorskip("optuna", reason="sweeps need finetune-studio[sweep]")


def test_a_grid_sweep_that_uses_up_its_grid_tells_its_last_trial(tmp_path: Path) -> None:
    # Optuna's grid sampler ends a study whose grid is used up with Study.stop(), which raises outside
    # optimize(): the last trial's tell must still end it (a sweep of the whole grid once never completed).
    from finetune_studio.supervisor.sweep_study import open_study

    spec = SweepCreate.model_validate({
        "request": {}, "space": {"learning_rate": {"type": "categorical", "choices": [1e-3, 1e-2]}},
        "objective": {"metric": "train_loss"}, "trials": 2, "sampler": "grid",
    })
    study = open_study(tmp_path / "sweeps.db", "sw_grid", spec)
    asked = [study.ask() for _ in range(2)]
    assert sorted(params["learning_rate"] for _, params in asked) == [1e-3, 1e-2]
    for number, _ in asked:
        study.tell(number, "complete", 1.0 + number)
    trials = study.study.get_trials(deepcopy=False)
    assert [(t.number, t.state.name, t.value) for t in trials] == [(0, "COMPLETE", 1.0), (1, "COMPLETE", 2.0)]
