// The page's sign-in, with accounts on (docs/API.md, Accounts): the page asks GET /auth/me
// first. A single-user server does not serve /auth (404): the page goes on as it always
// has. With accounts on, the answer is 200 (a live session cookie, or a kept API key) or 401:
// then a sign-in form (name, password) covers the page until POST /auth/session sets the
// session cookie (HttpOnly: the page never sees it). The CSRF token of either answer is
// kept in memory (api.js) and sent with every write. The header then says "signed in as
// NAME" with a Sign out button; a 401 later (the session expired, was signed out in another
// tab, or the account was removed) brings the form back, and signing in again reloads the
// page, so that nothing of the previous session's lists stays on it. What this browser keeps
// (the metric history and chats in IndexedDB, run names, the form's memory, a token in
// localStorage) is one user's: when someone else signs in here, it is deleted first.

import { api, ApiError, authHeaders, getToken, setSession, setToken } from "./api.js";
import { el } from "./dom.js";

const SIGN_IN_NOTE = "This studio has accounts: sign in with the name and password an admin gave you.";
const ENDED_NOTE = "Your session has ended (it expired, was signed out, or the account was removed): sign in again.";
// Whose this browser's kept data is (localStorage); every key and database of the page starts with PREFIX.
const PREFIX = "finetune-studio";
const USER_KEY = `${PREFIX}.user`;

/** Delete what this browser keeps for the page (localStorage keys, IndexedDB databases) unless it is `name`'s. */
async function keepOnlyFor(name) {
  let last = null;
  try {
    last = localStorage.getItem(USER_KEY);
  } catch {
    return; // storage blocked: nothing is kept
  }
  if (last === name) return;
  for (const key of Object.keys(localStorage)) {
    if (key.startsWith(`${PREFIX}.`)) localStorage.removeItem(key);
  }
  const databases = indexedDB.databases ? await indexedDB.databases() : [];
  await Promise.all(databases.filter((db) => db.name && db.name.startsWith(PREFIX)).map((db) => new Promise((done) => {
    const request = indexedDB.deleteDatabase(db.name);
    request.onsuccess = request.onerror = request.onblocked = () => done();
  })));
  localStorage.setItem(USER_KEY, name);
}

/** What GET /auth/me says: {mode: "single", sure} (no accounts; not sure: no answer), {mode: "in", me}, or {mode: "out"}. */
async function whoAmI() {
  let response;
  try {
    response = await fetch("auth/me", {
      headers: { Accept: "application/json", ...authHeaders() }, cache: "no-store", credentials: "same-origin",
    });
  } catch {
    return { mode: "single", sure: false }; // no answer: the page's own polling says so; a later 401 asks again
  }
  // 429: too many failures from this address, which only a server with accounts counts.
  if (response.status === 401 || response.status === 429) return { mode: "out" };
  if (!response.ok) return { mode: "single", sure: response.status === 404 }; // 404: the server has no accounts
  return { mode: "in", me: await response.json() };
}

class SignInDialog {
  constructor() {
    this.name = el("input", { id: "signin-name", "data-testid": "signin-name", name: "username", autocomplete: "username",
      spellcheck: "false", required: true, maxlength: 64 });
    this.password = el("input", { id: "signin-password", "data-testid": "signin-password", type: "password",
      autocomplete: "current-password", required: true, maxlength: 1024 });
    this.note = el("p", { class: "dialog-note", "data-testid": "signin-note" }, SIGN_IN_NOTE);
    this.error = el("p", { class: "dialog-error", "data-testid": "signin-error", role: "alert", hidden: true });
    this.submit = el("button", { type: "submit", class: "btn btn-primary", "data-testid": "signin-submit" }, "Sign in");
    const form = el("form", { "data-testid": "signin-form", novalidate: true, onsubmit: (event) => {
      event.preventDefault();
      this.send();
    } },
    el("h2", { id: "signin-title" }, "Sign in"), this.note,
    el("div", { class: "field" }, el("label", { for: "signin-name" }, "Name"), this.name),
    el("div", { class: "field" }, el("label", { for: "signin-password" }, "Password"), this.password),
    this.error,
    el("div", { class: "dialog-actions" }, el("span", { class: "spacer" }), this.submit));
    this.dialog = el("dialog", { class: "signin-dialog", "data-testid": "signin-dialog", "aria-labelledby": "signin-title" }, form);
    // Nothing of the page is used before signing in: Escape does not close the form.
    this.dialog.addEventListener("cancel", (event) => event.preventDefault());
    document.body.append(this.dialog);
    this.done = null;
  }

  /** Show the form; resolves with POST /auth/session's answer once a sign-in went through. */
  ask(note) {
    this.note.textContent = note;
    this.showError("");
    if (!this.dialog.open) this.dialog.showModal();
    (this.name.value ? this.password : this.name).focus();
    return new Promise((resolve) => {
      this.done = resolve;
    });
  }

  showError(text) {
    this.error.textContent = text;
    this.error.hidden = !text;
  }

  async send() {
    const name = this.name.value.trim();
    if (!name || !this.password.value) {
      this.showError(!name ? "name: enter your user name" : "password: enter your password");
      (!name ? this.name : this.password).focus();
      return;
    }
    this.submit.disabled = true;
    try {
      const answer = await api("auth/session", { method: "POST", body: { name, password: this.password.value } });
      this.password.value = "";
      this.dialog.close();
      if (this.done) this.done(answer);
    } catch (error) {
      this.showError(error instanceof ApiError ? error.lines.join(" ") : `The server could not be reached: ${error.message || error}`);
      this.password.select();
    } finally {
      this.submit.disabled = false;
    }
  }
}

/** The header's "signed in as NAME" and its Sign out button (in #account). */
function showAccount(me) {
  const root = document.getElementById("account");
  const signOut = el("button", { type: "button", class: "btn btn-ghost btn-small", "data-testid": "sign-out", onclick: async () => {
    signOut.disabled = true;
    try {
      await api("auth/session", { method: "DELETE" });
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) { // a 401: signed out already
        signOut.disabled = false;
        alert(`Signing out failed: ${error.message || error}`);
        return;
      }
    }
    location.replace(location.pathname); // the page starts again from the sign-in form, showing no run
  } }, "Sign out");
  root.replaceChildren(
    el("span", { class: "account-who" }, "Signed in as ", el("strong", { "data-testid": "account-name" }, me.name),
      me.admin ? el("span", { class: "muted" }, " (admin)") : null),
    me.session ? signOut : el("span", { class: "muted" }, " (API key)"),
  );
  root.dataset.user = me.name;
  root.hidden = false;
}

/**
 * Before the rest of the page: null for a server without accounts (nothing changes), else
 * the signed-in caller (GET /auth/me's answer), once the form has signed them in if needed.
 */
export async function setUpAccount() {
  const found = await whoAmI();
  if (found.mode === "single") {
    // Unreachable when the page loaded: a 401 later may still say the server has accounts.
    if (!found.sure) {
      const again = () => whoAmI().then((now) => {
        if (now.mode !== "single") location.reload(); // accounts after all: the page starts at the sign-in
        else if (now.sure) window.removeEventListener("studio:unauthorized", again);
      });
      window.addEventListener("studio:unauthorized", again);
    }
    return null;
  }
  const dialog = new SignInDialog();
  let me = found.me;
  setSession(me ? me.csrf_token : "");
  if (!me) {
    me = await dialog.ask(SIGN_IN_NOTE);
    if (getToken()) setToken(""); // the kept token was refused: the session is what signs in now
    setSession(me.csrf_token);
  }
  await keepOnlyFor(me.name);
  showAccount(me);
  let checking = false;
  window.addEventListener("studio:unauthorized", async () => {
    if (dialog.dialog.open || checking) return;
    checking = true;
    try {
      if ((await whoAmI()).mode !== "out") return; // refused for another reason than the session
      document.getElementById("account").hidden = true;
      setSession("");
      const now = await dialog.ask(ENDED_NOTE);
      if (now.name !== me.name) {
        await keepOnlyFor(now.name);
        location.replace(location.pathname); // someone else: none of the last one's runs is shown
      } else {
        location.reload(); // the page starts again, signed in
      }
    } finally {
      checking = false;
    }
  });
  return me;
}
