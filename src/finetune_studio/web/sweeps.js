// Sweeps (docs/API.md, Sweeps): the list of the server's sweeps (GET /sweeps, read again
// as the list of runs is), and one sweep's view (#sweep=<id>): its status, every trial's
// loss curve overlaid (each trial is a training job: its JobFeed, from this browser's
// history then its stream, as the job view draws a run), the objective against each
// parameter (sweepcharts.js), the best trial marked, and per trial: its run, "Run again
// with these" (the form filled with the trial's request, as a run's Run again does), its
// chat and its export (the run's own, in its view). The sweep itself is followed live
// from /sweeps/{id}/stream (sse.js); its answer (GET /sweeps/{id}: best, importances,
// counts) is read again when a trial ends. Every text from the server is put in as text.

import { api, ApiError } from "./api.js";
import { alignOnSteps, MetricChart } from "./charts.js";
import { el } from "./dom.js";
import { JobFeed } from "./feed.js";
import * as fmt from "./format.js";
import { isServable } from "./jobs.js";
import { chatHash, goTo, routeHash, sweepHash } from "./route.js";
import { renderScheduler } from "./schedule.js";
import { JobStream } from "./sse.js";
import { renderStreamState } from "./streamstate.js";
import { ParamChart } from "./sweepcharts.js";

const SWEEP_ENDED = new Set(["completed", "stopped", "error"]);
// The badge colours of the runs' phases (styles.css), for a sweep's statuses and its trials' states.
const SWEEP_BADGE = { queued: "idle", running: "training", completed: "completed", stopped: "stopped", error: "error" };
const TRIAL_BADGE = { queued: "idle", running: "training", complete: "completed", pruned: "stopped", failed: "error" };
const STATE_LABELS = { queued: "Queued", running: "Running", complete: "Complete", pruned: "Pruned", failed: "Failed" };
// Trial events after which the sweep's answer has changed (its best, counts, importances).
const SETTLING = new Set(["finished", "pruned", "failed", "requeued"]);
const LIST_EVERY_MS = 5000;
const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626", "#4b5563", "#c026d3"];

const SWEEP_LABELS = { queued: "Queued", running: "Running", completed: "Completed", stopped: "Stopped", error: "Failed" };

function sweepLabel(status) {
  return SWEEP_LABELS[status] || status;
}

function badge(kind, state, label, testid) {
  return el("span", { class: "badge", "data-phase": kind[state] || "", "data-testid": testid }, label);
}

function shownValue(value) {
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : fmt.metric(value);
  return String(value);
}

/** What a sweep is, in a line: "eval_loss (minimize) · 2 of 3 trials · best 1.2345". */
function summary(sweep) {
  const parts = [`${sweep.objective.metric} (${sweep.objective.direction})`,
    `${sweep.counted} of ${sweep.trials_planned} trials`];
  if (sweep.failed) parts.push(`${sweep.failed} failed`);
  if (sweep.best) parts.push(`best ${fmt.metric(sweep.best.value)} (trial ${sweep.best.number})`);
  return parts.join(" · ");
}

/** The list of sweeps (#sweeps-card): hidden while the server has none. */
export class SweepList {
  constructor(root) {
    this.root = root;
    this.sweeps = [];
    this.selected = null;
    this.readAt = 0;
    this.inFlight = null;
    this.list = el("ul", { class: "sweep-list", "data-testid": "sweep-list", "aria-label": "Sweeps, newest first" });
    root.replaceChildren(
      el("div", { class: "card-head" }, el("h2", { class: "card-title", id: "sweeps-title" }, "Sweeps")),
      this.list,
    );
  }

  /** Read the list again, at most every LIST_EVERY_MS unless `now`. */
  refresh(now = false) {
    if (this.inFlight || (!now && Date.now() - this.readAt < LIST_EVERY_MS)) return this.inFlight;
    this.readAt = Date.now();
    this.inFlight = api("sweeps")
      .then((answer) => {
        this.sweeps = answer.sweeps;
        this.render();
      })
      .catch(() => {}) // the runs' list says when the server is down or wants a token
      .finally(() => {
        this.inFlight = null;
      });
    return this.inFlight;
  }

  select(sweepId) {
    this.selected = sweepId;
    this.render();
  }

  render() {
    this.root.hidden = this.sweeps.length === 0;
    this.list.replaceChildren(...this.sweeps.map((sweep) =>
      el("li", { "data-sweep-id": sweep.sweep_id },
        el("a", { class: "job-item sweep-item", "data-testid": "sweep-item", href: sweepHash(sweep.sweep_id),
          "aria-current": sweep.sweep_id === this.selected ? "page" : false },
        badge(SWEEP_BADGE, sweep.status, sweepLabel(sweep.status)),
        el("span", { class: "job-name" }, sweep.label || `Sweep ${sweep.sweep_id}`),
        el("span", { class: "job-msg" }, summary(sweep))))));
  }
}

/** One sweep's view (#sweep-view). */
export class SweepView {
  /** `jobs` (a JobsIndex: the trials' statuses and names), `writer` (the HistoryWriter the trials' feeds store into). */
  constructor(root, { jobs, writer, onChange = () => {} }) {
    this.root = root;
    this.jobs = jobs;
    this.writer = writer;
    this.onChange = onChange; // the sweep's answer was read again (the list shows it too)
    this.form = null; // the StartForm, attached by the app once it exists
    this.sweepId = null;
    this.sweep = null; // the latest GET /sweeps/{id}
    this.trials = new Map(); // number -> trial, from the answer and the stream's trial events
    this.feeds = new Map(); // job id -> JobFeed of a trial
    this.stream = null;
    this.connection = { state: "idle" };
    this.eventCount = 0;
    this.historyCount = 0; // streamstate.js reads these as it reads a JobFeed's
    this.historyLoaded = true;
    this.problem = null;
    this.note = "";
    this.reading = null;
    this.again = false;
    this.params = new Map(); // parameter -> ParamChart
    this.series = []; // the loss chart's series, one per trial with a feed
    this.schedule = renderScheduler(() => this.render());
    this.build();
  }

  build() {
    this.title = el("h2", { class: "job-title", "data-testid": "sweep-title" }, "Sweep");
    this.badge = el("span", { class: "badge", "data-testid": "sweep-status" });
    this.idText = el("code", { class: "job-id", "data-testid": "sweep-id" });
    this.message = el("span", { class: "job-message", "data-testid": "sweep-message" });
    this.stopButton = el("button", { type: "button", class: "btn btn-danger", "data-testid": "sweep-stop", hidden: true,
      onclick: () => this.stop() }, "Stop");
    this.summary = el("p", { class: "sweep-summary", "data-testid": "sweep-summary" });
    this.errorBox = el("div", { class: "alert alert-error", role: "alert", "data-testid": "sweep-error", hidden: true });
    this.noteBox = el("p", { class: "run-tools-note", role: "status", "aria-live": "polite", "data-testid": "sweep-note" });
    this.lossBox = el("div", { class: "chart-box" });
    this.paramBox = el("div", { class: "sweep-params", "data-testid": "sweep-params" });
    this.table = el("table", { class: "sweep-trials", "data-testid": "sweep-trials" });
    this.footer = el("footer", { class: "stream-state", "data-testid": "sweep-stream-state", "data-state": "idle" });
    this.root.replaceChildren(
      el("header", { class: "job-head" },
        el("div", { class: "job-head-text" }, this.title,
          el("div", { class: "job-sub" }, this.badge, this.idText, this.message)),
        el("div", { class: "job-actions" }, this.stopButton)),
      this.summary, this.errorBox, this.noteBox,
      el("div", { class: "charts" },
        el("figure", { class: "chart chart-wide", "data-testid": "sweep-chart-loss" },
          el("figcaption", "Loss of every trial"), this.lossBox)),
      this.paramBox,
      el("div", { class: "sweep-table-wrap" }, this.table),
      this.footer);
    this.loss = null;
  }

  /** Show sweep `sweepId`: its answer, then its stream and its trials' feeds. */
  show(sweepId) {
    this.root.hidden = false;
    if (!this.loss) this.loss = new MetricChart(this.lossBox, { height: 230, emptyText: "Waiting for the first trial's steps…" });
    if (sweepId === this.sweepId) {
      this.schedule();
      return;
    }
    this.close();
    this.sweepId = sweepId;
    this.sweep = null;
    this.problem = null;
    this.note = "";
    this.eventCount = 0;
    this.connection = { state: "idle" };
    for (const chart of this.params.values()) chart.destroy();
    this.params.clear();
    this.paramBox.replaceChildren();
    this.read();
    this.schedule();
  }

  hide() {
    this.close();
    this.sweepId = null;
    this.root.hidden = true;
  }

  close() {
    if (this.stream) this.stream.close();
    this.stream = null;
    for (const feed of this.feeds.values()) feed.close();
    this.feeds.clear();
    this.trials.clear();
  }

  /** GET /sweeps/{id}, one at a time (asked again while one is out: once more after it); then its stream. */
  async read() {
    if (this.reading) {
      this.again = true;
      return this.reading;
    }
    this.reading = this.readOnce(this.sweepId).finally(() => {
      this.reading = null;
    });
    await this.reading;
    if (this.again) {
      this.again = false;
      await this.read();
    }
  }

  async readOnce(sweepId) {
    try {
      const answer = await api(`sweeps/${encodeURIComponent(sweepId)}`);
      if (sweepId !== this.sweepId) return;
      this.sweep = answer;
      this.problem = null;
      for (const trial of answer.trials) this.trials.set(trial.number, trial);
      this.onChange(answer);
      this.follow(sweepId);
    } catch (error) {
      if (sweepId !== this.sweepId) return;
      this.problem = error instanceof ApiError && error.status === 404
        ? `The server knows no sweep ${sweepId}`
        : `Could not read the sweep: ${error instanceof ApiError ? error.lines.join(" ") : String(error.message || error)}`;
    }
    this.schedule();
  }

  /** Follow the sweep's stream from its first event: each trial event updates its trial. */
  follow(sweepId) {
    if (sweepId !== this.sweepId || this.stream || !this.sweep) return;
    this.stream = new JobStream(sweepId, {
      path: `sweeps/${encodeURIComponent(sweepId)}/stream`,
      kinds: new Set(["status", "trial"]),
      ends: (kind, data) => kind === "status" && SWEEP_ENDED.has(data.status),
      onEvent: (event) => {
        this.eventCount += 1;
        if (event.kind === "trial") {
          const { sweep_id: _, event: what, report: __, ...trial } = event.data;
          this.trials.set(trial.number, { ...this.trials.get(trial.number), ...trial });
          if (SETTLING.has(what)) this.read();
        } else {
          this.sweep = this.sweep && { ...this.sweep, status: event.data.status, message: event.data.message, error: event.data.error };
          if (SWEEP_ENDED.has(event.data.status)) this.read();
        }
        this.schedule();
      },
      onState: (state) => {
        this.connection = state;
        this.schedule();
      },
    }).start();
  }

  /** The trials in number order, each with its feed opened once it has a job that left the queue. */
  trialList() {
    const trials = [...this.trials.values()].sort((a, b) => a.number - b.number);
    for (const trial of trials) {
      if (!trial.job_id || trial.state === "queued" || this.feeds.has(trial.job_id)) continue;
      const feed = new JobFeed(trial.job_id, {
        writer: this.writer,
        onChange: (changed, what) => {
          if (what === "status" || what === "history") this.jobs.remember(changed.jobId, changed.firstStatus);
          this.schedule();
        },
      });
      this.feeds.set(trial.job_id, feed);
      feed.open().catch((error) => console.error("could not open a trial's feed", error));
    }
    return trials;
  }

  async stop() {
    if (!this.sweepId || this.stopButton.getAttribute("aria-disabled") === "true") return;
    this.stopButton.setAttribute("aria-disabled", "true");
    try {
      this.sweep = await api(`sweeps/${encodeURIComponent(this.sweepId)}/stop`, { method: "POST" });
      this.say("Stopping: no more trials; the running ones stop after their step and save what they trained.");
    } catch (error) {
      this.say(`Could not stop the sweep: ${error instanceof ApiError ? error.lines.join(" ") : String(error.message || error)}`, true);
      this.stopButton.removeAttribute("aria-disabled");
    }
    this.schedule();
  }

  say(text, isError = false) {
    this.note = text;
    this.noteBox.dataset.error = String(isError);
  }

  /** "Run again with these": the form filled with the trial's request (its values among them). */
  async runAgain(trial) {
    if (!this.form) return;
    try {
      const { request, withheld_secrets: secrets } = await api(`train/jobs/${encodeURIComponent(trial.job_id)}`);
      const note = `The settings of trial ${trial.number} of sweep ${this.sweepId} (run ${trial.job_id}): change what you like and start.`;
      this.form.fillFrom(request, { note, secrets });
      this.say(`The form holds trial ${trial.number}'s settings.`);
    } catch (error) {
      this.say(`Could not read trial ${trial.number}'s settings: ${error instanceof ApiError ? error.lines.join(" ") : String(error.message || error)}`, true);
    }
    this.schedule();
  }

  /** Export: the trial's own run view, brought to its export panel once the panel is shown. */
  exportTrial(trial) {
    goTo(trial.job_id);
    let frames = 0;
    const reach = () => {
      const panel = document.querySelector("#job-view [data-testid=export-panel]");
      if (panel && !panel.hidden) {
        panel.scrollIntoView({ block: "start" });
        const format = panel.querySelector("[data-testid=export-format]");
        if (format) format.focus({ preventScroll: true });
      } else if (frames++ < 300) {
        requestAnimationFrame(reach);
      }
    };
    requestAnimationFrame(reach);
  }

  statusOf(jobId) {
    const feed = this.feeds.get(jobId);
    return (feed && feed.status) || this.jobs.statusOf(jobId);
  }

  render() {
    if (!this.sweepId) return;
    const sweep = this.sweep;
    const trials = this.trialList();
    const best = sweep && sweep.best ? sweep.best.number : null;
    this.title.textContent = (sweep && sweep.label) || `Sweep ${this.sweepId}`;
    this.idText.textContent = this.sweepId;
    const status = sweep ? sweep.status : "";
    this.badge.dataset.phase = SWEEP_BADGE[status] || "";
    this.badge.textContent = status ? sweepLabel(status) : "…";
    this.root.dataset.status = status;
    const message = this.problem || (sweep ? sweep.message : "");
    if (this.message.textContent !== message) this.message.textContent = message;
    this.summary.textContent = sweep ? summary(sweep) : "";
    this.errorBox.hidden = !(sweep && sweep.error);
    this.errorBox.textContent = (sweep && sweep.error) || "";
    this.noteBox.textContent = this.note;
    const ended = !sweep || SWEEP_ENDED.has(status);
    this.stopButton.hidden = ended;
    if (ended) this.stopButton.removeAttribute("aria-disabled");

    this.renderLoss(trials, best);
    this.renderParams(trials, best);
    this.renderTable(trials, best);
    renderStreamState(this.footer, this);
  }

  renderLoss(trials, best) {
    const shown = trials.filter((trial) => this.feeds.has(trial.job_id));
    const feeds = shown.map((trial) => this.feeds.get(trial.job_id));
    if (!feeds.length) {
      this.loss.update([], []);
      this.series = [];
      return;
    }
    const { x, columns } = alignOnSteps(feeds);
    this.series = shown.map((trial, i) => ({
      key: `trial-${trial.number}`,
      label: `trial ${trial.number}${trial.number === best ? " · best" : ""}`,
      stroke: COLORS[trial.number % COLORS.length],
      dash: trial.number === best || best == null ? undefined : [4, 3],
      values: columns[i].map((p) => (p && p.loss != null ? p.loss : null)),
    }));
    this.loss.update(x, this.series);
  }

  renderParams(trials, best) {
    const names = [];
    for (const trial of trials) for (const name of Object.keys(trial.params || {})) if (!names.includes(name)) names.push(name);
    const importances = (this.sweep && this.sweep.importances) || {};
    for (const name of names) {
      let chart = this.params.get(name);
      if (!chart) {
        const box = el("div", { class: "chart-box" });
        const caption = el("figcaption");
        this.paramBox.append(el("figure", { class: "chart", "data-testid": "sweep-param-chart", "data-param": name }, caption, box));
        chart = new ParamChart(box, name);
        chart.caption = caption;
        this.params.set(name, chart);
      }
      const importance = importances[name];
      const metric = this.sweep ? this.sweep.objective.metric : "objective";
      chart.caption.textContent = `${metric} against ${name}${importance != null ? ` · importance ${importance.toFixed(2)}` : ""}`;
      const points = trials
        .filter((trial) => trial.value != null && trial.params && name in trial.params)
        .map((trial) => ({ x: trial.params[name], y: trial.value, number: trial.number }));
      chart.update(points, best);
    }
  }

  renderTable(trials, best) {
    const names = [];
    for (const trial of trials) for (const name of Object.keys(trial.params || {})) if (!names.includes(name)) names.push(name);
    const metric = this.sweep ? this.sweep.objective.metric : "objective";
    const key = JSON.stringify([names, metric, best, trials, trials.map((t) => [Boolean(this.feeds.get(t.job_id)?.finished),
      Boolean(t.job_id && isServable(this.statusOf(t.job_id)))])]);
    if (this.table.dataset.key === key) return; // unchanged: the focus stays on a button a person pressed
    this.table.dataset.key = key;
    const head = el("tr", el("th", { scope: "col" }, "Trial"), el("th", { scope: "col" }, "State"),
      names.map((name) => el("th", { scope: "col" }, name)), el("th", { scope: "col" }, metric),
      el("th", { scope: "col" }, "Steps"), el("th", { scope: "col" }, el("span", { class: "visually-hidden" }, "Actions")));
    const rows = trials.map((trial) => {
      const isBest = trial.number === best;
      const servable = trial.job_id && isServable(this.statusOf(trial.job_id));
      const feed = this.feeds.get(trial.job_id);
      const steps = trial.steps != null ? trial.steps : feed && feed.finished && feed.latest ? feed.latest.step : null;
      const actions = trial.job_id ? [
        el("a", { class: "btn btn-small", href: routeHash(trial.job_id), "data-testid": "trial-open" }, "Run"),
        el("button", { type: "button", class: "btn btn-small", "data-testid": "trial-run-again",
          onclick: () => this.runAgain(trial) }, "Run again with these"),
        servable && el("a", { class: "btn btn-small", href: chatHash(trial.job_id), "data-testid": "trial-chat" }, "Chat"),
        servable && el("button", { type: "button", class: "btn btn-small", "data-testid": "trial-export",
          onclick: () => this.exportTrial(trial) }, "Export"),
      ] : [];
      return el("tr", { "data-testid": "sweep-trial", "data-number": trial.number, "data-job-id": trial.job_id || false,
        "data-state": trial.state, "data-best": isBest ? "true" : false, class: isBest ? "best" : false },
      el("th", { scope: "row" }, String(trial.number), isBest && el("span", { class: "best-mark", "data-testid": "best-mark" }, "best"),
        trial.requeued && el("span", { class: "muted", title: "Interrupted by a server restart: its values were queued again" }, " (requeued)")),
      el("td", badge(TRIAL_BADGE, trial.state, STATE_LABELS[trial.state] || trial.state)),
      names.map((name) => el("td", { "data-param": name }, name in (trial.params || {}) ? shownValue(trial.params[name]) : "–")),
      el("td", { "data-testid": "trial-value" }, trial.value != null ? fmt.metric(trial.value) : "–"),
      el("td", steps != null ? fmt.integer(steps) : "–"),
      el("td", { class: "trial-actions" }, actions));
    });
    this.table.replaceChildren(el("thead", head), el("tbody", rows));
  }

  /** For window.__studio.sweep(): what the view draws. */
  snapshot() {
    const best = this.sweep && this.sweep.best ? this.sweep.best.number : null;
    return {
      sweepId: this.sweepId,
      status: this.sweep ? this.sweep.status : null,
      best,
      connection: this.connection.state,
      series: (this.series || []).map((s, i) => ({ label: s.label, points: this.loss ? this.loss.points(i) : 0 })),
      params: Object.fromEntries([...this.params].map(([name, chart]) => [name, chart.points()])),
      trials: [...this.trials.values()].map((t) => ({ number: t.number, job_id: t.job_id, state: t.state, value: t.value })),
    };
  }
}
