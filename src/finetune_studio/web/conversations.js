// Conversations with trained models, kept in IndexedDB so that a reload (or
// tomorrow) finds them again. Their own database, "finetune-studio-chat", beside
// history.js's "finetune-studio": the metric history's schema and version stay
// as they were, so nothing stored there needs an upgrade.
//
// A conversation belongs to one model (the job id) and one mode:
//   {id, model, mode: "chat" | "compare", base, title, created_at, updated_at,
//    settings: {system, temperature, max_tokens, seed},
//    turns: [{user, at, answers: {tuned: Answer, base?: Answer}}]}
// An Answer is {model, content, state: "streaming" | "done" | "stopped" | "error",
// finish_reason, usage, error, started_at, ended_at}. A compare conversation keeps
// two histories in one list of turns: each turn's prompt is shared, and each side
// (`tuned`, the fine-tuned job; `base`, its base model) has its own answer.

import { reopeningDatabase } from "./idbopen.js";

const DB_NAME = "finetune-studio-chat";
const DB_VERSION = 1;
export const CONVERSATIONS = "conversations";
const BY_MODEL = "by_model";

export const DEFAULT_SETTINGS = Object.freeze({ system: "", temperature: 0.7, max_tokens: 256, seed: null });

const database = reopeningDatabase(
  DB_NAME,
  DB_VERSION,
  (db) => {
    const store = db.createObjectStore(CONVERSATIONS, { keyPath: "id" });
    store.createIndex(BY_MODEL, "model");
  },
  "conversations",
);

function newId() {
  // crypto.randomUUID() needs a secure context; a server reached over plain HTTP on a LAN is not one.
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A new, empty conversation (stored on its first save). */
export function newConversation(model, mode, base, settings = DEFAULT_SETTINGS) {
  const now = Date.now();
  return { id: newId(), model, mode, base, title: "", created_at: now, updated_at: now, settings: { ...settings }, turns: [] };
}

/**
 * The conversations with `model` in `mode`, most recently used first. An answer
 * that was still streaming when its page went away is marked stopped.
 */
export async function listConversations(model, mode) {
  const db = await database();
  if (!db) return [];
  const rows = await db.getAllFromIndex(CONVERSATIONS, BY_MODEL, model);
  for (const conversation of rows) {
    for (const turn of conversation.turns) {
      for (const answer of Object.values(turn.answers)) {
        if (answer.state === "streaming") {
          answer.state = "stopped";
          answer.interrupted = true;
        }
      }
    }
  }
  return rows.filter((row) => row.mode === mode).sort((a, b) => b.updated_at - a.updated_at);
}

// Saves are chained so that they land in the order they were asked for.
let saving = Promise.resolve();

/** Store `conversation` (a copy of it as it is now); resolves once written. */
export function saveConversation(conversation) {
  conversation.updated_at = Date.now();
  if (!conversation.title && conversation.turns.length) conversation.title = titleOf(conversation.turns[0].user);
  const row = structuredClone(conversation);
  saving = saving.then(async () => {
    const db = await database();
    if (!db) return;
    try {
      await db.put(CONVERSATIONS, row);
    } catch (error) {
      console.warn("could not store the conversation in IndexedDB", error);
    }
  });
  return saving;
}

export async function deleteConversation(id) {
  await saving;
  const db = await database();
  if (db) await db.delete(CONVERSATIONS, id);
}

function titleOf(text) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > 60 ? `${line.slice(0, 57)}…` : line;
}

/**
 * The messages to send for `side` ("tuned" or "base") to answer turn `index`: the
 * system prompt, every earlier turn that side answered (a failed or empty answer
 * leaves its turn out, so that user and assistant still alternate), and the turn's prompt.
 */
export function messagesFor(conversation, side, index) {
  const messages = [];
  const system = conversation.settings.system.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const turn of conversation.turns.slice(0, index)) {
    const answer = turn.answers[side];
    if (!answer || answer.state === "error" || answer.state === "streaming" || !answer.content) continue;
    messages.push({ role: "user", content: turn.user }, { role: "assistant", content: answer.content });
  }
  messages.push({ role: "user", content: conversation.turns[index].user });
  return messages;
}
