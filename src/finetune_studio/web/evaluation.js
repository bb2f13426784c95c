// The evaluation view (#eval=<id>; docs/API.md, Evaluation): what is evaluated, a live
// progress line while it runs (its event stream, followed as export.js follows an export),
// then the results table (evaltable.js) and the per-sample view (evalrows.js). A select
// lists every evaluation on the server (GET /eval/jobs), and "← Run" leads back to the run
// it evaluates. Every text from the server is put in the page as text.

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";
import { EvalRows } from "./evalrows.js";
import { jobOfModel, modelName, resultsTable } from "./evaltable.js";
import * as fmt from "./format.js";
import { evalHash, routeHash } from "./route.js";
import { renderScheduler } from "./schedule.js";
import { JobStream } from "./sse.js";

// An evaluation's own running phases (schemas.EvalPhase); the others read as a run's do.
const EVAL_PHASE_LABELS = { evaluating: "Evaluating", judging: "Judging" };

export function evalPhaseLabel(phase) {
  return EVAL_PHASE_LABELS[phase] ?? fmt.phaseLabel(phase);
}

/** What an evaluation is, in a line: its label or suites, then its models. */
export function evalSummary(status, jobs) {
  const details = (status && status.details) || {};
  const models = (details.models || []).map((model) => modelName(jobs, model)).join(" vs ");
  const what = details.label || (details.suites || []).join(", ") || "evaluation";
  return models ? `${what}: ${models}` : what;
}

/** The progress line of an EvalProgress: "Samples 12 / 40 · 30.0% · heldout · base of run · ETA 0:12". */
export function progressLine(progress, jobs) {
  const parts = [`Samples ${fmt.integer(progress.step)} / ${fmt.integer(progress.total_steps)}`, fmt.percent(progress.progress_percent)];
  if (progress.suite) parts.push(progress.suite);
  if (progress.model) parts.push(modelName(jobs, progress.model));
  if (progress.eta_seconds != null) parts.push(`ETA ${fmt.duration(progress.eta_seconds)}`);
  return parts.join(" · ");
}

export class EvalView {
  constructor(root, { jobs }) {
    this.root = root;
    this.jobs = jobs;
    this.evalId = null;
    this.stream = null;
    this.list = [];
    this.forget();
    this.schedule = renderScheduler(() => this.render());
    this.rows = new EvalRows({ jobs, schedule: this.schedule });
    this.build();
  }

  build() {
    this.back = el("a", { class: "back-link", "data-testid": "eval-back", hidden: true }, "← Run");
    this.title = el("h2", { class: "job-title", "data-testid": "eval-title" }, "Evaluation");
    this.badge = el("span", { class: "badge", "data-testid": "eval-phase" });
    this.idText = el("code", { class: "job-id", "data-testid": "eval-id" });
    this.message = el("span", { class: "job-message", "data-testid": "eval-message" });
    this.select = el("select", { "data-testid": "eval-select", "aria-label": "Evaluations", onchange: () => {
      if (this.select.value) location.hash = evalHash(this.select.value);
    } });
    this.stopButton = el("button", { type: "button", class: "btn btn-danger", "data-testid": "eval-stop", hidden: true, onclick: () => this.stop() }, "Stop");
    this.progressBar = el("progress", { max: "100", value: "0", "aria-label": "Evaluation progress", "data-testid": "eval-progress-bar" });
    this.progressText = el("span", { class: "muted", "data-testid": "eval-progress" });
    this.progressBox = el("div", { class: "eval-progress", hidden: true }, this.progressBar, this.progressText);
    this.errorBox = el("div", { class: "alert alert-error", role: "alert", "data-testid": "eval-error", hidden: true });
    this.warnings = el("div", { class: "alert alert-warn", "data-testid": "eval-warnings", hidden: true });
    this.tableBox = el("div", { class: "eval-results", "data-testid": "eval-results" });
    this.root.replaceChildren(
      el("header", { class: "job-head" },
        el("div", { class: "job-head-text" }, this.title,
          el("div", { class: "job-sub" }, this.back, this.badge, this.idText, this.message)),
        el("div", { class: "job-actions" }, el("label", { class: "compare" }, el("span", "Evaluations"), this.select), this.stopButton)),
      this.progressBox, this.errorBox, this.warnings, this.tableBox, this.rows.root);
  }

  /** Show evaluation `evalId`: its status, then its stream while it runs, then its results. */
  show(evalId) {
    this.root.hidden = false;
    this.loadList();
    if (evalId === this.evalId) return;
    this.close();
    this.evalId = evalId;
    this.forget();
    this.tableBox.replaceChildren();
    this.rows.hide();
    this.load(evalId);
    this.schedule();
  }

  /** What was known of the evaluation shown before. */
  forget() {
    this.status = null;
    this.progress = null;
    this.results = null;
    this.problem = null; // a text: the evaluation or its results could not be read
    this.stopping = false;
  }

  hide() {
    this.close();
    this.evalId = null;
    this.root.hidden = true;
  }

  close() {
    if (this.stream) this.stream.close();
    this.stream = null;
  }

  async loadList() {
    try {
      const answer = await api("eval/jobs");
      this.list = answer.data;
      this.schedule();
    } catch {
      // the select keeps what it had; the view itself says what went wrong
    }
  }

  async load(evalId) {
    let status;
    try {
      status = await api(`eval/status/${encodeURIComponent(evalId)}`);
    } catch (error) {
      if (evalId !== this.evalId) return;
      this.problem = error instanceof ApiError && error.status === 404
        ? `There is no evaluation ${evalId} on this server.`
        : `The evaluation could not be read: ${error instanceof ApiError ? error.lines.join(" ") : error.message || error}`;
      this.schedule();
      return;
    }
    if (evalId !== this.evalId) return;
    this.status = status;
    if (fmt.TERMINAL.has(status.phase)) this.finished();
    else {
      this.stream = new JobStream(evalId, { prefix: "eval", onEvent: (event) => this.onEvent(evalId, event) }).start();
    }
    this.schedule();
  }

  onEvent(evalId, event) {
    if (evalId !== this.evalId) return;
    if (event.kind === "status") {
      this.status = event.data;
      if (fmt.TERMINAL.has(event.data.phase)) {
        this.stream = null;
        this.finished();
        this.loadList();
      }
    } else if (event.kind === "progress") {
      this.progress = event.data;
    }
    this.schedule();
  }

  /** The evaluation has ended: a completed one's results are read. */
  async finished() {
    const evalId = this.evalId;
    if (!this.status || this.status.phase !== "completed") return;
    try {
      const results = await api(`eval/results/${encodeURIComponent(evalId)}`);
      if (evalId !== this.evalId) return;
      this.results = results;
      this.tableBox.replaceChildren(resultsTable(results, this.jobs));
      this.rows.show(evalId, results);
    } catch (error) {
      if (evalId !== this.evalId) return;
      this.problem = `The results could not be read: ${error instanceof ApiError ? error.lines.join(" ") : error.message || error}`;
    }
    this.schedule();
  }

  async stop() {
    if (!this.evalId || this.stopping) return;
    this.stopping = true;
    this.schedule();
    try {
      await api(`eval/stop/${encodeURIComponent(this.evalId)}`, { method: "POST" });
    } catch (error) {
      this.stopping = false;
      this.problem = `Could not stop the evaluation: ${error instanceof ApiError ? error.lines.join(" ") : error.message || error}`;
    }
    this.schedule();
  }

  /** The names of runs came (the job list): the table names its models by them. */
  namesChanged() {
    if (this.results && !this.root.hidden) this.tableBox.replaceChildren(resultsTable(this.results, this.jobs));
    this.schedule();
  }

  render() {
    if (this.root.hidden || !this.evalId) return;
    const status = this.status;
    const phase = status ? status.phase : "";
    const details = (status && status.details) || {};
    this.root.dataset.phase = phase;
    this.title.textContent = status ? evalSummary(status, this.jobs) : "Evaluation";
    this.idText.textContent = this.evalId;
    this.badge.dataset.phase = phase;
    this.badge.textContent = phase ? evalPhaseLabel(phase) : "…";
    let message = status ? status.message : "";
    if (phase === "idle" && details.queue_position) message = `Waiting in the queue: position ${details.queue_position}`;
    this.message.textContent = message;
    this.message.title = message;
    document.title = `${evalPhaseLabel(phase || "idle").toLowerCase()} evaluation ${this.evalId} · finetune-studio`;

    const jobId = (details.models || []).map((model) => jobOfModel(this.jobs, model)).find(Boolean);
    this.back.hidden = !jobId;
    if (jobId) this.back.href = routeHash(jobId);

    const running = Boolean(phase) && !fmt.TERMINAL.has(phase);
    this.stopButton.hidden = !running;
    this.stopButton.disabled = this.stopping;
    this.stopButton.textContent = this.stopping ? "Stopping…" : "Stop";
    this.progressBox.hidden = !running;
    if (running) {
      const percent = this.progress ? Math.max(0, Math.min(100, this.progress.progress_percent)) : 0;
      this.progressBar.value = percent;
      this.progressText.textContent = this.progress ? progressLine(this.progress, this.jobs) : evalPhaseLabel(phase);
    }

    const failure = phase === "error" ? [el("strong", fmt.errorHeadline(details.error_code)), el("p", status.error || status.message)] : null;
    const problem = this.problem ? [el("p", this.problem)] : null;
    this.errorBox.hidden = !failure && !problem;
    if (failure || problem) this.errorBox.replaceChildren(...(failure || []), ...(problem || []));

    const warnings = (this.results && this.results.warnings) || [];
    this.warnings.hidden = !warnings.length;
    if (warnings.length) this.warnings.replaceChildren(el("strong", warnings.length === 1 ? "1 warning" : `${warnings.length} warnings`), el("ul", warnings.map((w) => el("li", w))));

    this.renderSelect();
    this.rows.render();
  }

  renderSelect() {
    const options = this.list.map((item) => [item.eval_id, `${evalSummary(item, this.jobs)} · ${item.eval_id.slice(0, 6)} (${evalPhaseLabel(item.phase).toLowerCase()})`]);
    if (!options.some(([id]) => id === this.evalId)) options.unshift([this.evalId, this.evalId]);
    const key = JSON.stringify(options);
    if (this.select.dataset.key !== key) {
      this.select.dataset.key = key;
      this.select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
    }
    if (this.select.value !== this.evalId) this.select.value = this.evalId;
  }
}
