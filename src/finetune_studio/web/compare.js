// The "Compare with" select in the job view's header: every other run on the
// server, and choosing one puts it in the location (#job=…&compare=…).

import { goTo } from "./route.js";
import { phaseLabel } from "./format.js";

export class CompareSelect {
  /** `currentJob()` is the run shown, whose list the select leaves out. */
  constructor(select, currentJob) {
    this.select = select;
    select.addEventListener("change", () => goTo(currentJob(), select.value || null));
  }

  /** Offer the runs of `jobs` (a JobsIndex) other than `jobId`; select `compareId`. */
  render(jobs, jobId, compareId) {
    const current = compareId || "";
    const options = [["", "none"]];
    for (const status of jobs.list) {
      if (status.job_id === jobId) continue;
      const state = status.phase === "completed" ? "" : ` (${phaseLabel(status.phase).toLowerCase()})`;
      options.push([status.job_id, `${jobs.shortName(status.job_id)} · ${status.job_id.slice(0, 6)}${state}`]);
    }
    if (current && !options.some(([id]) => id === current)) options.push([current, current]);
    const key = JSON.stringify(options);
    if (this.select.dataset.key !== key) {
      this.select.dataset.key = key;
      this.select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
    }
    if (this.select.value !== current) this.select.value = current;
  }
}
