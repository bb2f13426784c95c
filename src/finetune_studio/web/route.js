// Where the page is, kept in the location's hash: #job=<id>[&compare=<id>] names
// the run shown and the one overlaid on its charts; #chat=<id>[&compare=1] the
// run chatted with (compare: beside its base model); #eval=<id> an evaluation
// (evaluation.js); #sweep=<id> a sweep (sweeps.js). Links and the back button work because every change of view goes
// through the hash.

/**
 * The run shown and the one compared with it, from the hash (null when absent);
 * or `chat`, the run chatted with, and `compareBase`, whether its base answers too; or
 * `evaluation`, the evaluation shown; or `sweep`, the sweep shown.
 */
export function currentRoute() {
  const params = new URLSearchParams(location.hash.slice(1));
  const chat = params.get("chat");
  const evaluation = params.get("eval");
  const sweep = params.get("sweep");
  const none = { job: null, compare: null, chat: null, compareBase: false, evaluation: null, sweep: null };
  if (sweep) return { ...none, sweep };
  if (evaluation) return { ...none, evaluation };
  if (chat) return { ...none, chat, compareBase: params.get("compare") === "1" };
  return { ...none, job: params.get("job"), compare: params.get("compare") };
}

/** The hash of a sweep's view, with its "#". */
export function sweepHash(sweepId) {
  return `#${new URLSearchParams({ sweep: sweepId })}`;
}

/** The hash of an evaluation's view, with its "#". */
export function evalHash(evalId) {
  return `#${new URLSearchParams({ eval: evalId })}`;
}

/** The hash of the chat with a run, with its "#"; `compareBase` puts its base model beside it. */
export function chatHash(job, compareBase = false) {
  const params = new URLSearchParams({ chat: job });
  if (compareBase) params.set("compare", "1");
  return `#${params}`;
}

/** The hash for a run (and optionally one compared with it), with its "#". */
export function routeHash(job, compare = null) {
  const params = new URLSearchParams({ job });
  if (compare) params.set("compare", compare);
  return `#${params}`;
}

/** Show a run: a new history entry, announced by "hashchange". */
export function goTo(job, compare = null) {
  location.hash = routeHash(job, compare);
}

/** Show a run in place of the current entry (no new history entry, no "hashchange"). */
export function replaceRoute(job) {
  history.replaceState(null, "", routeHash(job));
}
