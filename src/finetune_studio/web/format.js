// Words and numbers for people: phase names, durations, metrics, sizes, error codes, moments.

export const PHASES = ["idle", "loading_model", "loading_dataset", "configuring", "training"];
export const TERMINAL = new Set(["completed", "error", "stopped"]);

const PHASE_LABELS = {
  idle: "Queued",
  loading_model: "Loading model",
  loading_dataset: "Loading data",
  configuring: "Configuring",
  training: "Training",
  completed: "Completed",
  error: "Failed",
  stopped: "Stopped",
};

export function phaseLabel(phase) {
  return PHASE_LABELS[phase] ?? phase;
}

// What each error code means and what to do about it; the server's own `error`
// text is shown beneath, so these stay short. One entry per code of `ErrorCode`
// in schemas.py (tests/unit/test_web_codes.py checks it).
const ERROR_CODES = {
  model_not_found: "The model could not be loaded",
  dataset_invalid: "The dataset could not be read",
  dataset_not_found: "The dataset could not be found",
  config_invalid: "The settings cannot be used together",
  out_of_memory: "Out of memory: try a smaller batch size or max sequence length",
  disk_full: "The disk is full",
  training_failed: "Training failed",
  diverged: "The loss diverged: lower the learning rate or check the data",
  export_failed: "The export failed: its log says where",
  export_tools_missing: "llama.cpp's tools are not installed: install finetune-studio[gguf]",
  evaluation_failed: "The evaluation failed: its error says which model, task or judge",
  worker_died: "The training process ended unexpectedly",
  worker_failed_to_start: "The training process could not start",
  cluster_unavailable: "The Ray cluster could not be reached: check the server's --ray-address",
  storage_unavailable: "The job storage could not be read or written: check ray_storage_path and the nodes' credentials",
  server_restarted: "The server restarted while this run was going; its checkpoints are kept",
  internal_error: "The server failed while running this job: see its log",
};

export function errorHeadline(code) {
  if (!code) return "The run failed";
  return ERROR_CODES[code] ?? `The run failed (${code.replaceAll("_", " ")})`;
}

function pad2(n) {
  return String(n).padStart(2, "0");
}

/** 42 -> "0:42", 725 -> "12:05", 3723 -> "1:02:03". */
export function duration(seconds) {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  return h > 0 ? `${h}:${pad2(m)}:${pad2(rest)}` : `${m}:${pad2(rest)}`;
}

export function metric(value, digits = 4) {
  if (value == null || !Number.isFinite(value)) return "–";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
  return value.toFixed(digits);
}

export function rate(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  if (value === 0) return "0";
  return value.toExponential(2).replace("e-", "e−");
}

export function integer(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  return Math.round(value).toLocaleString("en-US");
}

export function percent(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  return `${value.toFixed(1)}%`;
}

// Decimal units, as disks and the server's sizes count them (1 kB = 1000 bytes).
const BYTE_UNITS = ["byte", "kilobyte", "megabyte", "gigabyte", "terabyte", "petabyte"];
const BYTE_FORMATS = BYTE_UNITS.map(
  (unit) =>
    new Intl.NumberFormat("en-US", {
      style: "unit",
      unit,
      // "512 bytes", then the short names: "1.5 kB", "734 MB", "5.37 GB".
      unitDisplay: unit === "byte" ? "long" : "short",
      maximumSignificantDigits: 3,
    }),
);

/**
 * A size in bytes as people read it, in the largest unit under its value and three
 * significant digits: 512 -> "512 bytes", 1536 -> "1.54 kB", 734003200 -> "734 MB",
 * 5368709120 -> "5.37 GB"; "–" when unknown.
 */
export function bytes(value) {
  if (value == null || !Number.isFinite(value)) return "–";
  let unit = 0;
  // Step up while the value would read 1,000 or more in this unit (999,999 bytes is "1 MB", not "1,000 kB").
  while (unit < BYTE_UNITS.length - 1 && Number((Math.abs(value) / 1000 ** unit).toPrecision(3)) >= 1000) unit += 1;
  const scaled = unit === 0 ? Math.round(value) : value / 1000 ** unit;
  return BYTE_FORMATS[unit].format(scaled);
}

/**
 * How long a phase took: 0.43 -> "0.4 s", 12.3 -> "12 s", 185 -> "3:05"; a phase
 * still running counts whole seconds, so its ticking reads 1 s, 2 s, 3 s.
 */
export function took(seconds, { running = false } = {}) {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return "";
  const s = running ? Math.floor(seconds) : seconds;
  if (s < 9.95 && !running) return `${s.toFixed(1)} s`;
  if (s < 59.5) return `${Math.round(s)} s`;
  return duration(s);
}

/** 0.0002 -> "2e-4": how people write learning rates. */
export function shortExp(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return String(value ?? "");
  const [mantissa, exp] = value.toExponential().split("e");
  return `${Number(mantissa)}e${Number(exp)}`;
}

export function basename(path) {
  if (!path) return "";
  const trimmed = String(path).replace(/[\\/]+$/, "");
  const parts = trimmed.split(/[\\/]/);
  return parts[parts.length - 1] || trimmed;
}

/** A moment the server gives in seconds since the epoch, in the reader's own date and time. */
export function when(seconds) {
  return new Date(seconds * 1000).toLocaleString();
}
