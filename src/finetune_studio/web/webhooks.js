// The webhooks panel (docs/API.md, Webhooks): register a URL for the events it wants (the
// choices come from GET /webhook-events), see its secret once, send it a test event, see each
// delivery with its attempts, and remove it. Deliveries that are still pending are read again
// every POLL_MS while the panel is open, until each has been delivered or has failed.
// Every text from the server is put in the page as text, never as markup.

import { api, ApiError } from "./api.js";
import { el, fillList, secretPanel, showLines, showOnce } from "./dom.js";
import { when } from "./format.js";
import { renderScheduler } from "./schedule.js";

const POLL_MS = 1000;
const DELIVERIES_SHOWN = 20;
const STATE_LABELS = { pending: "Pending", delivered: "Delivered", failed: "Failed" };

/** The outcome of a delivery's latest attempt, in words. */
function lastAttempt(delivery) {
  const attempt = delivery.attempts[delivery.attempts.length - 1];
  if (!attempt) return delivery.next_attempt_at ? `not sent yet (due ${when(delivery.next_attempt_at)})` : "not sent yet";
  const outcome = attempt.status_code != null ? `HTTP ${attempt.status_code}` : attempt.error || "no answer";
  const count = delivery.attempts.length;
  return `${outcome} after ${count} attempt${count === 1 ? "" : "s"}`;
}

export class WebhooksPanel {
  constructor(root) {
    this.root = root;
    this.eventTypes = null; // [{name, description}], read once
    this.hooks = []; // GET /webhooks's data
    this.deliveries = new Map(); // webhook id -> its deliveries, for those whose list is open
    this.secret = null; // {id, secret} of the one just added: shown once
    this.error = null; // lines of the last refusal
    this.timer = 0;
    this.schedule = renderScheduler(() => this.draw());
    this.build();
    root.addEventListener("toggle", () => {
      if (root.open) this.load();
      else this.stopPolling();
    });
    window.addEventListener("studio:token", () => {
      if (root.open) this.load();
    });
  }

  build() {
    this.url = el("input", { id: "webhook-url", "data-testid": "webhook-url", type: "url", required: true, spellcheck: "false",
      placeholder: "https://example.com/hooks" });
    this.events = el("fieldset", { class: "webhook-events", "data-testid": "webhook-events" }, el("legend", "Events"));
    Object.assign(this, secretPanel(this.root, {
      name: "webhook", button: ["Add webhook", "webhook-add"], secretId: "webhook-secret", label: "Webhooks", submit: () => this.add(),
      fields: [el("label", { class: "field", for: "webhook-url" }, "URL"), this.url, this.events],
    }));
  }

  async load() {
    try {
      if (!this.eventTypes) {
        this.eventTypes = (await api("webhook-events")).data;
        this.renderEvents();
      }
      this.hooks = (await api("webhooks")).data;
      this.error = null;
      await Promise.all([...this.deliveries.keys()].map((id) => this.loadDeliveries(id)));
    } catch (error) {
      this.error = error instanceof ApiError ? error.lines : [String(error.message || error)];
    }
    this.schedule();
    this.pollIfPending();
  }

  renderEvents() {
    const boxes = this.eventTypes.map(({ name, description }) =>
      el("label", { class: "webhook-event", title: description },
        el("input", { type: "checkbox", name: "webhook-event", value: name, "data-testid": `webhook-event-${name}`,
          checked: name.startsWith("fine_tuning.job.") }),
        el("code", name)));
    this.events.replaceChildren(el("legend", "Events"), ...boxes);
  }

  chosenEvents() {
    return [...this.events.querySelectorAll("input[name=webhook-event]:checked")].map((input) => input.value);
  }

  async add() {
    this.addButton.disabled = true;
    try {
      const created = await api("webhooks", { method: "POST", body: { url: this.url.value.trim(), events: this.chosenEvents() } });
      this.secret = { id: created.id, secret: created.secret };
      this.url.value = "";
      this.error = null;
      this.hooks = (await api("webhooks")).data;
    } catch (error) {
      this.error = error instanceof ApiError ? error.lines : [String(error.message || error)];
    } finally {
      this.addButton.disabled = false;
    }
    this.schedule();
  }

  async act(hook, action) {
    try {
      if (action === "remove") {
        await api(`webhooks/${encodeURIComponent(hook.id)}`, { method: "DELETE" });
        this.deliveries.delete(hook.id);
        if (this.secret && this.secret.id === hook.id) this.secret = null;
        this.hooks = (await api("webhooks")).data;
      } else if (action === "test") {
        await api(`webhooks/${encodeURIComponent(hook.id)}/test`, { method: "POST" });
        await this.loadDeliveries(hook.id);
      } else if (this.deliveries.has(hook.id)) {
        this.deliveries.delete(hook.id);
      } else {
        await this.loadDeliveries(hook.id);
      }
      this.error = null;
    } catch (error) {
      this.error = error instanceof ApiError ? error.lines : [String(error.message || error)];
    }
    this.schedule();
    this.pollIfPending();
  }

  async loadDeliveries(id) {
    const answer = await api(`webhooks/${encodeURIComponent(id)}/deliveries?limit=${DELIVERIES_SHOWN}`);
    this.deliveries.set(id, answer.data);
  }

  /** Read the open lists again while a delivery in them is pending (and the panel is open). */
  pollIfPending() {
    const pending = [...this.deliveries.values()].some((list) => list.some((d) => d.state === "pending"));
    if (!pending || !this.root.open || this.timer) return;
    this.timer = setTimeout(async () => {
      this.timer = 0;
      try {
        await Promise.all([...this.deliveries.keys()].map((id) => this.loadDeliveries(id)));
        this.hooks = (await api("webhooks")).data; // a webhook may have been disabled meanwhile
      } catch (error) {
        this.error = error instanceof ApiError ? error.lines : [String(error.message || error)];
      }
      this.schedule();
      this.pollIfPending();
    }, POLL_MS);
  }

  stopPolling() {
    clearTimeout(this.timer);
    this.timer = 0;
  }

  draw() {
    showLines(this.errorBox, this.error);
    showOnce(this.secretBox, "Its signing secret, shown this once: ", this.secret && this.secret.secret,
      "webhook-secret-value");
    fillList(this.list, this.hooks.map((hook) => this.item(hook)), "No webhooks yet.");
  }

  item(hook) {
    const button = (label, action, testid) =>
      el("button", { type: "button", class: "btn btn-small", "data-testid": testid, onclick: () => this.act(hook, action) }, label);
    const deliveries = this.deliveries.get(hook.id);
    const parts = [
      el("div", { class: "webhook-head" },
        el("code", { class: "webhook-target", "data-testid": "webhook-target", title: hook.url }, hook.url),
        hook.disabled ? el("span", { class: "badge", "data-phase": "error", "data-testid": "webhook-disabled" }, "Disabled") : null),
      el("div", { class: "muted webhook-subscribed" }, hook.events.join(", ")),
      hook.disabled && hook.disabled_reason ? el("div", { class: "webhook-reason" }, hook.disabled_reason) : null,
      el("div", { class: "webhook-actions" },
        button("Send test", "test", "webhook-test"),
        button(deliveries ? "Hide deliveries" : "Deliveries", "deliveries", "webhook-deliveries-toggle"),
        button("Remove", "remove", "webhook-remove")),
    ];
    if (deliveries) {
      const rows = deliveries.map((delivery) =>
        el("li", { class: "webhook-delivery", "data-testid": "webhook-delivery", "data-state": delivery.state, title: delivery.id },
          el("code", delivery.event_type), " ",
          el("span", { class: "badge", "data-testid": "webhook-delivery-state" }, STATE_LABELS[delivery.state] || delivery.state), " ",
          el("span", { class: "muted" }, `${when(delivery.created_at)}: ${lastAttempt(delivery)}`),
          delivery.last_error && delivery.state !== "delivered" ? el("div", { class: "webhook-reason" }, delivery.last_error) : null));
      parts.push(el("ul", { class: "webhook-deliveries", "data-testid": "webhook-deliveries" },
        rows.length ? rows : [el("li", { class: "muted" }, "No deliveries yet.")]));
    }
    return el("li", { class: "webhook", "data-testid": "webhook", "data-webhook-id": hook.id }, parts);
  }
}
