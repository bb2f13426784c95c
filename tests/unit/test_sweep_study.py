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


def test_the_hyperband_pruner_stops_a_trial_far_behind_the_finished_ones(tmp_path: Path) -> None:
    # `pruner: hyperband`: Optuna's HyperbandPruner, its smallest rung at n_warmup_steps (at least 1)
    # and its largest taken from the first finished trial. Two trials finish with low losses over 9
    # steps; of the trials whose losses stay far above theirs, the pruner stops several, some at a
    # rung before their last step (which rung depends on the bracket Optuna assigns each trial).
    from finetune_studio.supervisor.sweep_study import open_study

    spec = SweepCreate.model_validate({
        "request": {}, "space": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        "objective": {"metric": "train_loss"}, "trials": 12, "sampler": "random", "seed": 0,
        "pruner": {"type": "hyperband", "n_warmup_steps": 1},
    })
    study = open_study(tmp_path / "sweeps.db", "sw_hyperband", spec)
    assert type(study.study.pruner).__name__ == "HyperbandPruner"
    for _ in range(4):
        number, _params = study.ask()
        for step in range(1, 10):
            assert not study.report(number, 1.0 / step, step)
        study.tell(number, "complete", 1.0 / 9)
    stopped_at = []
    for _ in range(8):
        number, _params = study.ask()
        for step in range(1, 10):
            if study.report(number, 10.0 + step, step):
                stopped_at.append(step)
                study.tell(number, "pruned")
                break
        else:
            study.tell(number, "complete", 19.0)
    assert len(stopped_at) >= 3 and min(stopped_at) < 9, stopped_at
