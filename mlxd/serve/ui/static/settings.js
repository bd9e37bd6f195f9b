// The settings panel, kept in localStorage. An empty field is the server's default: it is not sent.

const ITEM = "mlxd.settings";
// field -> how its text becomes the request's value
const NUMBERS = {
  temperature: parseFloat,
  top_p: parseFloat,
  top_k: (v) => parseInt(v, 10),
  min_p: parseFloat,
  max_tokens: (v) => parseInt(v, 10),
  seed: (v) => parseInt(v, 10),
};

function field(name) {
  return document.getElementById(`set-${name}`);
}

function load() {
  try {
    return JSON.parse(localStorage.getItem(ITEM) || "{}") || {};
  } catch (e) {
    return {}; // unreadable settings: the defaults, the item stays for the user to fix
  }
}

export function initSettings(onError) {
  const saved = load();
  for (const name of ["system", ...Object.keys(NUMBERS)]) {
    const input = field(name);
    if (typeof saved[name] === "string") input.value = saved[name];
    input.addEventListener("input", () => {
      const all = {};
      for (const n of ["system", ...Object.keys(NUMBERS)]) all[n] = field(n).value;
      try {
        localStorage.setItem(ITEM, JSON.stringify(all));
      } catch (e) {
        onError(`Settings not saved: ${e.message}`);
      }
    });
  }
}

// The request fields the user set, and the system prompt ("" when none).
export function currentSettings() {
  const params = {};
  for (const [name, parse] of Object.entries(NUMBERS)) {
    const text = field(name).value.trim();
    if (text === "") continue;
    const value = parse(text);
    if (Number.isFinite(value)) params[name] = value;
  }
  return { params, system: field("system").value.trim() };
}
