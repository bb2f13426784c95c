// The sweep view's plot of the objective against one parameter (sweeps.js): a scatter of
// the trials that reported an objective, the best one drawn apart. uPlot (vendored), with
// the axes of the metric charts (charts.js). A parameter whose values are numbers is drawn
// on its own scale (logarithmic when they are all positive and span over a decade, as
// learning rates do); one of words or true/false puts its choices side by side.

import { AXIS, ChartBox } from "./charts.js";
import * as fmt from "./format.js";
import uPlot from "./vendor/uplot/uPlot.esm.js";

const TRIAL = "#2563eb";
const BEST = "#d97706";

function numeric(values) {
  return values.every((v) => typeof v === "number" && Number.isFinite(v));
}

function tick(value) {
  if (value == null) return "";
  const abs = Math.abs(value);
  return abs !== 0 && (abs < 1e-2 || abs >= 1e5) ? fmt.shortExp(Number(value.toPrecision(2))) : String(Number(value.toPrecision(4)));
}

/** The x scale's range: the values with room around them, so that no point sits cut at an edge. */
function xRange(x, isNumeric, log, choices) {
  if (!isNumeric) return [-0.5, choices - 0.5];
  const low = Math.min(...x);
  const high = Math.max(...x);
  if (log) return [low / 2, high * 2];
  const pad = (high - low) * 0.08 || Math.abs(low) * 0.1 || 1;
  return [low - pad, high + pad];
}

export class ParamChart extends ChartBox {
  /** `name`: the parameter, as the x axis's label. */
  constructor(box, name, { height = 170 } = {}) {
    super(box, height, "No trial has an objective yet");
    this.name = name;
    this.data = [[], [], []];
  }

  /** Draw `points` ([{x: the trial's value of the parameter, y: its objective, number}]), `bestNumber` apart. */
  update(points, bestNumber) {
    this.empty.hidden = points.length > 0;
    const signature = JSON.stringify([points, bestNumber]);
    if (signature === this.signature) return;
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.data = [[], [], []];
    this.signature = "";
    if (!points.length) return;
    const values = points.map((p) => p.x);
    const isNumeric = numeric(values);
    const choices = isNumeric ? [] : [...new Set(values.map((v) => JSON.stringify(v)))];
    const at = (v) => (isNumeric ? v : choices.indexOf(JSON.stringify(v)));
    const sorted = [...points].sort((a, b) => at(a.x) - at(b.x));
    const x = sorted.map((p) => at(p.x));
    const log = isNumeric && x.every((v) => v > 0) && Math.max(...x) / Math.min(...x) > 10;
    this.data = [
      x,
      sorted.map((p) => (p.number === bestNumber ? null : p.y)),
      sorted.map((p) => (p.number === bestNumber ? p.y : null)),
    ];
    if (this.box.clientWidth === 0) return; // hidden: drawn when shown
    this.signature = signature;
    const xValues = isNumeric
      ? (u, ticks) => ticks.map(tick)
      : (u, ticks) => ticks.map((v) => (Number.isInteger(v) && choices[v] !== undefined ? String(JSON.parse(choices[v])) : ""));
    const shown = (u, v, seriesIdx, idx) => (idx == null || v == null ? "–" : fmt.metric(v));
    this.plot = new uPlot({
      width: this.width(),
      height: this.height,
      pxAlign: 0,
      cursor: { drag: { x: false, y: false }, points: { size: 8 } },
      legend: { live: true },
      scales: { x: { time: false, distr: log ? 3 : 1, range: xRange(x, isNumeric, log, choices.length) } },
      axes: [
        { ...AXIS, size: 30, values: xValues, ...(isNumeric ? {} : { splits: () => choices.map((_, i) => i) }) },
        { ...AXIS, size: 52, values: (u, ticks) => ticks.map(tick) },
      ],
      series: [
        { label: this.name, value: (u, v, seriesIdx, idx) => (idx == null ? "–" : isNumeric ? tick(v) : xValues(u, [v])[0]) },
        { label: "trials", stroke: TRIAL, width: 0, value: shown, points: { show: true, size: 7, fill: TRIAL, stroke: TRIAL } },
        { label: "best", stroke: BEST, width: 0, value: shown, points: { show: true, size: 11, fill: BEST, stroke: BEST } },
      ],
    }, this.data, this.box);
  }

  /** How many trials the plot draws (the best among them). */
  points() {
    return this.data[1].filter((v) => v != null).length + this.data[2].filter((v) => v != null).length;
  }
}
