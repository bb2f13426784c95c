// Data files from this computer: dropped on the form or picked, uploaded to the
// server's one file store (POST /v1/files, purpose "studio": checked there, kept
// under its data dir), named in the form's dataset list, listed for reuse (GET
// /v1/files), and previewed: the first rows as a job would read them (POST
// /datasets/inspect, where the server has it).

import { api, ApiError } from "./api.js";
import { el } from "./dom.js";
import { inWords } from "./fields.js";
import { bytes } from "./format.js";

const PURPOSE = "studio";

/** What a training request names for a stored file: its path on the server where the store says it, else its id. */
export function datasetName(file) {
  return file.path || file.local_path || file.id;
}

export class Uploads {
  constructor(form) {
    this.form = form;
    this.zone = form.querySelector("#dropzone");
    this.input = form.querySelector("#upload-input");
    this.state = form.querySelector("#upload-state");
    this.listBox = form.querySelector("#uploads");
    this.list = form.querySelector("#upload-list");
    this.files = [];
    this.input.addEventListener("change", () => {
      this.upload([...this.input.files]);
      this.input.value = "";
    });
    this.zone.addEventListener("dragover", (event) => {
      event.preventDefault();
      this.zone.dataset.over = "true";
    });
    this.zone.addEventListener("dragleave", () => delete this.zone.dataset.over);
    this.zone.addEventListener("drop", (event) => {
      event.preventDefault();
      delete this.zone.dataset.over;
      this.upload([...(event.dataTransfer ? event.dataTransfer.files : [])]);
    });
  }

  /** The files uploaded before (this server's studio files). */
  async load() {
    try {
      const answer = await api(`v1/files?purpose=${PURPOSE}`);
      this.files = (answer.data || []).filter((file) => file.purpose === PURPOSE);
      this.renderList();
    } catch {
      // no file store on this server, or no token yet: nothing to list
    }
  }

  say(text, isError = false) {
    this.state.textContent = text;
    this.state.dataset.error = String(isError);
  }

  async upload(files) {
    if (!files.length) return;
    for (const file of files) {
      this.say(`Uploading ${file.name} (${bytes(file.size)})…`);
      const body = new FormData();
      body.append("purpose", PURPOSE);
      body.append("file", file, file.name);
      try {
        const stored = await api("v1/files", { method: "POST", body });
        this.files = [stored, ...this.files.filter((known) => known.id !== stored.id)];
        this.use(stored);
        this.say(`Uploaded ${stored.filename} (${bytes(stored.bytes)}), checked and stored on the server.`);
      } catch (error) {
        const text = error instanceof ApiError ? error.lines.join(" ") : String(error.message || error);
        const why = error instanceof ApiError && error.status === 404 ? "this server has no file store (/v1/files)" : text;
        this.say(`${file.name} was not uploaded: ${inWords(why)}`, true);
      }
    }
    this.renderList();
  }

  /** Name a stored file in the form's dataset list (once); the form's input event has
   * the dataset preview (inspect.js's watchDatasetFields) read it. */
  use(file) {
    const input = this.form.elements.local_datasets;
    const name = datasetName(file);
    const lines = input.value.split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
    if (!lines.includes(name)) lines.push(name);
    input.value = lines.join("\n");
    input.dispatchEvent(new Event("input", { bubbles: true }));
  }

  renderList() {
    this.listBox.hidden = this.files.length === 0;
    this.form.querySelector("#uploads-count").textContent = String(this.files.length);
    const items = this.files.map((file) =>
      el("li", { "data-file-id": file.id },
        el("span", { class: "upload-name", title: `${file.filename} · ${file.id}` }, file.filename),
        el("span", { class: "muted" }, bytes(file.bytes)),
        el("button", {
          type: "button", class: "btn btn-small", "data-testid": "upload-use", "aria-label": `Use ${file.filename}`,
          onclick: () => this.use(file),
        }, "Use")));
    this.list.replaceChildren(...items);
  }
}
