// The list of runs in the sidebar card: one link per job, newest first, with its
// phase, name, id and latest message (or its place in the queue).

import { routeHash } from "./route.js";
import * as fmt from "./format.js";

/** Draw `jobs.list` (a JobsIndex) into #job-list, marking `selectedId` as the current run. */
export function renderJobList(jobs, selectedId) {
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
    msg.dataset.testid = position ? "queue-position" : "job-message";
    return li;
  });
  // Reorder only when needed, so that focus and hover stay put while polling.
  const same = items.length === list.children.length && items.every((li, i) => list.children[i] === li);
  if (!same) list.replaceChildren(...items);
}
