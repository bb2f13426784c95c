"""A sweep's Optuna study: ask, report, tell, enqueue, importances (the one module that imports optuna).

Optuna is imported inside `open_study`, on the first sweep, never when the server starts;
every call here blocks (SQLite through SQLAlchemy) and runs in the sweep manager's one
worker thread (supervisor/sweeps.py), never on the event loop. The study lives in Optuna's
RDB storage, `<data-dir>/sweeps.db` (`wire.DataDir.sweeps_db`), named by the sweep's id, so
a restarted server loads it again with every trial it had (`load_if_exists`).

Ask-and-tell is not covered by Optuna's heartbeat: what a restart does to a trial that was
running is the sweep manager's decision (told FAIL here, its values queued again with
`enqueue`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from finetune_studio.schemas import SweepCreate, SweepParameter

if TYPE_CHECKING:  # pragma: no cover - types only
    import optuna

log = logging.getLogger("finetune_studio.sweeps")


class StudyProblem(ValueError):
    """Optuna refused the space, the sampler or the pruner; the text says what, `field` where."""

    def __init__(self, message: str, field: Optional[str] = None) -> None:
        super().__init__(message)
        self.field = field


class Study:
    """One sweep's study; `trials` keeps the asked trials it still reports for."""

    def __init__(self, study: optuna.Study, spec: SweepCreate) -> None:
        self.study = study
        self.spec = spec
        self._open: dict[int, optuna.Trial] = {}

    def ask(self) -> tuple[int, dict[str, Any]]:
        """A new trial (an enqueued one first): its number and the values Optuna chose."""
        trial = self.study.ask(distributions(self.spec))
        self._open[trial.number] = trial
        return trial.number, dict(trial.params)

    def report(self, number: int, value: float, step: int) -> bool:
        """Report a trial's intermediate value at `step`; whether the pruner stops it."""
        if not math.isfinite(value):
            return False
        trial = self._trial(number)
        if step in trial.storage.get_trial(trial._trial_id).intermediate_values:  # noqa: SLF001 - Optuna's own id
            return False  # a step reported before a restart
        trial.report(value, step)
        return bool(trial.should_prune())

    def tell(self, number: int, state: str, value: Optional[float] = None) -> None:
        """End a trial: `complete` (with its value), `pruned` or `failed`. A trial already ended is left as it is."""
        import optuna

        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "failed": optuna.trial.TrialState.FAIL}
        values = value if state == "complete" else None
        try:
            self.study.tell(number, values, state=states[state], skip_if_finished=True)
        except RuntimeError as exc:
            # The grid sampler ends a study whose grid is used up with Study.stop(), which refuses
            # outside optimize() (ask-and-tell) once the trial's end is stored; the sweep counts its trials itself.
            if "Study.stop" not in str(exc):
                raise
        self._open.pop(number, None)

    def enqueue(self, params: dict[str, Any]) -> None:
        """Queue these values for the next `ask` (a trial a restart interrupted)."""
        self.study.enqueue_trial(params, skip_if_exists=False)

    def importances(self) -> dict[str, float]:
        """Optuna's parameter importances over the complete trials ({} with fewer than two)."""
        import optuna

        complete = [t for t in self.study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if len(complete) < 2:
            return {}
        try:
            return {name: float(value) for name, value in optuna.importance.get_param_importances(self.study).items()}
        except (ValueError, RuntimeError) as exc:  # a space of one value, identical trials ...
            log.debug("no importances for sweep %s: %s", self.study.study_name, exc)
            return {}

    def _trial(self, number: int) -> optuna.Trial:
        trial = self._open.get(number)
        if trial is None:  # asked before a restart: the same trial, from the storage
            import optuna

            frozen = next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)
            trial = self._open[number] = optuna.Trial(self.study, frozen._trial_id)  # noqa: SLF001 - Optuna's own id
        return trial


def open_study(storage: Path, sweep_id: str, spec: SweepCreate) -> Study:
    """Create the sweep's study, or load it again after a restart (StudyProblem when Optuna refuses it)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions(spec)  # Optuna's own checks of every field, before anything is stored
    try:
        study = optuna.create_study(
            study_name=sweep_id,
            storage=f"sqlite:///{storage}",
            sampler=_sampler(spec),
            pruner=_pruner(spec),
            direction=spec.objective.direction,
            load_if_exists=True,
        )
    except ValueError as exc:
        raise StudyProblem(f"Optuna refused the sweep: {exc}") from exc
    return Study(study, spec)


def distributions(spec: SweepCreate) -> dict[str, Any]:
    """Each field's Optuna distribution (a grid's fields: their grid values, as categorical choices)."""
    import optuna.distributions as d

    made: dict[str, Any] = {}
    for name, parameter in spec.space.items():
        try:
            made[name] = _distribution(d, parameter, grid=spec.sampler == "grid")
        except ValueError as exc:
            raise StudyProblem(f"space.{name}: {exc}", field=f"space.{name}") from exc
    return made


def _distribution(d: Any, parameter: SweepParameter, grid: bool) -> Any:
    values = parameter.grid() if grid else None
    if values is not None:
        return d.CategoricalDistribution(values)
    if parameter.type == "categorical":
        return d.CategoricalDistribution(parameter.choices or [])
    low, high = parameter.bounds()
    if parameter.type == "int":
        step = int(parameter.step or 1)
        return d.IntDistribution(int(low), int(high), log=parameter.log, step=step)
    return d.FloatDistribution(low, high, log=parameter.log, step=parameter.step)


def _sampler(spec: SweepCreate) -> Any:
    import optuna

    if spec.sampler == "grid":
        space = {name: parameter.grid() or [] for name, parameter in spec.space.items()}
        return optuna.samplers.GridSampler(space, seed=spec.seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def _pruner(spec: SweepCreate) -> Any:
    import optuna

    pruner = spec.pruner_spec()
    if pruner.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner.n_startup_trials, n_warmup_steps=pruner.n_warmup_steps)
    if pruner.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, pruner.n_warmup_steps))
    return optuna.pruners.NopPruner()
