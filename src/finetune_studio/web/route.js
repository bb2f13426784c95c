// Where the page is, kept in the location's hash: #job=<id>[&compare=<id>] names
// the run shown and the one overlaid on its charts. Links and the back button
// work because every change of view goes through the hash.

/** The run shown and the one compared with it, from the hash (null when absent). */
export function currentRoute() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { job: params.get("job"), compare: params.get("compare") };
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
