// An evaluation's results as a table (docs/API.md, GET /eval/results/{id}): one column per
// model, one row per metric named `suite/name`; each value with its 95% interval (`ci95`),
// and for each model after the first its difference from the first (`deltas`) with that
// difference's own interval (`deltas_ci95`), marked where the interval excludes zero: better
// or worse by the metric's `higher_is_better`. The numbers are the server's; nothing is
// computed here but their reading.

import { el } from "./dom.js";
import * as fmt from "./format.js";
import { BASE_MODEL_PREFIX } from "./rules.js";

const DIGITS = 3;

function isKnownJob(jobs, jobId) {
  const meta = jobs.meta(jobId);
  return Boolean(jobs.statusOf(jobId) || meta.model_name || meta.project_name);
}

/** A model's name as people know it: a run's label (or model), "base of <run>", else its id. */
export function modelName(jobs, model) {
  if (model.startsWith(BASE_MODEL_PREFIX)) {
    const jobId = model.slice(BASE_MODEL_PREFIX.length);
    return `base of ${isKnownJob(jobs, jobId) ? jobs.shortName(jobId) : jobId}`;
  }
  return isKnownJob(jobs, model) ? jobs.shortName(model) : model;
}

/** The training job a model id belongs to (a job id, or base:<job id>); null for another model. */
export function jobOfModel(jobs, model) {
  const jobId = model.startsWith(BASE_MODEL_PREFIX) ? model.slice(BASE_MODEL_PREFIX.length) : model;
  return isKnownJob(jobs, jobId) ? jobId : null;
}

/** "[0.512, 0.801]"; "" without an interval. */
export function interval(bounds) {
  if (!Array.isArray(bounds) || bounds.length !== 2) return "";
  return `[${fmt.metric(bounds[0], DIGITS)}, ${fmt.metric(bounds[1], DIGITS)}]`;
}

function signed(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  return `${value > 0 ? "+" : value < 0 ? "−" : "±"}${fmt.metric(Math.abs(value), DIGITS)}`;
}

/**
 * What a difference says: "better" or "worse" (its interval excludes zero, in the metric's
 * direction), "unsure" (the interval holds zero), or "" (no interval to judge by).
 */
export function verdictOf(delta, bounds, higherIsBetter) {
  if (delta == null || !Array.isArray(bounds) || bounds.length !== 2) return "";
  const [low, high] = bounds;
  if (!(low > 0 || high < 0)) return "unsure";
  return (low > 0) === Boolean(higherIsBetter) ? "better" : "worse";
}

const VERDICT_WORDS = {
  better: "its 95% interval excludes zero: better than the first model",
  worse: "its 95% interval excludes zero: worse than the first model",
  unsure: "its 95% interval includes zero: no clear difference",
};

function cell(metric, model, index, first) {
  const value = (metric.values || {})[model];
  const parts = [
    el("span", { class: "eval-value", "data-testid": "eval-value" }, fmt.metric(value, DIGITS)),
    el("span", { class: "eval-ci muted", "data-testid": "eval-ci" }, interval((metric.ci95 || {})[model])),
  ];
  const delta = (metric.deltas || {})[model];
  if (index > 0 && delta != null) {
    const bounds = (metric.deltas_ci95 || {})[model];
    const verdict = verdictOf(delta, bounds, metric.higher_is_better);
    parts.push(el("div", {
      class: "eval-delta", "data-testid": "eval-delta", "data-verdict": verdict,
      title: `The difference from ${first}${verdict ? `; ${VERDICT_WORDS[verdict]}` : ""}`,
    },
    el("span", { class: "eval-delta-value", "data-testid": "eval-delta-value" }, `Δ ${signed(delta)}`),
    el("span", { class: "eval-ci", "data-testid": "eval-delta-ci" }, interval(bounds)),
    verdict === "better" || verdict === "worse"
      ? el("span", { class: "eval-mark", "aria-label": verdict }, verdict === "better" ? "▲" : "▼")
      : null));
  }
  return el("td", { "data-model": model, "data-testid": "eval-cell" }, parts);
}

/** The results table of `results` (an EvalResults), models named by `jobs` (a JobsIndex). */
export function resultsTable(results, jobs) {
  const models = results.models || [];
  const first = models.length ? modelName(jobs, models[0]) : "";
  const head = el("tr", el("th", { scope: "col" }, "Metric"),
    models.map((model, index) => el("th", { scope: "col", "data-model": model },
      el("span", { class: "eval-model-name" }, modelName(jobs, model)),
      el("code", { class: "job-id" }, model),
      index === 0 && models.length > 1 ? el("span", { class: "muted eval-first" }, "the first: differences are from it") : null)));
  const rows = (results.metrics || []).map((metric) => el("tr", { "data-testid": "eval-metric", "data-metric": metric.name },
    el("th", { scope: "row" },
      el("span", { class: "eval-metric-name" }, metric.name),
      el("span", { class: "muted eval-metric-note" },
        `${metric.higher_is_better ? "higher" : "lower"} is better${metric.samples != null ? ` · ${fmt.integer(metric.samples)} samples` : ""}`)),
    models.map((model, index) => cell(metric, model, index, first))));
  return el("div", { class: "eval-table-wrap" },
    el("table", { class: "eval-table", "data-testid": "eval-table" },
      el("caption", { class: "muted" }, "Each value with its 95% interval; below it, the difference from the first model with the difference's own interval (▲ better, ▼ worse: the interval excludes zero)."),
      el("thead", head), el("tbody", rows)));
}
