// The jobs of one kind that a panel lists (a run's exports, its evaluations), each followed by
// its event stream (sse.js: the same ids and replay as a training job's) until its terminal
// status; and RunPanel, what the run view's panels of them share: export.js and evalpanel.js.

import { api } from "./api.js";
import { TERMINAL } from "./format.js";
import { renderScheduler } from "./schedule.js";
import { JobStream } from "./sse.js";

export class FollowedJobs {
  /** `prefix`: the routes' ("export", "eval"); `onEvent(item, event)` after each event (the item's status already updated). */
  constructor(prefix, onEvent) {
    this.prefix = prefix;
    this.onEvent = onEvent;
    this.items = new Map(); // id -> { status, stream, ...what make() gave }
  }

  get(id) {
    return this.items.get(id);
  }

  get size() {
    return this.items.size;
  }

  /** [id, item] pairs, the newest tracked first. */
  newestFirst() {
    return [...this.items.entries()].reverse();
  }

  /** Remember job `id` (its item made by `make()` the first time) and follow it while `status` has not ended. */
  track(id, status, make = () => ({})) {
    let item = this.items.get(id);
    if (!item) {
      item = { ...make(), status, stream: null };
      this.items.set(id, item);
    }
    if (!TERMINAL.has(status.phase) && !item.stream) {
      item.stream = new JobStream(id, {
        prefix: this.prefix,
        onEvent: (event) => {
          if (event.kind === "status") {
            item.status = event.data;
            if (TERMINAL.has(event.data.phase)) item.stream = null;
          }
          this.onEvent(item, event);
        },
      }).start();
    }
    return item;
  }

  /** Stop following every one, and forget them. */
  clear() {
    for (const item of this.items.values()) if (item.stream) item.stream.close();
    this.items.clear();
  }
}

/**
 * A panel of a run's view that lists jobs of one kind made from the run, and follows each while
 * it runs. A subclass gives `build()` (the panel's element, with `this.list` in it), `draw()`,
 * `listPath(jobId)` (the list route), `track(status)` and, where the list holds others' jobs too,
 * `belongs(jobId, status)`.
 */
export class RunPanel {
  /** `prefix`: the jobs' routes ("export", "eval"); `onEvent` as FollowedJobs's. */
  constructor(jobRoot, prefix, onEvent, { after = [".alerts"] } = {}) {
    this.jobId = null;
    this.followed = new FollowedJobs(prefix, onEvent);
    this.loaded = null; // the run whose jobs were loaded
    this.busy = false;
    this.error = null; // what a refused start said
    this.drawnKey = null; // what draw() last drew, for a panel that redraws only on a change
    this.schedule = renderScheduler(() => this.draw()); // draw() at most once a frame
    this.root = this.build();
    const anchor = after.map((selector) => jobRoot.querySelector(selector)).find(Boolean);
    if (anchor) anchor.after(this.root);
    else jobRoot.append(this.root);
  }

  /** Show the panel's part of run `jobId`; its jobs are loaded by the first `loadOnce()`. */
  show(jobId) {
    if (jobId === this.jobId) return;
    this.followed.clear();
    this.jobId = jobId;
    this.loaded = null;
    this.error = null;
    this.drawnKey = null;
    this.list.replaceChildren();
  }

  hide() {
    this.followed.clear();
    this.jobId = null;
    this.root.hidden = true;
  }

  /** Load the shown run's jobs, the first time this is called for it. */
  loadOnce() {
    if (this.jobId == null || this.loaded === this.jobId) return;
    this.loaded = this.jobId;
    this.load(this.jobId);
  }

  async load(jobId) {
    let answer;
    try {
      answer = await api(this.listPath(jobId));
    } catch {
      if (jobId === this.jobId) this.loaded = null; // asked again on a later render (a token may come)
      return;
    }
    if (jobId !== this.jobId) return;
    for (const status of answer.data.slice().reverse()) if (this.belongs(jobId, status)) this.track(status);
    this.schedule();
  }

  belongs() {
    return true;
  }
}
