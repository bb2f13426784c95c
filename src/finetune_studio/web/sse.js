// Server-Sent Events read with fetch(), so that requests can carry an
// Authorization header (EventSource cannot). The text/event-stream parsing is
// eventsource-parser's (vendored); around it, the stream reconnects by itself,
// sending Last-Event-ID, until the job's terminal status has arrived.

import { authHeaders } from "./api.js";
import { TERMINAL } from "./format.js";
import { createParser } from "./vendor/eventsource-parser/index.js";

/**
 * A text/event-stream parser: feed() it text chunks, split anywhere; onEvent gets
 * {id, event, data} per event. As in EventSource, `id` is the last id the stream
 * has named (an event without one keeps it) and `event` defaults to "message".
 */
export function eventParser(onEvent, { onComment, onRetry } = {}) {
  let lastId = "";
  return createParser({
    onId: (id) => {
      lastId = id;
    },
    onEvent: (event) => onEvent({ id: lastId, event: event.event || "message", data: event.data }),
    onComment,
    onRetry,
  });
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}

function waitForEvent(name, signal) {
  return new Promise((resolve) => {
    const done = () => {
      window.removeEventListener(name, done);
      signal.removeEventListener("abort", done);
      resolve();
    };
    window.addEventListener(name, done);
    signal.addEventListener("abort", done, { once: true });
  });
}

// A job's stream: its status and progress events, ending with its terminal status.
const JOB_KINDS = new Set(["status", "progress"]);

function jobEnded(kind, data) {
  return kind === "status" && TERMINAL.has(data.phase);
}

/** Every stream connection made (job, Last-Event-ID sent): shown as window.__studio.connections. */
export const connectionLog = [];

/**
 * A job's event stream, resumed after `lastEventId`, reconnecting with backoff.
 *
 * onEvent({id, kind, data}) gets each event once, in id order. onState({state, ...})
 * reports: connecting, live, reconnecting (attempt, delayMs, reason), unauthorized,
 * gone (404, or 416: a cursor past the job's last event), ended (terminal status seen), closed.
 * `prefix` "export" follows an export's stream (export/stream/ID), "eval" an evaluation's
 * (eval/stream/ID), instead of a training job's. A stream of another shape (a sweep's:
 * sweeps.js) names its `path`, the event `kinds` it takes, and `ends(kind, data)`: whether
 * an event is its terminal one.
 */
export class JobStream {
  constructor(jobId, { lastEventId = 0, onEvent, onState, prefix = "train", path = null, kinds = JOB_KINDS, ends = jobEnded }) {
    this.jobId = jobId;
    this.prefix = prefix;
    this.path = path || `${prefix}/stream/${encodeURIComponent(jobId)}`;
    this.kinds = kinds;
    this.ends = ends;
    this.lastEventId = lastEventId;
    this.onEvent = onEvent;
    this.onState = onState || (() => {});
    this.controller = new AbortController();
    this.finished = false;
    this.baseDelay = 500;
  }

  start() {
    this.run().catch((error) => console.error("stream loop failed", error));
    return this;
  }

  close() {
    if (this.controller.signal.aborted) return;
    this.controller.abort();
    this.onState({ state: "closed" });
  }

  get closed() {
    return this.controller.signal.aborted;
  }

  async run() {
    const signal = this.controller.signal;
    let failures = 0;
    while (!this.closed && !this.finished) {
      let received = 0;
      let reason = "the connection closed";
      try {
        this.onState({ state: failures ? "reconnecting" : "connecting", attempt: failures });
        const headers = { Accept: "text/event-stream", ...authHeaders() };
        if (this.lastEventId > 0) headers["Last-Event-ID"] = String(this.lastEventId);
        connectionLog.push({ job_id: this.jobId, last_event_id: this.lastEventId, at: Date.now() });
        const response = await fetch(this.path, {
          headers,
          signal,
          cache: "no-store",
        });
        if (response.status === 401) {
          window.dispatchEvent(new CustomEvent("studio:unauthorized"));
          this.onState({ state: "unauthorized" });
          await waitForEvent("studio:token", signal);
          failures = 0;
          continue;
        }
        if (response.status === 404 || response.status === 416) {
          // No such job, or this page holds events past the job's last one (the
          // server's data was replaced): retrying cannot help.
          this.onState({ state: "gone" });
          return;
        }
        if (!response.ok || !response.body) {
          throw new Error(`the server answered HTTP ${response.status}`);
        }
        this.onState({ state: "live" });
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        const parser = eventParser((event) => {
          if (this.accept(event)) received += 1;
        }, { onRetry: (ms) => { this.baseDelay = Math.max(100, Math.min(ms, 30000)); } });
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(value);
          if (this.finished) {
            await reader.cancel().catch(() => {});
            break;
          }
        }
      } catch (error) {
        if (this.closed) return;
        reason = error instanceof TypeError ? "the server is unreachable" : String(error.message || error);
      }
      if (this.closed) return;
      if (this.finished) break;
      failures = received > 0 ? 1 : failures + 1;
      const delayMs = Math.min(this.baseDelay * 2 ** (failures - 1), 15000) * (0.85 + Math.random() * 0.3);
      this.onState({ state: "reconnecting", attempt: failures, delayMs, reason, retryAt: Date.now() + delayMs });
      await sleep(delayMs, signal);
    }
    if (this.finished && !this.closed) this.onState({ state: "ended" });
  }

  /** Take one parsed event; false for a duplicate or something that is not ours. */
  accept(raw) {
    const id = Number.parseInt(raw.id, 10);
    if (!Number.isSafeInteger(id) || id <= this.lastEventId) return false;
    if (!this.kinds.has(raw.event)) {
      this.lastEventId = id;
      return false;
    }
    let data;
    try {
      data = JSON.parse(raw.data);
    } catch {
      console.warn("ignored an event whose data is not JSON", raw);
      this.lastEventId = id;
      return false;
    }
    this.lastEventId = id;
    if (this.ends(raw.event, data)) this.finished = true;
    this.onEvent({ id, kind: raw.event, data });
    return true;
  }
}
