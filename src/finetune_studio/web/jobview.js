// The job view: phase timeline, progress and ETA, metric charts (with an optional
// second run overlaid), warnings and errors in words, and the Stop button.

import { api, ApiError } from "./api.js";
import { alignOnSteps, MetricChart } from "./charts.js";
import { JobFeed } from "./feed.js";
import * as fmt from "./format.js";

const COLORS = {
  loss: "#2563eb",
  eval: "#d97706",
  lr: "#059669",
  grad: "#db2777",
  compare: "#7c3aed",
  compareEval: "#a78bfa",
};
const DASH = [6, 4];

function $(root, selector) {
  return root.querySelector(selector);
}

export class JobView {
  constructor(root, { writer, jobs }) {
    this.root = root;
    this.writer = writer;
    this.jobs = jobs; // the JobsIndex: latest statuses from /train/jobs, names
    this.feed = null;
    this.compare = null;
    this.pending = false;
    this.stopping = false;
    this.stopError = null;
    this.charts = null;
    this.stopButton = $(root, "#stop-button");
    this.compareSelect = $(root, "#compare-select");
    this.stopButton.addEventListener("click", () => this.stop());
    this.compareSelect.addEventListener("change", () => {
      const params = new URLSearchParams({ job: this.feed.jobId });
      if (this.compareSelect.value) params.set("compare", this.compareSelect.value);
      location.hash = params.toString();
    });
    this.timeline = $(root, "#timeline");
    this.buildTimeline();
  }

  get jobId() {
    return this.feed ? this.feed.jobId : null;
  }

  ensureCharts() {
    if (this.charts) return;
    this.charts = {
      loss: new MetricChart($(this.root, "#chart-loss"), { height: 230 }),
      lr: new MetricChart($(this.root, "#chart-lr"), { height: 170, kind: "exp", showStep: false }),
      grad: new MetricChart($(this.root, "#chart-grad"), { height: 170, showStep: false }),
    };
  }

  /** Show a job (and optionally overlay another); reuses feeds that are already open. */
  show(jobId, compareId) {
    this.root.hidden = false;
    this.ensureCharts();
    if (!this.feed || this.feed.jobId !== jobId) {
      if (this.feed) this.feed.close();
      this.stopping = false;
      this.stopError = null;
      this.feed = this.openFeed(jobId);
    }
    const wanted = compareId && compareId !== jobId ? compareId : null;
    if ((this.compare ? this.compare.jobId : null) !== wanted) {
      if (this.compare) this.compare.close();
      this.compare = wanted ? this.openFeed(wanted) : null;
    }
    this.schedule();
  }

  hide() {
    document.title = "finetune-studio";
    if (this.feed) this.feed.close();
    if (this.compare) this.compare.close();
    this.feed = null;
    this.compare = null;
    this.root.hidden = true;
  }

  openFeed(jobId) {
    const feed = new JobFeed(jobId, {
      writer: this.writer,
      onChange: (changed, what) => {
        if (changed !== this.feed && changed !== this.compare) return;
        if (what === "status") {
          this.jobs.remember(changed.jobId, changed.firstStatus);
          this.jobs.refreshSoon();
        }
        if (what === "history") this.jobs.remember(changed.jobId, changed.firstStatus);
        this.schedule();
      },
    });
    feed.open().catch((error) => console.error("could not open the job feed", error));
    return feed;
  }

  /** Reconnect streams that waited for a token. */
  retry() {
    for (const feed of [this.feed, this.compare]) {
      if (feed && feed.connection.state === "unauthorized") feed.retry();
    }
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  async stop() {
    const feed = this.feed;
    if (!feed || feed.finished) return;
    this.stopping = true;
    this.stopError = null;
    this.render();
    try {
      await api(`train/stop/${encodeURIComponent(feed.jobId)}`, { method: "POST" });
      this.jobs.refreshSoon();
    } catch (error) {
      this.stopping = false;
      this.stopError = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
    }
    this.render();
  }

  // -- rendering ------------------------------------------------------------

  buildTimeline() {
    const nodes = [...fmt.PHASES, "end"].map((phase) => {
      const li = document.createElement("li");
      li.dataset.phase = phase;
      li.dataset.state = "pending";
      const dot = document.createElement("span");
      dot.className = "dot";
      dot.setAttribute("aria-hidden", "true");
      const label = document.createElement("span");
      label.className = "label";
      label.textContent = phase === "end" ? "Completed" : fmt.phaseLabel(phase);
      li.append(dot, label);
      return li;
    });
    this.timeline.replaceChildren(...nodes);
  }

  renderTimeline(feed) {
    const phase = feed.phase;
    const terminal = fmt.TERMINAL.has(phase);
    const lastRunning = [...feed.phasesSeen].reverse().find((p) => !fmt.TERMINAL.has(p));
    const reached = fmt.PHASES.indexOf(terminal ? lastRunning ?? "idle" : phase);
    for (const li of this.timeline.children) {
      const node = li.dataset.phase;
      let state = "pending";
      if (node === "end") {
        li.querySelector(".label").textContent = terminal ? fmt.phaseLabel(phase) : "Completed";
        state = phase === "completed" ? "done" : phase === "error" ? "failed" : phase === "stopped" ? "stopped" : "pending";
      } else {
        const index = fmt.PHASES.indexOf(node);
        if (phase === "completed" || index < reached) state = "done";
        else if (index === reached) state = !terminal ? "current" : phase === "error" ? "failed" : "stopped";
        else state = terminal ? "skipped" : "pending";
      }
      li.dataset.state = state;
      if (state === "current") li.setAttribute("aria-current", "step");
      else li.removeAttribute("aria-current");
    }
  }

  renderProgress(feed) {
    const p = feed.latest;
    const phase = feed.phase;
    const done = phase === "completed";
    const percent = done ? 100 : p ? Math.max(0, Math.min(100, p.progress_percent)) : 0;
    const bar = $(this.root, "#progress");
    bar.setAttribute("aria-valuenow", String(Math.round(percent)));
    bar.dataset.phase = phase || "";
    const fill = $(this.root, "#progress-fill");
    // Animate steps as they stream in, not the jump to where a run already is.
    const jump = this.progressOf !== feed || !feed.historyLoaded || feed.eventCount === feed.historyCount;
    this.progressOf = feed.historyLoaded ? feed : null;
    fill.classList.toggle("no-anim", jump);
    fill.style.transform = `scaleX(${percent / 100})`;
    const set = (id, text) => {
      const el = $(this.root, id);
      if (el.textContent !== text) el.textContent = text;
    };
    set("#s-step", p ? `${fmt.integer(p.step)} / ${fmt.integer(p.total_steps)}` : "–");
    set("#s-percent", p ? fmt.percent(percent) : "–");
    set("#s-elapsed", p ? fmt.duration(p.elapsed_seconds) : "–");
    set("#s-eta", fmt.TERMINAL.has(phase) ? (done ? "done" : "–") : p ? fmt.duration(p.eta_seconds) : "–");
    set("#s-loss", p ? fmt.metric(p.loss) : "–");
    set("#s-lr", p ? fmt.rate(p.learning_rate) : "–");
    set("#s-epoch", p && p.epoch != null ? p.epoch.toFixed(2) : "–");
    set("#s-tokens", p && p.num_tokens != null ? fmt.integer(p.num_tokens) : "–");
  }

  renderAlerts(feed) {
    const status = feed.status;
    const details = (status && status.details) || {};
    const errorBox = $(this.root, "#job-error");
    if (status && status.phase === "error") {
      const title = document.createElement("strong");
      title.textContent = fmt.errorHeadline(details.error_code);
      const text = document.createElement("p");
      text.textContent = status.error || status.message;
      const parts = [title, text];
      if (details.error_code) {
        const code = document.createElement("code");
        code.className = "error-code";
        code.dataset.testid = "error-code";
        code.textContent = details.error_code;
        parts.push(code);
      }
      if (details.last_checkpoint) {
        const cp = document.createElement("p");
        cp.className = "muted";
        cp.textContent = `Last checkpoint: ${details.last_checkpoint}`;
        parts.push(cp);
      }
      errorBox.replaceChildren(...parts);
      errorBox.hidden = false;
    } else if (this.stopError) {
      const title = Object.assign(document.createElement("strong"), { textContent: "Could not stop this run" });
      errorBox.replaceChildren(title, Object.assign(document.createElement("p"), { textContent: this.stopError }));
      errorBox.hidden = false;
    } else {
      errorBox.hidden = true;
      errorBox.replaceChildren();
    }

    const warnings = Array.isArray(details.warnings) ? details.warnings : [];
    const warnBox = $(this.root, "#job-warnings");
    warnBox.hidden = warnings.length === 0;
    if (warnings.length) {
      const key = JSON.stringify(warnings);
      if (warnBox.dataset.key !== key) {
        warnBox.dataset.key = key;
        const title = document.createElement("strong");
        title.textContent = warnings.length === 1 ? "1 warning" : `${warnings.length} warnings`;
        const list = document.createElement("ul");
        for (const w of warnings) list.append(Object.assign(document.createElement("li"), { textContent: w }));
        warnBox.replaceChildren(title, list);
      }
    }

    const outBox = $(this.root, "#job-outputs");
    const phase = status && status.phase;
    if (phase === "completed" || phase === "stopped") {
      const rows = [
        ["Adapter", details.adapter_dir],
        ["Model", details.model_dir],
        ["Output folder", details.output_dir],
        ["Final training loss", details.train_loss != null ? fmt.metric(details.train_loss) : null],
      ].filter(([, value]) => value != null && value !== "");
      const dl = document.createElement("dl");
      for (const [label, value] of rows) {
        const div = document.createElement("div");
        div.append(Object.assign(document.createElement("dt"), { textContent: label }),
          Object.assign(document.createElement("dd"), { textContent: String(value) }));
        dl.append(div);
      }
      const title = document.createElement("strong");
      title.textContent = phase === "completed" ? "Training completed" : "Stopped";
      outBox.replaceChildren(title, dl);
      outBox.hidden = false;
    } else {
      outBox.hidden = true;
    }
  }

  renderCharts() {
    const feed = this.feed;
    const cmp = this.compare;
    const runs = cmp ? [feed, cmp] : [feed];
    const { x, columns } = alignOnSteps(runs);
    const pick = (column, key) => column.map((p) => (p && p[key] != null ? p[key] : null));
    const clip = (text) => (text.length > 24 ? `${text.slice(0, 23)}…` : text);
    // Alone, a series is named by its metric; compared, by its run.
    const mine = cmp ? clip(this.jobs.shortName(feed.jobId)) : null;
    const theirs = cmp ? clip(this.jobs.shortName(cmp.jobId)) : null;

    const loss = [{ key: "loss", label: mine ? `loss · ${mine}` : "loss", stroke: COLORS.loss, values: pick(columns[0], "loss") }];
    if (feed.hasEval) {
      loss.push({ key: "eval", label: mine ? `eval · ${mine}` : "eval loss", stroke: COLORS.eval, pointsOnly: true, values: pick(columns[0], "eval_loss") });
    }
    if (cmp) {
      loss.push({ key: "cmp", label: `loss · ${theirs}`, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "loss") });
      if (cmp.hasEval) {
        loss.push({ key: "cmp-eval", label: `eval · ${theirs}`, stroke: COLORS.compareEval, pointsOnly: true, values: pick(columns[1], "eval_loss") });
      }
    }
    this.charts.loss.update(x, loss);

    const lr = [{ key: "lr", label: mine || "learning rate", stroke: COLORS.lr, values: pick(columns[0], "learning_rate") }];
    const grad = [{ key: "grad", label: mine || "grad norm", stroke: COLORS.grad, values: pick(columns[0], "grad_norm") }];
    if (cmp) {
      lr.push({ key: "cmp", label: theirs, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "learning_rate") });
      grad.push({ key: "cmp", label: theirs, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "grad_norm") });
    }
    this.charts.lr.update(x, lr);
    this.charts.grad.update(x, grad);
    const empty = feed.finished ? "No training steps were recorded" : "Waiting for the first step…";
    for (const chart of Object.values(this.charts)) chart.setEmptyText(empty);
  }

  renderCompareOptions() {
    const select = this.compareSelect;
    const current = this.compare ? this.compare.jobId : "";
    const options = [["", "none"]];
    for (const status of this.jobs.list) {
      if (status.job_id === this.feed.jobId) continue;
      const state = status.phase === "completed" ? "" : ` (${fmt.phaseLabel(status.phase).toLowerCase()})`;
      options.push([status.job_id, `${this.jobs.shortName(status.job_id)} · ${status.job_id.slice(0, 6)}${state}`]);
    }
    if (current && !options.some(([id]) => id === current)) options.push([current, current]);
    const key = JSON.stringify(options);
    if (select.dataset.key !== key) {
      select.dataset.key = key;
      select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
    }
    if (select.value !== current) select.value = current;
  }

  renderConnection(feed) {
    const footer = $(this.root, "#stream-state");
    const c = feed.connection;
    let text;
    const fromHistory = feed.historyCount ? ` (${fmt.integer(feed.historyCount)} from this browser's history)` : "";
    switch (c.state) {
      case "live":
        text = `Live · ${fmt.integer(feed.eventCount)} events${fromHistory}`;
        break;
      case "connecting":
        text = "Connecting to the stream…";
        break;
      case "reconnecting":
        text = c.delayMs != null
          ? `Connection lost (${c.reason}); reconnecting in ${Math.max(1, Math.round(c.delayMs / 1000))} s, attempt ${c.attempt}`
          : `Reconnecting (attempt ${c.attempt})…`;
        break;
      case "unauthorized":
        text = "Waiting for an API token (Settings)";
        break;
      case "gone":
        text = "The server does not know this job";
        break;
      case "ended":
        text = `Finished · ${fmt.integer(feed.eventCount)} events${fromHistory}`;
        break;
      default:
        text = feed.historyLoaded ? "" : "Reading history…";
    }
    footer.dataset.state = c.state;
    if (footer.textContent !== text) footer.textContent = text;
  }

  render() {
    const feed = this.feed;
    if (!feed) return;
    const status = feed.status || this.jobs.statusOf(feed.jobId);
    const phase = feed.phase || (status && status.phase) || "";
    $(this.root, "#job-title").textContent = this.jobs.displayName(feed.jobId);
    $(this.root, "#job-id").textContent = feed.jobId;
    const badge = $(this.root, "#job-phase");
    badge.dataset.phase = phase;
    badge.textContent = phase ? fmt.phaseLabel(phase) : "…";
    let message = status ? status.message : "";
    const listed = this.jobs.statusOf(feed.jobId);
    const position = listed && listed.phase === "idle" && listed.details ? listed.details.queue_position : null;
    if (phase === "idle" && position) message = `Waiting in the queue: position ${position}`;
    $(this.root, "#job-message").textContent = message;
    this.root.dataset.phase = phase;

    this.renderTimeline(feed);
    this.renderProgress(feed);
    this.renderAlerts(feed);
    this.renderCharts();
    this.renderCompareOptions();
    this.renderConnection(feed);

    const finished = fmt.TERMINAL.has(phase);
    // The tab's title tells how a run is doing while the page is in the background.
    const name = this.jobs.shortName(feed.jobId);
    const done = phase === "training" && feed.latest ? `${Math.floor(feed.latest.progress_percent)}% · ` : "";
    document.title = phase ? `${done}${name} (${fmt.phaseLabel(phase).toLowerCase()}) · finetune-studio` : "finetune-studio";
    this.stopButton.disabled = finished || this.stopping || !phase;
    this.stopButton.textContent = this.stopping && !finished ? "Stopping…" : "Stop";
  }
}
