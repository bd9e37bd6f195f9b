// The server's OpenAI-compatible API: the model list and streamed chat completions (SSE).

const KEY_ITEM = "mlxd.apiKey";

export class AuthError extends Error {}

export class APIError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export function getKey() {
  try {
    return localStorage.getItem(KEY_ITEM) || "";
  } catch (e) {
    return "";
  }
}

export function setKey(key) {
  localStorage.setItem(KEY_ITEM, key);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(resp) {
  let message = `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (body && body.error) message = body.error.message || message;
  } catch (e) {
    // a body that is not JSON: the status says enough
  }
  if (resp.status === 401) return new AuthError(message);
  return new APIError(message, resp.status);
}

export async function listModels() {
  const resp = await fetch("/v1/models", { headers: headers() });
  if (!resp.ok) throw await failure(resp);
  const body = await resp.json();
  return Array.isArray(body.data) ? body.data : [];
}

// Streams one completion; `on` gets {content, reasoning} deltas, the usage and the time of the
// first token. Throws AuthError/APIError, or the AbortError when `signal` fires.
export async function streamChat(body, signal, on) {
  const resp = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!resp.ok) throw await failure(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/\r$/, "");
      buffer = buffer.slice(cut + 1);
      if (handleLine(line, on) === "done") return;
    }
  }
  if (buffer.trim()) handleLine(buffer.trim(), on);
}

// One SSE line. Comments (`: keepalive`) and blank lines carry nothing.
function handleLine(line, on) {
  if (!line.startsWith("data:")) return null;
  const data = line.slice(5).trim();
  if (data === "[DONE]") return "done";
  let frame;
  try {
    frame = JSON.parse(data);
  } catch (e) {
    return null; // a torn or foreign line: skip it rather than lose the answer so far
  }
  if (frame.error) throw new APIError(frame.error.message || "the stream failed", 0);
  if (frame.usage) on.usage(frame.usage);
  const choice = frame.choices && frame.choices[0];
  if (!choice) return null;
  const delta = choice.delta || {};
  const reasoning = delta.reasoning_content || delta.reasoning || "";
  const content = delta.content || "";
  if (reasoning || content) on.delta({ content, reasoning });
  if (choice.finish_reason) on.finish(choice.finish_reason);
  return null;
}
