// The progress bar and the stat tiles under the timeline: step, percent done,
// elapsed, ETA, loss, learning rate, epoch, tokens, the server's tokens/s (a rate over
// the latest steps) and MFU beside it, token accuracy and memory of the latest progress event.

import * as fmt from "./format.js";

/** MFU (0 to 1) as a percentage: "41.7%", and two significant digits below 1% ("0.052%"); "" when unknown. */
function utilization(value) {
  if (value == null || !Number.isFinite(value)) return "";
  const percent = 100 * value;
  return percent >= 1 ? `${percent.toFixed(1)}%` : `${Number(percent.toPrecision(2))}%`;
}

export class ProgressTiles {
  constructor(root) {
    this.root = root;
    this.bar = root.querySelector("#progress");
    this.fill = root.querySelector("#progress-fill");
    this.shownFeed = null; // the feed whose history the bar has already jumped to
  }

  /** Draw the latest progress of `feed` (a JobFeed). */
  render(feed) {
    const p = feed.latest;
    const phase = feed.phase;
    const done = phase === "completed";
    const percent = done ? 100 : p ? Math.max(0, Math.min(100, p.progress_percent)) : 0;
    this.bar.setAttribute("aria-valuenow", String(Math.round(percent)));
    this.bar.dataset.phase = phase || "";
    // Animate steps as they stream in, not the jump to where a run already is.
    const jump = this.shownFeed !== feed || !feed.historyLoaded || feed.eventCount === feed.historyCount;
    this.shownFeed = feed.historyLoaded ? feed : null;
    this.fill.classList.toggle("no-anim", jump);
    this.fill.style.transform = `scaleX(${percent / 100})`;
    const set = (id, text) => {
      const el = this.root.querySelector(id);
      if (el.textContent !== text) el.textContent = text;
    };
    set("#s-step", p ? `${fmt.integer(p.step)} / ${fmt.integer(p.total_steps)}` : "–");
    set("#s-percent", p ? fmt.percent(percent) : "–");
    set("#s-elapsed", p ? fmt.duration(p.elapsed_seconds) : "–");
    set("#s-eta", fmt.TERMINAL.has(phase) ? (done ? "done" : "–") : p ? fmt.duration(p.eta_seconds) : "–");
    // A NaN or infinite loss arrives as null with loss_finite false: say so, not "–".
    set("#s-loss", p ? (p.loss_finite === false ? "not finite" : fmt.metric(p.loss)) : "–");
    set("#s-lr", p ? fmt.rate(p.learning_rate) : "–");
    set("#s-epoch", p && p.epoch != null ? p.epoch.toFixed(2) : "–");
    set("#s-tokens", p && p.num_tokens != null ? fmt.integer(p.num_tokens) : "–");
    set("#s-tps", p && p.tokens_per_second != null ? fmt.integer(p.tokens_per_second) : "–");
    set("#s-mfu", utilization(p ? p.mfu : null));
    set("#s-accuracy", p && p.mean_token_accuracy != null ? fmt.percent(100 * p.mean_token_accuracy) : "–");
    set("#s-memory", fmt.bytes(p ? p.memory_bytes : null));
    set("#s-gpu-memory", fmt.bytes(p ? p.gpu_memory_bytes : null));
  }
}
