// The top bar: the model picker (from /v1/models, with each entry's state and parent), the key
// prompt a 401 opens, and the theme toggle (the system's, dark, light).

import { AuthError, listModels } from "./api.js";

const $ = (id) => document.getElementById(id);

export async function loadModels(showBanner) {
  const select = $("model");
  let models;
  try {
    models = await listModels();
  } catch (e) {
    if (e instanceof AuthError) return askKey();
    return showBanner(`Cannot list models: ${e.message || e}`);
  }
  const want = select.value || localStorage.getItem("mlxd.model");
  select.replaceChildren();
  for (const m of models) {
    const option = document.createElement("option");
    option.value = m.id;
    let label = m.id;
    if (m.parent) label += ` (adapter of ${m.parent})`;
    if (m.state) label += ` — ${m.state}`;
    option.textContent = label;
    select.append(option);
  }
  if (models.some((m) => m.id === want)) select.value = want;
}

export function askKey() {
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
}

export function initTheme() {
  const button = $("theme-toggle");
  const label = () => {
    const t = document.documentElement.dataset.theme || "auto";
    button.textContent = { auto: "◐ Auto", dark: "☾ Dark", light: "☀ Light" }[t];
  };
  button.addEventListener("click", () => {
    const order = { auto: "dark", dark: "light", light: "auto" };
    const next = order[document.documentElement.dataset.theme || "auto"];
    if (next === "auto") delete document.documentElement.dataset.theme;
    else document.documentElement.dataset.theme = next;
    localStorage.setItem("mlxd.theme", next);
    label();
  });
  label();
}
