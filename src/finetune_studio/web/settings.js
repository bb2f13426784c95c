// The Settings dialog: the API token (kept in localStorage by api.js), checked
// with the server before it is kept (a wrong one is refused in the dialog, in
// words), the token's state on its button ("no token", "token set", "token
// rejected"), the prompt that opens when the server answers 401, and the button
// that clears this browser's metric history.

import { accountsOn, getToken, setToken, TOKEN_KEY } from "./api.js";
import { clearHistory } from "./history.js";

const ASK_FOR_TOKEN =
  "This server wants an API token: enter the value of FINETUNE_STUDIO_TOKEN it was started with.";
const REJECTED =
  "The server refused this token (401): it is not the FINETUNE_STUDIO_TOKEN the server was started with. Check it and try again.";
const WANTED = "The server wants a token: without one it shows no runs and starts none.";

/** "ok" when the server takes `token` on an API path, "rejected" on a 401, "unreachable" otherwise. */
async function checkToken(token) {
  try {
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    const response = await fetch("train/jobs", { headers, cache: "no-store" });
    return response.status === 401 ? "rejected" : "ok";
  } catch {
    return "unreachable";
  }
}

/** Wire the dialog to the page; a saved token is announced by api.js's "studio:token" event. */
export function setUpSettings() {
  const dialog = document.getElementById("settings");
  const tokenInput = document.getElementById("token-input");
  const note = document.getElementById("settings-note");
  const problem = document.getElementById("settings-error");
  const save = document.getElementById("token-save");
  // Asked and declined: stop asking until a 401 after a new token.
  let dismissed = false;
  // The server refused the token in use (a 401 since it was set), or the one just entered (`tried`).
  let rejected = false;
  let tried = "";

  function renderTokenState() {
    const set = Boolean(getToken());
    const el = document.getElementById("token-state");
    el.textContent = rejected ? (set || tried ? "token rejected" : "token needed") : set ? "token set" : "no token";
    el.dataset.set = String(set && !rejected);
    el.dataset.state = rejected ? "rejected" : set ? "set" : "none";
  }

  function showProblem(text) {
    problem.textContent = text;
    problem.hidden = !text;
    if (text) tokenInput.setAttribute("aria-invalid", "true");
    else tokenInput.removeAttribute("aria-invalid");
  }

  function open(text) {
    if (dialog.open) return;
    tokenInput.value = getToken();
    note.hidden = !text;
    note.textContent = text || "";
    showProblem(rejected && getToken() ? REJECTED : "");
    dialog.showModal();
    tokenInput.focus();
    tokenInput.select();
  }

  document.getElementById("settings-button").addEventListener("click", () => open(""));
  document.getElementById("settings-cancel").addEventListener("click", () => dialog.close("cancel"));
  // Save checks the token first: a wrong one stays in the dialog, refused in words.
  document.getElementById("settings-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = tokenInput.value.trim();
    save.setAttribute("aria-disabled", "true");
    save.textContent = "Checking…";
    const verdict = await checkToken(token);
    save.removeAttribute("aria-disabled");
    save.textContent = "Save";
    if (verdict === "rejected") {
      rejected = true;
      tried = token;
      renderTokenState();
      showProblem(token ? REJECTED : WANTED);
      tokenInput.focus();
      tokenInput.select();
      return;
    }
    rejected = false;
    tried = "";
    showProblem("");
    dialog.close("save");
  });
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") {
      setToken(tokenInput.value);
      dismissed = false;
    } else if (!note.hidden) {
      dismissed = true;
    }
    dialog.returnValue = "";
  });
  document.getElementById("clear-history").addEventListener("click", async () => {
    if (!confirm("Delete every run's metric history kept in this browser? The server keeps its own copy.")) return;
    await clearHistory();
    location.reload();
  });

  window.addEventListener("studio:unauthorized", () => {
    if (accountsOn()) return; // the sign-in form asks (signin.js)
    rejected = true;
    renderTokenState();
    if (!dismissed) open(ASK_FOR_TOKEN);
  });
  // The server answered with the token in use: it is good.
  window.addEventListener("studio:authorized", () => {
    if (!rejected) return;
    rejected = false;
    renderTokenState();
  });
  window.addEventListener("studio:token", renderTokenState);
  // A token saved in another tab.
  window.addEventListener("storage", (event) => {
    if (event.key === TOKEN_KEY) setToken(getToken());
  });
  renderTokenState();
}
