// The job view's three panels in words: the error (headline from its code, the
// server's text, the last checkpoint), the warnings, and what a finished run left
// behind (adapter, model and output folders, final loss).

import { el } from "./dom.js";
import * as fmt from "./format.js";

function renderError(box, status, stopError) {
  const details = (status && status.details) || {};
  if (status && status.phase === "error") {
    const parts = [el("strong", fmt.errorHeadline(details.error_code)), el("p", status.error || status.message)];
    if (details.error_code) parts.push(el("code", { class: "error-code", "data-testid": "error-code" }, details.error_code));
    if (details.last_checkpoint) parts.push(el("p", { class: "muted" }, `Last checkpoint: ${details.last_checkpoint}`));
    box.replaceChildren(...parts);
    box.hidden = false;
  } else if (stopError) {
    box.replaceChildren(el("strong", "Could not stop this run"), el("p", stopError));
    box.hidden = false;
  } else {
    box.hidden = true;
    box.replaceChildren();
  }
}

function renderWarnings(box, details) {
  // A Ray run's restarts are warnings too; the cluster line (cluster.js) lists them already.
  const restarts = new Set(Array.isArray(details.restarts) ? details.restarts : []);
  const warnings = (Array.isArray(details.warnings) ? details.warnings : []).filter((warning) => !restarts.has(warning));
  box.hidden = warnings.length === 0;
  if (!warnings.length) return;
  const key = JSON.stringify(warnings);
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const title = warnings.length === 1 ? "1 warning" : `${warnings.length} warnings`;
  box.replaceChildren(el("strong", title), el("ul", warnings.map((warning) => el("li", warning))));
}

function renderOutputs(box, status) {
  const details = (status && status.details) || {};
  const phase = status && status.phase;
  if (phase !== "completed" && phase !== "stopped") {
    box.hidden = true;
    return;
  }
  const rows = [
    ["Adapter", details.adapter_dir],
    ["Model", details.model_dir],
    ["Output folder", details.output_dir],
    ["Final training loss", details.train_loss != null ? fmt.metric(details.train_loss) : null],
  ].filter(([, value]) => value != null && value !== "");
  const dl = el("dl", rows.map(([label, value]) => el("div", el("dt", label), el("dd", String(value)))));
  box.replaceChildren(el("strong", phase === "completed" ? "Training completed" : "Stopped"), dl);
  box.hidden = false;
}

/** Draw the panels under `root` for `status` (the latest TrainingStatus), and a failed Stop. */
export function renderAlerts(root, status, stopError) {
  renderError(root.querySelector("#job-error"), status, stopError);
  renderWarnings(root.querySelector("#job-warnings"), (status && status.details) || {});
  renderOutputs(root.querySelector("#job-outputs"), status);
}
