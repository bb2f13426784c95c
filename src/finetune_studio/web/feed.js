// JobFeed: everything known about one job, from IndexedDB first, then live from
// its stream (resumed after the last stored event id). Each event is applied once.

import { loadEvents } from "./history.js";
import { JobStream } from "./sse.js";
import { TERMINAL } from "./format.js";

export class JobFeed {
  constructor(jobId, { writer, onChange }) {
    this.jobId = jobId;
    this.writer = writer;
    this.onChange = onChange || (() => {});
    this.lastId = 0;
    this.eventCount = 0;
    this.historyCount = 0; // events drawn from IndexedDB at open
    this.historySteps = 0; // chart points drawn from IndexedDB at open
    this.historyLoaded = false;
    this.status = null; // the latest TrainingStatus
    this.firstStatus = null; // the queued status: it names the model
    this.cluster = null; // the latest status details that carried `ray` (a run on a Ray cluster)
    this.phasesSeen = [];
    this.phaseStarts = new Map(); // phase -> its first status's details.time (null: not stamped)
    this.steps = []; // distinct steps, ascending
    this.byStep = new Map(); // step -> TrainingProgress
    this.latest = null; // the latest TrainingProgress
    this.hasEval = false;
    this.connection = { state: "idle" };
    this.stream = null;
    this.closed = false;
  }

  get phase() {
    return this.status ? this.status.phase : null;
  }

  get finished() {
    return TERMINAL.has(this.phase);
  }

  async open() {
    const stored = await loadEvents(this.jobId);
    if (this.closed) return;
    for (const row of stored) this.apply(row);
    this.historyCount = stored.length;
    this.historySteps = this.steps.length;
    this.historyLoaded = true;
    this.onChange(this, "history");
    if (this.finished) {
      this.connection = { state: "ended" };
      this.onChange(this, "connection");
      return;
    }
    this.connect();
  }

  connect() {
    if (this.closed) return;
    this.stream = new JobStream(this.jobId, {
      lastEventId: this.lastId,
      onEvent: (event) => {
        if (this.apply(event)) {
          this.writer.put(this.jobId, event);
          this.onChange(this, event.kind);
        }
      },
      onState: (state) => {
        this.connection = state;
        this.onChange(this, "connection");
      },
    }).start();
  }

  /** Reconnect now (after a token was entered, say) if the stream is waiting. */
  retry() {
    if (this.closed || this.finished) return;
    if (this.stream) this.stream.close();
    this.connect();
  }

  apply(event) {
    if (event.id <= this.lastId) return false;
    this.lastId = event.id;
    this.eventCount += 1;
    if (event.kind === "status") {
      const status = event.data;
      if (!this.firstStatus) this.firstStatus = status;
      this.status = status;
      if (status.details && status.details.ray) this.cluster = status.details;
      if (!this.phasesSeen.includes(status.phase)) {
        this.phasesSeen.push(status.phase);
        const time = status.details ? status.details.time : null;
        this.phaseStarts.set(status.phase, Number.isFinite(time) ? time : null);
      }
    } else if (event.kind === "progress") {
      const progress = event.data;
      const step = progress.step;
      if (!this.byStep.has(step)) {
        // Steps arrive in order; a resumed run may repeat some: keep the axis sorted.
        if (this.steps.length && step < this.steps[this.steps.length - 1]) {
          this.steps.push(step);
          this.steps.sort((a, b) => a - b);
        } else {
          this.steps.push(step);
        }
      }
      // An evaluation may report on a step already seen: merge, keeping both.
      const merged = { ...this.byStep.get(step), ...progress };
      this.byStep.set(step, merged);
      if (!this.latest || step >= this.latest.step) this.latest = merged;
      if (progress.eval_loss != null) this.hasEval = true;
    }
    return true;
  }

  close() {
    this.closed = true;
    if (this.stream) this.stream.close();
  }
}
