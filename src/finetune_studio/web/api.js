// The server's HTTP API: JSON requests that carry the API token (or, with accounts on, the
// session cookie and its CSRF token: signin.js), and its error shapes.

/** Where the token is kept in localStorage. */
export const TOKEN_KEY = "finetune-studio.token";

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(token) {
  const value = token.trim();
  try {
    if (value) localStorage.setItem(TOKEN_KEY, value);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage blocked: the token lives for this page only.
  }
  memoryToken = value;
  window.dispatchEvent(new CustomEvent("studio:token"));
}

let memoryToken = getToken();

/** The header that carries the session's CSRF token (api/accounts.py CSRF_HEADER). */
export const CSRF_HEADER = "X-CSRF-Token";

// With accounts on (signin.js finds out): the session's CSRF token, kept in memory only
// (never in storage), sent with every request so that writes made with the cookie pass.
let accounts = false;
let csrfToken = "";

/** Whether the server has accounts (its /auth/me answers 200 or 401, not 404): then a 401 asks for a sign-in. */
export function accountsOn() {
  return accounts;
}

/** Accounts are on; `token` is the signed-in session's CSRF token ("" when signed out, or signed in with a key). */
export function setSession(token) {
  accounts = true;
  csrfToken = token || "";
}

export function authHeaders() {
  const token = memoryToken || getToken();
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  if (csrfToken) headers[CSRF_HEADER] = csrfToken;
  return headers;
}

/** A refused request: `status` is the HTTP status, `body` the parsed answer (or text). */
export class ApiError extends Error {
  constructor(status, body) {
    super(errorLines(status, body).join("\n"));
    this.status = status;
    this.body = body;
  }

  get lines() {
    return errorLines(this.status, this.body);
  }
}

/** The server's error text as lines: `error` (our refusals), `detail` (FastAPI's 422 list or a string). */
export function errorLines(status, body) {
  if (body && typeof body === "object") {
    if (typeof body.error === "string" && body.error) return [body.error];
    // OpenAI's shape, under /v1/: {"error": {"message", "param", "code"}}
    if (body.error && typeof body.error.message === "string") return [body.error.message];
    if (Array.isArray(body.detail)) {
      return body.detail.map((item) => {
        const loc = (item.loc || []).filter((part) => part !== "body").join(".");
        const msg = String(item.msg || "invalid").replace(/^Value error, /, "");
        return loc ? `${loc}: ${msg}` : msg;
      });
    }
    if (typeof body.detail === "string") return [body.detail];
  }
  if (typeof body === "string" && body.trim()) return [`HTTP ${status}: ${body.trim().slice(0, 300)}`];
  return [`HTTP ${status}`];
}

/** Fields named by a 422 answer, for marking them in the form. */
export function invalidFields(body) {
  if (!body || !Array.isArray(body.detail)) return [];
  return body.detail.map((item) => (item.loc || [])[1]).filter((name) => typeof name === "string");
}

/** A request to the API: `body` goes as JSON, or as multipart when it is a FormData. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json", ...authHeaders() };
  const multipart = body instanceof FormData;
  if (body !== undefined && !multipart) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined || multipart ? body : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "same-origin", // the session cookie, with accounts on
  });
  if (response.status === 204) return null;
  const text = await response.text();
  let parsed = text;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    // not JSON: keep the text
  }
  if (!response.ok) {
    if (response.status === 401) window.dispatchEvent(new CustomEvent("studio:unauthorized"));
    throw new ApiError(response.status, parsed);
  }
  // The OpenAPI document is open to all: only an API path's answer says the token is good.
  if (!path.startsWith("openapi")) window.dispatchEvent(new CustomEvent("studio:authorized"));
  return parsed;
}
