// window.__studio: a small read-only window into the page for the browser tests
// and for people debugging it (chart points, the feed's last event id, the
// stream connections made, the chat's conversation).

import { connectionLog } from "./sse.js";

/** Expose the JobView `view`, the HistoryWriter `writer` and the ChatView `chat` as window.__studio. */
export function exposeProbe(view, writer, chat) {
  window.__studio = {
    jobId: () => view.jobId,
    phase: () => (view.feed ? view.feed.phase : null),
    steps: () => (view.feed ? view.feed.steps.slice() : []),
    points: (chart = "loss", series = 0) => view.charts.points(chart, series),
    lastEventId: () => (view.feed ? view.feed.lastId : 0),
    eventCount: () => (view.feed ? view.feed.eventCount : 0),
    historyCount: () => (view.feed && view.feed.historyLoaded ? view.feed.historyCount : null),
    historyPoints: () => (view.feed && view.feed.historyLoaded ? view.feed.historySteps : null),
    connection: () => (view.feed ? view.feed.connection.state : null),
    compareId: () => (view.compare ? view.compare.jobId : null),
    comparePoints: () => (view.compare ? view.compare.steps.length : 0),
    connections: connectionLog,
    written: () => writer.written,
    flushed: () => writer.idle,
    chat: () => chat.snapshot(),
  };
}
