// finetune-studio's web UI: wires the parts of the page together. Plain ES
// modules, no build step; the libraries (uPlot, eventsource-parser, idb) are
// vendored under vendor/ with their licenses.
//
//   route.js     the location's hash: which run is shown, which is compared
//   jobs.js      the server's job list (polled) and the names of runs
//   joblist.js   the list of runs
//   jobview.js   the run shown: its feed (feed.js, sse.js, history.js) and parts
//   chat.js      the chat with a run (chatlog.js, chatstream.js, conversations.js)
//   evaluation.js an evaluation: its progress, results table (evaltable.js) and samples (evalrows.js);
//                evalpanel.js starts one from a run's view and lists the run's evaluations
//   form.js      the start form (fields.js: every field of the request; upload.js: data files)
//   runtools.js  a run's settings, Run again, Resume, Rename, Delete
//   settings.js  the API token dialog
//   signin.js    with accounts on: the sign-in form, "signed in as", sign-out; keys.js the key manager
//   probe.js     window.__studio, for tests and debugging
//   dom.js       el(tag, props, ...children): the views' one element builder
//   schedule.js  renders coalesced to one per animation frame (job view, chat, export panel)
//   format.js    words and numbers for people (phases, durations, metrics, sizes)
//   webhooks.js  the webhooks panel: add, test, deliveries, remove
//   trackers.js  a run's links to its experiment trackers (details.trackers)
//   sweeps.js    the list of sweeps and a sweep's view: its trials' curves, the objective per parameter

import { ChatView } from "./chat.js";
import { EvalView } from "./evaluation.js";
import { deleteJobHistory, HistoryWriter, openHistory } from "./history.js";
import { StartForm } from "./form.js";
import { JobsIndex } from "./jobs.js";
import { renderJobList, showMoreRuns } from "./joblist.js";
import { JobView } from "./jobview.js";
import { KeysPanel } from "./keys.js";
import { exposeProbe } from "./probe.js";
import { currentRoute, goTo, replaceRoute } from "./route.js";
import { RunTools } from "./runtools.js";
import { setUpSettings } from "./settings.js";
import { setUpAccount } from "./signin.js";
import { watchDatasetFields } from "./inspect.js";
import { SweepList, SweepView } from "./sweeps.js";
import { Uploads } from "./upload.js";
import { WebhooksPanel } from "./webhooks.js";

// One column (phones, narrow windows): the form sits above the run's view.
const ONE_COLUMN = "(max-width: 820px)";

const SERVER_STATES = {
  ok: "Connected",
  unauthorized: "API token needed",
  down: "Server unreachable, retrying…",
};

function renderServerState(state) {
  const el = document.querySelector("[data-testid=server-state]");
  el.dataset.state = state;
  el.textContent = SERVER_STATES[state];
}

async function main() {
  // With accounts on, nothing of the page is read before signing in (null: a single-user server).
  const me = await setUpAccount();
  const writer = new HistoryWriter();
  await openHistory();

  const jobs = new JobsIndex({
    onUpdate: () => {
      const route = currentRoute();
      renderJobList(jobs, view.jobId || route.chat);
      // Nothing chosen yet: show the newest run.
      if (!route.job && !route.chat && !route.evaluation && !route.sweep && jobs.list.length && !view.jobId) {
        replaceRoute(jobs.list[0].job_id);
        showRoute();
      }
      if (view.jobId) view.schedule();
      if (chat.jobId) chat.schedule();
      if (evaluation.evalId) evaluation.namesChanged();
      if (jobs.state === "ok") sweepList.refresh();
      if (sweepView.sweepId) sweepView.schedule();
    },
    onServerState: renderServerState,
  });
  const view = new JobView(document.getElementById("job-view"), { writer, jobs });
  const chat = new ChatView(document.getElementById("chat-view"), { jobs });
  const evaluation = new EvalView(document.getElementById("eval-view"), { jobs });
  const sweepList = new SweepList(document.getElementById("sweeps-card"));
  const sweepView = new SweepView(document.getElementById("sweep-view"), { jobs, writer, onChange: () => sweepList.refresh(true) });

  function showRoute() {
    const { job, compare, chat: chatJob, compareBase, evaluation: evalId, sweep: sweepId } = currentRoute();
    document.body.dataset.view = sweepId ? "sweep" : evalId ? "eval" : chatJob ? "chat" : "job";
    document.getElementById("no-job").hidden = Boolean(job || chatJob || evalId || sweepId);
    sweepList.select(sweepId);
    if (sweepId) {
      view.hide();
      chat.hide();
      evaluation.hide();
      sweepView.show(sweepId);
    } else if (evalId) {
      sweepView.hide();
      view.hide();
      chat.hide();
      evaluation.show(evalId);
    } else if (chatJob) {
      sweepView.hide();
      evaluation.hide();
      view.hide();
      chat.show(chatJob, compareBase).catch((error) => console.error("could not open the chat", error));
    } else {
      sweepView.hide();
      chat.hide();
      evaluation.hide();
      if (job) view.show(job, compare);
      else view.hide();
    }
    renderJobList(jobs, view.jobId || chatJob);
  }

  setUpSettings();
  new WebhooksPanel(document.getElementById("webhooks-panel"));
  if (me) new KeysPanel(document.getElementById("keys-panel"), me);
  window.addEventListener("studio:token", () => {
    jobs.refresh();
    view.retry();
  });

  /** A run was queued (from the form, or Resume): show it, and on one column bring it into sight. */
  function started(jobId, body) {
    jobs.remember(jobId, { details: { model_name: body.model_name, project_name: body.project_name || "" } });
    goTo(jobId);
    showRoute(); // now, not at "hashchange": the view must be there to be scrolled to
    jobs.refresh();
    if (window.matchMedia(ONE_COLUMN).matches) document.getElementById("job-view").scrollIntoView({ block: "start" });
  }

  const form = new StartForm(document.getElementById("start-form"), { onStarted: started });
  sweepView.form = form; // "Run again with these" fills it
  // /system answers 401 until the token is entered: ask again then (the Cluster fields, the machine's note).
  window.addEventListener("studio:token", () => {
    form.refreshSystem().catch((error) => console.warn("could not read /system", error));
  });
  const uploads = new Uploads(document.getElementById("start-form"));
  // The dataset preview (inspect.js): re-read as the data fields change.
  watchDatasetFields(document.getElementById("start-form"), document.getElementById("data-preview"));
  view.tools = new RunTools(document.getElementById("job-view"), {
    jobs,
    form,
    onStarted: started,
    onDeleted: (jobId) => {
      deleteJobHistory(jobId).catch((error) => console.warn("could not forget the run's history", error));
      jobs.forget(jobId);
      const next = jobs.list[0];
      if (next) goTo(next.job_id);
      else location.hash = "";
      // The deleted run's controls are gone: the focus goes to the list of runs.
      document.getElementById("jobs-title").focus();
      document.getElementById("start-result").textContent = "";
      document.getElementById("job-list").setAttribute("data-deleted", jobId);
    },
  });

  for (const id of ["job-search", "job-filter"]) {
    document.getElementById(id).addEventListener("input", () => renderJobList(jobs, view.jobId || currentRoute().chat));
  }
  document.getElementById("more-runs").addEventListener("click", () => {
    showMoreRuns();
    renderJobList(jobs, view.jobId || currentRoute().chat);
  });

  window.addEventListener("hashchange", showRoute);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) jobs.refresh();
  });
  exposeProbe(view, writer, chat);
  window.__studio.sweep = () => sweepView.snapshot();

  showRoute();
  await form.load();
  uploads.load();
  jobs.poll();
  document.body.dataset.ready = "true";
}

main().catch((error) => {
  console.error(error);
  document.body.dataset.ready = "error";
});
