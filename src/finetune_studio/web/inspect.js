// The dataset preview: what a job would make of the data (POST /datasets/inspect),
// drawn into a given element. The shape and rows, tokens per row, the first rows as
// the model sees them (the part the loss covers highlighted, what max_seq_length
// cuts off struck through), every problem with its file and line, and a suggested
// column mapping with a button that fills the form's custom_format_mapping.
//
//   inspectInto(box, body)        post `body` (a DatasetInspectRequest) and draw the answer
//   renderInspection(box, report) draw a report already fetched
//   watchDatasetFields(form, box) re-inspect as the user edits the form's data fields

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";

// The form fields an inspection reads, as DatasetInspectRequest names them.
const WATCHED = ["local_datasets", "format_type", "model_name", "max_seq_length", "custom_format_mapping", "train_on_completions"];
const DEBOUNCE_MS = 700;

function count(n) {
  return Number(n || 0).toLocaleString();
}

/** One line about the data: "4 rows · chatml (detected) · 25–55 tokens per row (p50 47, p95 55) · 3 longer than 2,048". */
export function summary(report) {
  const parts = [];
  if (report.shape) {
    parts.push(`${count(report.rows)} rows`, `${report.shape}${report.detected ? " (detected)" : ""}`);
  }
  const t = report.tokens;
  if (t) {
    parts.push(`${count(t.min)}–${count(t.max)} tokens per row (mean ${Math.round(t.mean)}, p50 ${count(t.p50)}, p95 ${count(t.p95)})`);
    parts.push(`${count(report.truncated_rows)} longer than ${count(report.max_seq_length)}`);
  }
  if (report.skipped_rows) parts.push(`${count(report.skipped_rows)} bad rows skipped`);
  return parts.join(" · ");
}

// Set on the element (element.style), so the preview reads right wherever it is placed (no stylesheet needed).
const TRAINS = { background: "rgba(46, 160, 67, 0.18)" };
const CUT = { opacity: "0.55", textDecoration: "line-through" };

function segmentSpan(segment) {
  const title = [
    segment.role || "text",
    segment.truncated ? "cut off by max_seq_length" : segment.trains ? "the loss covers it" : "no loss",
  ].join(" · ");
  return el("span", {
    class: "inspect-seg",
    "data-trains": String(segment.trains),
    "data-truncated": String(segment.truncated),
    "data-role": segment.role || null,
    title,
    style: segment.truncated ? CUT : segment.trains ? TRAINS : null,
  }, segment.text);
}

function rowBlock(row) {
  const head = [`row ${row.index}`];
  if (row.tokens != null) head.push(`${count(row.tokens)} tokens`);
  if (row.clipped) head.push("shown in part");
  return el("div", { class: "inspect-row", "data-testid": "inspect-row" },
    el("small", { class: "muted" }, head.join(" · ")),
    el("pre", { style: { whiteSpace: "pre-wrap" } }, row.segments.map(segmentSpan)));
}

function suggestion(box, mapping) {
  const text = JSON.stringify(mapping);
  const form = box.closest("form");
  const field = form ? form.elements.namedItem("custom_format_mapping") : null;
  const useMapping = () => {
    field.value = text;
    field.dispatchEvent(new Event("input", { bubbles: true }));
    field.dispatchEvent(new Event("change", { bubbles: true }));
  };
  return el("p", { class: "inspect-suggestion", "data-testid": "inspect-suggestion" },
    el("span", "These columns are no known shape; a mapping that reads them: "),
    el("code", text),
    field && " ",
    field && el("button", { type: "button", class: "btn btn-ghost", "data-testid": "inspect-use-mapping", onclick: useMapping },
      "Use this mapping"));
}

/** Draw an inspection report (a DatasetInspection) into `box`. */
export function renderInspection(box, report) {
  const parts = [el("p", { class: "inspect-head", "data-testid": "inspect-summary" }, summary(report))];
  if (report.error) parts.push(el("p", { class: "inspect-error", "data-testid": "inspect-error" }, report.error));
  if (report.problems && report.problems.length && report.problem_counts && Object.keys(report.problem_counts).length) {
    const items = report.problems.map((problem) => {
      const where = [problem.file, problem.where].filter(Boolean).join(", ");
      return el("li", `${where}: ${problem.problem}`);
    });
    parts.push(el("ul", { class: "inspect-problems", "data-testid": "inspect-problems" }, items));
  }
  if (report.suggested_mapping) parts.push(suggestion(box, report.suggested_mapping));
  for (const warning of report.warnings || []) parts.push(el("p", { class: "inspect-warning muted" }, `Note: ${warning}`));
  if (report.preview && report.preview.length) {
    const how = report.rendered_with === "chat_template" ? "as the model sees them" : "each turn's text (name a model to see its template)";
    parts.push(el("small", { class: "muted" }, `First rows, ${how}; highlighted: the loss covers it; struck: cut off by max_seq_length`));
    parts.push(...report.preview.map(rowBlock));
  }
  box.dataset.ok = String(Boolean(report.ok));
  box.dataset.testid = box.dataset.testid || "inspect-report";
  box.replaceChildren(...parts);
  box.hidden = false;
}

/**
 * Inspect `body` and draw the answer into `box`; returns the report, or null when the
 * server could not answer (an older server without the route, busy, a refused path:
 * said in the box, never thrown). A later call aborts an earlier one still running.
 */
export async function inspectInto(box, body) {
  if (box._inspecting) box._inspecting.abort();
  const controller = new AbortController();
  box._inspecting = controller;
  box.hidden = false;
  box.setAttribute("aria-busy", "true");
  if (!box.childElementCount) box.replaceChildren(el("p", { class: "muted" }, "Reading the data…"));
  try {
    const report = await api("datasets/inspect", { method: "POST", body, signal: controller.signal });
    if (controller.signal.aborted) return null;
    renderInspection(box, report);
    return report;
  } catch (error) {
    if (controller.signal.aborted || (error && error.name === "AbortError")) return null;
    if (error instanceof ApiError && error.status === 404) {
      box.hidden = true; // a server without inspections
      return null;
    }
    const text = error instanceof ApiError ? error.lines.join(" ") : String((error && error.message) || error);
    box.dataset.ok = "false";
    box.replaceChildren(el("p", { class: "inspect-error", "data-testid": "inspect-error" }, `No preview: ${text}`));
    return null;
  } finally {
    if (box._inspecting === controller) {
      box._inspecting = null;
      box.removeAttribute("aria-busy");
    }
  }
}

/** The inspection request the form's data fields make, or null while no dataset is named. */
export function requestFromForm(form) {
  const value = (name) => {
    const field = form.elements.namedItem(name);
    if (!field) return undefined;
    return field.type === "checkbox" ? field.checked : String(field.value || "").trim();
  };
  const files = (value("local_datasets") || "").split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
  if (!files.length) return null;
  const body = { local_datasets: files, format_type: value("format_type") || "auto", preview_rows: 3 };
  const model = value("model_name");
  if (model) body.model_name = model;
  const length = Number(value("max_seq_length"));
  if (Number.isInteger(length) && length >= 8) body.max_seq_length = length;
  const mapping = value("custom_format_mapping");
  if (mapping) {
    try {
      const parsed = JSON.parse(mapping);
      if (parsed && typeof parsed === "object" && Object.keys(parsed).length) body.custom_format_mapping = parsed;
    } catch {
      // Not JSON yet (being typed): the form itself says so.
    }
  }
  if (value("train_on_completions") === true) body.train_on_completions = true;
  return body;
}

/** Re-inspect into `box` whenever the form's data fields settle after an edit. */
export function watchDatasetFields(form, box) {
  let timer = null;
  let lastKey = "";
  const refresh = () => {
    const body = requestFromForm(form);
    const key = JSON.stringify(body);
    if (key === lastKey) return;
    lastKey = key;
    if (!body) {
      if (box._inspecting) box._inspecting.abort();
      box.hidden = true;
      return;
    }
    inspectInto(box, body);
  };
  const soon = (event) => {
    if (!event.target || !WATCHED.includes(event.target.name)) return;
    clearTimeout(timer);
    timer = setTimeout(refresh, DEBOUNCE_MS);
  };
  form.addEventListener("input", soon);
  form.addEventListener("change", soon);
  return { refresh: () => { lastKey = ""; refresh(); } };
}
