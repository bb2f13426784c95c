// What a person can do with the run shown, besides Stop: see its full settings,
// run it again (the form filled with its request), resume a stopped run from its
// checkpoint (a new job with resume_from_checkpoint), rename it (PATCH
// /train/jobs/{id}) and delete it (DELETE /train/jobs/{id}, asked once). Each
// action leaves the focus where the person acted, or on what replaced it.

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";
import { fieldLabel } from "./fields.js";
import { TERMINAL } from "./format.js";

function shown(value) {
  if (value == null || value === "") return "—";
  if (Array.isArray(value)) return value.length ? value.join(", ") : "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** The checkpoint a stopped (or failed) run can be resumed from, or null. */
export function resumableCheckpoint(status) {
  if (!status || (status.phase !== "stopped" && status.phase !== "error")) return null;
  const details = status.details || {};
  return details.last_checkpoint || null;
}

export class RunTools {
  /**
   * `jobs` (a JobsIndex), `form` (the StartForm), `onStarted(jobId, body)` for a
   * resumed run, `onDeleted(jobId)` once the server has deleted one.
   */
  constructor(root, { jobs, form, onStarted, onDeleted }) {
    this.root = root;
    this.jobs = jobs;
    this.form = form;
    this.onStarted = onStarted;
    this.onDeleted = onDeleted;
    this.jobId = null;
    this.cached = null; // {jobId, promise} of GET /train/jobs/{id}
    this.status = null;
    this.note = root.querySelector("#run-tools-note");
    this.resumeButton = root.querySelector("#resume-button");
    this.deleteButton = root.querySelector("#delete-button");
    this.renameButton = root.querySelector("#rename-button");
    this.renameForm = root.querySelector("#rename-form");
    this.renameInput = root.querySelector("#rename-input");
    this.settings = root.querySelector("#run-settings");

    root.querySelector("#run-again").addEventListener("click", () => this.runAgain());
    this.resumeButton.addEventListener("click", () => this.resume());
    this.deleteButton.addEventListener("click", () => this.remove());
    this.renameButton.addEventListener("click", () => this.startRename());
    root.querySelector("#rename-cancel").addEventListener("click", () => this.endRename());
    this.renameForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.rename();
    });
    this.renameInput.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.endRename();
      }
    });
    this.settings.addEventListener("toggle", () => {
      if (this.settings.open) this.renderSettings();
    });
  }

  /** A new run is shown: forget the last one's request and close what was open. */
  show(jobId) {
    if (jobId === this.jobId) return;
    this.jobId = jobId;
    this.cached = null;
    this.settings.open = false;
    this.say("");
    this.endRename(false);
  }

  /** Update the buttons for the run's latest status. */
  render(status, phase) {
    this.status = status;
    const finished = TERMINAL.has(phase);
    const checkpoint = resumableCheckpoint(status);
    this.resumeButton.hidden = !checkpoint;
    this.resumeButton.title = checkpoint ? `Start a new run from ${checkpoint}` : "";
    this.setEnabled(this.deleteButton, finished, "Stop the run first: only a finished run can be deleted");
  }

  setEnabled(button, enabled, why) {
    if (enabled) {
      button.removeAttribute("aria-disabled");
      button.title = "";
    } else {
      // aria-disabled, not disabled: a focused button keeps the focus when it turns off.
      button.setAttribute("aria-disabled", "true");
      button.title = why;
    }
  }

  say(text, isError = false) {
    this.note.textContent = text;
    this.note.dataset.error = String(isError);
  }

  /** The run's stored request ({job_id, status, request, withheld_secrets}), fetched once per run. */
  detail() {
    if (!this.cached || this.cached.jobId !== this.jobId) {
      const jobId = this.jobId;
      const promise = api(`train/jobs/${encodeURIComponent(jobId)}`);
      promise.catch(() => {
        if (this.cached && this.cached.promise === promise) this.cached = null;
      });
      this.cached = { jobId, promise };
    }
    return this.cached.promise;
  }

  failed(what, error) {
    const text = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
    this.say(`${what}: ${text}`, true);
  }

  async renderSettings() {
    const list = this.root.querySelector("#settings-list");
    list.replaceChildren(el("dd", "Loading…"));
    try {
      const { request, withheld_secrets: secrets } = await this.detail();
      const rows = Object.entries(request).map(([name, value]) =>
        el("div", el("dt", { title: name }, fieldLabel(name)), el("dd", { "data-field": name }, shown(value))));
      for (const name of secrets || []) rows.push(el("div", el("dt", fieldLabel(name)), el("dd", "sent, not stored")));
      list.replaceChildren(...rows);
    } catch (error) {
      list.replaceChildren(el("dd", "Could not read this run's settings."));
      this.failed("Could not read the settings", error);
    }
  }

  async runAgain() {
    const jobId = this.jobId;
    try {
      const { request, withheld_secrets: secrets } = await this.detail();
      this.form.fillFrom(request, { note: `The settings of run ${jobId}: change what you like and start.`, secrets });
    } catch (error) {
      this.failed("Could not read this run's settings", error);
    }
  }

  async resume() {
    const checkpoint = resumableCheckpoint(this.status);
    if (!checkpoint) return;
    const jobId = this.jobId;
    try {
      const { request, withheld_secrets: secrets } = await this.detail();
      const body = { ...request, resume_from_checkpoint: checkpoint };
      if ((secrets || []).length) {
        // The secrets were never stored: the form asks for them.
        this.form.fillFrom(body, { note: `Resuming run ${jobId} from ${checkpoint}.`, secrets });
        return;
      }
      this.resumeButton.setAttribute("aria-disabled", "true");
      const answer = await api("train/start", { method: "POST", body });
      this.say(`Resumed as run ${answer.job_id}`);
      this.onStarted(answer.job_id, body);
    } catch (error) {
      this.failed("Could not resume", error);
    } finally {
      this.resumeButton.removeAttribute("aria-disabled");
    }
  }

  startRename() {
    this.renameInput.value = this.jobs.meta(this.jobId).project_name || "";
    this.renameForm.hidden = false;
    this.renameButton.hidden = true;
    this.renameInput.focus();
    this.renameInput.select();
  }

  endRename(focus = true) {
    const wasOpen = !this.renameForm.hidden;
    this.renameForm.hidden = true;
    this.renameButton.hidden = false;
    if (focus && wasOpen) this.renameButton.focus();
  }

  async rename() {
    const jobId = this.jobId;
    const label = this.renameInput.value.trim();
    try {
      const answer = await api(`train/jobs/${encodeURIComponent(jobId)}`, {
        method: "PATCH",
        body: { project_name: label || null },
      });
      this.cached = { jobId, promise: Promise.resolve(answer) };
      this.jobs.rename(jobId, label);
      this.endRename();
      this.say(label ? `Renamed to “${label}”` : "Label removed");
      if (this.settings.open) this.renderSettings();
    } catch (error) {
      this.failed("Could not rename", error);
      this.renameInput.focus();
    }
  }

  async remove() {
    if (this.deleteButton.getAttribute("aria-disabled") === "true") {
      this.say(this.deleteButton.title, true);
      return;
    }
    const jobId = this.jobId;
    const name = this.jobs.displayName(jobId);
    if (!confirm(`Delete run “${name}” (${jobId})? Its checkpoints, adapter, exports and history are removed for good.`)) {
      return;
    }
    try {
      await api(`train/jobs/${encodeURIComponent(jobId)}`, { method: "DELETE" });
      this.onDeleted(jobId);
    } catch (error) {
      this.failed("Could not delete", error);
    }
  }
}
