"""`mlxd chat --url`: the same chat against a running OpenAI-compatible server (`mlxd serve`,
mlx_lm.server, ...). The conversation is kept here and sent whole each turn to a streamed
/v1/chat/completions; reasoning deltas (`reasoning` or `reasoning_content`) show dimmed."""

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from .chat_ui import THINK, ChatScreen

TIMEOUT = httpx.Timeout(10.0, read=None)  # a long prefill may keep the first byte a while


class RemoteError(Exception):
    """The server answered with an error; its message is shown and the chat goes on."""


def base_url(url: str) -> str:
    """The API root: `http://host:port`, with or without a trailing `/v1`, gives `.../v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def pick_model(client: httpx.Client, root: str) -> str | None:
    """The first model the server lists, for servers that need a name; None when it lists none."""
    try:
        r = client.get(f"{root}/models")
        r.raise_for_status()
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return data[0].get("id") if data and isinstance(data[0], dict) else None


def request_body(
    args: argparse.Namespace, model: str | None, messages: list[dict], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """mlx_lm.chat's sampling flags as the wire's fields; the XTC ones only when XTC is on,
    since only mlx-lm-style servers know them."""
    body: dict[str, Any] = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": args.max_tokens,
        "temperature": args.temp,
        "top_p": args.top_p,
        "seed": args.seed,
    }
    if model is not None:
        body["model"] = model
    if args.xtc_probability > 0:
        body["xtc_probability"] = args.xtc_probability
        body["xtc_threshold"] = args.xtc_threshold
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def sse_chunks(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to `[DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if isinstance(chunk, dict) and "error" in chunk:
            raise RemoteError(_message(chunk))
        yield chunk


def _message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error if error is not None else payload)


def stream_turn(
    client: httpx.Client, root: str, body: dict[str, Any], screen: ChatScreen
) -> tuple[str, str]:
    """Stream one reply onto the screen: (its content, its stats line)."""
    reply = screen.reply(THINK, thinking=False)
    content, in_reasoning, usage = "", False, None
    tic, first = time.perf_counter(), None
    try:
        with client.stream("POST", f"{root}/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                try:
                    raise RemoteError(f"{r.status_code}: {_message(r.json())}")
                except ValueError:
                    raise RemoteError(f"{r.status_code}: {r.text.strip()}") from None
            for chunk in sse_chunks(r):
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    think = delta.get("reasoning") or delta.get("reasoning_content") or ""
                    text = delta.get("content") or ""
                    if (think or text) and first is None:
                        first = time.perf_counter()
                    if think:
                        # Shown between the markers, as a local model's reasoning is.
                        reply.write(think if in_reasoning else THINK[0] + think)
                        in_reasoning = True
                    if text:
                        reply.write(THINK[1] + text if in_reasoning else text)
                        in_reasoning = False
                        content += text
    finally:
        if in_reasoning:
            reply.write(THINK[1])
        reply.close()
    return content, _stats(usage, tic, first)


def _stats(usage: dict | None, tic: float, first: float | None) -> str:
    end = time.perf_counter()
    if not usage:
        return f"{end - tic:.1f} s"
    n = int(usage.get("completion_tokens", 0))
    tps = n / (end - first) if first is not None and end > first else 0.0
    return f"{n} tokens · {tps:.1f} tok/s · prompt {usage.get('prompt_tokens', 0)} tokens"


def run_remote(args: argparse.Namespace, kwargs: dict[str, Any]) -> None:
    root = base_url(args.url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    screen = ChatScreen()
    with httpx.Client(headers=headers, timeout=TIMEOUT) as client:
        model = args.model or pick_model(client, root)
        rows = [("server", root), ("model", model or "(the server's default)")]
        rows.append(("max tokens", f"{args.max_tokens:,}"))
        screen.header(rows)
        system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        history: list[dict[str, str]] = []
        while (query := screen.prompt()) is not None:
            if query == "q":
                break
            if query == "r":
                history = []
                screen.say("  reset context cleared")
                continue
            if query == "h":
                screen.help()
                continue
            messages = system + history + [{"role": "user", "content": query}]
            try:
                content, stats = stream_turn(
                    client, root, request_body(args, model, messages, kwargs), screen
                )
            except (RemoteError, httpx.HTTPError, ValueError) as e:
                # The turn is dropped from the conversation; the next one may succeed.
                print(f"mlxd chat: {args.url}: {e}", file=sys.stderr)
                continue
            history += [messages[-1], {"role": "assistant", "content": content}]
            screen.stats(stats)
        screen.say("bye")
