// The live dashboard: polls /v1/dashboard every second and redraws. Everything the server
// sends goes in as text (textContent), never as markup. No libraries: the plots are inline SVG.
"use strict";

const KEY_NAME = "mlxd-api-key"; // the chat page stores the key under the same name
const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function storedKey() {
  try {
    return localStorage.getItem(KEY_NAME);
  } catch (e) {
    return null; // storage blocked: ask every time
  }
}

function saveKey(key) {
  try {
    if (key) localStorage.setItem(KEY_NAME, key);
    else localStorage.removeItem(KEY_NAME);
  } catch (e) {
    /* storage blocked */
  }
}

let apiKey = storedKey();

// Build an element: `el("td", {class: "num"}, "12")`.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i && v < 10 ? 1 : 0)} ${units[i]}`;
}

function num(v, digits = 1) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
}

function seconds(v) {
  if (v === null || v === undefined) return "–";
  if (v < 1) return `${Math.round(v * 1000)} ms`;
  if (v < 120) return `${v.toFixed(1)} s`;
  const m = Math.floor(v / 60);
  return m < 120 ? `${m} min` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

// A line over the last `span` seconds ending at `now`; null values break the line and are
// skipped (a TTFT only exists where a request got its first token).
function plot(svg, points, field, now, span, fmt) {
  // The first minutes fill the width instead of a sliver at its right edge.
  span = points.length ? Math.min(span, Math.max(60, now - points[0].t)) : span;
  const W = 600, H = 160, top = 14, bottom = 4;
  const vals = points.map((p) => p[field]).filter((v) => v !== null && v !== undefined);
  const max = Math.max(1e-9, ...vals) * 1.1;
  const x = (t) => W - ((now - t) / span) * W;
  const y = (v) => H - bottom - (v / max) * (H - top - bottom);
  svg.replaceChildren();
  for (const f of [0.25, 0.5, 0.75]) {
    const gy = y(max * f);
    svg.append(svgEl("line", { class: "grid", x1: 0, x2: W, y1: gy, y2: gy }));
  }
  let run = [];
  const runs = [run];
  for (const p of points) {
    const v = p[field];
    if (v === null || v === undefined) {
      if (run.length) runs.push((run = []));
      continue;
    }
    run.push([x(p.t), y(v)]);
  }
  let drawn = 0;
  for (const r of runs) {
    if (r.length === 0) continue;
    drawn += r.length;
    const pts = r.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(" ");
    if (r.length > 1) {
      const area = `${r[0][0].toFixed(1)},${H} ${pts} ${r[r.length - 1][0].toFixed(1)},${H}`;
      svg.append(svgEl("polygon", { class: "area", points: area }));
      svg.append(svgEl("polyline", { class: "line", points: pts }));
    } else {
      svg.append(svgEl("circle", { class: "dot", cx: r[0][0], cy: r[0][1], r: 3 }));
    }
  }
  const label = svgEl("text", { x: 4, y: 11 });
  label.textContent = vals.length ? `max ${fmt(Math.max(...vals))}` : "no data yet";
  svg.append(label);
  const left = svgEl("text", { x: 4, y: H - 6 });
  left.textContent = `-${seconds(span)}`;
  svg.append(left);
  svg.dataset.points = String(drawn);
}

// A local folder's last part (its full path in the tooltip); a repo id as it is.
function shortName(name) {
  return /^[/.~]/.test(name) ? name.replace(/\/+$/, "").split("/").pop() : name;
}

function cell(text, cls) {
  return el("td", cls ? { class: cls } : {}, text);
}

function renderRows(models) {
  const body = $("rows").querySelector("tbody");
  const trs = [];
  for (const m of models) {
    for (const r of m.rows) {
      const state = el("span", { class: `state state-${r.state}` }, r.state);
      const gen = r.state === "waiting" ? "–" : `${r.generated_tokens} / ${r.max_tokens}`;
      const cached = r.cached_tokens ? ` (${r.cached_tokens} cached)` : "";
      const speed = r.state === "decode" ? num(r.tokens_per_s) : "–";
      const tr = el("tr", { "data-model": m.name, "data-state": r.state, "data-row": r.id },
        el("td", { class: "name", title: m.name }, shortName(m.name)),
        cell(String(r.id).slice(-6), "muted"), el("td", {}, state),
        cell(`${r.prompt_tokens}${cached}`, "num"), cell(gen, "num"), cell(speed, "num"),
        cell(seconds(r.age_s), "num"), cell(seconds(r.ttft_s), "num"), cell(r.adapter || "–"),
        cell(r.speculation || "–"));
      trs.push(tr);
    }
  }
  body.replaceChildren(...trs);
  $("no-rows").hidden = trs.length > 0;
}

function meter(title, parts, total, totalLabel) {
  const track = el("div", { class: "track" });
  for (const [cls, value] of parts) {
    const pct = total > 0 ? Math.min(100, (100 * value) / total) : 0;
    const seg = el("div", { class: `seg ${cls}` });
    seg.style.width = `${pct.toFixed(2)}%`; // CSSOM, which the CSP allows (style attributes not)
    track.append(seg);
  }
  const legend = el("div", { class: "legend" }, el("span", {}, title), el("span", {}, totalLabel));
  return el("div", { class: "meter" }, legend, track);
}

function stats(pairs) {
  const dl = el("dl", { class: "stats" });
  for (const [k, v] of pairs) dl.append(el("dt", {}, k), el("dd", {}, v));
  return dl;
}

function renderModel(m) {
  const mem = m.memory;
  const kv = m.kv;
  const counts = `${m.running} running · ${m.waiting} waiting · ${num(m.tokens_per_s)} tok/s`;
  const head = el("h3", { title: m.name }, el("span", { class: "name" }, shortName(m.name)),
    el("span", { class: "muted" }, counts));
  const card = el("article", { class: "card model", "data-model": m.name }, head);
  if (!m.alive) {
    card.append(el("p", { class: "error" }, `engine down: ${m.down_reason || "stopped"}`));
  }
  const kvKind = kv.budget_bytes ? "reserved" : "in use";
  card.append(meter(`memory: weights + KV ${kvKind}`,
    [["seg-weights", mem.weight_bytes], ["seg-kv", mem.kv_bytes]], mem.total_bytes,
    `${bytes(mem.weight_bytes)} + ${bytes(mem.kv_bytes)} = ${bytes(mem.total_bytes)}`));
  const budget = kv.budget_bytes;
  if (budget) {
    const pct = num((100 * kv.reserved_bytes) / budget);
    card.append(meter("KV budget used", [["seg-kv", kv.reserved_bytes]], budget,
      `${bytes(kv.reserved_bytes)} of ${bytes(budget)} (${pct}%)`));
  } else {
    const used = `in use ≈ ${bytes(kv.in_use_bytes)}`;
    card.append(meter("KV budget used: no budget set", [], 0, used));
  }
  const s = m.store;
  if (s) {
    const rate = s.lookups ? `${num((100 * s.hits) / s.lookups)}%` : "–";
    card.append(el("h4", { class: "muted" }, "prefix store"), stats([
      ["RAM", `${bytes(s.ram_bytes)} · ${s.ram_entries} entries`],
      ["SSD", s.ssd_bytes === null ? "off" : `${bytes(s.ssd_bytes)} · ${s.ssd_entries} entries`],
      ["hits (RAM / SSD)", `${s.hits_ram} / ${s.hits_ssd}`],
      ["hit rate", `${rate} of ${s.lookups}`],
      ["tokens from store", s.hit_tokens], ["SSD restores", s.ssd_restores],
    ]));
  } else {
    card.append(el("p", { class: "muted" }, "no prefix store"));
  }
  return card;
}

function renderUnloaded(list) {
  const trs = list.map((e) => el("tr", { "data-model": e.id },
    el("td", { class: "name", title: e.id }, shortName(e.id)), cell(e.state),
    cell(bytes(e.size_bytes), "num"), cell(e.pinned ? "yes" : "no")));
  $("unloaded").querySelector("tbody").replaceChildren(...trs);
  $("no-unloaded").hidden = trs.length > 0;
}

function render(d) {
  const t = d.totals;
  $("t-running").textContent = t.running;
  $("t-waiting").textContent = t.waiting;
  $("t-tps").textContent = num(t.tokens_per_s);
  // TTFT: the running rows' (the histogram counts a request once it ends), else the last one
  const ttfts = d.models.flatMap((m) => m.rows).map((r) => r.ttft_s).filter((v) => v !== null);
  const lastTtft = [...t.history].reverse().find((p) => p.ttft_s !== null);
  const ttft = ttfts.length ? ttfts.reduce((a, b) => a + b, 0) / ttfts.length : lastTtft?.ttft_s;
  $("t-ttft").textContent = seconds(ttft);
  $("t-mem").textContent = bytes(d.models.reduce((a, m) => a + m.memory.total_bytes, 0));
  $("t-uptime").textContent = seconds(d.uptime_s);
  const span = `up to the last ${Math.round(d.window_s / 60)} min`;
  $("tps-span").textContent = span;
  $("ttft-span").textContent = span;
  plot($("plot-tps"), t.history, "tokens_per_s", d.time, d.window_s, (v) => v.toFixed(1));
  plot($("plot-ttft"), t.history, "ttft_s", d.time, d.window_s, seconds);
  renderRows(d.models);
  $("models").replaceChildren(...d.models.map(renderModel));
  renderUnloaded(d.unloaded);
}

function setStatus(text, ok) {
  const s = $("status");
  s.textContent = text;
  s.className = `status ${ok ? "ok" : "bad"}`;
}

function askKey(message) {
  $("key-form").hidden = false;
  $("key-error").textContent = message || "";
  $("key-input").focus();
}

async function poll() {
  const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  try {
    const resp = await fetch("/v1/dashboard", { headers, cache: "no-store" });
    if (resp.status === 401) {
      setStatus("API key needed", false);
      askKey(apiKey ? "The server refused this key." : "");
      return; // no polling until a key is given
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    render(await resp.json());
    setStatus(`live · ${new Date().toLocaleTimeString()}`, true);
  } catch (e) {
    setStatus(`unreachable: ${e.message}`, false);
  }
  setTimeout(poll, POLL_MS);
}

function toggleTheme() {
  const root = document.documentElement;
  const dark = root.dataset.theme
    ? root.dataset.theme === "dark"
    : window.matchMedia("(prefers-color-scheme: dark)").matches;
  root.dataset.theme = dark ? "light" : "dark";
  try {
    localStorage.setItem("mlxd.theme", root.dataset.theme);
  } catch (e) {
    /* storage blocked: this page only */
  }
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  apiKey = $("key-input").value.trim();
  saveKey(apiKey);
  $("key-form").hidden = true;
  $("forget-key").hidden = !apiKey;
  poll();
});
$("forget-key").addEventListener("click", () => {
  apiKey = null;
  saveKey(null);
  $("forget-key").hidden = true;
});
$("theme").addEventListener("click", toggleTheme);
$("forget-key").hidden = !apiKey;
poll();
