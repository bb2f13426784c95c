// The page's one render scheduler: the views (the job view, the chat, the export
// panel) ask for a render as often as their data changes (each event of a stream,
// each token of an answer), and each render runs at most once per animation frame,
// all of them on the same frame.

const queued = new Set();
let frame = 0;

function flush() {
  frame = 0;
  const renders = [...queued];
  queued.clear(); // a render that asks again is drawn on the next frame
  let failure = null;
  for (const render of renders) {
    try {
      render();
    } catch (error) {
      failure ??= error; // the others still draw; the first failure is thrown below, uncaught as before
    }
  }
  if (failure) throw failure;
}

/** Run `render` on the next animation frame, once however often it is asked for before then. */
export function scheduleRender(render) {
  queued.add(render);
  if (!frame) frame = requestAnimationFrame(flush);
}

/** A function that schedules `render` (scheduleRender) each time it is called: a view's `schedule`. */
export function renderScheduler(render) {
  return () => scheduleRender(render);
}
