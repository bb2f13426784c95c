// The Settings dialog: the API token (kept in localStorage by api.js), the
// "token set" mark on its button, the prompt that opens when the server answers
// 401, and the button that clears this browser's metric history.

import { getToken, setToken, TOKEN_KEY } from "./api.js";
import { clearHistory } from "./history.js";

const ASK_FOR_TOKEN =
  "This server wants an API token: enter the value of FINETUNE_STUDIO_TOKEN it was started with.";

/** Wire the dialog to the page; a saved token is announced by api.js's "studio:token" event. */
export function setUpSettings() {
  const dialog = document.getElementById("settings");
  const tokenInput = document.getElementById("token-input");
  const note = document.getElementById("settings-note");
  // Asked and declined: stop asking until a 401 after a new token.
  let dismissed = false;

  function renderTokenState() {
    const set = Boolean(getToken());
    const el = document.getElementById("token-state");
    el.textContent = set ? "token set" : "no token";
    el.dataset.set = String(set);
  }

  function open(text) {
    if (dialog.open) return;
    tokenInput.value = getToken();
    note.hidden = !text;
    note.textContent = text || "";
    dialog.showModal();
    tokenInput.focus();
    tokenInput.select();
  }

  document.getElementById("settings-button").addEventListener("click", () => open(""));
  document.getElementById("settings-cancel").addEventListener("click", () => dialog.close("cancel"));
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
    if (!dismissed) open(ASK_FOR_TOKEN);
  });
  window.addEventListener("studio:token", renderTokenState);
  // A token saved in another tab.
  window.addEventListener("storage", (event) => {
    if (event.key === TOKEN_KEY) setToken(getToken());
  });
  renderTokenState();
}
