// The phase timeline: one node per running phase plus the end (Completed, Failed
// or Stopped), each marked done, current, failed, stopped, skipped or pending,
// with how long the phase took beneath it. Times come from the status events'
// `details.time` (seconds since the epoch, stamped by the server); events from
// before the server stamped them show no durations.

import * as fmt from "./format.js";

// Each node's state in words, for screen readers (on screen it is the dot's colour and mark).
const STATE_WORDS = {
  done: "done",
  current: "in progress",
  failed: "failed here",
  stopped: "stopped here",
  skipped: "skipped",
  pending: "not reached yet",
};

/**
 * How long each phase took, in seconds: from its first status event to the next
 * phase's. The phase still running counts up to `now` and is marked `running`.
 * A phase whose start or end has no time is left out.
 *
 * @param {string[]} phasesSeen  phases in the order the job entered them
 * @param {Map<string, number|null>} startOf  each phase's first `details.time`
 * @param {number} now  seconds since the epoch
 * @returns {Map<string, {seconds: number, running: boolean}>}
 */
export function phaseDurations(phasesSeen, startOf, now) {
  const took = new Map();
  phasesSeen.forEach((phase, i) => {
    if (fmt.TERMINAL.has(phase)) return;
    const start = startOf.get(phase);
    const next = phasesSeen[i + 1];
    const running = next === undefined;
    const end = running ? now : startOf.get(next);
    if (start == null || end == null) return;
    // The browser's clock may trail the server's: a phase never took less than 0.
    took.set(phase, { seconds: Math.max(0, end - start), running });
  });
  return took;
}

export class PhaseTimeline {
  constructor(list) {
    this.list = list;
    this.feed = null;
    this.ticker = null;
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
      const took = document.createElement("span");
      took.className = "took";
      took.dataset.testid = "phase-took";
      const words = document.createElement("span");
      words.className = "visually-hidden state-words";
      words.dataset.testid = "phase-state";
      words.textContent = `: ${STATE_WORDS.pending}`;
      li.append(dot, label, words, took);
      return li;
    });
    list.replaceChildren(...nodes);
  }

  /** Draw the states of `feed` (a JobFeed); while a phase runs, its time ticks. */
  render(feed) {
    this.feed = feed;
    const phase = feed.phase;
    const terminal = fmt.TERMINAL.has(phase);
    const lastRunning = [...feed.phasesSeen].reverse().find((p) => !fmt.TERMINAL.has(p));
    const reached = fmt.PHASES.indexOf(terminal ? lastRunning ?? "idle" : phase);
    for (const li of this.list.children) {
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
      const words = li.querySelector(".state-words");
      const said = `: ${STATE_WORDS[state]}`;
      if (words.textContent !== said) words.textContent = said;
      if (state === "current") li.setAttribute("aria-current", "step");
      else li.removeAttribute("aria-current");
    }
    const running = this.renderDurations();
    if (running && !this.ticker) this.ticker = setInterval(() => this.renderDurations(), 1000);
    if (!running) this.stop();
  }

  /** Write each phase's duration; true while one of them is still counting. */
  renderDurations() {
    const feed = this.feed;
    const took = feed ? phaseDurations(feed.phasesSeen, feed.phaseStarts, Date.now() / 1000) : new Map();
    let running = false;
    for (const li of this.list.children) {
      const entry = took.get(li.dataset.phase);
      const text = entry ? fmt.took(entry.seconds, { running: entry.running }) : "";
      const span = li.querySelector(".took");
      if (span.textContent !== text) span.textContent = text;
      if (entry) li.dataset.seconds = String(entry.seconds);
      else delete li.dataset.seconds;
      running ||= Boolean(entry && entry.running);
    }
    return running;
  }

  /** Stop the ticking (the job view is hidden or shows a finished run). */
  stop() {
    clearInterval(this.ticker);
    this.ticker = null;
  }
}
