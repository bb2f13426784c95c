// One streamed chat answer: POST v1/chat/completions with `stream: true`, read
// with fetch() (so that it carries the API token) and the vendored
// eventsource-parser, yielded as text deltas until `data: [DONE]`. Aborting the
// signal ends the fetch; the server notices and cancels the request in its
// inference process.
//
// Errors come in OpenAI's shape, {error: {message, type, param, code}}, either as
// the answer's body (4xx/5xx before anything streamed) or as one `data:` line in
// the stream (the inference process died mid-answer). Both become a ChatError,
// which says in words what happened and whether trying again can help.

import { authHeaders } from "./api.js";
import { eventParser } from "./sse.js";

/** A failed answer: `status` (0: no answer at all), the OpenAI error's fields, and words for people. */
export class ChatError extends Error {
  constructor({ status = 0, message, type = null, code = null, param = null }) {
    super(message);
    this.status = status;
    this.type = type;
    this.code = code;
    this.param = param;
  }

  /** A short line that says what went wrong, above the server's own message. */
  get headline() {
    if (this.code === "model_not_found" || this.status === 404) return "Model not found";
    if (this.code === "inference_unavailable" || this.status === 503) return "The chat process stopped";
    if (this.code === "context_length_exceeded") return "The conversation is longer than the model's context";
    if (this.code === "cut_off") return "The answer was cut off";
    if (this.status === 401) return "API token needed";
    if (this.status === 0) return "The server is unreachable";
    if (this.status === 400 || this.status === 413 || this.status === 422) return "The request was refused";
    return "The server could not answer";
  }

  /**
   * Whether trying again may help: a crashed child restarts, a network recovers, and a retry
   * sends the settings as they are now (fewer max tokens fit the context). A model the
   * server does not serve stays unserved.
   */
  get retryable() {
    return !(this.status === 404 || this.code === "model_not_found");
  }

  /** What is kept with a conversation in IndexedDB. */
  toJSON() {
    return { status: this.status, message: this.message, type: this.type, code: this.code, param: this.param };
  }
}

/** A ChatError from what a conversation stored (see toJSON). */
export function storedChatError(data) {
  return new ChatError({ ...data, message: data.message || "the answer failed" });
}

function fromBody(status, body, text) {
  const error = body && typeof body === "object" ? body.error : null;
  if (error && typeof error === "object" && typeof error.message === "string") {
    return new ChatError({ status, message: error.message, type: error.type ?? null, code: error.code ?? null, param: error.param ?? null });
  }
  // Not OpenAI's shape: a proxy's page, or the training routes' {"error": "..."}.
  const said = typeof error === "string" ? error : (text || "").trim().slice(0, 300);
  return new ChatError({ status, message: said ? `HTTP ${status}: ${said}` : `the server answered HTTP ${status}` });
}

async function refusal(response) {
  const text = await response.text().catch(() => "");
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    // not JSON: fromBody quotes the text
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("studio:unauthorized"));
  return fromBody(response.status, body, text);
}

/**
 * Stream one answer. Yields {delta: "text"} as text arrives, then {finish: "stop" | "length"}
 * and {usage: {...}} when the server says so; returns after `data: [DONE]`. Throws a ChatError,
 * or the AbortError of `signal`.
 *
 * request: {model, messages, temperature, max_tokens, seed}; seed null leaves it out.
 */
export async function* streamChat(request, signal) {
  const body = {
    model: request.model,
    messages: request.messages,
    temperature: request.temperature,
    max_tokens: request.max_tokens,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (request.seed != null) body.seed = request.seed;
  let response;
  try {
    response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...authHeaders() },
      body: JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (error) {
    if (signal.aborted) throw error;
    throw new ChatError({ message: "the request did not reach the server: check that `finetune-studio serve` is running" });
  }
  if (!response.ok || !response.body) throw await refusal(response);

  // The parser calls back synchronously; what it found is yielded after each chunk.
  const found = [];
  let done = false;
  let failure = null;
  const parser = eventParser(({ data }) => {
    if (done || failure) return;
    if (data === "[DONE]") {
      done = true;
      return;
    }
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      failure = new ChatError({ status: response.status, message: `the server sent a line that is not JSON: ${data.slice(0, 120)}` });
      return;
    }
    if (chunk && chunk.error) {
      failure = fromBody(response.status, chunk, data);
      return;
    }
    const choice = (chunk.choices || [])[0];
    if (choice) {
      const text = choice.delta && choice.delta.content;
      if (text) found.push({ delta: text });
      if (choice.finish_reason) found.push({ finish: choice.finish_reason });
    }
    if (chunk.usage) found.push({ usage: chunk.usage });
  });

  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      let next;
      try {
        next = await reader.read();
      } catch (error) {
        if (signal.aborted) throw error;
        throw new ChatError({ status: response.status, code: "cut_off", message: "the connection broke before the answer was complete" });
      }
      if (next.done) break;
      parser.feed(next.value);
      yield* found.splice(0);
      if (failure) throw failure;
      if (done) return;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  throw new ChatError({ status: response.status, code: "cut_off", message: "the server closed the stream before it said [DONE]" });
}
