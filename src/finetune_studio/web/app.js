// finetune-studio's web UI: wires the parts of the page together. Plain ES
// modules, no build step; the libraries (uPlot, eventsource-parser, idb) are
// vendored under vendor/ with their licenses.
//
//   route.js     the location's hash: which run is shown, which is compared
//   jobs.js      the server's job list (polled) and the names of runs
//   joblist.js   the list of runs
//   jobview.js   the run shown: its feed (feed.js, sse.js, history.js) and parts
//   chat.js      the chat with a run (chatlog.js, chatstream.js, conversations.js)
//   form.js      the start form
//   settings.js  the API token dialog
//   probe.js     window.__studio, for tests and debugging

import { ChatView } from "./chat.js";
import { HistoryWriter, openHistory } from "./history.js";
import { StartForm } from "./form.js";
import { JobsIndex } from "./jobs.js";
import { renderJobList } from "./joblist.js";
import { JobView } from "./jobview.js";
import { exposeProbe } from "./probe.js";
import { currentRoute, goTo, replaceRoute } from "./route.js";
import { setUpSettings } from "./settings.js";

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
  const writer = new HistoryWriter();
  await openHistory();

  const jobs = new JobsIndex({
    onUpdate: () => {
      const route = currentRoute();
      renderJobList(jobs, view.jobId || route.chat);
      // Nothing chosen yet: show the newest run.
      if (!route.job && !route.chat && jobs.list.length && !view.jobId) {
        replaceRoute(jobs.list[0].job_id);
        showRoute();
      }
      if (view.jobId) view.schedule();
      if (chat.jobId) chat.schedule();
    },
    onServerState: renderServerState,
  });
  const view = new JobView(document.getElementById("job-view"), { writer, jobs });
  const chat = new ChatView(document.getElementById("chat-view"), { jobs });

  function showRoute() {
    const { job, compare, chat: chatJob, compareBase } = currentRoute();
    document.body.dataset.view = chatJob ? "chat" : "job";
    document.getElementById("no-job").hidden = Boolean(job || chatJob);
    if (chatJob) {
      view.hide();
      chat.show(chatJob, compareBase).catch((error) => console.error("could not open the chat", error));
    } else {
      chat.hide();
      if (job) view.show(job, compare);
      else view.hide();
    }
    renderJobList(jobs, view.jobId || chatJob);
  }

  setUpSettings();
  window.addEventListener("studio:token", () => {
    jobs.refresh();
    view.retry();
  });

  const form = new StartForm(document.getElementById("start-form"), {
    onStarted: (jobId, body) => {
      jobs.remember(jobId, { details: { model_name: body.model_name, project_name: body.project_name || "" } });
      goTo(jobId);
      jobs.refresh();
    },
  });

  window.addEventListener("hashchange", showRoute);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) jobs.refresh();
  });
  exposeProbe(view, writer, chat);

  showRoute();
  await form.load();
  jobs.poll();
  document.body.dataset.ready = "true";
}

main().catch((error) => {
  console.error(error);
  document.body.dataset.ready = "error";
});
