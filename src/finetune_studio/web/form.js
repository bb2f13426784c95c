// The start form: the whole training request (fields.js: the common fields first,
// the rest under "Advanced"), with defaults from the server's request model
// (/openapi.json) and from the machine (/system: no 4-bit loading or 8-bit
// optimizer where CUDA cannot do them; the Cluster fields only where jobs run on a
// Ray cluster, as only such a server takes them). Mistakes are shown beside their field, in
// the field's words: a number field refuses letters as they are typed, and the
// server's refusal (400 naming `field`, or 422 with `loc`) lands at the field too.

import { api, ApiError } from "./api.js";
import { BY_NAME, buildAdvanced, fieldLabel, fieldNamedIn, formatValue, inWords, parseValue } from "./fields.js";
import { bytes, shortExp } from "./format.js";

const REMEMBERED = ["model_name", "local_datasets", "format_type", "training_type"];
const MEMORY_KEY = "finetune-studio.form";
// Keys of a stored request that are the server's notes, never fields to send.
const NOT_FIELDS = new Set(["withheld_secrets", "queued_warnings"]);

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
    bad_rows: ["error", "skip"],
  },
  descriptions: {},
  known: null, // the request model's field names (null: /openapi.json was not read)
};

/** A property's enum, also where pydantic writes an Optional[Literal] as anyOf. */
function enumOf(prop) {
  if (Array.isArray(prop.enum)) return prop.enum;
  for (const option of prop.anyOf || []) if (Array.isArray(option.enum)) return option.enum;
  return null;
}

async function requestModel() {
  const model = structuredClone(FALLBACK);
  try {
    const spec = await api("openapi.json");
    const schema = spec.components.schemas.TrainingStartRequest;
    model.known = new Set(Object.keys(schema.properties));
    for (const [name, prop] of Object.entries(schema.properties)) {
      if ("default" in prop) model.defaults[name] = prop.default;
      else if (!(schema.required || []).includes(name)) model.defaults[name] = null;
      const values = enumOf(prop);
      if (values) model.enums[name] = values;
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
  /** onStarted(jobId, body) after the server queued a run. */
  constructor(form, { onStarted }) {
    this.form = form;
    this.onStarted = onStarted;
    this.errorBox = form.querySelector("#start-error");
    this.resultBox = form.querySelector("#start-result");
    this.button = form.querySelector("[type=submit]");
    this.advanced = form.querySelector("#advanced");
    this.model = FALLBACK;
    this.system = null;
    this.carried = {}; // fields of a run shown again that the form has no field for
    this.busy = false;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    // Enter submits from any field; in a list of paths it makes a new line, and
    // Ctrl+Enter (or Cmd+Enter) submits.
    form.addEventListener("keydown", (event) => {
      if (event.target.tagName === "TEXTAREA" && event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    // A number field says at once when its text is no number; other fields forget their error when edited.
    form.addEventListener("input", (event) => {
      const field = BY_NAME.get(event.target.name);
      if (field && (field.kind === "int" || field.kind === "float")) {
        const { error } = parseValue(field, event.target.value);
        if (error) this.setFieldError(field.name, error);
        else this.setFieldError(field.name, null);
      } else if (event.target.name) {
        this.setFieldError(event.target.name, null);
      }
    });
    form.addEventListener("change", (event) => {
      if (event.target.name === "training_method") this.showMethodFields();
    });
    form.querySelector("#reset-form").addEventListener("click", () => this.fill(true));
  }

  async load() {
    const [model, system] = await Promise.all([
      requestModel(),
      api("system").catch(() => null), // 401 before a token is entered: defaults without it
    ]);
    this.model = model;
    this.system = system;
    buildAdvanced(this.form.querySelector("#advanced-fields"), model.known, model.enums);
    const method = this.form.querySelector("[data-field=training_method]");
    method.hidden = !(model.known && model.known.has("training_method") && model.enums.training_method);
    for (const name of ["format_type", "training_type", "training_method"]) {
      const select = this.form.elements[name];
      const values = model.enums[name] || [];
      select.replaceChildren(...values.map((value) => new Option(value, value)));
    }
    for (const [name, text] of Object.entries(model.descriptions)) {
      const field = this.form.elements[name];
      if (field && field.title === "" && !(field instanceof RadioNodeList)) field.title = text;
    }
    this.renderSystem();
    this.showClusterFields();
    this.fill(false);
  }

  /**
   * Ask /system again when the first answer was missing (a 401 before the token was
   * entered): the machine's note and the Cluster fields appear; what was typed stays.
   */
  async refreshSystem() {
    if (this.system) return;
    this.system = await api("system").catch(() => null);
    this.renderSystem();
    this.showClusterFields();
  }

  /** Whether jobs run on a Ray cluster (/system's `ray`): only then are the Cluster fields shown and sent. */
  get onCluster() {
    return Boolean(this.system && this.system.ray);
  }

  showClusterFields() {
    for (const el of this.form.querySelectorAll("[data-cluster], [data-cluster-group]")) el.hidden = !this.onCluster;
  }

  /** The machine in one line, and why 4-bit loading and the 8-bit optimizer are off. */
  renderSystem() {
    const note = this.form.querySelector("#system-note");
    const s = this.system;
    if (!s) {
      note.hidden = true;
      return;
    }
    const gpu = s.cuda ? `${s.gpus.length || 1} CUDA GPU${s.gpus.length > 1 ? "s" : ""} (${s.torch_cuda})` : "no CUDA GPU";
    const memory = s.memory_bytes ? `${bytes(s.memory_bytes)} memory` : "";
    const parts = [`${s.cpu_count} CPU${s.cpu_count === 1 ? "" : "s"}`, memory, gpu].filter(Boolean);
    let text = `This server: ${parts.join(", ")}.`;
    if (!s.recommended.load_in_4bit) {
      text += s.cuda
        ? " bitsandbytes is not installed, so 4-bit loading and the 8-bit optimizer are off."
        : " 4-bit loading and the 8-bit optimizer need CUDA, so they are off.";
    }
    if (s.ray) text += ` Jobs train on the Ray cluster at ${s.ray.address}.`;
    note.textContent = text;
    note.hidden = false;
  }

  /** The form's fields, as fields.js describes them. */
  fields() {
    return [...BY_NAME.values()].filter((field) => this.form.elements[field.name]);
  }

  /** The default of a field here: the request model's, then what suits this machine. */
  defaultOf(name) {
    const recommended = this.system ? this.system.recommended : null;
    if (recommended && name in recommended) return recommended[name];
    if (name in this.model.defaults) return this.model.defaults[name];
    const values = this.model.enums[name];
    return values ? values[0] : null;
  }

  setValue(field, value) {
    const input = this.form.elements[field.name];
    if (field.kind === "bool") input.checked = Boolean(value);
    else if (field.kind === "select") input.value = value ?? input.options[0]?.value ?? "";
    else input.value = formatValue(field, value, shortExp);
  }

  /** Put the defaults in; unless `reset`, restore what was used last for model and data. */
  fill(reset) {
    for (const field of this.fields()) {
      if (field.kind === "secret" || field.name === "model_name" || field.name === "local_datasets") {
        this.form.elements[field.name].value = "";
      } else {
        this.setValue(field, this.defaultOf(field.name));
      }
    }
    if (!reset) {
      const last = remembered();
      for (const name of REMEMBERED) if (typeof last[name] === "string") this.form.elements[name].value = last[name];
    }
    this.carried = {};
    this.advanced.open = false;
    this.showMethodFields();
    this.clearMessages();
  }

  /**
   * Fill the form with a run's request (Run again): every field the form has, and
   * the rest kept to be sent as they were. `note` says where it came from.
   */
  fillFrom(request, { note = "", secrets = [] } = {}) {
    this.fill(true);
    const fields = this.fields();
    const names = new Set(fields.map((field) => field.name));
    let advanced = false;
    for (const field of fields) {
      if (!(field.name in request)) continue;
      this.setValue(field, request[field.name]);
      const value = request[field.name];
      const fallback = this.defaultOf(field.name);
      if (field.cluster && !this.onCluster) continue; // hidden, and not sent: nothing to open Advanced for
      if (!field.common && JSON.stringify(value ?? null) !== JSON.stringify(fallback ?? null)) advanced = true;
    }
    this.carried = Object.fromEntries(
      Object.entries(request).filter(([name, value]) => !names.has(name) && !NOT_FIELDS.has(name) && value !== undefined),
    );
    this.advanced.open = advanced;
    this.showMethodFields();
    const lines = [note];
    if (!this.onCluster && (request.num_workers > 1 || request.resources_per_worker)) {
      lines.push("That run asked for Ray workers; this server trains on this machine alone, so it runs in one process here.");
    }
    if (secrets.length) lines.push(`Enter ${secrets.map(fieldLabel).join(" and ")} again: secrets are never stored.`);
    this.resultBox.textContent = lines.filter(Boolean).join(" ");
    this.form.scrollIntoView({ block: "start" });
    this.form.elements.model_name.focus({ preventScroll: true });
  }

  /** Show the method fields of the chosen method only. */
  showMethodFields() {
    const method = this.form.elements.training_method ? this.form.elements.training_method.value : "";
    for (const wrap of this.form.querySelectorAll("[data-methods]")) {
      wrap.hidden = !wrap.dataset.methods.split(" ").includes(method);
    }
  }

  isShown(name) {
    const wrap = this.form.querySelector(`[data-field="${name}"]`);
    return !wrap || !wrap.hidden;
  }

  clearMessages() {
    this.errorBox.hidden = true;
    this.errorBox.replaceChildren();
    this.resultBox.textContent = "";
    for (const name of BY_NAME.keys()) this.setFieldError(name, null);
  }

  /** Show `message` beside the field `name` (null clears it), and mark the field. */
  setFieldError(name, message) {
    const input = this.form.elements[name];
    if (!input || input instanceof RadioNodeList) return;
    const wrap = input.closest(".field");
    let box = wrap.querySelector(":scope > .field-error");
    if (!message) {
      if (box) box.hidden = true;
      input.removeAttribute("aria-invalid");
      return;
    }
    if (!box) {
      box = document.createElement("small");
      box.className = "field-error";
      box.id = `error-${name}`;
      box.dataset.testid = `error-${name}`;
      // After the control (and its hint): read out with the field.
      input.after(box);
      const described = (input.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
      input.setAttribute("aria-describedby", [box.id, ...described].join(" "));
    }
    box.textContent = message;
    box.hidden = false;
    input.setAttribute("aria-invalid", "true");
    if (wrap.closest("#advanced")) this.advanced.open = true;
  }

  /** The request body, or the problems found without asking the server ([{field, message}]). */
  body() {
    const body = {};
    const problems = [];
    for (const field of this.fields()) {
      if (!this.isShown(field.name)) continue;
      const input = this.form.elements[field.name];
      if (field.kind === "bool") {
        body[field.name] = input.checked;
        continue;
      }
      if (field.kind === "select") {
        if (input.value) body[field.name] = input.value;
        continue;
      }
      const { value, error } = parseValue(field, input.value);
      if (error) problems.push({ field: field.name, message: error });
      else if (value !== undefined) body[field.name] = value;
    }
    if (!body.model_name) problems.push({ field: "model_name", message: "name a model folder, a .gguf file or a hub id" });
    if (!(body.local_datasets || []).length && !body.hf_dataset) {
      problems.push({ field: "local_datasets", message: "name at least one dataset file, upload one, or give a hub dataset under Advanced" });
    }
    for (const [name, value] of Object.entries(this.carried)) if (!(name in body)) body[name] = value;
    return { body, problems };
  }

  /**
   * Show problems: each beside its field (in the field's words), and a summary under
   * the button that names them; problems without a field appear in the summary alone.
   */
  showProblems(heading, problems) {
    const title = document.createElement("strong");
    title.textContent = heading;
    const list = document.createElement("ul");
    for (const { field, message } of problems) {
      const item = document.createElement("li");
      if (field && this.form.elements[field]) {
        this.setFieldError(field, message);
        const link = document.createElement("a");
        link.href = `#f-${field}`;
        link.textContent = fieldLabel(field);
        link.addEventListener("click", (event) => {
          event.preventDefault();
          this.form.elements[field].focus();
        });
        item.append(link, `: ${message}`);
      } else {
        item.textContent = message;
      }
      list.append(item);
    }
    this.errorBox.replaceChildren(title, list);
    this.errorBox.hidden = false;
  }

  /** The server's refusal as problems at fields: a 400's `field`, a 422's `loc`, or a field its text names. */
  problemsOf(error) {
    const body = error.body && typeof error.body === "object" ? error.body : {};
    if (Array.isArray(body.detail)) {
      return body.detail.map((item) => {
        const loc = (item.loc || []).filter((part) => part !== "body");
        let message = String(item.msg || "invalid").replace(/^Value error, /, "");
        let field = typeof loc[0] === "string" && this.form.elements[loc[0]] ? loc[0] : null;
        field ||= fieldNamedIn(message);
        if (field && !this.form.elements[field]) field = null;
        if (field) message = message.replace(new RegExp(`^${field}: `), "");
        const where = loc.length > 1 ? ` (${loc.slice(1).join(".")})` : "";
        return { field, message: inWords(message) + where };
      });
    }
    const text = typeof body.error === "string" ? body.error : error.lines.join(" ");
    let field = typeof body.field === "string" ? body.field : fieldNamedIn(text);
    if (field && !this.form.elements[field]) field = null;
    const message = field ? text.replace(new RegExp(`^${field}: `), "") : text;
    return [{ field, message: inWords(message) }];
  }

  async submit() {
    if (this.busy) return;
    this.clearMessages();
    const { body, problems } = this.body();
    if (problems.length) {
      this.showProblems(problems.length === 1 ? "Check this field" : `Check these ${problems.length} fields`, problems);
      this.form.elements[problems[0].field].focus();
      return;
    }
    this.busy = true;
    this.button.setAttribute("aria-disabled", "true");
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
      for (const input of this.form.querySelectorAll("input[type=password]")) input.value = "";
      this.resultBox.textContent = answer.message || `Queued ${answer.job_id}`;
      this.onStarted(answer.job_id, body);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        this.showProblems("The server wants an API token", [
          { field: null, message: "Open Settings (top right) and enter the token the server was started with." },
        ]);
      } else if (error instanceof ApiError) {
        const problems = this.problemsOf(error);
        const heading = error.status === 422 ? "The server cannot use these settings" : "The server refused to start this run";
        this.showProblems(heading, problems);
        const first = problems.find((problem) => problem.field);
        if (first) this.form.elements[first.field].focus();
      } else {
        this.showProblems("Could not reach the server", [{ field: null, message: String(error.message || error) }]);
      }
    } finally {
      this.busy = false;
      this.button.removeAttribute("aria-disabled");
      this.button.textContent = "Start training";
    }
  }
}
