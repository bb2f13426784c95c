// The start form: defaults from the server's request model (/openapi.json), a
// request body built from the fields, and the server's refusal shown beside it.

import { api, ApiError, invalidFields } from "./api.js";
import { shortExp } from "./format.js";

const INTEGER_FIELDS = ["num_epochs", "max_steps", "batch_size", "lora_r", "lora_alpha", "max_seq_length"];
const REMEMBERED = ["model_name", "local_datasets", "format_type", "training_type"];
const MEMORY_KEY = "finetune-studio.form";

// Identical to TrainingStartRequest in schemas.py; /openapi.json overrides them at load.
const FALLBACK = {
  defaults: {
    num_epochs: 1,
    max_steps: null,
    learning_rate: 2e-4,
    batch_size: 1,
    lora_r: 16,
    lora_alpha: 16,
    max_seq_length: 2048,
  },
  enums: {
    format_type: ["auto", "alpaca", "chatml", "sharegpt", "raw"],
    training_type: ["LoRA/QLoRA", "Full Finetuning", "Continued Pretraining"],
  },
  descriptions: {},
};

async function requestModel() {
  const model = structuredClone(FALLBACK);
  try {
    const spec = await api("openapi.json");
    const schema = spec.components.schemas.TrainingStartRequest;
    for (const [name, prop] of Object.entries(schema.properties)) {
      if ("default" in prop) model.defaults[name] = prop.default;
      else if (name in model.defaults && !(schema.required || []).includes(name)) model.defaults[name] = null;
      if (Array.isArray(prop.enum)) model.enums[name] = prop.enum;
      if (prop.description) model.descriptions[name] = prop.description;
    }
  } catch (error) {
    console.warn("could not read /openapi.json; using built-in defaults", error);
  }
  return model;
}

function remembered() {
  try {
    return JSON.parse(localStorage.getItem(MEMORY_KEY) || "{}");
  } catch {
    return {};
  }
}

export class StartForm {
  constructor(form, { onStarted }) {
    this.form = form;
    this.onStarted = onStarted;
    this.errorBox = form.querySelector("#start-error");
    this.resultBox = form.querySelector("#start-result");
    this.button = form.querySelector("[type=submit]");
    this.model = FALLBACK;
    this.busy = false;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    // Enter submits from any field; in the dataset list it makes a new line, and
    // Ctrl+Enter (or Cmd+Enter) submits.
    form.elements.local_datasets.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    form.addEventListener("input", (event) => event.target.removeAttribute("aria-invalid"));
    form.querySelector("#reset-form").addEventListener("click", () => this.fill(true));
  }

  async load() {
    this.model = await requestModel();
    for (const name of ["format_type", "training_type"]) {
      const select = this.form.elements[name];
      select.replaceChildren(...this.model.enums[name].map((value) => new Option(value, value)));
    }
    for (const [name, text] of Object.entries(this.model.descriptions)) {
      const field = this.form.elements[name];
      if (field && !field.title) field.title = text;
    }
    this.fill(false);
  }

  /** Put the defaults in; unless `reset`, restore what was used last for model and data. */
  fill(reset) {
    const { defaults, enums } = this.model;
    const el = this.form.elements;
    el.model_name.value = "";
    el.local_datasets.value = "";
    el.project_name.value = "";
    el.format_type.value = enums.format_type[0];
    el.training_type.value = enums.training_type[0];
    for (const name of INTEGER_FIELDS) el[name].value = defaults[name] ?? "";
    el.learning_rate.value = shortExp(defaults.learning_rate);
    if (!reset) {
      const last = remembered();
      for (const name of REMEMBERED) if (typeof last[name] === "string") el[name].value = last[name];
    }
    this.clearMessages();
  }

  clearMessages() {
    this.errorBox.hidden = true;
    this.errorBox.replaceChildren();
    this.resultBox.textContent = "";
    for (const field of this.form.elements) field.removeAttribute?.("aria-invalid");
  }

  /** The request body; throws {field, message} for what cannot be sent at all. */
  body() {
    const el = this.form.elements;
    const body = {
      model_name: el.model_name.value.trim(),
      training_type: el.training_type.value,
      format_type: el.format_type.value,
      local_datasets: el.local_datasets.value.split(/\r?\n/).map((line) => line.trim()).filter(Boolean),
    };
    if (!body.model_name) throw { field: "model_name", message: "model_name: name a model folder, a .gguf file or a hub id" };
    for (const name of INTEGER_FIELDS) {
      const input = el[name];
      if (input.validity.badInput) throw { field: name, message: `${name}: enter a whole number` };
      const text = input.value.trim();
      if (text === "") continue; // the server's default
      const number = Number(text);
      body[name] = Number.isFinite(number) ? number : text;
    }
    const lr = el.learning_rate.value.trim();
    if (lr) body.learning_rate = lr; // a string, as the Studio sends it; the server parses it
    const label = el.project_name.value.trim();
    if (label) body.project_name = label;
    return body;
  }

  showError(heading, lines, fields = []) {
    const title = document.createElement("strong");
    title.textContent = heading;
    const list = document.createElement("ul");
    for (const line of lines) {
      const item = document.createElement("li");
      item.textContent = line;
      list.append(item);
    }
    this.errorBox.replaceChildren(title, list);
    this.errorBox.hidden = false;
    this.errorBox.scrollIntoView({ block: "nearest" });
    for (const name of fields) this.form.elements[name]?.setAttribute("aria-invalid", "true");
  }

  async submit() {
    if (this.busy) return;
    this.clearMessages();
    let body;
    try {
      body = this.body();
    } catch (problem) {
      this.showError("Check the form", [problem.message], [problem.field]);
      this.form.elements[problem.field]?.focus();
      return;
    }
    this.busy = true;
    this.button.disabled = true;
    this.button.textContent = "Starting…";
    try {
      const answer = await api("train/start", { method: "POST", body });
      try {
        const memory = {};
        for (const name of REMEMBERED) memory[name] = this.form.elements[name].value;
        localStorage.setItem(MEMORY_KEY, JSON.stringify(memory));
      } catch {
        // storage blocked: nothing to remember
      }
      this.resultBox.textContent = answer.message || `Queued ${answer.job_id}`;
      this.onStarted(answer.job_id, body);
    } catch (error) {
      if (error instanceof ApiError) {
        const heading =
          error.status === 401
            ? "The server wants an API token (Settings)"
            : error.status === 422
              ? "The server rejected these settings (HTTP 422)"
              : `The server refused to start this run (HTTP ${error.status})`;
        this.showError(heading, error.lines, invalidFields(error.body));
      } else {
        this.showError("Could not reach the server", [String(error.message || error)]);
      }
    } finally {
      this.busy = false;
      this.button.disabled = false;
      this.button.textContent = "Start training";
    }
  }
}
