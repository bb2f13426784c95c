// The job view's tracker line: where the run is logged (details.trackers, from the request's
// report_to; training/trackers.py), with a link to the tracker's run where it has a web address
// (an MLflow server, a Trackio Space), else the run's id and where its store is.
// Hidden for a run logged to no tracker.

import { el } from "./dom.js";

const NAMES = { mlflow: "MLflow", trackio: "Trackio" };

/** `url` when it is an http(s) address (never a javascript: one), else null. */
function webAddress(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

function describe(tracker) {
  if (tracker.name === "mlflow") return [`run ${tracker.run_id} in ${tracker.experiment}`, tracker.tracking_uri];
  if (tracker.name === "trackio") return [`project ${tracker.project}, run ${tracker.run}`, tracker.url ? null : `trackio show --project "${tracker.project}"`];
  return [tracker.run_id || "", null];
}

/** Draw `box` for `status` (the run's latest). */
export function renderTrackers(box, status) {
  const trackers = (status && status.details && Array.isArray(status.details.trackers)) ? status.details.trackers : [];
  const key = JSON.stringify(trackers);
  if (box.dataset.key === key) return; // a hovered title or a selection survives the per-frame render
  box.dataset.key = key;
  box.hidden = !trackers.length;
  box.replaceChildren(...trackers.map((tracker) => {
    const [what, where] = describe(tracker);
    const label = NAMES[tracker.name] || tracker.name;
    const href = tracker.url ? webAddress(tracker.url) : null;
    const name = href
      ? el("a", { href, target: "_blank", rel: "noopener", "data-testid": `tracker-link-${tracker.name}` }, `${label}: ${what}`)
      : el("span", `${label}: ${what}`);
    return el("div", { class: "tracker", "data-testid": `tracker-${tracker.name}` }, name,
      where ? el("code", { class: "muted tracker-where", title: where }, ` ${where}`) : null);
  }));
}
