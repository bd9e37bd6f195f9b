// The chat page: conversations, the composer, streaming with Stop, models, theme and the key.

import { AuthError, setKey } from "./api.js";
import { generate } from "./chat.js";
import { initSettings } from "./settings.js";
import * as store from "./store.js";
import { askKey, initTheme, loadModels } from "./topbar.js";
import { renderList, renderTurns } from "./view.js";

const $ = (id) => document.getElementById(id);
const state = { convs: [], current: null, running: new Map() }; // running: conv id -> controller

function showBanner(text) {
  const b = $("banner");
  b.textContent = text;
  b.hidden = false;
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
}

async function persist(conv) {
  conv.updated = Date.now();
  try {
    await store.saveConversation(conv);
  } catch (e) {
    showBanner(`Could not save "${conv.title}" (kept in this tab only): ${e.message || e}`);
  }
}

function busy() {
  return state.current !== null && state.running.has(state.current.id);
}

function drawList() {
  const id = state.current && state.current.id;
  renderList($("conv-list"), state.convs, id, $("search").value, {
    open: openConv,
    rename: async (cid, title) => {
      const conv = state.convs.find((c) => c.id === cid);
      conv.title = title;
      await persist(conv);
      drawList();
    },
    remove: async (cid) => {
      if (state.running.has(cid)) state.running.get(cid).abort();
      try {
        await store.deleteConversation(cid);
      } catch (e) {
        return showBanner(`Could not delete: ${e.message || e}`);
      }
      state.convs = state.convs.filter((c) => c.id !== cid);
      if (state.current && state.current.id === cid) state.current = null;
      draw();
    },
    refresh: drawList,
  });
}

let lastReply = null;
function draw() {
  drawList();
  const box = $("messages");
  if (!state.current) {
    box.replaceChildren();
    lastReply = null;
  } else {
    lastReply = renderTurns(box, state.current, busy(), {
      edit: (text) => branch(text),
      regenerate: () => branch(null),
      select: async (i, k) => {
        state.current.turns[i].sel = k;
        draw();
        await persist(state.current);
      },
    });
  }
  $("send").hidden = busy();
  $("stop").hidden = !busy();
}

function openConv(id) {
  state.current = state.convs.find((c) => c.id === id) || null;
  localStorage.setItem("mlxd.current", id);
  document.body.classList.remove("side-open");
  draw();
}

async function send(text) {
  if (!state.current) {
    const now = Date.now();
    state.current = { id: newId(), title: text.slice(0, 48), created: now, updated: now, turns: [] };
    state.convs.unshift(state.current);
    localStorage.setItem("mlxd.current", state.current.id);
  }
  state.current.turns.push({ sel: 0, alts: [{ user: text, reply: { content: "" } }] });
  await run(state.current);
}

// A new version of the last turn: edited text, or the same text again; old versions stay.
async function branch(text) {
  const turn = state.current.turns[state.current.turns.length - 1];
  const user = text === null ? turn.alts[turn.sel].user : text;
  turn.alts.push({ user, reply: { content: "" } });
  turn.sel = turn.alts.length - 1;
  await run(state.current);
}

async function run(conv) {
  const controller = new AbortController();
  state.running.set(conv.id, controller);
  const turn = conv.turns[conv.turns.length - 1];
  const reply = turn.alts[turn.sel].reply;
  draw();
  await persist(conv);
  let pending = false;
  const redraw = () => {
    if (pending) return; // at most one redraw a frame, however fast tokens come
    pending = true;
    setTimeout(() => {
      pending = false;
      if (state.current === conv && state.running.has(conv.id) && lastReply) {
        const box = $("messages"); // follow the answer unless the user scrolled up
        const follow = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
        lastReply.update(reply, false);
        if (follow) box.scrollTop = box.scrollHeight;
      }
    }, 40);
  };
  try {
    await generate(conv, reply, $("model").value, controller.signal, redraw, AuthError);
  } catch (e) {
    askKey();
  } finally {
    state.running.delete(conv.id);
  }
  await persist(conv); // saved before Send comes back: a reload right after keeps the answer
  if (state.current === conv) draw();
}

function initComposer() {
  const input = $("input");
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = input.value;
    if (!text.trim() || busy()) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => {
    if (busy()) state.running.get(state.current.id).abort();
  });
}

function initSidebar() {
  $("new-chat").addEventListener("click", () => {
    state.current = null;
    localStorage.removeItem("mlxd.current");
    document.body.classList.remove("side-open");
    draw();
    $("input").focus();
  });
  $("search").addEventListener("input", drawList);
  $("open-side").addEventListener("click", () => document.body.classList.add("side-open"));
  $("close-side").addEventListener("click", () => document.body.classList.remove("side-open"));
  $("settings-toggle").addEventListener("click", () => {
    const panel = $("settings");
    panel.hidden = !panel.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!panel.hidden));
  });
  $("export").addEventListener("click", () => {
    const blob = new Blob([store.exportJSON(state.convs)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `mlxd-chats-${new Date().toISOString().slice(0, 10)}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  });
  $("import-file").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    e.target.value = "";
    if (!file) return;
    try {
      const list = store.parseImport(await file.text());
      for (const conv of list) await store.saveConversation(conv);
      await reload();
    } catch (err) {
      showBanner(`Import failed (nothing changed): ${err.message || err}`);
    }
  });
  $("key-form").addEventListener("submit", () => {
    setKey($("key-input").value.trim());
    $("banner").hidden = true;
    loadModels(showBanner);
  });
  $("banner").addEventListener("click", () => ($("banner").hidden = true));
}

// The stored list, keeping this tab's in-flight conversations as they are in memory.
async function reload() {
  let stored;
  try {
    stored = await store.listConversations();
  } catch (e) {
    document.body.dataset.loaded = "1";
    return showBanner(`Conversations could not be loaded (nothing was deleted): ${e.message || e}`);
  }
  const live = new Map(state.convs.filter((c) => state.running.has(c.id)).map((c) => [c.id, c]));
  state.convs = stored.map((c) => live.get(c.id) || c);
  const id = state.current ? state.current.id : localStorage.getItem("mlxd.current");
  state.current = state.convs.find((c) => c.id === id) || state.current;
  if (state.current && !state.convs.includes(state.current)) state.convs.unshift(state.current);
  draw();
  document.body.dataset.loaded = "1"; // the stored list is in (tests wait for it)
}

window.hljs.configure({ ignoreUnescapedHTML: true });
initTheme();
initComposer();
initSidebar();
initSettings(showBanner);
reload();
loadModels(showBanner);
window.addEventListener("focus", () => {
  if (!busy()) reload(); // another tab may have added conversations
});
