// The job view's header and the tab's title: the run's name, id, phase badge and
// latest message (a queued run's place in the queue), and the "Chat with this
// model" action once the run has saved a model to chat with.

import * as fmt from "./format.js";
import { isServable } from "./jobs.js";
import { chatHash } from "./route.js";

/**
 * The phase a run is in: from its own stream, else from the server's job list
 * (before the stream has said anything); "" when neither knows yet.
 */
export function phaseOf(feed, jobs) {
  const status = feed.status || jobs.statusOf(feed.jobId);
  return feed.phase || (status && status.phase) || "";
}

/** Draw the header under `root` for `feed` (a JobFeed) with names from `jobs` (a JobsIndex). */
export function renderHeader(root, feed, jobs) {
  const status = feed.status || jobs.statusOf(feed.jobId);
  const phase = phaseOf(feed, jobs);
  root.querySelector("#job-title").textContent = jobs.displayName(feed.jobId);
  root.querySelector("#job-id").textContent = feed.jobId;
  const badge = root.querySelector("#job-phase");
  badge.dataset.phase = phase;
  badge.textContent = phase ? fmt.phaseLabel(phase) : "…";
  let message = status ? status.message : "";
  const listed = jobs.statusOf(feed.jobId);
  const position = listed && listed.phase === "idle" && listed.details ? listed.details.queue_position : null;
  if (phase === "idle" && position) message = `Waiting in the queue: position ${position}`;
  const messageBox = root.querySelector("#job-message");
  if (messageBox.textContent !== message) {
    messageBox.textContent = message;
    messageBox.title = message; // cut to one line: the whole text on hover
  }
  const title = root.querySelector("#job-title");
  title.title = title.textContent;
  root.dataset.phase = phase;

  const chat = root.querySelector("#chat-link");
  chat.hidden = !isServable(status);
  chat.href = chatHash(feed.jobId);

  // The tab's title tells how a run is doing while the page is in the background.
  const name = jobs.shortName(feed.jobId);
  const done = phase === "training" && feed.latest ? `${Math.floor(feed.latest.progress_percent)}% · ` : "";
  document.title = phase ? `${done}${name} (${fmt.phaseLabel(phase).toLowerCase()}) · finetune-studio` : "finetune-studio";
}
