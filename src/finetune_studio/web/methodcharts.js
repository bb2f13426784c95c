// The training method's own figures beside the loss (docs/API.md, Training methods): a dpo,
// orpo, kto or grpo job's progress events carry `metrics` ({name: number}, TRL's
// names), and this module charts the ones that say whether the method is learning:
// the rewards (DPO's chosen, rejected and margin; GRPO's mean reward and each reward
// function's), the accuracy or spread, GRPO's completion length, and the KL.
// The charts are added to the job view's chart grid on the first step that has them;
// an SFT job has none, and shows none.

import { alignOnSteps, MetricChart } from "./charts.js";

const PALETTE = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];

// Each chart: which metrics it draws (in this order), by name or pattern.
export const GROUPS = [
  {
    id: "rewards",
    title: "Rewards",
    keys: [/^rewards\/chosen$/, /^rewards\/rejected$/, /^rewards\/margins$/, /^reward$/, /^rewards\/.+\/mean$/],
  },
  { id: "accuracy", title: "Reward accuracy · spread", keys: [/^rewards\/accuracies$/, /^reward_std$/] },
  { id: "length", title: "Completion length (tokens)", keys: [/^completions\/mean_length$/] },
  { id: "kl", title: "KL · log odds", keys: [/^kl$/, /^log_odds_ratio$/] },
];

/** The metric names of `feed`'s progress events, in the order first seen. */
export function metricNames(feed) {
  const names = new Set();
  for (const step of feed.steps) {
    const progress = feed.byStep.get(step);
    if (progress && progress.metrics) for (const name of Object.keys(progress.metrics)) names.add(name);
  }
  return [...names];
}

/** The names a group draws, of those present. */
export function groupKeys(group, names) {
  const chosen = [];
  for (const pattern of group.keys) for (const name of names) if (pattern.test(name) && !chosen.includes(name)) chosen.push(name);
  return chosen;
}

function label(name) {
  // "rewards/exact_match/mean" -> "exact_match"; "rewards/margins" -> "margins"
  const parts = name.split("/");
  if (parts.length === 3 && parts[0] === "rewards") return parts[1];
  return parts[parts.length - 1].replace(/_/g, " ");
}

export class MethodCharts {
  constructor(root) {
    this.root = root;
    this.charts = new Map(); // group id -> {figure, chart}
    this.seen = -1;
    this.feed = null;
  }

  /** Make (once) the chart of `group`, at the end of the chart grid. */
  chartFor(group) {
    let made = this.charts.get(group.id);
    if (made) return made;
    const grid = this.root.querySelector(".charts");
    const figure = document.createElement("figure");
    figure.className = "chart method-chart";
    figure.dataset.testid = `chart-method-${group.id}`;
    const caption = document.createElement("figcaption");
    caption.textContent = group.title;
    const box = document.createElement("div");
    box.className = "chart-box";
    figure.append(caption, box);
    (grid || this.root).append(figure);
    made = { figure, chart: new MetricChart(box, { height: 170, showStep: false }) };
    this.charts.set(group.id, made);
    return made;
  }

  /** Draw `feed`'s method metrics (a JobFeed); hide the charts of a job without them. */
  render(feed) {
    if (feed === this.feed && feed.eventCount === this.seen) return; // nothing new
    this.feed = feed;
    this.seen = feed.eventCount;
    const names = metricNames(feed);
    const { x, columns } = alignOnSteps([feed]);
    for (const group of GROUPS) {
      const keys = groupKeys(group, names);
      if (!keys.length) {
        const made = this.charts.get(group.id);
        if (made) made.figure.hidden = true;
        continue;
      }
      const { figure, chart } = this.chartFor(group);
      figure.hidden = false;
      chart.update(
        x,
        keys.map((key, index) => ({
          key,
          label: label(key),
          stroke: PALETTE[index % PALETTE.length],
          values: columns[0].map((p) => (p && p.metrics && p.metrics[key] != null ? p.metrics[key] : null)),
        })),
      );
    }
  }
}
