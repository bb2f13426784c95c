// The key manager (with accounts on; docs/API.md, Accounts): the signed-in user's API keys
// (GET /auth/keys: an admin's lists everyone's), each with its prefix, name, scopes, expiry
// and last use; a new key with a name, scopes (at most the user's own) and an expiry in days
// (POST /auth/keys), shown this once; and Revoke (DELETE /auth/keys/{id}), which the key's
// next request feels. Every text from the server is put in the page as text, never as markup.

import { api, ApiError } from "./api.js";
import { el, fillList, secretPanel, showLines, showOnce } from "./dom.js";
import { when } from "./format.js";
import { renderScheduler } from "./schedule.js";

export class KeysPanel {
  /** `root`: the panel (a <details>); `me`: GET /auth/me's answer (name, admin, scopes). */
  constructor(root, me) {
    this.root = root;
    this.me = me;
    this.keys = []; // GET /auth/keys's data
    this.made = null; // {id, key} of the one just made: shown once
    this.error = null; // lines of the last refusal
    this.schedule = renderScheduler(() => this.draw());
    this.build();
    root.hidden = false;
    root.addEventListener("toggle", () => {
      if (root.open) this.load();
    });
  }

  build() {
    this.name = el("input", { id: "key-name", "data-testid": "key-name", required: true, maxlength: 100, spellcheck: "false",
      placeholder: "laptop CLI" });
    const boxes = this.me.scopes.map((scope) =>
      el("label", { class: "webhook-event" },
        el("input", { type: "checkbox", name: "key-scope", value: scope, "data-testid": `key-scope-${scope}`,
          checked: scope === "read" }),
        el("code", scope)));
    this.scopes = el("fieldset", { class: "webhook-events", "data-testid": "key-scopes" }, el("legend", "Scopes"), boxes);
    this.days = el("input", { id: "key-days", "data-testid": "key-days", type: "number", min: "1", max: "3650", step: "1",
      inputmode: "numeric", placeholder: "never" });
    Object.assign(this, secretPanel(this.root, {
      name: "key", button: ["Create key", "key-create"], secretId: "key-made", label: "API keys", submit: () => this.create(),
      fields: [el("label", { class: "field", for: "key-name" }, "Name"), this.name, this.scopes,
        el("label", { class: "field", for: "key-days" }, "Expires after (days; empty: never)"), this.days],
    }));
  }

  refused(error) {
    this.error = error instanceof ApiError ? error.lines : [String(error.message || error)];
  }

  async load() {
    try {
      this.keys = (await api("auth/keys")).data;
      this.error = null;
    } catch (error) {
      this.refused(error);
    }
    this.schedule();
  }

  async create() {
    const name = this.name.value.trim();
    const scopes = [...this.scopes.querySelectorAll("input[name=key-scope]:checked")].map((input) => input.value);
    const days = this.days.value.trim();
    const problem = !name ? "name: give the key a name, to tell it apart in this list"
      : !scopes.length ? "scopes: choose at least one"
        : days && !(Number(days) > 0) ? "expires_in_days: a number of days above 0, or empty for a key that never expires"
          : null;
    if (problem) {
      this.error = [problem];
      this.schedule();
      return;
    }
    this.addButton.disabled = true;
    try {
      const body = { name, scopes, ...(days ? { expires_in_days: Number(days) } : {}) };
      const made = await api("auth/keys", { method: "POST", body });
      this.made = { id: made.id, key: made.key };
      this.name.value = "";
      this.days.value = "";
      this.error = null;
      this.keys = (await api("auth/keys")).data;
    } catch (error) {
      this.refused(error);
    } finally {
      this.addButton.disabled = false;
    }
    this.schedule();
  }

  async revoke(key) {
    try {
      await api(`auth/keys/${encodeURIComponent(key.id)}`, { method: "DELETE" });
      if (this.made && this.made.id === key.id) this.made = null;
      this.keys = (await api("auth/keys")).data;
      this.error = null;
    } catch (error) {
      this.refused(error);
    }
    this.schedule();
  }

  draw() {
    showLines(this.errorBox, this.error);
    showOnce(this.secretBox, "The new key, shown this once (copy it now; the server keeps only its hash): ",
      this.made && this.made.key, "key-secret");
    fillList(this.list, this.keys.map((key) => this.item(key)), "No API keys yet.");
  }

  item(key) {
    const owner = this.me.admin && key.user !== this.me.name ? ` of ${key.user}` : "";
    return el("li", { class: "webhook", "data-testid": "key-item", "data-key-id": key.id },
      el("div", { class: "webhook-head" },
        el("code", { class: "webhook-target", "data-testid": "key-prefix" }, `${key.prefix}…`), " ",
        el("strong", { "data-testid": "key-label" }, key.name), owner),
      el("div", { class: "muted", "data-testid": "key-scopes-shown" }, key.scopes.join(", ")),
      el("div", { class: "muted", "data-testid": "key-dates" },
        `expires ${key.expires_at ? when(key.expires_at) : "never"}; last used ${key.last_used_at ? when(key.last_used_at) : "never"}`),
      el("div", { class: "webhook-actions" },
        el("button", { type: "button", class: "btn btn-small", "data-testid": "key-revoke", onclick: () => this.revoke(key) }, "Revoke")));
  }
}
