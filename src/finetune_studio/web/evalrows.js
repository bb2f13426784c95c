// An evaluation's per-sample rows (GET /eval/results/{id}/samples): each sample's prompt,
// reference, every model's answer and scores (and a judge's verdicts with their reasons),
// ordered by how much one model gains over the first on one metric: the largest gains first,
// or (the toggle) the largest losses first, or as the suite gave them.
//
// A sample's gain is the compared model's score minus the first model's, turned by the
// metric's direction (the results' `higher_is_better` for the suite's metric of that name),
// so a positive gain is always "the compared model did better"; a judge's sample gains +1,
// 0 or -1 by its outcome (win, tie, loss against the first model). The rows of one suite are
// read in pages of the server's largest size, up to MAX_ROWS, and drawn PAGE_ROWS at a time.

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";
import * as fmt from "./format.js";
import { modelName } from "./evaltable.js";
import { MAX_EVAL_SAMPLE_PAGE } from "./rules.js";

export const PAGE_ROWS = 20; // rows drawn at a time
export const MAX_ROWS = 5000; // rows read to sort; beyond, the view says it sorts the first ones
const VERDICT = "verdict"; // the metric key of a judge's outcome
const OUTCOME_GAIN = { win: 1, tie: 0, loss: -1 };
const ORDERS = [
  ["gains", "Largest gains first"],
  ["losses", "Largest losses first"],
  ["index", "In order"],
];

/** The results' metric of `suite` that a per-sample score `name` belongs to (`suite/name` or `suite/<task>/name`). */
export function suiteMetric(results, suite, name) {
  const metrics = (results.metrics || []).filter((metric) => metric.suite === suite);
  return metrics.find((metric) => metric.name === `${suite}/${name}`) || metrics.find((metric) => metric.name.endsWith(`/${name}`)) || null;
}

/** The metrics a suite's rows can be ordered by: [{key, label, higherIsBetter}], in the results' order. */
export function sortMetrics(results, suite, rows) {
  const names = new Set();
  for (const row of rows) for (const scores of Object.values(row.scores || {})) for (const name of Object.keys(scores)) names.add(name);
  const order = (results.metrics || []).map((metric) => metric.name);
  const found = [];
  for (const name of names) {
    const metric = suiteMetric(results, suite, name);
    if (metric) found.push({ key: name, label: name, higherIsBetter: metric.higher_is_better !== false, at: order.indexOf(metric.name) });
  }
  found.sort((a, b) => a.at - b.at || a.key.localeCompare(b.key));
  const options = found.map(({ key, label, higherIsBetter }) => ({ key, label, higherIsBetter }));
  if (rows.some((row) => row.verdict)) options.unshift({ key: VERDICT, label: "the judge's verdict", higherIsBetter: true });
  return options;
}

/** How much `other` gains over `first` on one sample (see the module's comment); null when either has no score. */
export function sampleGain(row, first, other, metric) {
  if (metric.key === VERDICT) {
    const outcome = ((row.verdict || {})[other] || {}).outcome;
    return outcome in OUTCOME_GAIN ? OUTCOME_GAIN[outcome] : null;
  }
  const mine = ((row.scores || {})[other] || {})[metric.key];
  const theirs = ((row.scores || {})[first] || {})[metric.key];
  if (typeof mine !== "number" || typeof theirs !== "number") return null;
  const difference = mine - theirs;
  return metric.higherIsBetter ? difference : -difference;
}

/** `rows` ordered for `order` ("gains", "losses" or "index") by their gains; rows without one come last. */
export function orderRows(rows, gains, order) {
  const ranked = rows.map((row, at) => ({ row, gain: gains[at], at }));
  if (order === "index") return ranked;
  const sign = order === "losses" ? 1 : -1;
  return ranked.sort((a, b) => {
    if (a.gain == null || b.gain == null) return (a.gain == null) - (b.gain == null) || a.at - b.at;
    return sign * (a.gain - b.gain) || a.at - b.at;
  });
}

function scoreText(scores) {
  return Object.entries(scores || {}).map(([name, value]) => `${name} ${fmt.metric(value, 3)}`).join(" · ");
}

export class EvalRows {
  /** `jobs` (a JobsIndex) names the models; `schedule()` asks the view for a render. */
  constructor({ jobs, schedule }) {
    this.jobs = jobs;
    this.schedule = schedule;
    this.results = null;
    this.suite = null;
    this.rows = null; // the suite's rows, once read
    this.total = 0;
    this.loading = null; // the suite being read
    this.error = null;
    this.metricKey = null;
    this.other = null;
    this.order = "gains";
    this.page = 0;
    this.drawn = null;
    this.root = this.build();
  }

  build() {
    this.suiteSelect = el("select", { "data-testid": "eval-rows-suite", onchange: () => this.readSuite(this.suiteSelect.value) });
    this.metricSelect = el("select", { "data-testid": "eval-rows-metric", onchange: () => this.choose({ metricKey: this.metricSelect.value }) });
    this.modelSelect = el("select", { "data-testid": "eval-rows-model", onchange: () => this.choose({ other: this.modelSelect.value }) });
    this.modelField = el("label", { class: "eval-rows-field" }, el("span", "Compared model"), this.modelSelect);
    this.orderButtons = ORDERS.map(([order, label]) => el("button", {
      type: "button", class: "btn btn-small", "data-order": order, "data-testid": `eval-rows-order-${order}`,
      onclick: () => this.choose({ order }),
    }, label));
    this.note = el("p", { class: "muted eval-rows-note", "data-testid": "eval-rows-note", role: "status" });
    this.list = el("ol", { class: "eval-rows", "data-testid": "eval-rows", "aria-label": "Samples" });
    this.previous = el("button", { type: "button", class: "btn btn-small", "data-testid": "eval-rows-previous", onclick: () => this.turn(-1) }, "Previous");
    this.next = el("button", { type: "button", class: "btn btn-small", "data-testid": "eval-rows-next", onclick: () => this.turn(1) }, "Next");
    this.pageText = el("span", { class: "muted", "data-testid": "eval-rows-page" });
    return el("section", { class: "eval-samples-view", "data-testid": "eval-samples-view", "aria-labelledby": "eval-rows-title", hidden: true },
      el("h3", { id: "eval-rows-title" }, "Samples"),
      el("div", { class: "eval-rows-tools" },
        el("label", { class: "eval-rows-field" }, el("span", "Suite"), this.suiteSelect),
        el("label", { class: "eval-rows-field" }, el("span", "Ordered by"), this.metricSelect),
        this.modelField,
        el("div", { class: "segmented eval-rows-order", role: "group", "aria-label": "Order" }, this.orderButtons)),
      this.note, this.list,
      el("div", { class: "eval-rows-pager" }, this.previous, this.pageText, this.next));
  }

  /** A completed evaluation's results: read its first suite's rows. */
  show(evalId, results) {
    if (this.evalId === evalId && this.results) return;
    this.evalId = evalId;
    this.results = results;
    const suites = [...new Set((results.metrics || []).map((metric) => metric.suite))];
    this.suiteSelect.replaceChildren(...suites.map((suite) => new Option(suite, suite)));
    const models = results.models || [];
    this.other = models[1] || null;
    this.modelSelect.replaceChildren(...models.slice(1).map((model) => new Option(modelName(this.jobs, model), model)));
    this.modelField.hidden = models.length <= 2;
    this.root.hidden = false;
    if (suites.length) this.readSuite(suites[0]);
    else this.root.hidden = true;
  }

  hide() {
    this.evalId = null;
    this.results = null;
    this.rows = null;
    this.drawn = null;
    this.root.hidden = true;
  }

  async readSuite(suite) {
    const evalId = this.evalId;
    this.suite = suite;
    this.rows = null;
    this.error = null;
    this.page = 0;
    this.loading = suite;
    this.schedule();
    const rows = [];
    let total = 0;
    try {
      do {
        const query = new URLSearchParams({ suite, offset: String(rows.length), limit: String(MAX_EVAL_SAMPLE_PAGE) });
        const answer = await api(`eval/results/${encodeURIComponent(evalId)}/samples?${query}`);
        if (this.evalId !== evalId || this.suite !== suite) return;
        rows.push(...answer.data);
        total = answer.total;
        if (!answer.data.length) break;
      } while (rows.length < Math.min(total, MAX_ROWS));
    } catch (error) {
      if (this.evalId !== evalId || this.suite !== suite) return;
      this.error = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
      this.loading = null;
      this.schedule();
      return;
    }
    this.rows = rows.slice(0, MAX_ROWS);
    this.total = total;
    this.loading = null;
    const options = sortMetrics(this.results, suite, this.rows);
    this.metrics = options;
    this.metricSelect.replaceChildren(...options.map((option) => new Option(option.label, option.key)));
    if (!options.some((option) => option.key === this.metricKey)) this.metricKey = options.length ? options[0].key : null;
    this.schedule();
  }

  choose(change) {
    Object.assign(this, change);
    this.page = 0;
    this.schedule();
  }

  turn(by) {
    this.page += by;
    this.schedule();
    this.list.scrollIntoView({ block: "nearest" });
  }

  render() {
    if (this.root.hidden || !this.results) return;
    const models = this.results.models || [];
    const first = models[0];
    for (const button of this.orderButtons) button.setAttribute("aria-pressed", String(button.dataset.order === this.order));
    if (this.suiteSelect.value !== this.suite && this.suite) this.suiteSelect.value = this.suite;
    if (this.loading || this.error || !this.rows) {
      this.note.textContent = this.error ? `The samples could not be read: ${this.error}` : `Reading the samples of ${this.suite}…`;
      this.note.dataset.error = String(Boolean(this.error));
      this.list.replaceChildren();
      this.previous.disabled = this.next.disabled = true;
      this.pageText.textContent = "";
      this.drawn = null;
      return;
    }
    const metric = (this.metrics || []).find((option) => option.key === this.metricKey) || null;
    if (metric && this.metricSelect.value !== metric.key) this.metricSelect.value = metric.key;
    if (this.other && this.modelSelect.value !== this.other) this.modelSelect.value = this.other;
    const key = JSON.stringify([this.evalId, this.suite, this.metricKey, this.other, this.order, this.page, this.rows.length]);
    if (key === this.drawn) return;
    this.drawn = key;
    const comparable = metric && this.other;
    const gains = this.rows.map((row) => (comparable ? sampleGain(row, first, this.other, metric) : null));
    const ordered = orderRows(this.rows, gains, comparable ? this.order : "index");
    const pages = Math.max(1, Math.ceil(ordered.length / PAGE_ROWS));
    this.page = Math.min(Math.max(0, this.page), pages - 1);
    const start = this.page * PAGE_ROWS;
    const shown = ordered.slice(start, start + PAGE_ROWS);
    const otherName = this.other ? modelName(this.jobs, this.other) : "";
    const firstName = first ? modelName(this.jobs, first) : "";
    let note = comparable
      ? `Gain: how much better ${otherName} does than ${firstName} (the first model) on ${metric.label}, per sample.`
      : "These samples have no score to compare the models by: shown in order.";
    if (this.total > this.rows.length) note += ` Ordered over the first ${fmt.integer(this.rows.length)} of ${fmt.integer(this.total)} samples.`;
    this.note.textContent = note;
    this.note.dataset.error = "false";
    this.list.replaceChildren(...shown.map(({ row, gain }) => this.drawRow(row, gain, comparable ? metric : null, models)));
    this.previous.disabled = this.page === 0;
    this.next.disabled = this.page >= pages - 1;
    this.pageText.textContent = ordered.length
      ? `Samples ${fmt.integer(start + 1)}–${fmt.integer(start + shown.length)} of ${fmt.integer(ordered.length)}`
      : "No samples";
  }

  drawRow(row, gain, metric, models) {
    const direction = gain == null ? "none" : gain > 0 ? "gain" : gain < 0 ? "loss" : "even";
    const gainText = gain == null ? (metric ? `no ${metric.label}` : "") : `${gain > 0 ? "+" : gain < 0 ? "−" : "±"}${fmt.metric(Math.abs(gain), 3)} ${metric.label}`;
    const texts = [
      el("div", { class: "eval-text" }, el("span", { class: "eval-text-label" }, "Prompt"),
        el("pre", { "data-testid": "eval-row-prompt" }, row.prompt)),
    ];
    if (row.reference != null) {
      texts.push(el("div", { class: "eval-text" }, el("span", { class: "eval-text-label" }, "Reference"),
        el("pre", { "data-testid": "eval-row-reference" }, row.reference)));
    }
    const answers = models.map((model) => {
      const answer = (row.answers || {})[model];
      const verdict = (row.verdict || {})[model];
      return el("div", { class: "eval-answer", "data-testid": "eval-row-answer", "data-model": model },
        el("div", { class: "eval-answer-head" },
          el("strong", modelName(this.jobs, model)),
          el("span", { class: "muted", "data-testid": "eval-row-scores" }, scoreText((row.scores || {})[model]))),
        el("pre", answer == null ? { class: "muted" } : {}, answer == null ? "(no answer)" : answer),
        verdict ? this.drawVerdict(verdict) : null);
    });
    return el("li", { class: "eval-row", "data-testid": "eval-row", "data-index": row.index, "data-gain": gain == null ? "" : String(gain) },
      el("div", { class: "eval-row-head" },
        el("span", { class: "muted" }, `#${row.index}`),
        gainText ? el("span", { class: "eval-gain", "data-direction": direction, "data-testid": "eval-row-gain" }, gainText) : null),
      texts, el("div", { class: "eval-answers" }, answers));
  }

  drawVerdict(verdict) {
    const reasons = (verdict.verdicts || []).map((one) => el("li",
      `${one.A} as A, ${one.B} as B: ${one.parsed ? `winner ${one.winner}` : "not parsed (a tie)"}${one.reason ? ` — ${one.reason}` : ""}`));
    return el("div", { class: "eval-verdict", "data-testid": "eval-row-verdict" },
      el("span", `The judge: ${verdict.outcome}`), el("ul", reasons));
  }
}
