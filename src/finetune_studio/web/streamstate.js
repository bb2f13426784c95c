// The footer of the job view: the state of the run's event stream in words (live
// with its event count, reconnecting with the reason and the next attempt, ...).

import { integer } from "./format.js";

function describe(feed) {
  const c = feed.connection;
  const fromHistory = feed.historyCount ? ` (${integer(feed.historyCount)} from this browser's history)` : "";
  switch (c.state) {
    case "live":
      return `Live · ${integer(feed.eventCount)} events${fromHistory}`;
    case "connecting":
      return "Connecting to the stream…";
    case "reconnecting":
      return c.delayMs != null
        ? `Connection lost (${c.reason}); reconnecting in ${Math.max(1, Math.round(c.delayMs / 1000))} s, attempt ${c.attempt}`
        : `Reconnecting (attempt ${c.attempt})…`;
    case "unauthorized":
      return "Waiting for an API token (Settings)";
    case "gone":
      return "The server does not know this job";
    case "ended":
      return `Finished · ${integer(feed.eventCount)} events${fromHistory}`;
    default:
      return feed.historyLoaded ? "" : "Reading history…";
  }
}

/** Write the stream state of `feed` (a JobFeed) into `footer`. */
export function renderStreamState(footer, feed) {
  const text = describe(feed);
  footer.dataset.state = feed.connection.state;
  if (footer.textContent !== text) footer.textContent = text;
}
