// The metric history in IndexedDB: every status and progress event of every job
// watched from this browser, keyed by [job_id, event id] so that storing an event
// twice is impossible. A reload draws from here at once and resumes the stream
// after the last stored id.
//
// Database "finetune-studio", store "events": {job_id, id, kind, data, stored_at},
// reached through idb (vendored, opened by idbopen.js), which turns IndexedDB's
// requests into promises.

import { reopeningDatabase } from "./idbopen.js";

const DB_NAME = "finetune-studio";
const DB_VERSION = 1;
export const EVENTS = "events";

/** The database, or null where IndexedDB is unavailable (then history is not kept). */
export const openHistory = reopeningDatabase(
  DB_NAME,
  DB_VERSION,
  (database) => {
    if (!database.objectStoreNames.contains(EVENTS)) database.createObjectStore(EVENTS, { keyPath: ["job_id", "id"] });
  },
  "history",
);

function jobRange(jobId) {
  return IDBKeyRange.bound([jobId, -Infinity], [jobId, Infinity]);
}

/**
 * A job's stored events in id order, cut at the first gap: a write lost when a page
 * was closed mid-flight then costs a replay of the events after it, never a hole.
 */
export async function loadEvents(jobId) {
  const db = await openHistory();
  if (!db) return [];
  const rows = await db.getAll(EVENTS, jobRange(jobId));
  const events = [];
  for (const row of rows) {
    if (row.id !== events.length + 1) break;
    events.push(row);
  }
  return events;
}

/** Forget one job's events (the job was deleted on the server). */
export async function deleteJobHistory(jobId) {
  const db = await openHistory();
  if (!db) return;
  await db.delete(EVENTS, jobRange(jobId));
}

export async function clearHistory() {
  const db = await openHistory();
  if (!db) return;
  await db.clear(EVENTS);
}

/**
 * Writes events in batches: one transaction per task turn. Read-write transactions
 * on one store commit in the order they were created, so what is stored is always
 * a prefix of the stream.
 */
export class HistoryWriter {
  constructor() {
    this.pending = [];
    this.scheduled = false;
    this.written = 0;
    this.idle = Promise.resolve();
  }

  put(jobId, event) {
    this.pending.push({ job_id: jobId, id: event.id, kind: event.kind, data: event.data, stored_at: Date.now() });
    if (!this.scheduled) {
      this.scheduled = true;
      this.idle = new Promise((resolve) => setTimeout(() => this.flush().then(resolve, resolve), 0));
    }
  }

  async flush() {
    this.scheduled = false;
    const batch = this.pending;
    this.pending = [];
    if (batch.length === 0) return;
    const db = await openHistory();
    if (!db) return;
    try {
      const tx = db.transaction(EVENTS, "readwrite");
      await Promise.all([...batch.map((row) => tx.store.put(row)), tx.done]);
      this.written += batch.length;
    } catch (error) {
      console.warn("could not store events in IndexedDB", error);
    }
  }
}
