// The job view: which run is shown (and which is overlaid), their feeds, the Stop
// button, and one render per animation frame (schedule.js) that draws the parts: the header
// (jobhead.js), a Ray run's cluster line (cluster.js), the phase timeline
// (timeline.js), progress tiles (progress.js), error/warning/output panels
// (alerts.js), charts (runcharts.js), the compare
// select (compare.js), the export and evaluation panels (export.js, evalpanel.js) and
// the stream state (streamstate.js).

import { api, ApiError } from "./api.js";
import { renderAlerts } from "./alerts.js";
import { renderCluster } from "./cluster.js";
import { renderTrackers } from "./trackers.js";
import { CompareSelect } from "./compare.js";
import { EvalPanel } from "./evalpanel.js";
import { EvalSamples } from "./evalsamples.js";
import { ExportPanel } from "./export.js";
import { JobFeed } from "./feed.js";
import { MethodCharts } from "./methodcharts.js";
import { phaseOf, renderHeader } from "./jobhead.js";
import { ProgressTiles } from "./progress.js";
import { RunCharts } from "./runcharts.js";
import { renderScheduler } from "./schedule.js";
import { renderStreamState } from "./streamstate.js";
import { PhaseTimeline } from "./timeline.js";
import { TERMINAL } from "./format.js";

export class JobView {
  constructor(root, { writer, jobs }) {
    this.root = root;
    this.tools = null; // the RunTools (runtools.js), attached by the app once the form exists
    this.writer = writer;
    this.jobs = jobs; // the JobsIndex: latest statuses from /train/jobs, names
    this.feed = null;
    this.compare = null;
    this.schedule = renderScheduler(() => this.render()); // render() at most once a frame
    this.stopping = false;
    this.stopError = null;
    this.stopButton = root.querySelector("#stop-button");
    this.stopButton.addEventListener("click", () => this.stop());
    this.compareSelect = new CompareSelect(root.querySelector("#compare-select"), () => this.feed.jobId);
    this.timeline = new PhaseTimeline(root.querySelector("#timeline"));
    this.progress = new ProgressTiles(root);
    this.charts = new RunCharts(root);
    this.evalSamples = new EvalSamples(root); // evalsamples.js: the answers at the latest evaluation
    this.methodCharts = new MethodCharts(root); // methodcharts.js: dpo's margins, grpo's rewards... beside the loss
    this.exportPanel = new ExportPanel(root); // export.js: shown for a job with a result
    this.evalPanel = new EvalPanel(root, { jobs }); // evalpanel.js: "Evaluate against its base", its evaluations
  }

  get jobId() {
    return this.feed ? this.feed.jobId : null;
  }

  /** Show a job (and optionally overlay another); reuses feeds that are already open. */
  show(jobId, compareId) {
    this.root.hidden = false;
    this.charts.ensure();
    if (!this.feed || this.feed.jobId !== jobId) {
      if (this.feed) this.feed.close();
      this.stopping = false;
      this.stopError = null;
      this.feed = this.openFeed(jobId);
      this.exportPanel.show(jobId);
      this.evalPanel.show(jobId);
      if (this.tools) this.tools.show(jobId);
    }
    const wanted = compareId && compareId !== jobId ? compareId : null;
    if ((this.compare ? this.compare.jobId : null) !== wanted) {
      if (this.compare) this.compare.close();
      this.compare = wanted ? this.openFeed(wanted) : null;
    }
    this.schedule();
  }

  hide() {
    document.title = "finetune-studio";
    if (this.feed) this.feed.close();
    if (this.compare) this.compare.close();
    this.feed = null;
    this.compare = null;
    this.timeline.stop();
    this.exportPanel.hide();
    this.evalPanel.hide();
    this.root.hidden = true;
  }

  openFeed(jobId) {
    const feed = new JobFeed(jobId, {
      writer: this.writer,
      onChange: (changed, what) => {
        if (changed !== this.feed && changed !== this.compare) return;
        if (what === "status") {
          this.jobs.remember(changed.jobId, changed.firstStatus);
          this.jobs.refreshSoon();
        }
        if (what === "history") this.jobs.remember(changed.jobId, changed.firstStatus);
        this.schedule();
      },
    });
    feed.open().catch((error) => console.error("could not open the job feed", error));
    return feed;
  }

  /** Reconnect streams that waited for a token. */
  retry() {
    for (const feed of [this.feed, this.compare]) {
      if (feed && feed.connection.state === "unauthorized") feed.retry();
    }
  }

  async stop() {
    const feed = this.feed;
    if (!feed || feed.finished || this.stopButton.getAttribute("aria-disabled") === "true") return;
    this.stopping = true;
    this.stopError = null;
    this.render();
    try {
      await api(`train/stop/${encodeURIComponent(feed.jobId)}`, { method: "POST" });
      this.jobs.refreshSoon();
    } catch (error) {
      this.stopping = false;
      this.stopError = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
    }
    this.render();
  }

  render() {
    const feed = this.feed;
    if (!feed) return;
    renderHeader(this.root, feed, this.jobs);
    const listed = this.jobs.statusOf(feed.jobId);
    const listedDetails = listed && listed.details && listed.details.ray ? listed.details : null;
    renderCluster(this.root.querySelector("#job-cluster"), feed.status || listed, feed.cluster || listedDetails);
    renderTrackers(this.root.querySelector("#job-trackers"), feed.status || listed);
    this.timeline.render(feed);
    this.progress.render(feed);
    renderAlerts(this.root, feed.status, this.stopError);
    this.charts.render(feed, this.compare, (jobId) => this.jobs.shortName(jobId));
    this.evalSamples.render(feed);
    this.methodCharts.render(feed);
    this.compareSelect.render(this.jobs, feed.jobId, this.compare ? this.compare.jobId : null);
    renderStreamState(this.root.querySelector("#stream-state"), feed);

    const phase = phaseOf(feed, this.jobs);
    const finished = TERMINAL.has(phase);
    // aria-disabled rather than disabled: the focus stays on Stop when it turns off.
    if (finished || this.stopping || !phase) this.stopButton.setAttribute("aria-disabled", "true");
    else this.stopButton.removeAttribute("aria-disabled");
    this.stopButton.textContent = this.stopping && !finished ? "Stopping…" : "Stop";
    if (this.tools) this.tools.render(feed.status || this.jobs.statusOf(feed.jobId), phase);
    this.exportPanel.render(phase, feed.status || this.jobs.statusOf(feed.jobId));
    // The list's status carries what is joined when read (details.eval); the stream's does not.
    this.evalPanel.render(phase, feed.status || this.jobs.statusOf(feed.jobId), this.jobs.statusOf(feed.jobId));
  }
}
