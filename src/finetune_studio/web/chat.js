// The chat view (#chat=JOB, and #chat=JOB&compare=1): talk to a trained run, or
// send one prompt to its base model and to the fine-tuned model at once and read
// both answers side by side. Here: the controls (system prompt, temperature, max
// tokens, seed), the choice of conversation, sending and stopping. The transcript
// is drawn by chatlog.js, answers are streamed by chatstream.js, and
// conversations are kept by conversations.js.
//
// Model ids are the server's (GET /v1/models): the job id for the fine-tuned
// model, and the job's `model_name` for its base.

import { api, ApiError } from "./api.js";
import { ChatLog } from "./chatlog.js";
import { ChatError, streamChat } from "./chatstream.js";
import {
  DEFAULT_SETTINGS,
  deleteConversation,
  listConversations,
  messagesFor,
  newConversation,
  saveConversation,
} from "./conversations.js";
import { basename, phaseLabel } from "./format.js";
import { isServable } from "./jobs.js";
import { chatHash, routeHash } from "./route.js";
import { renderScheduler } from "./schedule.js";

const TUNED = "tuned";
const BASE = "base";
// How often a streaming answer is stored, so that closing the page mid-answer keeps most of it.
const SAVE_EVERY_MS = 2000;
// The settings last sent: a new conversation starts with them.
const SETTINGS_KEY = "finetune-studio.chat-settings";

function lastSettings() {
  try {
    const stored = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "null");
    if (stored && typeof stored === "object") return { ...DEFAULT_SETTINGS, ...stored };
  } catch {
    // unreadable or blocked: the defaults
  }
  return { ...DEFAULT_SETTINGS };
}

function rememberSettings(settings) {
  try {
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
  } catch {
    // storage blocked: new conversations start from the defaults
  }
}

/** "temperature 0.7 · 256 tokens · seed 7 · system prompt": the settings at a glance. */
function settingsSummary(settings) {
  const parts = [`temperature ${settings.temperature}`];
  parts.push(settings.max_tokens == null ? "max tokens: the context" : `max ${settings.max_tokens} tokens`);
  if (settings.seed != null) parts.push(`seed ${settings.seed}`);
  if (settings.system.trim()) parts.push("system prompt");
  return parts.join(" · ");
}

/** The controls' values as settings, and what is wrong with them (field -> words). */
function readControls(controls) {
  const problems = {};
  const temperatureText = controls.temperature.value.trim();
  const temperature = Number(temperatureText);
  if (temperatureText === "" || !Number.isFinite(temperature) || temperature < 0 || temperature > 2) {
    problems.temperature = "Temperature is a number from 0 (always the likeliest token) to 2.";
  }
  const maxText = controls.max_tokens.value.trim();
  const maxTokens = maxText === "" ? null : Number(maxText);
  if (maxTokens !== null && !(Number.isSafeInteger(maxTokens) && maxTokens >= 1)) {
    problems.max_tokens = "Max tokens is a whole number of at least 1 (or empty: the rest of the model's context).";
  }
  const seedText = controls.seed.value.trim();
  const seed = seedText === "" ? null : Number(seedText);
  if (seed !== null && !(Number.isSafeInteger(seed) && seed >= 0)) {
    problems.seed = "Seed is a whole number of 0 or more (or empty for a random one).";
  }
  return { settings: { system: controls.system.value, temperature, max_tokens: maxTokens, seed }, problems };
}

function fillControls(controls, settings) {
  controls.system.value = settings.system;
  controls.temperature.value = String(settings.temperature);
  controls.max_tokens.value = settings.max_tokens == null ? "" : String(settings.max_tokens);
  controls.seed.value = settings.seed == null ? "" : String(settings.seed);
  for (const input of Object.values(controls)) input.removeAttribute("aria-invalid");
}

function whenLabel(time) {
  const date = new Date(time);
  const sameDay = date.toDateString() === new Date().toDateString();
  return sameDay ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : date.toLocaleDateString();
}

export class ChatView {
  constructor(root, { jobs }) {
    this.root = root;
    this.jobs = jobs; // the JobsIndex: names, and statuses when the list has them
    this.jobId = null;
    this.compare = false;
    this.status = null; // the job's status, from train/status
    this.statusProblem = "";
    this.conversation = null;
    this.conversations = [];
    this.running = new Map(); // side -> AbortController of its answer in flight
    this.stats = new WeakMap(); // answer -> {deltas}: for window.__studio
    this.loaded = false;
    this.showing = null; // identifies the latest show(): a slower earlier load is dropped
    this.schedule = renderScheduler(() => { // render() at most once a frame, while a chat is shown
      if (this.jobId) this.render();
    });

    const $ = (id) => root.querySelector(`#${id}`);
    this.title = $("chat-title");
    this.modelId = $("chat-model");
    this.note = $("chat-note");
    this.back = $("chat-back");
    this.modeChat = $("chat-mode-chat");
    this.modeCompare = $("chat-mode-compare");
    this.select = $("chat-conversations");
    this.newButton = $("chat-new");
    this.deleteButton = $("chat-delete");
    this.problemBox = $("chat-settings-error");
    this.settingsBox = $("chat-settings");
    this.settingsSummary = $("chat-settings-summary");
    this.empty = $("chat-empty");
    this.form = $("chat-form");
    this.input = $("chat-input");
    this.sendButton = $("chat-send");
    this.stopButton = $("chat-stop");
    this.controls = {
      system: $("chat-system"),
      temperature: $("chat-temperature"),
      max_tokens: $("chat-max-tokens"),
      seed: $("chat-seed"),
    };
    this.log = new ChatLog($("chat-log"), { onStop: (side) => this.stop(side), onRetry: (side) => this.retry(side) });

    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.input.addEventListener("keydown", (event) => {
      // Enter sends, Shift+Enter is a new line; Enter that ends an IME composition is neither.
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    this.stopButton.addEventListener("click", () => this.stopAll());
    for (const input of Object.values(this.controls)) input.addEventListener("input", () => this.controlsChanged());
    this.select.addEventListener("change", () => this.choose(this.select.value));
    this.newButton.addEventListener("click", () => this.startNew());
    this.deleteButton.addEventListener("click", () => this.deleteCurrent());
  }

  get mode() {
    return this.compare ? "compare" : "chat";
  }

  get busy() {
    return this.running.size > 0;
  }

  /**
   * The base model's id: the job's `model_name` (GET /v1/models lists it under that id), from
   * its status, else as this browser remembers it (the job list, the conversation).
   */
  get baseModel() {
    const details = (this.status && this.status.details) || {};
    const listed = this.jobs.statusOf(this.jobId);
    return (
      details.model_name ||
      (listed && listed.details && listed.details.model_name) ||
      this.jobs.meta(this.jobId).model_name ||
      (this.conversation && this.conversation.base) ||
      null
    );
  }

  get sides() {
    const tuned = { side: TUNED, label: `Fine-tuned · ${this.jobs.shortName(this.jobId)}` };
    if (!this.compare) return [tuned];
    return [{ side: BASE, label: `Base · ${basename(this.baseModel) || "unknown"}` }, tuned];
  }

  modelOf(side) {
    return side === TUNED ? this.jobId : this.baseModel;
  }

  /** Show the chat with `jobId` (compare mode: with its base beside it). */
  async show(jobId, compare) {
    this.root.hidden = false;
    if (jobId === this.jobId && compare === this.compare) {
      this.schedule();
      return;
    }
    this.stopAll();
    this.jobId = jobId;
    this.compare = compare;
    this.status = null;
    this.statusProblem = "";
    this.conversation = null;
    this.conversations = [];
    this.loaded = false;
    const showing = (this.showing = {});
    this.render();
    this.loadStatus(showing);
    const list = await listConversations(jobId, this.mode);
    if (showing !== this.showing) return;
    this.conversations = list;
    this.conversation = list[0] || newConversation(jobId, this.mode, this.baseModel, lastSettings());
    fillControls(this.controls, this.conversation.settings);
    this.loaded = true;
    this.render();
  }

  hide() {
    this.stopAll();
    this.showing = null;
    this.jobId = null;
    this.root.hidden = true;
  }

  async loadStatus(showing) {
    try {
      const status = await api(`train/status/${encodeURIComponent(this.jobId)}`);
      if (showing !== this.showing) return;
      this.status = status;
      this.jobs.remember(this.jobId, status);
    } catch (error) {
      if (showing !== this.showing) return;
      this.statusProblem =
        error instanceof ApiError && error.status === 404
          ? `The server knows no run ${this.jobId}.`
          : `Could not read this run's status: ${error instanceof ApiError ? error.lines.join(" ") : error.message}`;
    }
    this.schedule();
  }

  controlsChanged() {
    const { settings, problems } = readControls(this.controls);
    this.showProblems(problems);
    if (Object.keys(problems).length || !this.conversation) return;
    this.conversation.settings = settings;
    this.schedule();
    // An empty conversation is stored with its first message; one with turns keeps its new settings now.
    if (this.conversation.turns.length) {
      clearTimeout(this.settingsSave);
      this.settingsSave = setTimeout(() => saveConversation(this.conversation), 400);
    }
  }

  showProblems(problems) {
    for (const [name, input] of Object.entries(this.controls)) {
      if (problems[name]) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
    const words = Object.values(problems);
    this.problemBox.hidden = words.length === 0;
    this.problemBox.textContent = words.join(" ");
    if (words.length) this.settingsBox.open = true;
  }

  async choose(id) {
    if (this.busy || !this.conversation || id === this.conversation.id) return;
    const chosen = this.conversations.find((c) => c.id === id);
    if (!chosen) return;
    this.conversation = chosen;
    fillControls(this.controls, chosen.settings);
    this.showProblems({});
    this.render();
  }

  startNew() {
    if (this.busy || !this.loaded) return;
    const { settings, problems } = readControls(this.controls);
    const keep = Object.keys(problems).length ? this.conversation.settings : settings;
    this.conversation = newConversation(this.jobId, this.mode, this.baseModel, keep);
    this.render();
    this.input.focus();
  }

  async deleteCurrent() {
    if (this.busy || !this.conversation || !this.conversation.turns.length) return;
    if (!confirm("Delete this conversation from this browser?")) return;
    const gone = this.conversation.id;
    await deleteConversation(gone);
    this.conversations = this.conversations.filter((c) => c.id !== gone);
    this.conversation = this.conversations[0] || newConversation(this.jobId, this.mode, this.baseModel, this.conversation.settings);
    fillControls(this.controls, this.conversation.settings);
    this.render();
  }

  /** Send the prompt box's text as a new turn, to one model or (compare) to both at once. */
  send() {
    const text = this.input.value;
    if (!text.trim() || this.busy || !this.loaded) return;
    const { settings, problems } = readControls(this.controls);
    this.showProblems(problems);
    if (Object.keys(problems).length) return;
    const conversation = this.conversation;
    conversation.settings = settings;
    rememberSettings(settings);
    if (!conversation.turns.length) conversation.base = this.baseModel;
    if (!this.conversations.includes(conversation)) this.conversations.unshift(conversation);
    conversation.turns.push({ user: text, at: Date.now(), answers: {} });
    this.input.value = "";
    const index = conversation.turns.length - 1;
    for (const { side } of this.sides) this.answer(conversation, index, side);
    saveConversation(conversation);
    this.render();
  }

  retry(side) {
    const conversation = this.conversation;
    if (!conversation || this.running.has(side) || !conversation.turns.length) return;
    const { settings, problems } = readControls(this.controls);
    this.showProblems(problems);
    if (Object.keys(problems).length) return;
    conversation.settings = settings;
    this.answer(conversation, conversation.turns.length - 1, side);
    saveConversation(conversation);
    this.render();
  }

  /** Stream `side`'s answer to turn `index` into the conversation; saved when it ends. */
  async answer(conversation, index, side) {
    const { settings } = conversation;
    const model = this.modelOf(side);
    const answer = {
      model,
      content: "",
      state: "streaming",
      finish_reason: null,
      usage: null,
      error: null,
      started_at: Date.now(),
      ended_at: null,
    };
    conversation.turns[index].answers[side] = answer;
    const stats = { deltas: 0 };
    this.stats.set(answer, stats);
    const controller = new AbortController();
    this.running.set(side, controller);
    try {
      if (!model) {
        throw new ChatError({
          message: `the base model of run ${this.jobId} is not known yet (its status names no model_name): ${this.statusProblem || "try again in a moment"}`,
        });
      }
      const request = {
        model,
        messages: messagesFor(conversation, side, index),
        temperature: settings.temperature,
        max_tokens: settings.max_tokens,
        seed: settings.seed,
      };
      let saved = Date.now();
      for await (const part of streamChat(request, controller.signal)) {
        if (part.delta) {
          answer.content += part.delta;
          stats.deltas += 1;
        }
        if (part.finish) answer.finish_reason = part.finish;
        if (part.usage) answer.usage = part.usage;
        if (Date.now() - saved > SAVE_EVERY_MS) {
          saved = Date.now();
          saveConversation(conversation);
        }
        this.schedule();
      }
      answer.state = "done";
    } catch (error) {
      if (controller.signal.aborted) {
        answer.state = "stopped";
      } else {
        answer.state = "error";
        answer.error = error instanceof ChatError ? error.toJSON() : { status: 0, message: String(error.message || error) };
        if (error instanceof ChatError && error.param && this.controls[error.param]) {
          this.controls[error.param].setAttribute("aria-invalid", "true");
        }
      }
    } finally {
      answer.ended_at = Date.now();
      if (this.running.get(side) === controller) this.running.delete(side);
      saveConversation(conversation);
      this.schedule();
    }
  }

  stop(side) {
    const controller = this.running.get(side);
    if (controller) controller.abort();
  }

  stopAll() {
    for (const controller of this.running.values()) controller.abort();
  }

  render() {
    const jobId = this.jobId;
    if (!jobId) return;
    const name = this.jobs.displayName(jobId);
    this.title.textContent = this.compare ? `Compare · ${name}` : `Chat · ${name}`;
    document.title = `Chat · ${this.jobs.shortName(jobId)} · finetune-studio`;
    this.modelId.textContent = jobId;
    this.back.href = routeHash(jobId);
    this.modeChat.href = chatHash(jobId, false);
    this.modeCompare.href = chatHash(jobId, true);
    this.modeChat.setAttribute("aria-current", String(!this.compare));
    this.modeCompare.setAttribute("aria-current", String(this.compare));
    this.root.dataset.mode = this.mode;
    this.note.textContent = this.noteText();

    this.renderConversations();
    const conversation = this.conversation;
    this.settingsSummary.textContent = conversation ? settingsSummary(conversation.settings) : "";
    this.empty.hidden = !this.loaded || Boolean(conversation && conversation.turns.length);
    this.empty.textContent = this.compare
      ? "Ask something: the base model and the fine-tuned one answer side by side."
      : "Ask something: the fine-tuned model answers.";
    if (conversation) this.log.render(conversation, this.sides, new Set(this.running.keys()));
    this.root.dataset.busy = String(this.busy);
    this.sendButton.hidden = this.busy;
    this.stopButton.hidden = !this.busy;
    this.sendButton.disabled = !this.loaded;
    this.newButton.disabled = this.busy || !this.loaded;
    this.select.disabled = this.busy || this.select.options.length < 2;
    this.deleteButton.disabled = this.busy || !conversation || !conversation.turns.length;
  }

  noteText() {
    if (this.statusProblem) return this.statusProblem;
    const status = this.status || this.jobs.statusOf(this.jobId);
    if (status && !isServable(status)) {
      return status.phase === "stopped"
        ? "This run stopped before it saved a model: there is nothing to chat with."
        : `This run is ${phaseLabel(status.phase).toLowerCase()}: it has no model to chat with until it completes.`;
    }
    if (this.compare) return this.baseModel ? `Base model: ${this.baseModel}` : "Reading the base model's name…";
    return "";
  }

  renderConversations() {
    const options = this.conversations.map((c) => [c.id, `${c.title || "New conversation"} · ${whenLabel(c.updated_at)}`]);
    if (this.conversation && !this.conversations.includes(this.conversation)) options.unshift([this.conversation.id, "New conversation"]);
    const key = JSON.stringify(options);
    if (this.select.dataset.key !== key) {
      this.select.dataset.key = key;
      this.select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
    }
    if (this.conversation && this.select.value !== this.conversation.id) this.select.value = this.conversation.id;
  }

  /** What window.__studio.chat() shows: the conversation and how its answers arrived. */
  snapshot() {
    if (!this.jobId) return null;
    const conversation = this.conversation;
    return {
      jobId: this.jobId,
      mode: this.mode,
      loaded: this.loaded,
      busy: this.busy,
      baseModel: this.baseModel,
      conversationId: conversation ? conversation.id : null,
      conversations: this.conversations.length,
      turns: conversation
        ? conversation.turns.map((turn) => ({
            user: turn.user,
            answers: Object.fromEntries(
              Object.entries(turn.answers).map(([side, answer]) => [
                side,
                {
                  ...structuredClone(answer),
                  deltas: (this.stats.get(answer) || { deltas: 0 }).deltas,
                  frames: this.log.framesOf(answer),
                },
              ]),
            ),
          }))
        : [],
    };
  }
}
