"""Each value's 95% interval, and each model's difference from the first with its own interval.

- A metric that is a mean over samples (or a ratio of two sums over them: a loss over tokens,
  a token accuracy) gets a paired bootstrap: BOOTSTRAP_RESAMPLES resamples of the samples,
  drawn once with a fixed seed (BOOTSTRAP_SEED) and shared by every model, so that each
  model's interval and each difference's come from the same draws. Intervals are the 2.5th
  and 97.5th percentiles of the resampled statistics.
- Corpus BLEU and chrF are not means over samples: sacrebleu's paired bootstrap
  (`sacrebleu.significance.PairedTest`, test_type "bs", its seed and resample count) scores
  each model; the intervals of each value and of each difference are read off the very
  resamples that test draws (the same seeded index matrix, each system's sufficient
  statistics summed per resample, sacrebleu's own score function), as percentiles like the
  means' (sacrebleu's own "mean +- half-width" can pass 100 on few samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's own default (SACREBLEU_SEED)


@dataclass
class Estimate:
    """A metric for every model: values, 95% intervals, differences from the first, and theirs."""

    values: dict[str, Optional[float]] = field(default_factory=dict)
    ci95: dict[str, list[float]] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)
    deltas_ci95: dict[str, list[float]] = field(default_factory=dict)


def resample_indices(count: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """The bootstrap's draws: `resamples` rows of `count` sample indices, with replacement."""
    rng = np.random.default_rng(seed)
    return rng.choice(count, size=(resamples, count), replace=True)


def _interval(stats: np.ndarray) -> Optional[list[float]]:
    finite = stats[np.isfinite(stats)]
    if finite.size == 0:
        return None
    low, high = np.percentile(finite, [2.5, 97.5])
    return [float(low), float(high)]


def paired_bootstrap(
    numerators: Mapping[str, Sequence[float]],
    models: Sequence[str],
    denominators: Optional[Mapping[str, Sequence[float]]] = None,
    transform: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> Estimate:
    """Each model's statistic sum(numerator) / sum(denominator) over the samples (a mean when
    there is no denominator), through `transform` (exp: a perplexity from a loss), with its
    interval, and its paired difference from the first of `models` (the samples of every model
    are the same samples, in the same order). A model without numerators has no value."""
    estimate = Estimate()
    present = [model for model in models if model in numerators]
    if not present:
        return estimate
    count = len(numerators[present[0]])
    if count == 0:
        estimate.values = {model: None for model in models}
        return estimate
    draws = resample_indices(count)
    resampled: dict[str, np.ndarray] = {}
    for model in models:
        if model not in numerators:
            estimate.values[model] = None
            continue
        num = np.asarray(numerators[model], dtype=np.float64)
        den = np.asarray(denominators[model], dtype=np.float64) if denominators is not None else np.ones_like(num)
        if num.shape != (count,) or den.shape != (count,):
            raise ValueError(f"model {model} has {num.size} samples where the first has {count}: they must be the same samples")
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.array([num.sum() / den.sum()]) if den.sum() else np.array([math.nan])
            stats = num[draws].sum(axis=1) / den[draws].sum(axis=1)
        if transform is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                value, stats = transform(value), transform(stats)
        estimate.values[model] = float(value[0]) if math.isfinite(float(value[0])) else None
        interval = _interval(stats)
        if interval is not None:
            estimate.ci95[model] = interval
        resampled[model] = stats
    first = models[0]
    first_value = estimate.values.get(first)
    if first in resampled and first_value is not None:
        for model in models[1:]:
            model_value = estimate.values.get(model)
            if model not in resampled or model_value is None:
                continue
            estimate.deltas[model] = model_value - first_value
            interval = _interval(resampled[model] - resampled[first])
            if interval is not None:
                estimate.deltas_ci95[model] = interval
    return estimate


def corpus_bootstrap(
    hypotheses: Mapping[str, Sequence[str]], references: Sequence[str], models: Sequence[str]
) -> dict[str, Estimate]:
    """Corpus BLEU and chrF of each model's answers against the references (`{"bleu": ..., "chrf": ...}`),
    by sacrebleu's paired bootstrap (see the module's docstring)."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF
    from sacrebleu.significance import PairedTest

    named: list[tuple[str, Sequence[str]]] = [(model, list(hypotheses[model])) for model in models]
    refs = [list(references)]
    test = PairedTest(named, {"bleu": BLEU(), "chrf": CHRF()}, references=refs, test_type="bs", n_samples=BOOTSTRAP_RESAMPLES)
    _, scores = test()
    seed = test._seed  # noqa: SLF001 - the seed the test drew its resamples with
    draws = np.random.default_rng(seed).choice(len(references), size=(test.n_samples, len(references)), replace=True)
    found: dict[str, Estimate] = {}
    for key, metric_class in (("bleu", BLEU), ("chrf", CHRF)):
        name = next(name for name in scores if name != "System" and name.lower().startswith(key))
        estimate = Estimate()
        per_resample: dict[str, np.ndarray] = {}
        for model, result in zip(models, scores[name], strict=True):
            estimate.values[model] = _result_field(result, "score")
            per_resample[model] = _resampled_scores(metric_class(), hypotheses[model], refs, draws)
            interval = _interval(per_resample[model])
            if interval is not None:
                estimate.ci95[model] = interval
        first = models[0]
        for model in models[1:]:
            first_value, value = estimate.values.get(first), estimate.values.get(model)
            if first_value is None or value is None:
                continue
            estimate.deltas[model] = value - first_value
            interval = _interval(per_resample[model] - per_resample[first])
            if interval is not None:
                estimate.deltas_ci95[model] = interval
        found[key] = estimate
    return found


def _result_field(result: Any, name: str) -> Optional[float]:
    value = getattr(result, name, None)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None


def _resampled_scores(metric: Any, hypotheses: Sequence[str], references: list[list[str]], draws: np.ndarray) -> np.ndarray:
    """sacrebleu's score of each resample, from the system's sufficient statistics (as its paired test computes them)."""
    stats = np.array(metric._extract_corpus_statistics(list(hypotheses), references), dtype="float32")  # noqa: SLF001
    return np.array([metric._compute_score_from_stats(stats[row].sum(0)).score for row in draws])  # noqa: SLF001
