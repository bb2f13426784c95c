// The job view's cluster line, for a run on a Ray cluster (docs/SCALE-OUT.md): its
// workers and what each asks for, the communication backend, how many restarts it
// has spent, where its files travel (a URI), what it waits for while Ray places the
// workers, and each restart in words. Hidden for a run trained on the server's machine.

import { el } from "./dom.js";
import { TERMINAL } from "./format.js";

/** {"CPU": 2, "GPU": 1} -> "2 CPU, 1 GPU"; Ray's default (one CPU) when none were asked for. */
export function describeResources(resources) {
  const entries = Object.entries(resources || {});
  if (!entries.length) return "1 CPU";
  return entries.map(([name, amount]) => `${amount} ${name}`).join(", ");
}

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

/**
 * Draw `box` for `status` (the run's latest) and `known` (the latest details that
 * carried `ray`: a status the server itself writes, a lost child's, has none).
 */
export function renderCluster(box, status, known) {
  const details = (status && status.details) || {};
  const facts = details.ray ? details : known;
  const ray = facts && facts.ray;
  if (!ray) {
    box.hidden = true;
    box.replaceChildren();
    delete box.dataset.key;
    return;
  }
  const restarts = Array.isArray(facts.restarts) ? facts.restarts : [];
  const storage = facts.storage;
  const rows = [
    ["Ray cluster", ray.address, "cluster-address"],
    ["Workers", `${ray.num_workers} × ${describeResources(ray.resources_per_worker)}`, "cluster-workers"],
    ["Backend", ray.backend, "cluster-backend"],
    ["Restarts", `${restarts.length} of at most ${ray.max_failures}`, "cluster-restart-count"],
    ["Storage", storage, "cluster-storage"],
  ].filter(([, value]) => value != null && value !== "");
  // A long URI is cut to the line: the whole of it on hover (the title).
  const items = rows.map(([label, value, testid]) =>
    el("div", el("dt", label), el("dd", { "data-testid": testid, title: String(value) }, String(value))));
  const parts = [el("dl", { class: "cluster-facts" }, items)];
  const waiting = details.waiting_for;
  if (waiting && !TERMINAL.has(status.phase)) {
    const count = waiting.num_workers ?? ray.num_workers;
    const each = describeResources(waiting.resources_per_worker ?? ray.resources_per_worker);
    parts.push(el("p", { "data-testid": "cluster-waiting" }, `Waiting for the cluster to place ${plural(count, "worker")} (${each} each)`));
  }
  if (restarts.length) {
    parts.push(el("ul", { "data-testid": "cluster-restarts" }, restarts.map((restart) => el("li", restart))));
  }
  // Redraw only on a change: a hovered title or a selection survives the per-frame render.
  const key = JSON.stringify([rows, waiting && !TERMINAL.has(status.phase) ? waiting : null, restarts]);
  box.hidden = false;
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.replaceChildren(...parts);
}
