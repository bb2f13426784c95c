// JobsIndex: the server's job list (polled from /train/jobs), and the model and
// label of every job this browser has seen (in localStorage: later statuses no
// longer carry them, so a finished run keeps its name).

import { api, ApiError } from "./api.js";
import { basename } from "./format.js";
import { RESULT_PHASES } from "./rules.js";

const POLL_MS = 2000;
const NAMES_KEY = "finetune-studio.job-names";

/**
 * Whether a status says its job has a model to chat with, as GET /v1/models does:
 * completed, or stopped after saving an adapter or a model (the server's rule, rules.js).
 */
export function isServable(status) {
  if (!status || !Object.hasOwn(RESULT_PHASES, status.phase)) return false;
  const details = status.details || {};
  const needs = RESULT_PHASES[status.phase];
  return needs.length === 0 || needs.some((key) => Boolean(details[key]));
}

export class JobsIndex {
  /** onUpdate() after each new list; onServerState("ok" | "unauthorized" | "down"). */
  constructor({ onUpdate, onServerState }) {
    this.list = [];
    this.byId = new Map();
    this.onUpdate = onUpdate;
    this.onServerState = onServerState;
    this.timer = null;
    this.loaded = false; // the server answered with its list at least once (since the last 401)
    this.state = "unknown"; // "ok" | "unauthorized" | "down", as onServerState was told
    this.inFlight = null;
    try {
      this.names = JSON.parse(localStorage.getItem(NAMES_KEY) || "{}");
    } catch {
      this.names = {};
    }
  }

  statusOf(jobId) {
    return this.byId.get(jobId) || null;
  }

  /** Keep the model and label of a job: later statuses no longer carry them. */
  remember(jobId, status) {
    const details = status && status.details;
    if (!details || this.names[jobId]) return;
    if (!details.model_name && !details.project_name) return;
    this.names[jobId] = { model_name: details.model_name || "", project_name: details.project_name || "" };
    try {
      localStorage.setItem(NAMES_KEY, JSON.stringify(this.names));
    } catch {
      // storage blocked
    }
  }

  /** A new label, from a rename here: it replaces the one kept. */
  rename(jobId, projectName) {
    const known = this.names[jobId] || { model_name: this.meta(jobId).model_name, project_name: "" };
    this.names[jobId] = { ...known, project_name: projectName };
    const listed = this.byId.get(jobId);
    if (listed) listed.details = { ...(listed.details || {}), project_name: projectName };
    this.save();
    this.onUpdate();
  }

  /** A job deleted on the server: gone from the list and the names. */
  forget(jobId) {
    delete this.names[jobId];
    this.list = this.list.filter((status) => status.job_id !== jobId);
    this.byId.delete(jobId);
    this.save();
    this.onUpdate();
  }

  save() {
    try {
      localStorage.setItem(NAMES_KEY, JSON.stringify(this.names));
    } catch {
      // storage blocked
    }
  }

  meta(jobId) {
    const listed = this.byId.get(jobId);
    const details = (listed && listed.details) || {};
    const known = this.names[jobId] || {};
    return {
      model_name: details.model_name || known.model_name || "",
      // The list carries the current label (null: none); a rename changes it.
      project_name: "project_name" in details ? details.project_name || "" : known.project_name || "",
    };
  }

  shortName(jobId) {
    const { model_name, project_name } = this.meta(jobId);
    return project_name || basename(model_name) || jobId.slice(0, 6);
  }

  displayName(jobId, unknown = `Job ${jobId}`) {
    const { model_name, project_name } = this.meta(jobId);
    if (project_name && model_name) return `${project_name} · ${basename(model_name)}`;
    return project_name || basename(model_name) || unknown;
  }

  async refresh() {
    if (this.inFlight) return this.inFlight;
    this.inFlight = (async () => {
      try {
        const answer = await api("train/jobs");
        this.list = answer.data;
        this.byId = new Map(this.list.map((s) => [s.job_id, s]));
        for (const status of this.list) this.remember(status.job_id, status);
        this.loaded = true;
        this.state = "ok";
        this.onServerState("ok");
        this.onUpdate();
      } catch (error) {
        const refused = error instanceof ApiError && error.status === 401;
        this.state = refused ? "unauthorized" : "down";
        if (refused) {
          // With no valid token the server shows nothing: the list must not claim "no runs".
          this.loaded = false;
          this.list = [];
          this.byId = new Map();
          this.onUpdate();
        }
        this.onServerState(refused ? "unauthorized" : "down");
      } finally {
        this.inFlight = null;
      }
    })();
    return this.inFlight;
  }

  refreshSoon() {
    clearTimeout(this.soon);
    this.soon = setTimeout(() => this.refresh(), 150);
  }

  poll() {
    const tick = async () => {
      if (!document.hidden) await this.refresh();
      this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }
}
