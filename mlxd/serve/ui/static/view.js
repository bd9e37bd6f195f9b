// The message list: a turn is a user message and its reply, with alternatives (edits and
// regenerations) kept side by side and a "< 1/2 >" switcher; nothing is ever overwritten.

import { el, renderMarkdown, splitThink } from "./render.js";

export function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.prompt !== undefined) parts.push(`prompt ${stats.prompt}`);
  if (stats.cached !== undefined) parts.push(`cached ${stats.cached}`);
  if (stats.completion !== undefined) parts.push(`completion ${stats.completion}`);
  if (stats.ttft_ms !== undefined) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tps !== undefined) parts.push(`${stats.tps.toFixed(1)} tok/s`);
  return parts.join(" · ");
}

// The reply's reasoning (from the delta fields and from <think> in content) and its answer.
export function replyParts(reply) {
  const split = splitThink(reply.content || "");
  const reasoning = [reply.reasoning || "", split.reasoning].filter((s) => s.trim()).join("\n");
  return { reasoning, content: split.content };
}

// A reply's node; `update(reply, final)` redraws it while it streams.
export function replyNode(reply, streaming) {
  const node = el("div", "msg assistant");
  const think = el("details", "reasoning");
  const summary = el("summary", null, "Reasoning");
  const thinkBody = el("div", "reasoning-body");
  think.append(summary, thinkBody);
  const body = el("div", "content");
  const error = el("div", "error");
  const stats = el("div", "stats");
  node.append(think, body, error, stats);
  let lastReasoning = null;
  node.update = (r, final) => {
    const parts = replyParts(r);
    think.hidden = !parts.reasoning;
    if (parts.reasoning !== lastReasoning) {
      thinkBody.textContent = parts.reasoning; // reasoning is shown as text: never parsed as HTML
      lastReasoning = parts.reasoning;
    }
    think.open = !final && !parts.content.trim(); // open while thinking, folded once it answers
    summary.textContent = !final && !parts.content.trim() ? "Reasoning…" : "Reasoning";
    renderMarkdown(body, parts.content, final);
    node.classList.toggle("streaming", !final);
    error.hidden = !r.error;
    error.textContent = r.error ? `Error: ${r.error}` : "";
    let text = statsText(r.stats);
    if (r.stopped) text = text ? `${text} · stopped` : "stopped";
    stats.textContent = text;
  };
  node.update(reply, !streaming);
  return node;
}

function switcher(turn, onSwitch) {
  const box = el("span", "switcher");
  const prev = el("button", "icon prev", "<");
  const label = el("span", "alt-label", `${turn.sel + 1}/${turn.alts.length}`);
  const next = el("button", "icon next", ">");
  prev.type = next.type = "button";
  prev.setAttribute("aria-label", "Previous version");
  next.setAttribute("aria-label", "Next version");
  prev.disabled = turn.sel === 0;
  next.disabled = turn.sel === turn.alts.length - 1;
  prev.addEventListener("click", () => onSwitch(turn.sel - 1));
  next.addEventListener("click", () => onSwitch(turn.sel + 1));
  box.append(prev, label, next);
  return box;
}

function editor(text, onSubmit, onCancel) {
  const form = el("form", "edit");
  const area = el("textarea");
  area.value = text;
  area.rows = 3;
  const save = el("button", null, "Send");
  save.type = "submit";
  const cancel = el("button", null, "Cancel");
  cancel.type = "button";
  cancel.addEventListener("click", onCancel);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (area.value.trim()) onSubmit(area.value);
  });
  form.append(area, save, cancel);
  setTimeout(() => area.focus(), 0);
  return form;
}

// Draws every turn of `conv` into `box`; returns the reply node of the last turn.
// `h` has edit(text), regenerate(), select(turnIndex, altIndex); `busy` hides those while streaming.
export function renderTurns(box, conv, busy, h) {
  box.replaceChildren();
  let last = null;
  conv.turns.forEach((turn, i) => {
    const alt = turn.alts[turn.sel];
    const isLast = i === conv.turns.length - 1;
    const user = el("div", "msg user");
    user.append(el("div", "content user-text", alt.user));
    const tools = el("div", "tools");
    if (turn.alts.length > 1) tools.append(switcher(turn, (k) => h.select(i, k)));
    if (isLast && !busy) {
      const edit = el("button", "edit-btn", "Edit");
      edit.type = "button";
      edit.addEventListener("click", () => {
        user.replaceChildren(
          editor(alt.user, (text) => h.edit(text), () => renderTurns(box, conv, busy, h)),
        );
      });
      const regen = el("button", "regen-btn", "Regenerate");
      regen.type = "button";
      regen.addEventListener("click", () => h.regenerate());
      tools.append(edit, regen);
    }
    user.append(tools);
    last = replyNode(alt.reply, isLast && busy);
    box.append(user, last);
  });
  box.scrollTop = box.scrollHeight;
  return last;
}

// The sidebar: conversations (filtered by `query` over titles and messages), rename and delete.
export function renderList(ul, convs, currentId, query, h) {
  ul.replaceChildren();
  const q = query.trim().toLowerCase();
  for (const c of convs) {
    if (q && !matches(c, q)) continue;
    const li = el("li", c.id === currentId ? "conv current" : "conv");
    li.dataset.id = c.id;
    const title = el("button", "conv-title", c.title || "New chat");
    title.type = "button";
    title.addEventListener("click", () => h.open(c.id));
    const rename = el("button", "icon rename", "✎");
    rename.type = "button";
    rename.setAttribute("aria-label", "Rename");
    rename.addEventListener("click", () => {
      const input = el("input", "rename-input");
      input.value = c.title || "";
      let done = false; // Enter, then the blur it causes: one rename
      const commit = (keep) => {
        if (done) return;
        done = true;
        if (keep) h.rename(c.id, input.value.trim() || c.title);
        else h.refresh();
      };
      input.addEventListener("keydown", (e) => {
        if (e.key === "Enter") commit(true);
        if (e.key === "Escape") commit(false);
      });
      input.addEventListener("blur", () => commit(true));
      li.replaceChildren(input);
      input.focus();
      input.select();
    });
    const del = el("button", "icon delete", "✕");
    del.type = "button";
    del.setAttribute("aria-label", "Delete");
    del.addEventListener("click", () => {
      if (del.dataset.armed) return h.remove(c.id); // the second click confirms
      del.dataset.armed = "1";
      del.textContent = "Delete?";
      setTimeout(() => {
        delete del.dataset.armed;
        del.textContent = "✕";
      }, 3000);
    });
    li.append(title, rename, del);
    ul.append(li);
  }
}

function matches(conv, q) {
  if ((conv.title || "").toLowerCase().includes(q)) return true;
  return conv.turns.some((t) =>
    t.alts.some((a) => `${a.user}\n${a.reply.content}`.toLowerCase().includes(q)),
  );
}
