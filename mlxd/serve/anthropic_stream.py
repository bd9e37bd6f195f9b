"""A Messages reply as Anthropic streams it, and the same events folded into one message.

The event sequence: `message_start` (the message with empty content and the input usage, sent
once the engine has admitted the request: the prompt cache's hit is known then, before prefill),
`ping`, then for each content block in order `content_block_start`, `content_block_delta`s
(`thinking_delta`, `text_delta`, or one `input_json_delta` with the tool input's JSON) and
`content_block_stop`; then `message_delta` (stop_reason, stop_sequence, usage) and
`message_stop`. A failure after the stream has started is an `error` event, as Anthropic's.

Blocks are built from a choice's deltas: reasoning -> `thinking`, content -> `text`, each
parsed tool call -> `tool_use`. A new kind of output closes the open block and opens the next.
Whitespace at the edges of a thinking or text block is dropped (a Qwen3 reply is
`<think>\\n...\\n</think>\\n\\nanswer`), so a block holds only what was said and a run of
whitespace between two blocks (before a tool call, say) makes no block; a prefill's text keeps
its leading whitespace, because the client appends it to the text it sent. The non-streaming
response folds the very same events, so both modes return the same content.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from .errors import APIError, anthropic_body
from .generation import Generation
from .text import Delta, ToolCall

# OpenAI-style finish reasons (Chunk.finish) -> Anthropic stop reasons.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A parsed call's arguments as the tool_use `input` object."""
    try:
        value = json.loads(call.arguments) if call.arguments else {}
    except json.JSONDecodeError:
        return {"arguments": call.arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class StopWords:
    """Which of the request's stop sequences ended a row that finished with "stop".

    The row ends on a stop sequence's token ids (the engine, as mlx-lm) or when the generated
    text contains it (ChoiceText); neither is reported in the chunks, so it is recovered from
    the row's token ids: the sequence whose ids they end with, else the one whose text ends
    first in the decoded text. EOS as the last token means no stop sequence did it."""

    def __init__(self, tokenizer: Any, words: list[str]) -> None:
        self.tokenizer, self.words = tokenizer, words
        self.ids = [(w, tokenizer.encode(w, add_special_tokens=False)) for w in words]
        self.eos = set(tokenizer.eos_token_ids)

    def matched(self, token_ids: list[int]) -> str | None:
        if not self.words or not token_ids or token_ids[-1] in self.eos:
            return None
        for word, ids in self.ids:
            if ids and token_ids[-len(ids) :] == ids:
                return word
        text = self.tokenizer.decode(token_ids)
        ends = [(text.find(w) + len(w), i) for i, w in enumerate(self.words) if w in text]
        return self.words[min(ends)[1]] if ends else None


class Blocks:
    """Deltas in, content block events out (start / delta / stop), in order."""

    def __init__(self, keep_leading_text: bool = False) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" / "text" while such a block is open
        self.held = ""  # whitespace that is only sent if more of the same block follows
        self.keep_leading_text = keep_leading_text  # a prefill continues the client's text

    def feed(self, delta: Delta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._text("thinking", delta.reasoning)
        for call in delta.tool_calls:
            events += self._tool(call)
        if delta.content:
            events += self._text("text", delta.content)
        return events

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open, self.held = None, ""
        return [{"type": "content_block_stop", "index": self.index}]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.index += 1
        self.open = block["type"] if block["type"] in ("thinking", "text") else None
        return [
            *events,
            {"type": "content_block_start", "index": self.index, "content_block": block},
        ]

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open != kind:
            keep = kind == "text" and self.keep_leading_text and self.index == -1
            if not keep:
                text = text.lstrip()
            if not text:
                return self.close() if self.open is not None else []
            block = {"type": "thinking", "thinking": "", "signature": ""}
            events += self._start(block if kind == "thinking" else {"type": "text", "text": ""})
        body = text.rstrip()
        send, self.held = (self.held + body, text[len(body) :]) if body else ("", self.held + text)
        if send:
            key = "thinking" if kind == "thinking" else "text"
            delta = {"type": f"{key}_delta", key: send}
            events.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        return events

    def _tool(self, call: ToolCall) -> list[dict[str, Any]]:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        delta = {
            "type": "input_json_delta",
            "partial_json": json.dumps(tool_input(call), ensure_ascii=False),
        }
        return [
            *self._start(block),
            {"type": "content_block_delta", "index": self.index, "delta": delta},
            {"type": "content_block_stop", "index": self.index},
        ]


def usage_json(gen: Generation, cached: int, output_tokens: int) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` excludes the prompt tokens read from the cache,
    which `cache_read_input_tokens` counts."""
    return {
        "input_tokens": gen.usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


async def admitted(gen: Generation) -> int:
    """The prompt tokens the prefix store serves the request, once the engine has admitted its
    rows: it looks the prompt up then, before prefilling. Waiting stops at the request's
    deadline or a row that ended unadmitted (its error follows in the chunks)."""
    loop, delay = asyncio.get_running_loop(), 0.001
    while not all(h.admitted or h.pending() or h.done is not None for h in gen.handles):
        if gen.deadline is not None and loop.time() >= gen.deadline:
            break
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.02)
    return max((h.cached_tokens for h in gen.handles), default=0)


async def events(
    gen: Generation,
    model: str,
    stops: StopWords,
    prefill: bool = False,
) -> AsyncIterator[dict[str, Any]]:
    """The reply's events (dicts with their `type`), from message_start to message_stop."""
    try:
        cached = await admitted(gen)  # message_start and message_delta report the same input
    except BaseException:  # the client left while the request waited: its rows end
        gen.cancel()
        raise
    message = {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_json(gen, cached, 0),
    }
    yield {"type": "message_start", "message": message}
    yield {"type": "ping"}
    blocks = Blocks(keep_leading_text=prefill)
    token_ids: list[int] = []
    finish = "stop"
    async with aclosing(gen.chunks()) as chunks:  # closing it cancels the rows
        async for chunk in chunks:
            token_ids += [t.id for t in chunk.tokens]
            for event in blocks.feed(chunk.delta):
                yield event
            if chunk.finish is not None:
                finish = chunk.finish
    for event in blocks.close():
        yield event
    stop_reason, stop_sequence = STOP_REASONS.get(finish, "end_turn"), None
    if finish == "stop" and (stop_sequence := stops.matched(token_ids)) is not None:
        stop_reason = "stop_sequence"
    elif (
        finish == "length"
        and gen.usage.completion_tokens < gen.params.max_tokens
        and not gen.timed_out
    ):
        stop_reason = "model_context_window_exceeded"  # max_tokens was cut to what fits
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": usage_json(gen, cached, gen.usage.completion_tokens),
    }
    yield {"type": "message_stop"}


def error_event(exc: BaseException) -> dict[str, Any]:
    """Anthropic's error event: an APIError keeps its own type (rate_limit_error for a 429)."""
    if isinstance(exc, APIError):
        return anthropic_body(exc)
    return {"type": "error", "error": {"type": "api_error", "message": f"{exc}"}}


async def fold(stream: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """The whole message the events describe (the non-streaming response)."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    async for event in stream:
        kind = event["type"]
        if kind == "message_start":
            message = dict(event["message"], content=[])
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop":
            if event["index"] in partial:
                message["content"][event["index"]]["input"] = json.loads(partial[event["index"]])
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = event["usage"]
    return message
