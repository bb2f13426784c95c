// The list of runs: one link per job, newest first, with its phase, name, id and
// latest message (or its place in the queue); searched by text and filtered by
// phase; it grows with the page, PAGE runs at a time.

import { routeHash } from "./route.js";
import * as fmt from "./format.js";

const PAGE = 50;
let shownCount = PAGE;

/** Show PAGE more runs. */
export function showMoreRuns() {
  shownCount += PAGE;
}

function matches(jobs, status, text, phase) {
  if (phase === "running" && (fmt.TERMINAL.has(status.phase) || status.phase === "idle")) return false;
  if (phase && phase !== "running" && status.phase !== phase) return false;
  if (!text) return true;
  const { model_name, project_name } = jobs.meta(status.job_id);
  const haystack = [status.job_id, model_name, project_name, status.message, status.error, fmt.phaseLabel(status.phase)]
    .join(" ")
    .toLowerCase();
  return text.split(/\s+/).every((word) => haystack.includes(word));
}

function emptyText(jobs, filtered) {
  if (jobs.state === "unauthorized") {
    return "This server wants an API token: its runs are shown once the token is entered in Settings (top right).";
  }
  if (!jobs.loaded) return jobs.state === "down" ? "The server cannot be reached: runs are shown once it answers." : "Loading runs…";
  if (filtered) return "No run matches the search.";
  return "No runs yet. Fill in the form and press Enter.";
}

/** Draw `jobs.list` (a JobsIndex) into #job-list, marking `selectedId` as the current run. */
export function renderJobList(jobs, selectedId) {
  const list = document.getElementById("job-list");
  const text = document.getElementById("job-search").value.trim().toLowerCase();
  const phase = document.getElementById("job-filter").value;
  const wanted = jobs.list.filter((status) => matches(jobs, status, text, phase));
  const empty = document.getElementById("jobs-empty");
  empty.hidden = wanted.length > 0;
  empty.dataset.state = jobs.state;
  const message = emptyText(jobs, jobs.list.length > 0);
  if (empty.textContent !== message) empty.textContent = message;
  const count = wanted.length === jobs.list.length ? String(jobs.list.length) : `${wanted.length} of ${jobs.list.length}`;
  document.getElementById("jobs-count").textContent = jobs.list.length ? count : "";
  const more = document.getElementById("more-runs");
  more.hidden = wanted.length <= shownCount;
  more.textContent = `Show more runs (${wanted.length - Math.min(shownCount, wanted.length)} more)`;
  const existing = new Map([...list.children].map((li) => [li.dataset.jobId, li]));
  const items = wanted.slice(0, shownCount).map((status) => {
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
    a.href = routeHash(status.job_id);
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
    // Long names and messages are cut to fit: the whole text on hover.
    a.title = `${a.querySelector(".job-name").textContent || status.job_id} · ${fmt.phaseLabel(status.phase)}: ${msg.textContent}`;
    msg.dataset.testid = position ? "queue-position" : "job-message";
    drawSparkline(a, status.details && status.details.summary ? status.details.summary.loss_sparkline : null);
    return li;
  });
  // Reorder only when needed, so that focus and hover stay put while polling.
  const same = items.length === list.children.length && items.every((li, i) => list.children[i] === li);
  if (!same) list.replaceChildren(...items);
}

const SVG = "http://www.w3.org/2000/svg";

/** The run's loss at a glance (`details.summary.loss_sparkline`, at most 64 points): a
 * tiny inline polyline, lowest loss at the bottom; nothing when there are under 2 points. */
function drawSparkline(a, points) {
  let svg = a.querySelector(".job-spark");
  const values = Array.isArray(points) ? points.filter((v) => Number.isFinite(v)) : [];
  if (values.length < 2) {
    if (svg) svg.remove();
    return;
  }
  if (!svg) {
    svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "job-spark");
    svg.setAttribute("viewBox", "0 0 64 16");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    svg.dataset.testid = "job-sparkline";
    svg.appendChild(document.createElementNS(SVG, "polyline"));
    a.appendChild(svg);
  }
  const low = Math.min(...values);
  const span = Math.max(...values) - low || 1;
  const step = 64 / (values.length - 1);
  const coords = values.map((v, i) => `${(i * step).toFixed(1)},${(15 - ((v - low) / span) * 14).toFixed(1)}`);
  svg.firstElementChild.setAttribute("points", coords.join(" "));
}
