// The chat view's transcript: one item per turn, the prompt and then its answers
// (one, or in compare mode the base model's beside the fine-tuned one's). Drawn
// in place: a streaming answer's text is the only thing that changes on most
// frames, so elements are kept and only what differs is written. Text is always
// set as text (never HTML): a model's answer can contain anything.

import { storedChatError } from "./chatstream.js";
import { el } from "./dom.js";
import { integer } from "./format.js";

const FINISH_WORDS = {
  stop: "finished",
  length: "reached max tokens",
};

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** "12 tokens · 85 tok/s · reached max tokens", or the state of an unfinished answer. */
function describe(answer) {
  if (answer.state === "streaming") return answer.content ? "writing…" : "waiting for the model…";
  if (answer.state === "error") return "failed";
  const parts = [];
  const tokens = answer.usage ? answer.usage.completion_tokens : null;
  if (tokens != null) parts.push(`${integer(tokens)} ${tokens === 1 ? "token" : "tokens"}`);
  const seconds = (answer.ended_at - answer.started_at) / 1000;
  if (tokens && seconds > 0 && Number.isFinite(seconds)) parts.push(`${integer(Math.round(tokens / seconds))} tok/s`);
  if (answer.state === "stopped") parts.push(answer.interrupted ? "interrupted (the page was closed)" : "stopped");
  else parts.push(FINISH_WORDS[answer.finish_reason] || "finished");
  return parts.join(" · ");
}

export class ChatLog {
  /**
   * `list` is the <ol> the turns go in. Callbacks: onStop(side) and onRetry(side)
   * for the buttons of the last turn's answers.
   */
  constructor(list, { onStop, onRetry }) {
    this.list = list;
    this.onStop = onStop;
    this.onRetry = onRetry;
    this.items = [];
    this.key = null;
    this.frames = new WeakMap(); // answer -> frames on which its text grew (for window.__studio)
  }

  framesOf(answer) {
    return this.frames.get(answer) || 0;
  }

  /**
   * Draw `conversation`'s turns. `sides` is the answers shown, in order, each
   * {side, label}; `running` the sides whose answers are streaming now.
   */
  render(conversation, sides, running) {
    const key = `${conversation.id}|${sides.map((s) => s.side).join(",")}`;
    if (key !== this.key) {
      this.key = key;
      this.items = [];
      this.list.replaceChildren();
    }
    const turns = conversation.turns;
    while (this.items.length > turns.length) this.items.pop().root.remove();
    // The page scrolls: follow a growing answer while the reader is at the bottom.
    const page = document.scrollingElement;
    const before = page.scrollHeight;
    const atBottom = before - page.scrollTop - page.clientHeight < 48;
    turns.forEach((turn, index) => {
      let item = this.items[index];
      if (!item) {
        item = this.createTurn(sides);
        this.items.push(item);
        this.list.append(item.root);
      }
      setText(item.user, turn.user);
      const last = index === turns.length - 1;
      for (const { side } of sides) this.drawAnswer(item.answers[side], turn.answers[side], side, last, running);
    });
    if (atBottom && page.scrollHeight > before) page.scrollTop = page.scrollHeight;
  }

  createTurn(sides) {
    const user = el("div", { class: "user-msg", "data-testid": "user-message" });
    const row = el("div", { class: "answers", "data-count": sides.length });
    const answers = {};
    for (const { side, label } of sides) {
      const meta = el("span", { class: "answer-meta", "data-testid": "answer-meta" });
      const actions = el("span", { class: "answer-actions" });
      const text = el("div", { class: "answer-text", "data-testid": "answer-text" });
      const error = el("div", { class: "answer-error", role: "alert", "data-testid": "answer-error", hidden: true });
      const cell = el("article", { class: "answer", "data-side": side, "data-testid": `answer-${side}` },
        el("header", { class: "answer-head" }, el("span", { class: "answer-label" }, label), meta, actions),
        text, error);
      row.append(cell);
      answers[side] = { cell, meta, actions, text, error, button: null };
    }
    const root = el("li", { class: "turn", "data-testid": "turn" }, user, row);
    return { root, user, answers };
  }

  drawAnswer(parts, answer, side, last, running) {
    if (!answer) {
      parts.cell.dataset.state = "none";
      setText(parts.meta, "");
      setText(parts.text, "");
      this.setButton(parts, null);
      return;
    }
    parts.cell.dataset.state = answer.state;
    parts.cell.dataset.model = answer.model;
    if (parts.text.textContent !== answer.content) {
      if (answer.state === "streaming") this.frames.set(answer, this.framesOf(answer) + 1);
      parts.text.textContent = answer.content;
    }
    setText(parts.meta, describe(answer));
    this.drawError(parts.error, answer.error);
    // Stop while it streams; Retry on the last turn's failed answer, if sending again can help.
    let button = null;
    if (answer.state === "streaming" && running.has(side)) button = "stop";
    else if (last && answer.state === "error" && storedChatError(answer.error).retryable) button = "retry";
    this.setButton(parts, button, side);
  }

  drawError(box, stored) {
    if (!stored) {
      box.hidden = true;
      box.dataset.key = "";
      return;
    }
    const key = JSON.stringify(stored);
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    const error = storedChatError(stored);
    const parts = [el("strong", error.headline), el("p", error.message)];
    if (error.code) parts.push(el("code", { class: "error-code" }, error.status ? `${error.status} ${error.code}` : error.code));
    box.replaceChildren(...parts);
    box.hidden = false;
  }

  setButton(parts, kind, side) {
    if ((parts.button ? parts.button.dataset.kind : null) === kind) return;
    if (parts.button) parts.button.remove();
    parts.button = null;
    if (!kind) return;
    const stop = kind === "stop";
    const button = el("button", {
      type: "button", class: stop ? "btn btn-small btn-danger" : "btn btn-small", "data-kind": kind, "data-testid": `${kind}-${side}`,
      onclick: () => (stop ? this.onStop(side) : this.onRetry(side)),
    }, stop ? "Stop" : "Retry");
    parts.actions.append(button);
    parts.button = button;
  }
}
