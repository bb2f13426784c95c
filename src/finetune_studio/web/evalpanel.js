// The Evaluations panel of a run's view: "Evaluate against its base" (a small form: a
// held-out data file, optional lm-eval task names, a limit) starts an evaluation of the run
// (the first model) against its base model (POST /eval/start; the longest answer too) and opens its view; the list
// of the evaluations that compare this run or its base (GET /eval/jobs), each followed
// while it runs; and, for a run trained with `eval_after`, its evaluation's summary and
// `eval_guard`'s verdict as the run's status joins them (`details.eval`), with a warning
// when the fine-tuned model fell behind its base.

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";
import { evalPhaseLabel, evalSummary } from "./evaluation.js";
import { modelName } from "./evaltable.js";
import * as fmt from "./format.js";
import { isServable } from "./jobs.js";
import { evalHash } from "./route.js";
import { BASE_MODEL_PREFIX } from "./rules.js";
import { RunPanel } from "./followed.js";

/** The suites the form asks for: a heldout suite for a data file, an lm_eval one for task names. */
export function formSuites(data, tasks, limit, maxTokens) {
  const suites = [];
  const count = limit ? Number(limit) : null;
  const longest = maxTokens ? { max_new_tokens: Number(maxTokens) } : {};
  if (data) suites.push({ type: "heldout", data: [data], ...longest, ...(count ? { limit: count } : {}) });
  const names = tasks.split(/[\s,]+/).filter(Boolean);
  if (names.length) suites.push({ type: "lm_eval", tasks: names, ...(count ? { limit: count } : {}) });
  return suites;
}

export class EvalPanel extends RunPanel {
  constructor(jobRoot, { jobs }) {
    // eval id -> { status, progress }, each followed while it runs
    super(jobRoot, "eval", (item, event) => {
      if (event.kind === "progress") item.progress = event.data;
      this.schedule();
    }, { after: [".export-panel", ".alerts"] });
    this.jobs = jobs;
  }

  build() {
    this.dataInput = el("input", { id: "eval-data", "data-testid": "eval-data", spellcheck: "false", placeholder: "/path/to/heldout.jsonl" });
    this.tasksInput = el("input", { id: "eval-tasks", "data-testid": "eval-tasks", spellcheck: "false", placeholder: "e.g. arc_easy hellaswag" });
    this.limitInput = el("input", { id: "eval-limit", "data-testid": "eval-limit", type: "number", min: "1", step: "1", inputmode: "numeric", placeholder: "all" });
    this.tokensInput = el("input", { id: "eval-max-tokens", "data-testid": "eval-max-tokens", type: "number", min: "1", step: "1", inputmode: "numeric", placeholder: "128" });
    this.startButton = el("button", { type: "submit", class: "btn btn-primary", "data-testid": "eval-start" }, "Evaluate against its base");
    this.errorBox = el("div", { class: "alert alert-error", role: "alert", "data-testid": "eval-start-error", hidden: true });
    this.form = el("form", { class: "eval-form", "data-testid": "eval-form", novalidate: true, onsubmit: (event) => {
      event.preventDefault();
      this.start();
    } },
    el("div", { class: "field eval-form-data" }, el("label", { for: "eval-data" }, "Held-out data file"), this.dataInput,
      el("small", { class: "hint" }, "A path on the server, in any shape and file type training reads.")),
    el("div", { class: "field" }, el("label", { for: "eval-tasks" }, "lm-eval tasks ", el("span", { class: "muted" }, "(optional)")), this.tasksInput),
    el("div", { class: "field eval-form-limit" }, el("label", { for: "eval-limit" }, "Limit ", el("span", { class: "muted" }, "(rows per suite)")), this.limitInput),
    el("div", { class: "field eval-form-limit" }, el("label", { for: "eval-max-tokens" }, "Longest answer ", el("span", { class: "muted" }, "(tokens)")), this.tokensInput),
    this.startButton);
    this.afterTraining = el("div", { class: "eval-after", "data-testid": "eval-after", hidden: true });
    this.list = el("ul", { class: "export-list", "data-testid": "eval-list", "aria-label": "Evaluations of this run, newest first" });
    return el("section", { class: "export-panel eval-panel", "data-testid": "eval-panel", "aria-labelledby": "eval-panel-title", hidden: true },
      el("h3", { id: "eval-panel-title" }, "Evaluations"),
      el("p", { class: "muted export-hint" }, "Did it get better? Score this run against the base model it was trained from."),
      this.afterTraining, this.form, this.errorBox, this.list);
  }

  /** Called by the job view on each render: the run's phase, its status, and its status as the job list has it. */
  render(phase, status, listed) {
    this.status = listed && listed.details && listed.details.eval ? listed : status;
    const servable = isServable(status);
    const shown = this.jobId != null && (servable || this.followed.size > 0 || Boolean(this.summary()));
    this.root.hidden = !shown;
    this.form.hidden = !servable;
    if (fmt.TERMINAL.has(phase)) this.loadOnce();
    this.schedule();
  }

  /** `details.eval` of the run's status: {eval_id, summary, guard}, or null. */
  summary() {
    const details = (this.status && this.status.details) || {};
    return details.eval || null;
  }

  listPath() {
    return "eval/jobs";
  }

  /** An evaluation that compares the run or its base. */
  belongs(jobId, status) {
    const mine = [jobId, `${BASE_MODEL_PREFIX}${jobId}`];
    return ((status.details || {}).models || []).some((model) => mine.includes(model));
  }

  track(status) {
    return this.followed.track(status.eval_id, status, () => ({ progress: null }));
  }

  async start() {
    if (this.busy || !this.jobId) return;
    const data = this.dataInput.value.trim();
    const limit = this.limitInput.value.trim();
    const maxTokens = this.tokensInput.value.trim();
    const suites = formSuites(data, this.tasksInput.value, limit, maxTokens);
    if (!suites.length) {
      this.error = { lines: ["Name a held-out data file, or lm-eval tasks, to evaluate on."], field: "data" };
      this.schedule();
      return;
    }
    for (const [value, field, words] of [[limit, "limit", "Limit: a whole number of rows, 1 or more (empty: all of them)."],
      [maxTokens, "max-tokens", "Longest answer: a whole number of tokens, 1 or more (empty: the suite's default)."]]) {
      if (value && !(Number.isInteger(Number(value)) && Number(value) >= 1)) {
        this.error = { lines: [words], field };
        this.schedule();
        return;
      }
    }
    const jobId = this.jobId;
    this.busy = true;
    this.error = null;
    this.schedule();
    try {
      const body = { models: [jobId, `${BASE_MODEL_PREFIX}${jobId}`], suites };
      const answer = await api("eval/start", { method: "POST", body });
      const status = await api(`eval/status/${encodeURIComponent(answer.eval_id)}`);
      if (jobId === this.jobId) this.track(status);
      location.hash = evalHash(answer.eval_id);
    } catch (error) {
      const lines = error instanceof ApiError ? error.lines : [String(error.message || error)];
      const field = error instanceof ApiError && error.body && typeof error.body.field === "string" ? error.body.field : "";
      const named = { data: /\.data\[/, tasks: /\.tasks/, limit: /\.limit$/, "max-tokens": /\.max_new_tokens$/ };
      this.error = { lines, field: Object.keys(named).find((name) => named[name].test(field)) || "" };
    } finally {
      this.busy = false;
      this.schedule();
    }
  }

  draw() {
    if (this.root.hidden) return;
    this.startButton.disabled = this.busy;
    this.startButton.textContent = this.busy ? "Starting…" : "Evaluate against its base";
    this.errorBox.hidden = !this.error;
    if (this.error) this.errorBox.replaceChildren(el("strong", "The evaluation was not started"), ...this.error.lines.map((line) => el("div", line)));
    for (const [name, input] of [["data", this.dataInput], ["tasks", this.tasksInput], ["limit", this.limitInput], ["max-tokens", this.tokensInput]]) {
      if (this.error && this.error.field === name) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
    // Redrawn only when what they show changed: a link under the pointer stays put.
    const items = this.followed.newestFirst();
    const key = JSON.stringify([this.summary(), items.map(([id, item]) => [id, item.status, item.progress])]);
    if (key === this.drawnKey) return;
    this.drawnKey = key;
    this.drawAfterTraining();
    this.list.replaceChildren(...items.map(([id, item]) => this.drawItem(id, item)));
  }

  drawItem(evalId, item) {
    const status = item.status;
    const phase = status.phase;
    const running = !fmt.TERMINAL.has(phase);
    const percent = running && item.progress ? ` · ${fmt.percent(item.progress.progress_percent)}` : "";
    return el("li", { class: "export-item", "data-testid": "eval-item", "data-eval-id": evalId, "data-phase": phase },
      el("div", { class: "export-head" },
        el("span", { class: "badge", "data-phase": phase, "data-testid": "eval-item-phase" }, evalPhaseLabel(phase)),
        el("a", { class: "export-what", href: evalHash(evalId), "data-testid": "eval-item-link" }, evalSummary(status, this.jobs)),
        el("code", { class: "job-id" }, evalId),
        el("span", { class: "muted" }, `${phase === "error" ? status.error || status.message : status.message}${percent}`)));
  }

  drawAfterTraining() {
    const joined = this.summary();
    this.afterTraining.hidden = !joined;
    if (!joined) return;
    const summary = joined.summary;
    const guard = joined.guard;
    const parts = [el("div", { class: "export-head" },
      el("strong", "After training"),
      summary ? el("span", { class: "badge", "data-phase": summary.phase, "data-testid": "eval-after-phase" }, evalPhaseLabel(summary.phase)) : null,
      el("a", { href: evalHash(joined.eval_id), "data-testid": "eval-after-link" }, `Open evaluation ${joined.eval_id}`))];
    if (!summary) parts.push(el("p", { class: "muted" }, "The evaluation is no longer on this server."));
    else if (summary.phase === "error") parts.push(el("p", { class: "muted" }, summary.error || summary.message));
    if (summary && Array.isArray(summary.metrics) && summary.metrics.length) {
      const models = summary.models || [];
      const rows = summary.metrics.map((metric) => el("li", { "data-testid": "eval-after-metric", "data-metric": metric.name },
        el("span", { class: "eval-metric-name" }, metric.name), " ",
        models.map((model, index) => {
          const value = (metric.values || {})[model];
          const delta = index > 0 ? (metric.deltas || {})[model] : null;
          const difference = delta != null ? ` (Δ ${delta >= 0 ? "+" : "−"}${fmt.metric(Math.abs(delta), 3)})` : "";
          return el("span", { class: "muted" }, `${index ? " · " : ""}${modelName(this.jobs, model)} ${fmt.metric(value, 3)}${difference}`);
        })));
      parts.push(el("ul", { class: "eval-after-metrics" }, rows));
    }
    if (guard) {
      const state = guard.state;
      const words = {
        passed: `eval_guard passed: on ${guard.metric} the fine-tuned model is not behind its base by more than ${guard.max_drop}.`,
        pending: `eval_guard (${guard.metric}, at most ${guard.max_drop} behind): waiting for the evaluation.`,
        unavailable: `eval_guard could not be checked: ${guard.reason || "no result"}.`,
      };
      parts.push(state === "failed"
        ? el("div", { class: "alert alert-warn", role: "alert", "data-testid": "eval-guard", "data-state": state }, el("strong", "Fell behind its base"), el("div", guard.warning))
        : el("p", { class: "muted", "data-testid": "eval-guard", "data-state": state }, words[state] || state));
    }
    this.afterTraining.replaceChildren(...parts);
  }
}
