// The export panel of a finished job's view (docs/API.md, Export): choose a format
// and quantizations, start an export, follow it stage by stage from its event stream
// (the same stream, ids and replay as a training job's: sse.js), and get its files
// with their sizes and download links, and the `ollama create` line to copy.
//
// The panel is shown for a job that completed, or that stopped after saving its
// adapter or model. It lists the job's exports (GET /export/jobs?job_id=), newest
// first, and follows each one that has not ended. Every text from the server is
// put in the page as text, never as markup.

import { api, ApiError, authHeaders } from "./api.js";
import { el } from "./dom.js";
import { bytes, errorHeadline, phaseLabel, TERMINAL } from "./format.js";
import { RunPanel } from "./followed.js";

const FORMATS = [
  ["gguf", "GGUF: llama.cpp, Ollama, LM Studio"],
  ["merged_16bit", "Merged 16-bit safetensors: transformers, vLLM"],
  ["lora_gguf", "The LoRA adapter as GGUF: llama.cpp --lora"],
];
// llama.cpp's names (schemas.GgufQuantization, LoraGgufType); q4_k_m is the usual choice.
const GGUF_QUANTS = ["q4_k_m", "q5_k_m", "q6_k", "q8_0", "f16", "bf16"];
const LORA_TYPES = ["f16", "bf16", "q8_0"];
const STAGES = ["merging", "converting", "quantizing"];
const STAGE_LABELS = { merging: "Merging", converting: "Converting", quantizing: "Quantizing" };
const EXPORT_PHASE_LABELS = { merging: "Merging", converting: "Converting", quantizing: "Quantizing" };

function exportPhaseLabel(phase) {
  return EXPORT_PHASE_LABELS[phase] ?? phaseLabel(phase);
}

function downloadPath(exportId, name) {
  return `export/download/${encodeURIComponent(exportId)}/${name.split("/").map(encodeURIComponent).join("/")}`;
}

/** A download that carries the API token: fetched, then saved from memory (a link cannot send a header). */
async function downloadWithToken(path, filename) {
  const response = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (!response.ok) throw new Error(`the server answered HTTP ${response.status}`);
  const url = URL.createObjectURL(await response.blob());
  const link = el("a", { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export class ExportPanel extends RunPanel {
  constructor(jobRoot) {
    // export id -> { status, stages: {stage: progress}, percent, ... }, each followed while it runs
    super(jobRoot, "export", (item, event) => this.onEvent(item, event));
    this.hasAdapter = true;
  }

  build() {
    this.format = el("select", { id: "export-format", "data-testid": "export-format", onchange: () => this.renderChoices() },
      ...FORMATS.map(([value, label]) => el("option", { value }, label)));
    this.quants = el("fieldset", { class: "export-quants", "data-testid": "export-quants" });
    this.startButton = el("button", { type: "submit", class: "btn btn-primary", "data-testid": "export-start" }, "Export");
    this.errorBox = el("div", { class: "alert alert-error", "data-testid": "export-error", role: "alert", hidden: true });
    this.list = el("ul", { class: "export-list", "data-testid": "export-list", "aria-label": "Exports of this run, newest first" });
    const submit = (event) => {
      event.preventDefault();
      this.start();
    };
    const form = el("form", { class: "export-form", "data-testid": "export-form", onsubmit: submit },
      el("label", { class: "export-field" }, el("span", "Format"), this.format),
      this.quants,
      this.startButton);
    const section = el("section", { class: "export-panel", "data-testid": "export-panel", "aria-labelledby": "export-title", hidden: true },
      el("h3", { id: "export-title" }, "Export"),
      el("p", { class: "muted export-hint" }, "Take the result elsewhere: llama.cpp, Ollama, LM Studio, vLLM."),
      form, this.errorBox, this.list);
    this.renderChoices();
    return section;
  }

  renderChoices() {
    const format = this.format.value;
    this.quants.replaceChildren();
    if (format === "merged_16bit") {
      this.quants.append(el("legend", "16-bit safetensors, with the tokenizer and chat template"));
      return;
    }
    const lora = format === "lora_gguf";
    this.quants.append(el("legend", lora ? "Type (one)" : "Quantizations (one file each)"));
    for (const name of lora ? LORA_TYPES : GGUF_QUANTS) {
      const input = el("input", {
        type: lora ? "radio" : "checkbox", name: "export-quant", value: name, "data-testid": `export-quant-${name}`,
        checked: name === (lora ? "f16" : "q4_k_m"),
      });
      this.quants.append(el("label", { class: "export-quant" }, input, el("span", name)));
    }
  }

  /** Called by the job view on each render with the training job's phase and status. */
  render(phase, status) {
    const details = (status && status.details) || {};
    const saved = Boolean(details.adapter_dir || details.model_dir);
    const eligible = this.jobId != null && (phase === "completed" || (phase === "stopped" && saved));
    this.root.hidden = !eligible;
    if (!eligible) return;
    // A full fine-tuning has no adapter to export alone.
    this.hasAdapter = !details.model_dir || Boolean(details.adapter_dir);
    const loraOption = this.format.querySelector('option[value="lora_gguf"]');
    loraOption.disabled = !this.hasAdapter;
    if (!this.hasAdapter && this.format.value === "lora_gguf") {
      this.format.value = "gguf";
      this.renderChoices();
    }
    this.loadOnce();
  }

  listPath(jobId) {
    return `export/jobs?job_id=${encodeURIComponent(jobId)}`;
  }

  /** Remember an export and follow it while it runs. */
  track(status) {
    return this.followed.track(status.export_id, status, () => ({ stages: {}, percent: null, copied: null, downloadError: null }));
  }

  onEvent(item, event) {
    if (event.kind === "progress") {
      item.stages[event.data.stage] = event.data;
      item.percent = event.data.progress_percent;
    }
    this.schedule();
  }

  async start() {
    if (this.busy || !this.jobId) return;
    const format = this.format.value;
    const body = { job_id: this.jobId, format };
    const chosen = [...this.quants.querySelectorAll("input:checked")].map((input) => input.value);
    if (format !== "merged_16bit") {
      if (!chosen.length) {
        this.error = { headline: "Choose at least one quantization", lines: [] };
        this.schedule();
        return;
      }
      body.quantization = chosen;
    }
    this.busy = true;
    this.error = null;
    this.schedule();
    try {
      const answer = await api("export/start", { method: "POST", body });
      const status = await api(`export/status/${encodeURIComponent(answer.export_id)}`);
      this.track(status);
    } catch (error) {
      const code = error instanceof ApiError && error.body ? error.body.error_code : null;
      const lines = error instanceof ApiError ? error.lines : [String(error.message || error)];
      this.error = { headline: code ? errorHeadline(code) : "The export was not started", lines };
    } finally {
      this.busy = false;
      this.schedule();
    }
  }

  async stop(exportId) {
    try {
      await api(`export/stop/${encodeURIComponent(exportId)}`, { method: "POST" });
    } catch (error) {
      const item = this.followed.get(exportId);
      if (item) item.downloadError = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
      this.schedule();
    }
  }

  draw() {
    this.startButton.disabled = this.busy;
    this.startButton.textContent = this.busy ? "Starting…" : "Export";
    this.errorBox.hidden = !this.error;
    if (this.error) {
      this.errorBox.replaceChildren(el("strong", this.error.headline),
        ...this.error.lines.map((line) => el("div", line)));
    }
    const items = this.followed.newestFirst();
    this.list.replaceChildren(...items.map(([id, item]) => this.drawItem(id, item)));
  }

  drawItem(exportId, item) {
    const status = item.status;
    const details = status.details || {};
    const phase = status.phase;
    const quants = details.quantizations && details.quantizations.length ? ` (${details.quantizations.join(", ")})` : "";
    const head = el("div", { class: "export-head" },
      el("span", { class: "badge", "data-phase": phase, "data-testid": "export-phase" }, exportPhaseLabel(phase)),
      el("span", { class: "export-what" }, `${details.format || ""}${quants}`),
      el("code", { class: "job-id" }, exportId));
    if (!TERMINAL.has(phase)) {
      head.append(el("button", {
        type: "button", class: "btn btn-small btn-danger", "data-testid": "export-stop", onclick: () => this.stop(exportId),
      }, "Stop"));
    }
    const node = el("li", { class: "export-item", "data-testid": "export-item", "data-export-id": exportId, "data-phase": phase }, head);
    const stages = STAGES.filter((stage) => item.stages[stage]);
    if (stages.length && phase !== "completed") {
      const rows = stages.map((stage) => {
        const data = item.stages[stage];
        const share = data.total ? (100 * data.done) / data.total : 0;
        return el("div", { class: "export-stage", "data-testid": "export-stage", "data-stage": stage },
          el("span", `${STAGE_LABELS[stage]}${data.file ? ` ${data.file}` : ""}`),
          el("progress", { max: "100", value: share.toFixed(1), "aria-label": `${STAGE_LABELS[stage]} progress` }),
          el("span", { class: "muted" }, `${data.done}/${data.total}`));
      });
      node.append(el("div", { class: "export-stages" }, ...rows));
    }
    if (item.percent != null && !TERMINAL.has(phase)) {
      node.append(el("p", { class: "muted", "data-testid": "export-percent" }, `${item.percent.toFixed(1)}% of the export`));
    }
    if (phase === "error") {
      node.append(el("div", { class: "alert alert-error", role: "alert", "data-testid": "export-failure" },
        el("strong", errorHeadline(details.error_code)),
        el("div", status.error || status.message)));
    } else if (phase === "stopped") {
      node.append(el("p", { class: "muted" }, status.message));
    }
    if (phase === "completed") this.drawFiles(node, exportId, item);
    if (item.downloadError) node.append(el("p", { class: "alert alert-error" }, item.downloadError));
    return node;
  }

  drawFiles(node, exportId, item) {
    const files = (item.status.details || {}).files || [];
    const list = el("ul", { class: "export-files", "data-testid": "export-files" });
    for (const file of files) {
      const base = file.name.split("/").pop();
      const href = downloadPath(exportId, file.name);
      const download = (event) => {
        if (!authHeaders().Authorization) return; // a plain link does it
        event.preventDefault();
        item.downloadError = null;
        downloadWithToken(href, base).catch((error) => {
          item.downloadError = `The download of ${file.name} failed: ${error.message || error}`;
          this.schedule();
        });
      };
      const link = el("a", { href, download: base, "data-testid": "export-file-link", onclick: download }, file.name);
      list.append(el("li", { "data-testid": "export-file", "data-name": file.name },
        link, el("span", { class: "muted", "data-testid": "export-file-size" }, ` ${bytes(file.bytes)}`)));
    }
    node.append(list);
    if (files.some((file) => file.name === "Modelfile")) {
      const command = `ollama create finetune-${this.jobId} -f Modelfile`;
      const copyCommand = async () => {
        try {
          await navigator.clipboard.writeText(command);
          item.copied = "Copied";
        } catch {
          item.copied = "Select and copy";
        }
        this.schedule();
      };
      const copy = el("button", { type: "button", class: "btn btn-small", "data-testid": "copy-ollama", onclick: copyCommand }, item.copied || "Copy");
      node.append(el("div", { class: "export-ollama" },
        el("span", { class: "muted" }, "Download the files into one folder, then run there:"),
        el("code", { "data-testid": "ollama-command" }, command), copy));
    }
  }
}
