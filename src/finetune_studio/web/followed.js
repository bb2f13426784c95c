// The jobs of one kind that a panel lists (a run's exports, its evaluations), each followed by
// its event stream (sse.js: the same ids and replay as a training job's) until its terminal
// status: export.js and evalpanel.js.

import { TERMINAL } from "./format.js";
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
