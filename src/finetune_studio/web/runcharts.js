// The job view's three charts (loss with eval loss, learning rate, gradient norm)
// for one run, or two on a shared step axis when a second run is compared.

import { alignOnSteps, MetricChart } from "./charts.js";

const COLORS = {
  loss: "#2563eb",
  eval: "#d97706",
  lr: "#059669",
  grad: "#db2777",
  compare: "#7c3aed",
  compareEval: "#a78bfa",
};
const DASH = [6, 4];

function clip(text) {
  return text.length > 24 ? `${text.slice(0, 23)}…` : text;
}

function pick(column, key) {
  return column.map((p) => (p && p[key] != null ? p[key] : null));
}

export class RunCharts {
  constructor(root) {
    this.root = root;
    this.charts = null;
  }

  /** Build the charts on first use: uPlot sizes them from their boxes, so the view must be visible. */
  ensure() {
    if (this.charts) return;
    this.charts = {
      loss: new MetricChart(this.root.querySelector("#chart-loss"), { height: 230 }),
      lr: new MetricChart(this.root.querySelector("#chart-lr"), { height: 170, kind: "exp", showStep: false }),
      grad: new MetricChart(this.root.querySelector("#chart-grad"), { height: 170, showStep: false }),
    };
  }

  /** How many points a chart's series draws (0 before the charts exist). */
  points(chart, series) {
    return this.charts ? this.charts[chart].points(series) : 0;
  }

  /**
   * Draw `feed` (a JobFeed), with `compare` overlaid when given; `nameOf(jobId)`
   * names a run in the legends.
   */
  render(feed, compare, nameOf) {
    const runs = compare ? [feed, compare] : [feed];
    const { x, columns } = alignOnSteps(runs);
    // Alone, a series is named by its metric; compared, by its run.
    const mine = compare ? clip(nameOf(feed.jobId)) : null;
    const theirs = compare ? clip(nameOf(compare.jobId)) : null;

    const loss = [{ key: "loss", label: mine ? `loss · ${mine}` : "loss", stroke: COLORS.loss, values: pick(columns[0], "loss") }];
    if (feed.hasEval) {
      loss.push({ key: "eval", label: mine ? `eval · ${mine}` : "eval loss", stroke: COLORS.eval, pointsOnly: true, values: pick(columns[0], "eval_loss") });
    }
    if (compare) {
      loss.push({ key: "cmp", label: `loss · ${theirs}`, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "loss") });
      if (compare.hasEval) {
        loss.push({ key: "cmp-eval", label: `eval · ${theirs}`, stroke: COLORS.compareEval, pointsOnly: true, values: pick(columns[1], "eval_loss") });
      }
    }
    this.charts.loss.update(x, loss);

    const lr = [{ key: "lr", label: mine || "learning rate", stroke: COLORS.lr, values: pick(columns[0], "learning_rate") }];
    const grad = [{ key: "grad", label: mine || "grad norm", stroke: COLORS.grad, values: pick(columns[0], "grad_norm") }];
    if (compare) {
      lr.push({ key: "cmp", label: theirs, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "learning_rate") });
      grad.push({ key: "cmp", label: theirs, stroke: COLORS.compare, dash: DASH, values: pick(columns[1], "grad_norm") });
    }
    this.charts.lr.update(x, lr);
    this.charts.grad.update(x, grad);
    const empty = feed.finished ? "No training steps were recorded" : "Waiting for the first step…";
    for (const chart of Object.values(this.charts)) chart.setEmptyText(empty);
  }
}
