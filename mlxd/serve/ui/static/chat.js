// One generation: the request from a conversation's selected turns, streamed into a reply object
// (content, reasoning, stats, error); a stop or an error keeps what already arrived.

import { streamChat } from "./api.js";
import { currentSettings } from "./settings.js";
import { replyParts } from "./view.js";

// The messages for the last turn: earlier turns' chosen versions, answers without reasoning.
export function buildMessages(conv, system) {
  const messages = system ? [{ role: "system", content: system }] : [];
  conv.turns.forEach((turn, i) => {
    const alt = turn.alts[turn.sel];
    messages.push({ role: "user", content: alt.user });
    if (i < conv.turns.length - 1 && alt.reply.content) {
      messages.push({ role: "assistant", content: replyParts(alt.reply).content });
    }
  });
  return messages;
}

// Streams into `reply`, calling `redraw()` as text arrives. Resolves when the stream ends, is
// stopped through `signal`, or fails (reply.error); rethrows only an AuthError for the caller.
export async function generate(conv, reply, model, signal, redraw, AuthError) {
  const { params, system } = currentSettings();
  const body = { messages: buildMessages(conv, system), ...params };
  if (model) body.model = model;
  reply.model = model || "";
  const start = performance.now();
  let first = null;
  let usage = null;
  try {
    await streamChat(body, signal, {
      delta(d) {
        if (first === null) first = performance.now();
        reply.content = (reply.content || "") + d.content;
        reply.reasoning = (reply.reasoning || "") + d.reasoning;
        redraw();
      },
      usage(u) {
        usage = u;
      },
      finish(reason) {
        reply.finish = reason;
      },
    });
  } catch (e) {
    if (e.name === "AbortError") reply.stopped = true;
    else reply.error = e.message || String(e);
    if (e instanceof AuthError) {
      reply.stats = timing(start, first, usage);
      throw e;
    }
  }
  reply.stats = timing(start, first, usage);
}

function timing(start, first, usage) {
  const end = performance.now();
  const stats = {};
  if (usage) {
    stats.prompt = usage.prompt_tokens;
    const details = usage.prompt_tokens_details;
    stats.cached = (details && details.cached_tokens) || 0;
    stats.completion = usage.completion_tokens;
  }
  if (first !== null) {
    stats.ttft_ms = first - start;
    // decode speed: the tokens after the first over the time after the first
    if (usage && usage.completion_tokens > 1 && end > first) {
      stats.tps = ((usage.completion_tokens - 1) * 1000) / (end - first);
    }
  }
  return stats;
}
