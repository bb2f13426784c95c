// finetune-studio's web UI: wires the start form, the job list, the job view and
// the settings together. Plain ES modules, no build step; the one library (uPlot)
// is vendored under vendor/ with its license.
//
// Location: #job=<id>[&compare=<id>] names the run shown (and the one overlaid).

import { api, ApiError, getToken, setToken } from "./api.js";
import { clearHistory, HistoryWriter, openHistory } from "./history.js";
import { connectionLog } from "./sse.js";
import { StartForm } from "./form.js";
import { JobView } from "./jobview.js";
import * as fmt from "./format.js";

const POLL_MS = 2000;
const NAMES_KEY = "finetune-studio.job-names";

/** The server's job list (polled), plus the names of jobs remembered by this browser. */
class JobsIndex {
  constructor({ onUpdate, onServerState }) {
    this.list = [];
    this.byId = new Map();
    this.onUpdate = onUpdate;
    this.onServerState = onServerState;
    this.timer = null;
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

  meta(jobId) {
    const listed = this.byId.get(jobId);
    const details = (listed && listed.details) || {};
    const known = this.names[jobId] || {};
    return {
      model_name: details.model_name || known.model_name || "",
      project_name: details.project_name || known.project_name || "",
    };
  }

  shortName(jobId) {
    const { model_name, project_name } = this.meta(jobId);
    return project_name || fmt.basename(model_name) || jobId.slice(0, 6);
  }

  displayName(jobId, unknown = `Job ${jobId}`) {
    const { model_name, project_name } = this.meta(jobId);
    if (project_name && model_name) return `${project_name} · ${fmt.basename(model_name)}`;
    return project_name || fmt.basename(model_name) || unknown;
  }

  async refresh() {
    if (this.inFlight) return this.inFlight;
    this.inFlight = (async () => {
      try {
        const answer = await api("train/jobs");
        this.list = answer.data;
        this.byId = new Map(this.list.map((s) => [s.job_id, s]));
        for (const status of this.list) this.remember(status.job_id, status);
        this.onServerState("ok");
        this.onUpdate();
      } catch (error) {
        this.onServerState(error instanceof ApiError && error.status === 401 ? "unauthorized" : "down");
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

function renderJobList(jobs, selectedId) {
  const list = document.getElementById("job-list");
  document.getElementById("jobs-empty").hidden = jobs.list.length > 0;
  document.getElementById("jobs-count").textContent = jobs.list.length ? String(jobs.list.length) : "";
  const existing = new Map([...list.children].map((li) => [li.dataset.jobId, li]));
  const items = jobs.list.map((status) => {
    let li = existing.get(status.job_id);
    if (!li) {
      li = document.createElement("li");
      li.dataset.jobId = status.job_id;
      li.innerHTML = `<a class="job-item" data-testid="job-item">
          <span class="badge"></span>
          <span class="job-name"></span>
          <code class="job-id"></code>
          <span class="job-msg"></span>
        </a>`;
    }
    const a = li.firstElementChild;
    const params = new URLSearchParams({ job: status.job_id });
    a.href = `#${params}`;
    a.dataset.jobId = status.job_id;
    a.dataset.phase = status.phase;
    if (status.job_id === selectedId) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
    const badge = a.querySelector(".badge");
    badge.dataset.phase = status.phase;
    badge.textContent = fmt.phaseLabel(status.phase);
    a.querySelector(".job-name").textContent = jobs.displayName(status.job_id, "");
    a.querySelector(".job-id").textContent = status.job_id;
    const position = status.phase === "idle" && status.details ? status.details.queue_position : null;
    const msg = a.querySelector(".job-msg");
    msg.textContent = position ? `#${position} in queue` : status.error || status.message;
    msg.dataset.testid = position ? "queue-position" : "job-message";
    return li;
  });
  // Reorder only when needed, so that focus and hover stay put while polling.
  const same = items.length === list.children.length && items.every((li, i) => list.children[i] === li);
  if (!same) list.replaceChildren(...items);
}

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { job: params.get("job"), compare: params.get("compare") };
}

async function main() {
  const writer = new HistoryWriter();
  await openHistory();
  const serverState = document.querySelector("[data-testid=server-state]");
  const settings = document.getElementById("settings");
  const tokenInput = document.getElementById("token-input");
  const settingsNote = document.getElementById("settings-note");
  let unauthorizedDismissed = false;

  const jobs = new JobsIndex({
    onUpdate: () => {
      renderJobList(jobs, view.jobId);
      const { job } = route();
      if (!job && jobs.list.length && !view.jobId) {
        history.replaceState(null, "", `#job=${jobs.list[0].job_id}`);
        showRoute();
      }
      if (view.jobId) view.schedule();
    },
    onServerState: (state) => {
      serverState.dataset.state = state;
      serverState.textContent =
        state === "ok" ? "Connected" : state === "unauthorized" ? "API token needed" : "Server unreachable, retrying…";
    },
  });
  const view = new JobView(document.getElementById("job-view"), { writer, jobs });

  function showRoute() {
    const { job, compare } = route();
    document.getElementById("no-job").hidden = Boolean(job);
    if (job) view.show(job, compare);
    else view.hide();
    renderJobList(jobs, view.jobId);
  }

  function renderTokenState() {
    const set = Boolean(getToken());
    const el = document.getElementById("token-state");
    el.textContent = set ? "token set" : "no token";
    el.dataset.set = String(set);
  }

  function openSettings(note) {
    if (settings.open) return;
    tokenInput.value = getToken();
    settingsNote.hidden = !note;
    settingsNote.textContent = note || "";
    settings.showModal();
    tokenInput.focus();
    tokenInput.select();
  }

  document.getElementById("settings-button").addEventListener("click", () => openSettings(""));
  document.getElementById("settings-cancel").addEventListener("click", () => settings.close("cancel"));
  settings.addEventListener("close", () => {
    if (settings.returnValue === "save") {
      setToken(tokenInput.value);
      unauthorizedDismissed = false;
    } else if (!settingsNote.hidden) {
      unauthorizedDismissed = true; // asked and declined: stop asking until a 401 after a new token
    }
    settings.returnValue = "";
  });
  document.getElementById("clear-history").addEventListener("click", async () => {
    if (!confirm("Delete every run's metric history kept in this browser? The server keeps its own copy.")) return;
    await clearHistory();
    location.reload();
  });

  window.addEventListener("studio:unauthorized", () => {
    if (!unauthorizedDismissed) {
      openSettings("This server wants an API token: enter the value of FINETUNE_STUDIO_TOKEN it was started with.");
    }
  });
  window.addEventListener("studio:token", () => {
    renderTokenState();
    jobs.refresh();
    view.retry();
  });
  window.addEventListener("storage", (event) => {
    if (event.key === "finetune-studio.token") setToken(getToken());
  });

  const form = new StartForm(document.getElementById("start-form"), {
    onStarted: (jobId, body) => {
      jobs.remember(jobId, { details: { model_name: body.model_name, project_name: body.project_name || "" } });
      location.hash = new URLSearchParams({ job: jobId }).toString();
      jobs.refresh();
    },
  });

  window.addEventListener("hashchange", showRoute);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) jobs.refresh();
  });

  // A small read-only window into the page for tests and for people debugging it.
  window.__studio = {
    jobId: () => view.jobId,
    phase: () => (view.feed ? view.feed.phase : null),
    steps: () => (view.feed ? view.feed.steps.slice() : []),
    points: (chart = "loss", series = 0) => (view.charts ? view.charts[chart].points(series) : 0),
    lastEventId: () => (view.feed ? view.feed.lastId : 0),
    eventCount: () => (view.feed ? view.feed.eventCount : 0),
    historyCount: () => (view.feed && view.feed.historyLoaded ? view.feed.historyCount : null),
    historyPoints: () => (view.feed && view.feed.historyLoaded ? view.feed.historySteps : null),
    connection: () => (view.feed ? view.feed.connection.state : null),
    compareId: () => (view.compare ? view.compare.jobId : null),
    comparePoints: () => (view.compare ? view.compare.steps.length : 0),
    connections: connectionLog,
    written: () => writer.written,
    flushed: () => writer.idle,
  };

  renderTokenState();
  showRoute();
  await form.load();
  jobs.poll();
  document.body.dataset.ready = "true";
}

main().catch((error) => {
  console.error(error);
  document.body.dataset.ready = "error";
});
