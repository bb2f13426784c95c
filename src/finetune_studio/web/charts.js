// Metric charts: thin wrappers around uPlot (vendored, MIT) with fixed heights, so
// that nothing on the page moves while a run streams.

import uPlot from "./vendor/uplot/uPlot.esm.js";

// The axes' look, shared by every chart (sweepcharts.js draws its scatter plots with it).
export const AXIS = {
  stroke: "#6b7280",
  grid: { stroke: "#eceef2", width: 1 },
  ticks: { stroke: "#e2e5ea", width: 1, size: 4 },
  font: "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
};

function formatTick(kind) {
  if (kind === "exp") {
    return (u, values) => values.map((v) => (v == null ? "" : v === 0 ? "0" : v.toExponential(1)));
  }
  return (u, values) => values.map((v) => (v == null ? "" : Number(v.toPrecision(4)).toString()));
}

/** The value under the cursor; with the cursor away, the series' latest value. */
function latest(u, seriesIdx) {
  const values = u.data[seriesIdx] || [];
  for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
  return null;
}

function formatValue(kind) {
  const show = kind === "exp" ? (v) => v.toExponential(3) : (v) => v.toFixed(4);
  return (u, v, seriesIdx, idx) => {
    const value = idx == null ? latest(u, seriesIdx) : v;
    return value == null ? "–" : show(value);
  };
}

/**
 * What every chart of the page shares: its box, a fixed height, the text shown while it has
 * nothing to draw, its uPlot instance (built by the subclass) kept to the box's width.
 */
export class ChartBox {
  constructor(box, height, emptyText) {
    this.box = box;
    this.height = height;
    this.plot = null;
    this.signature = "";
    this.empty = document.createElement("div");
    this.empty.className = "chart-empty";
    this.empty.textContent = emptyText;
    box.append(this.empty);
    this.resizer = new ResizeObserver(() => this.fit());
    this.resizer.observe(box);
  }

  width() {
    return Math.max(160, Math.floor(this.box.clientWidth));
  }

  fit() {
    if (this.plot && this.box.clientWidth > 0) {
      const width = this.width();
      if (width !== this.plot.width) this.plot.setSize({ width, height: this.height });
    }
  }

  destroy() {
    this.resizer.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}

/**
 * One chart. update(x, series) takes the x values (steps) and the series to draw:
 * [{key, label, stroke, dash?, pointsOnly?, values}]. The uPlot instance is rebuilt
 * only when the set of series changes (a comparison chosen, eval loss appearing).
 */
export class MetricChart extends ChartBox {
  constructor(box, { height = 200, kind = "plain", showStep = true, emptyText = "Waiting for the first step…" } = {}) {
    super(box, height, emptyText);
    box.classList.toggle("hide-step", !showStep);
    this.kind = kind;
    this.data = [[]];
  }

  setEmptyText(text) {
    if (this.empty.textContent !== text) this.empty.textContent = text;
  }

  update(x, series) {
    this.data = [x, ...series.map((s) => s.values)];
    const signature = JSON.stringify(series.map((s) => [s.key, s.label, s.stroke, s.dash, s.pointsOnly]));
    this.empty.hidden = x.length > 0;
    if (!this.plot || signature !== this.signature || this.box.clientWidth === 0) {
      if (this.box.clientWidth === 0) return; // hidden: drawn when shown
      this.build(series);
      this.signature = signature;
    } else {
      this.plot.setData(this.data);
    }
  }

  build(series) {
    if (this.plot) this.plot.destroy();
    const kind = this.kind;
    const options = {
      width: this.width(),
      height: this.height,
      pxAlign: 0,
      cursor: { drag: { x: true, y: false }, points: { size: 7 } },
      legend: { live: true },
      scales: { x: { time: false } },
      axes: [
        { ...AXIS, size: 30, values: (u, values) => values.map((v) => (Number.isInteger(v) ? String(v) : "")) },
        { ...AXIS, size: kind === "exp" ? 62 : 52, values: formatTick(kind) },
      ],
      series: [
        {
          label: "step",
          value: (u, v, seriesIdx, idx) => {
            const value = idx == null ? latest(u, 0) : v;
            return value == null ? "–" : String(value);
          },
        },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.stroke,
          width: s.pointsOnly ? 0 : 1.75,
          dash: s.dash,
          spanGaps: true,
          value: formatValue(kind),
          points: s.pointsOnly ? { show: true, size: 6, fill: s.stroke, stroke: s.stroke } : undefined,
        })),
      ],
    };
    this.plot = new uPlot(options, this.data, this.box);
  }

  /** How many points the series at index `i` (0: the first after x) draws. */
  points(i = 0) {
    const values = this.data[i + 1] || [];
    let n = 0;
    for (const v of values) if (v != null) n += 1;
    return n;
  }
}

/**
 * Lay one or more runs on a shared step axis: x is the union of their steps, and
 * each run's values are null where it has no step.
 */
export function alignOnSteps(runs) {
  if (runs.length === 1) {
    const steps = runs[0].steps;
    return { x: steps, columns: [steps.map((s) => runs[0].byStep.get(s))] };
  }
  const all = new Set();
  for (const run of runs) for (const s of run.steps) all.add(s);
  const x = [...all].sort((a, b) => a - b);
  return { x, columns: runs.map((run) => x.map((s) => run.byStep.get(s))) };
}
