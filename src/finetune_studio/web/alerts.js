// The job view's three panels in words: the error (headline from its code, the
// server's text, the last checkpoint), the warnings, and what a finished run left
// behind (adapter, model and output folders, final loss).

import * as fmt from "./format.js";

function element(tag, text) {
  return Object.assign(document.createElement(tag), { textContent: text });
}

function renderError(box, status, stopError) {
  const details = (status && status.details) || {};
  if (status && status.phase === "error") {
    const parts = [element("strong", fmt.errorHeadline(details.error_code)), element("p", status.error || status.message)];
    if (details.error_code) {
      const code = element("code", details.error_code);
      code.className = "error-code";
      code.dataset.testid = "error-code";
      parts.push(code);
    }
    if (details.last_checkpoint) {
      const checkpoint = element("p", `Last checkpoint: ${details.last_checkpoint}`);
      checkpoint.className = "muted";
      parts.push(checkpoint);
    }
    box.replaceChildren(...parts);
    box.hidden = false;
  } else if (stopError) {
    box.replaceChildren(element("strong", "Could not stop this run"), element("p", stopError));
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
  const title = element("strong", warnings.length === 1 ? "1 warning" : `${warnings.length} warnings`);
  const list = document.createElement("ul");
  for (const warning of warnings) list.append(element("li", warning));
  box.replaceChildren(title, list);
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
  const dl = document.createElement("dl");
  for (const [label, value] of rows) {
    const div = document.createElement("div");
    div.append(element("dt", label), element("dd", String(value)));
    dl.append(div);
  }
  box.replaceChildren(element("strong", phase === "completed" ? "Training completed" : "Stopped"), dl);
  box.hidden = false;
}

/** Draw the panels under `root` for `status` (the latest TrainingStatus), and a failed Stop. */
export function renderAlerts(root, status, stopError) {
  renderError(root.querySelector("#job-error"), status, stopError);
  renderWarnings(root.querySelector("#job-warnings"), (status && status.details) || {});
  renderOutputs(root.querySelector("#job-outputs"), status);
}
