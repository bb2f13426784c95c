// The model's answers beside the loss: on each evaluated step the server sends
// `eval_samples` ([{prompt, completion}], the model's greedy answers to the first
// evaluation prompts at that step); this panel shows the latest ones, under the
// charts, so a run that learns nothing (or only to repeat itself) is seen while it runs.

import { el } from "./dom.js";

const WRAPPED = { whiteSpace: "pre-wrap" };

/** An answer as shown: one that is empty or only whitespace (a model that learned nothing yet) is said so. */
export function shown(completion) {
  const text = String(completion ?? "");
  if (!text) return "(an empty answer)";
  if (!text.trim()) return `(only whitespace: ${JSON.stringify(text).slice(0, 40)})`;
  return text;
}

/** The latest progress event of `feed` that carries eval_samples, or null. */
export function latestSamples(feed) {
  for (let i = feed.steps.length - 1; i >= 0; i -= 1) {
    const progress = feed.byStep.get(feed.steps[i]);
    if (progress && Array.isArray(progress.eval_samples) && progress.eval_samples.length) return progress;
  }
  return null;
}

export class EvalSamples {
  constructor(root) {
    this.root = root;
    this.box = null; // made on the first samples, after the charts
    this.shown = null; // "jobId:step" drawn
    this.seen = -1; // the feed's event count when last looked at
    this.feed = null;
  }

  ensure() {
    if (this.box) return this.box;
    const box = el("section", {
      class: "eval-samples", "data-testid": "eval-samples", "aria-label": "The model's answers at the latest evaluation",
    });
    const charts = this.root.querySelector(".charts");
    if (charts) charts.after(box);
    else this.root.append(box);
    this.box = box;
    return box;
  }

  /** Draw the latest samples of `feed` (a JobFeed); nothing for a run without them. */
  render(feed) {
    if (feed === this.feed && feed.eventCount === this.seen) return; // nothing new: no scan
    this.feed = feed;
    this.seen = feed.eventCount;
    const progress = latestSamples(feed);
    if (!progress) {
      if (this.box) this.box.hidden = true;
      this.shown = null;
      return;
    }
    const key = `${feed.jobId}:${progress.step}`;
    const box = this.ensure();
    box.hidden = false;
    if (key === this.shown) return;
    this.shown = key;
    const loss = progress.eval_loss != null ? ` (eval loss ${Number(progress.eval_loss).toPrecision(4)})` : "";
    const samples = progress.eval_samples.map((sample) =>
      el("div", { class: "eval-sample", "data-testid": "eval-sample" },
        el("pre", { class: "eval-prompt muted", style: WRAPPED }, sample.prompt),
        el("pre", { class: "eval-completion", style: WRAPPED, "data-testid": "eval-completion" }, shown(sample.completion))));
    box.replaceChildren(el("h3", { class: "card-subtitle" }, `Answers at step ${progress.step}${loss}`), ...samples);
  }
}
