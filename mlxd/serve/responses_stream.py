"""Generation chunks -> Responses output items and the events OpenAI streams for them.

One OutputBuilder serves both modes (the non-streaming response is the streamed one without
the events), so the two can never disagree. An item opens on its first non-blank text and
blank text at an item's edges is held back (dropped if the item ends), so the `\\n\\n` a
template puts after `</think>` or before a tool call never becomes an empty message."""

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .errors import APIError, openai_body
from .generation import Chunk, Generation
from .responses_convert import (
    function_call_item,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
    response_object,
    usage_json,
)
from .streaming import sse_event
from .text import ToolCall

log = logging.getLogger("mlxd.serve")

Event = tuple[str, dict[str, Any]]


@dataclass
class _Open:
    kind: str  # "message" or "reasoning"
    id: str
    index: int
    text: str = ""
    held: str = ""  # trailing blank text, sent only if more text follows


class OutputBuilder:
    """Feed chunks; get (event name, payload) pairs. `output` holds the finished items."""

    def __init__(self) -> None:
        self.output: list[dict[str, Any]] = []
        self.open: _Open | None = None
        self.finish: str | None = None
        self.reasoning_tokens = 0

    def feed(self, chunk: Chunk) -> list[Event]:
        d, events = chunk.delta, []
        if d.reasoning and not d.content:
            self.reasoning_tokens += len(chunk.tokens)
        if d.reasoning:
            events += self._text("reasoning", d.reasoning)
        if d.content:
            events += self._text("message", d.content)
        for call in d.tool_calls:
            events += self._close("completed") + self._call(call)
        if chunk.finish is not None:
            self.finish = chunk.finish
            events += self._close("incomplete" if chunk.finish == "length" else "completed")
        return events

    @property
    def status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open.kind != kind:
            text = text.lstrip()
            if not text:
                return events
            events += self._close("completed") + self._start(kind)
        o = self.open
        assert o is not None
        text = o.held + text
        body = text.rstrip()
        o.held = text[len(body) :]
        if body:
            o.text += body
            where = self._where(o)
            if kind == "message":
                delta = {**where, "delta": body, "logprobs": []}
                events.append(("response.output_text.delta", delta))
            else:
                events.append(("response.reasoning_text.delta", {**where, "delta": body}))
        return events

    def _start(self, kind: str) -> list[Event]:
        o = self.open = _Open(kind, new_id("msg" if kind == "message" else "rs"), len(self.output))
        if kind == "message":
            item, part = message_item(o.id, None, "in_progress"), output_text_part("")
        else:
            item, part = reasoning_item(o.id, None, "in_progress"), _reasoning_part("")
        return [
            ("response.output_item.added", {"output_index": o.index, "item": item}),
            ("response.content_part.added", {**self._where(o), "part": part}),
        ]

    def _close(self, status: str) -> list[Event]:
        o = self.open
        if o is None:
            return []
        self.open = None
        where = self._where(o)
        if o.kind == "message":
            item, part = message_item(o.id, o.text, status), output_text_part(o.text)
            done = ("response.output_text.done", {**where, "text": o.text, "logprobs": []})
        else:
            item, part = reasoning_item(o.id, o.text, status), _reasoning_part(o.text)
            done = ("response.reasoning_text.done", {**where, "text": o.text})
        self.output.append(item)
        return [
            done,
            ("response.content_part.done", {**where, "part": part}),
            ("response.output_item.done", {"output_index": o.index, "item": item}),
        ]

    def _call(self, call: ToolCall) -> list[Event]:
        """Tool parsers yield whole calls, so the arguments go out as one delta."""
        item_id, index = new_id("fc"), len(self.output)
        final = function_call_item(item_id, call, call.arguments, "completed")
        self.output.append(final)
        where = {"item_id": item_id, "output_index": index}
        added = function_call_item(item_id, call, "", "in_progress")
        return [
            ("response.output_item.added", {"output_index": index, "item": added}),
            ("response.function_call_arguments.delta", {**where, "delta": call.arguments}),
            ("response.function_call_arguments.done", {**where, "arguments": call.arguments}),
            ("response.output_item.done", {"output_index": index, "item": final}),
        ]

    @staticmethod
    def _where(o: _Open) -> dict[str, Any]:
        return {"item_id": o.id, "output_index": o.index, "content_index": 0}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


class ResponseRun:
    """One response being generated: its chunks, then the stored final object."""

    def __init__(
        self, head: dict[str, Any], gen: Generation, items: list[dict], store: Any
    ) -> None:
        self.head, self.gen, self.items, self.store = head, gen, items, store
        self.builder = OutputBuilder()

    def final(self) -> dict[str, Any]:
        b = self.builder
        usage = usage_json(self.gen.usage, b.reasoning_tokens)
        return response_object(self.head, b.status, b.output, usage)

    async def _save(self) -> dict[str, Any]:
        response = self.final()
        if self.store is not None:  # before the client hears "done", so a GET then finds it
            await self.store.save(response["id"], self.items, response)
        return response

    async def whole(self) -> dict[str, Any]:
        async for chunk in self.gen.chunks():
            self.builder.feed(chunk)
        return await self._save()

    async def frames(self) -> AsyncIterator[str]:
        seq = 0

        def frame(name: str, payload: dict[str, Any]) -> str:
            nonlocal seq
            seq += 1
            return sse_event(name, {"type": name, "sequence_number": seq - 1, **payload})

        start = response_object(self.head, "in_progress", [], None)
        yield frame("response.created", {"response": start})
        yield frame("response.in_progress", {"response": start})
        try:
            async for chunk in self.gen.chunks():
                for name, payload in self.builder.feed(chunk):
                    yield frame(name, payload)
            response = await self._save()
        except Exception as e:  # noqa: BLE001 - headers are sent; the stream reports it
            if isinstance(e, APIError):  # a refusal (--request-timeout), not a bug
                log.warning("response %s ended with %d: %s", self.head["id"], e.status, e)
                error = {"code": openai_body(e)["error"]["type"], "message": e.message}
            else:
                log.exception("response %s failed", self.head["id"])
                error = {"code": "server_error", "message": f"{type(e).__name__}: {e}"}
            failed = response_object(self.head, "failed", self.builder.output, None, error)
            yield frame("response.failed", {"response": failed})
            return
        name = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield frame(name, {"response": response})
