// The start form's fields: every field of the training request the form offers,
// with the words a person reads for it (its label), how its text becomes a value,
// and where it sits (the common fields in index.html, the rest built here under
// "Advanced"). The server's error texts name fields by their API names; `inWords`
// puts the labels in their place.

import { el } from "./dom.js";

/**
 * kind: int | float | text | secret | bool | select | lines (one per line) | csv (a
 * comma list) | json (an object or a list, as JSON). `methods`: shown only for these
 * training methods. `cluster`: shown only when the server runs jobs on a Ray cluster
 * (/system's `ray`). `options`: a select's values (else the request model's enum).
 * `suggest`: values offered in a datalist.
 */
export const FIELDS = [
  // common: in index.html
  { name: "model_name", label: "Model", kind: "text", common: true },
  { name: "local_datasets", label: "Dataset files", kind: "lines", common: true },
  { name: "format_type", label: "Format", kind: "select", common: true },
  { name: "training_type", label: "Training", kind: "select", common: true },
  { name: "training_method", label: "Method", kind: "select", common: true },
  { name: "num_epochs", label: "Epochs", kind: "int", common: true },
  { name: "max_steps", label: "Max steps", kind: "int", common: true },
  { name: "batch_size", label: "Batch size", kind: "int", common: true },
  { name: "learning_rate", label: "Learning rate", kind: "float", common: true, asText: true },
  { name: "max_seq_length", label: "Max seq length", kind: "int", common: true },
  { name: "lora_r", label: "Rank r", kind: "int", common: true },
  { name: "lora_alpha", label: "Alpha", kind: "int", common: true },
  { name: "project_name", label: "Label", kind: "text", common: true },

  // Advanced: evaluation and data
  { name: "local_eval_datasets", label: "Evaluation files", kind: "lines", group: "Evaluation and data", hint: "One path per line." },
  { name: "eval_steps", label: "Evaluate every", kind: "float", group: "Evaluation and data", hint: "A fraction of the total steps, e.g. 0.1; 0: never." },
  { name: "early_stopping_patience", label: "Early-stopping patience", kind: "int", group: "Evaluation and data" },
  { name: "early_stopping_threshold", label: "Early-stopping threshold", kind: "float", group: "Evaluation and data" },
  { name: "eval_sample_count", label: "Sample answers per evaluation", kind: "int", group: "Evaluation and data" },
  { name: "hf_dataset", label: "Hub dataset", kind: "text", group: "Evaluation and data", hint: "A hub id, or a local dataset folder." },
  { name: "subset", label: "Subset", kind: "text", group: "Evaluation and data" },
  { name: "train_split", label: "Train split", kind: "text", group: "Evaluation and data" },
  { name: "eval_split", label: "Eval split", kind: "text", group: "Evaluation and data" },
  { name: "dataset_slice_start", label: "Slice start", kind: "int", group: "Evaluation and data" },
  { name: "dataset_slice_end", label: "Slice end", kind: "int", group: "Evaluation and data" },
  { name: "custom_format_mapping", label: "Column roles", kind: "json", group: "Evaluation and data", hint: 'JSON, e.g. {"question": "user", "answer": "assistant"}.' },
  { name: "bad_rows", label: "Bad rows", kind: "select", group: "Evaluation and data" },
  { name: "max_bad_row_fraction", label: "Most bad rows skipped", kind: "float", group: "Evaluation and data" },
  { name: "packing", label: "Pack short rows together", kind: "bool", group: "Evaluation and data" },
  { name: "train_on_completions", label: "Train on completions only", kind: "bool", group: "Evaluation and data" },

  // Advanced: method
  { name: "beta", label: "Beta", kind: "float", group: "Method", methods: ["dpo", "orpo", "kto", "grpo"] },
  { name: "reward_functions", label: "Reward functions", kind: "json", group: "Method", methods: ["grpo"], hint: 'JSON list, e.g. [{"name": "length", "target": 40}].' },
  { name: "num_generations", label: "Generations per prompt", kind: "int", group: "Method", methods: ["grpo"] },
  { name: "max_completion_length", label: "Max completion length", kind: "int", group: "Method", methods: ["grpo"] },

  // Advanced: schedule
  { name: "gradient_accumulation_steps", label: "Gradient accumulation", kind: "int", group: "Schedule" },
  { name: "warmup_steps", label: "Warm-up steps", kind: "int", group: "Schedule" },
  { name: "warmup_ratio", label: "Warm-up ratio", kind: "float", group: "Schedule" },
  { name: "save_steps", label: "Save every (steps)", kind: "int", group: "Schedule" },
  { name: "weight_decay", label: "Weight decay", kind: "float", group: "Schedule" },
  { name: "max_grad_norm", label: "Max gradient norm", kind: "float", group: "Schedule" },
  { name: "random_seed", label: "Seed", kind: "int", group: "Schedule" },
  { name: "optim", label: "Optimizer", kind: "text", group: "Schedule", suggest: ["adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"] },
  { name: "lr_scheduler_type", label: "LR schedule", kind: "text", group: "Schedule", suggest: ["linear", "cosine", "constant", "constant_with_warmup", "polynomial"] },
  { name: "resume_from_checkpoint", label: "Resume from", kind: "text", group: "Schedule", hint: "A checkpoint folder, a run's folder, or a run's id." },

  // Advanced: model and LoRA
  { name: "load_in_4bit", label: "Load in 4 bits (QLoRA)", kind: "bool", group: "Model and LoRA" },
  { name: "use_lora", label: "Train a LoRA adapter", kind: "bool", group: "Model and LoRA" },
  { name: "lora_dropout", label: "LoRA dropout", kind: "float", group: "Model and LoRA" },
  { name: "target_modules", label: "Target modules", kind: "csv", group: "Model and LoRA", hint: "Comma-separated, e.g. q_proj, v_proj; empty: all linear layers." },
  { name: "use_rslora", label: "Rank-stabilized LoRA", kind: "bool", group: "Model and LoRA" },
  { name: "use_dora", label: "DoRA", kind: "bool", group: "Model and LoRA" },
  { name: "use_loftq", label: "LoftQ initialization", kind: "bool", group: "Model and LoRA" },
  { name: "gradient_checkpointing", label: "Gradient checkpointing", kind: "text", group: "Model and LoRA", suggest: ["true", "unsloth"] },
  { name: "trust_remote_code", label: "Trust the model's own code", kind: "bool", group: "Model and LoRA" },
  { name: "model_local_path", label: "Local model folder", kind: "text", group: "Model and LoRA", hint: "Loads from here instead of Model." },
  { name: "hf_token", label: "Hub token", kind: "secret", group: "Model and LoRA", hint: "Sent once, never stored." },

  // Advanced: cluster (a server started with --ray-address only)
  { name: "num_workers", label: "Workers", kind: "int", group: "Cluster", cluster: true, hint: "Data-parallel workers on the Ray cluster. Global batch = batch size × gradient accumulation × workers." },
  { name: "resources_per_worker", label: "Resources per worker", kind: "json", group: "Cluster", cluster: true, hint: 'JSON, e.g. {"CPU": 2, "GPU": 1}; empty: {"CPU": 1}.' },

  // Advanced: logging
  { name: "report_to", label: "Experiment trackers", kind: "csv", group: "Logging", hint: "Comma-separated: mlflow (at the server's MLFLOW_TRACKING_URI), trackio, wandb, tensorboard." },
  { name: "enable_tensorboard", label: "TensorBoard", kind: "bool", group: "Logging" },
  { name: "tensorboard_dir", label: "TensorBoard folder", kind: "text", group: "Logging" },
  { name: "enable_wandb", label: "Weights & Biases", kind: "bool", group: "Logging" },
  { name: "wandb_project", label: "W&B project", kind: "text", group: "Logging" },
  { name: "wandb_token", label: "W&B token", kind: "secret", group: "Logging", hint: "Sent once, never stored." },
];

export const BY_NAME = new Map(FIELDS.map((field) => [field.name, field]));
export const SECRETS = new Set(FIELDS.filter((f) => f.kind === "secret").map((f) => f.name));

/** The label of a request field ("max_steps" -> "Max steps"); the name itself when unknown. */
export function fieldLabel(name) {
  const field = BY_NAME.get(name);
  return field ? field.label : name;
}

// Longest names first, so that "local_eval_datasets" is not read as "local_..." + something shorter.
const NAMES = [...BY_NAME.keys()].sort((a, b) => b.length - a.length);
const NAME_PATTERN = new RegExp(`\\b(${NAMES.join("|")})\\b`, "g");

/** A server text in the form's words: every field name replaced by its label. */
export function inWords(text) {
  return String(text).replace(NAME_PATTERN, (name) => fieldLabel(name));
}

/** The first request field a text names, or null. */
export function fieldNamedIn(text) {
  const found = String(text).match(new RegExp(`\\b(${NAMES.join("|")})\\b`));
  return found ? found[1] : null;
}

/** The text of a field for a value of the request (what `read` turns back into it). */
export function formatValue(field, value, shortExp) {
  if (value == null) return "";
  switch (field.kind) {
    case "lines":
      return Array.isArray(value) ? value.join("\n") : String(value);
    case "csv":
      return Array.isArray(value) ? value.join(", ") : String(value);
    case "json":
      return JSON.stringify(value);
    case "float":
      return field.name === "learning_rate" ? shortExp(value) : String(value);
    default:
      return String(value);
  }
}

/**
 * The value of a field's text: {value} (undefined: leave the field out, the
 * server's default) or {error} in words, for the field's own message.
 */
export function parseValue(field, text) {
  const raw = String(text ?? "").trim();
  switch (field.kind) {
    case "int":
      if (raw === "") return { value: undefined };
      if (!/^\d+$/.test(raw)) return { error: `enter a whole number such as 100, not “${raw.slice(0, 20)}”` };
      return { value: Number(raw) };
    case "float": {
      if (raw === "") return { value: undefined };
      const number = Number(raw);
      if (!Number.isFinite(number) || !/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(raw)) {
        return { error: `enter a number such as ${field.name === "learning_rate" ? "2e-4" : "0.1"}, not “${raw.slice(0, 20)}”` };
      }
      // The learning rate goes as the Studio sends it, a string; the server parses it.
      return { value: field.asText ? raw : number };
    }
    case "lines":
      return { value: raw.split(/\r?\n/).map((line) => line.trim()).filter(Boolean) };
    case "csv":
      return { value: raw.split(",").map((part) => part.trim()).filter(Boolean) };
    case "json":
      if (raw === "") return { value: undefined };
      try {
        return { value: JSON.parse(raw) };
      } catch (error) {
        return { error: `not valid JSON (${String(error.message || error).slice(0, 80)})` };
      }
    default:
      return { value: raw === "" ? undefined : raw };
  }
}

const INPUT_MODES = { int: "numeric", float: "decimal" };

/** One field of the Advanced section: label, control, hint; `enums` gives a select's values. */
function buildField(field, enums) {
  const id = `f-${field.name}`;
  const hint = field.hint ? el("small", { class: "hint", id: `hint-${field.name}` }, field.hint) : null;
  // Every control has these; its hint is read out with it.
  const common = { id, name: field.name, "data-testid": `field-${field.name}`, "aria-describedby": hint && hint.id };
  const label = el("label", { for: id }, field.label);
  let parts;
  if (field.kind === "bool") {
    parts = [el("input", { ...common, type: "checkbox" }), label];
  } else if (field.kind === "select") {
    const values = field.options || enums[field.name] || [];
    parts = [label, el("select", common, values.map((value) => new Option(value, value)))];
  } else if (field.kind === "lines" || field.kind === "json") {
    parts = [label, el("textarea", { ...common, rows: "2", spellcheck: "false" })];
  } else {
    const list = field.suggest && el("datalist", { id: `${id}-options` }, field.suggest.map((value) => new Option(value, value)));
    const input = el("input", {
      ...common, spellcheck: "false", autocomplete: "off", type: field.kind === "secret" ? "password" : null,
      inputmode: INPUT_MODES[field.kind], list: list && list.id,
    });
    parts = [label, list, input];
  }
  return el("div", {
    class: field.kind === "bool" ? "field field-check" : "field",
    "data-field": field.name,
    "data-methods": field.methods && field.methods.join(" "),
    "data-cluster": Boolean(field.cluster),
  }, parts, hint);
}

/**
 * Build the Advanced section's fields into `container`, one fieldset per group, for
 * the fields the server's request model has (`known`: its property names; null when
 * unknown, then every field but the method ones).
 */
export function buildAdvanced(container, known, enums) {
  const groups = new Map();
  for (const field of FIELDS) {
    if (field.common) continue;
    if (known ? !known.has(field.name) : Boolean(field.methods)) continue;
    if (!groups.has(field.group)) groups.set(field.group, []);
    groups.get(field.group).push(field);
  }
  const sets = [...groups].map(([group, fields]) =>
    // A group of cluster fields alone is hidden with them (showClusterFields in form.js).
    el("fieldset", { class: "group", "data-cluster-group": fields.every((field) => field.cluster) },
      el("legend", group),
      el("div", { class: "grid-adv" }, fields.map((field) => buildField(field, enums)))));
  container.replaceChildren(...sets);
}
