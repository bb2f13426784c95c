// The page's one way to make elements: el(tag, props, ...children).
//
//   el("li", "a warning")                                  text as a child
//   el("code", { class: "error-code", "data-testid": "error-code" }, code)
//   el("button", { type: "button", class: "btn", onclick: () => stop() }, "Stop")
//   el("pre", { style: { whiteSpace: "pre-wrap" } }, text)
//
// props (optional; a string, a node or a list in its place is the first child):
//   class        the class names (a falsy one: none)
//   style        {property: value}: set through element.style (the CSSOM), never a style
//                attribute, so a Content-Security-Policy without 'unsafe-inline' allows it
//   onNAME       a function: addEventListener("NAME", function), e.g. onclick, onsubmit
//   any other    an attribute: true -> present (""), false/null/undefined -> left out,
//                else its String(); e.g. id, type, title, role, for, "aria-label", "data-testid"
// children: nodes; strings and numbers become text nodes (never parsed as markup:
// what the server or a model says is always text); null, undefined, false and ""
// are skipped; lists are flattened.

/** A new element `tag` with `props` and `children` (see above). */
export function el(tag, props, ...children) {
  const node = document.createElement(tag);
  if (isChild(props)) children.unshift(props);
  else if (props) setProps(node, props);
  append(node, children);
  return node;
}

/**
 * A panel that makes things the server shows a secret of once (keys.js, webhooks.js), put in `root`:
 * a form of `fields` and a submit button (`button`: its text and test id) that calls `submit()`,
 * then a box for a refusal's lines (`${name}-error`), one for the secret (`secretId`), and the list
 * (`${name}-list`, read out as `label`). Returns { addButton, errorBox, secretBox, list }.
 */
export function secretPanel(root, { name, fields, button: [text, buttonId], secretId, label, submit }) {
  const parts = {
    addButton: el("button", { type: "submit", class: "btn btn-small btn-primary", "data-testid": buttonId }, text),
    errorBox: el("div", { class: "alert alert-error", "data-testid": `${name}-error`, role: "alert", hidden: true }),
    secretBox: el("p", { class: "webhook-secret", "data-testid": secretId, role: "status", hidden: true }),
    list: el("ul", { class: "webhook-list", "data-testid": `${name}-list`, "aria-label": label }),
  };
  const form = el("form", { class: "webhook-form", "data-testid": `${name}-form`, novalidate: true, onsubmit: (event) => {
    event.preventDefault();
    submit();
  } }, fields, parts.addButton);
  root.append(form, parts.errorBox, parts.secretBox, parts.list);
  return parts;
}

/** Show `lines` (strings), one div each, in `box`; `box` is hidden while there are none (null). */
export function showLines(box, lines) {
  box.hidden = !lines;
  box.replaceChildren(...(lines || []).map((line) => el("div", line)));
}

/** A secret the server shows once: `text` and the `value` in a code element (`testid`) in `box`, hidden while none. */
export function showOnce(box, text, value, testid) {
  box.hidden = !value;
  if (value) box.replaceChildren(text, el("code", { "data-testid": testid }, value));
}

/** `list` holds `items`, or one muted line `empty` when there are none. */
export function fillList(list, items, empty) {
  list.replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, empty)]));
}

function isChild(value) {
  return typeof value === "string" || typeof value === "number" || value instanceof Node || Array.isArray(value);
}

function setProps(node, props) {
  for (const [name, value] of Object.entries(props)) {
    if (name === "class") {
      if (value) node.className = value;
    } else if (name === "style") {
      Object.assign(node.style, value);
    } else if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (value !== false && value != null) {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(node, children) {
  for (const child of children) {
    if (child == null || child === false || child === "") continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}
