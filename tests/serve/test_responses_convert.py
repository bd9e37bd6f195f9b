"""Responses wire format without a server: input items -> chat messages, flat tools -> chat
tools, chunks -> output items and stream events (checked against the openai SDK's types)."""

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from openai.types.responses import ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter

from mlxd.serve.errors import APIError
from mlxd.serve.generation import Chunk, TokenInfo, Usage
from mlxd.serve.responses_convert import chat_tools, flat_tools, input_items, to_messages
from mlxd.serve.responses_stream import OutputBuilder, ResponseRun
from mlxd.serve.text import Delta, ToolCall

EVENT = TypeAdapter(ResponseStreamEvent)
ITEM = TypeAdapter(ResponseOutputItem)


def chunk(content: str = "", reasoning: str = "", calls=(), finish: str | None = None) -> Chunk:
    delta = Delta(content, reasoning, list(calls))
    return Chunk(0, delta, [TokenInfo(1)], False, finish)


def test_string_input_with_instructions() -> None:
    messages = to_messages(input_items("Hello"), "Be brief.")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]


def test_message_items_parts_and_roles() -> None:
    items = [
        {"role": "developer", "content": "dev rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "b", "annotations": []}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "c"}, {"type": "input_text", "text": "d"}],
        },
    ]
    assert to_messages(items, None) == [
        {"role": "system", "content": "dev rules"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "cd"},
    ]


def test_function_calls_join_the_assistant_turn_and_reasoning_rides_on_it() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "need a tool"}],
        },
        {"type": "message", "role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"q": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "get", "arguments": '{"q": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "rainy"}],
        },
        {"type": "function_call", "call_id": "c3", "name": "get", "arguments": "{}"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
    ]

    def call(i: str, args: str) -> dict:
        return {"id": i, "type": "function", "function": {"name": "get", "arguments": args}}

    assert to_messages(items, None) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "need a tool",
            "tool_calls": [call("c1", '{"q": 1}'), call("c2", '{"q": 2}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
        {"role": "assistant", "content": "", "tool_calls": [call("c3", "{}")]},
    ]  # the trailing reasoning item has no assistant turn after it: dropped


def test_reasoning_before_a_user_turn_is_dropped() -> None:
    thought = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }
    items = [thought, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert to_messages(items, None) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


@pytest.mark.parametrize(
    "value",
    [
        42,
        [{"type": "input_image", "image_url": "x"}],
        [{"role": "tool", "content": "x"}],
        [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        [{"type": "function_call", "call_id": "c", "name": "f"}],
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}],
        [{"type": "function_call_output", "call_id": "c"}],
        ["not an object"],
        [{"role": ["user"], "content": "x"}],
    ],
)
def test_bad_input_is_a_400(value: object) -> None:
    with pytest.raises(APIError) as e:
        to_messages(input_items(value), None)
    assert e.value.status == 400 and e.value.param == "input"


def test_flat_tools_become_chat_tools() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "name": "w", "description": "d", "parameters": params}]
    assert chat_tools(tools) == [
        {"type": "function", "function": {"name": "w", "description": "d", "parameters": params}}
    ]
    echo = {
        "type": "function",
        "strict": None,
        "name": "w",
        "description": "d",
        "parameters": params,
    }
    assert flat_tools(chat_tools(tools)) == [echo]
    chat_shaped = [{"type": "function", "function": {"name": "w", "parameters": params}}]
    assert chat_tools(chat_shaped) == chat_shaped  # lenient: chat-shaped tools pass through
    with pytest.raises(APIError):
        chat_tools([{"type": "web_search"}])


def test_output_builder_reasoning_text_and_a_tool_call() -> None:
    b = OutputBuilder()
    events = []
    call = ToolCall("call_9", "get_weather", '{"city": "Paris"}')
    for c in [
        chunk(reasoning="think"),
        chunk(reasoning="ing\n"),
        chunk(content="\n\n"),
        chunk(content="Hi"),
        chunk(content=" there\n"),
        chunk(calls=[call], finish="tool_calls"),
    ]:
        events += b.feed(c)
    assert [name for name, _ in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    for seq, (name, payload) in enumerate(events):  # the SDK's own event models accept them
        EVENT.validate_python({"type": name, "sequence_number": seq, **payload})
    reasoning, message, fc = b.output
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert message["content"][0]["text"] == "Hi there"  # blank edges held back
    assert message["status"] == "completed"
    assert {k: fc[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call",
        "call_id": "call_9",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }
    assert [e[1]["output_index"] for e in events if e[0].endswith("item.done")] == [0, 1, 2]
    for item in b.output:
        ITEM.validate_python(item)
    assert b.status == "completed" and b.reasoning_tokens == 2


def test_output_builder_length_marks_the_message_incomplete() -> None:
    b = OutputBuilder()
    b.feed(chunk(content="partial"))
    events = b.feed(chunk(content=" text", finish="length"))
    assert b.status == "incomplete"
    assert b.output[0]["status"] == "incomplete"
    assert events[-1][1]["item"]["content"][0]["text"] == "partial text"


class FailingGeneration:
    """Stands in for Generation: one token of text, then the engine fails."""

    usage = Usage(prompt_tokens=5)

    async def chunks(self) -> AsyncIterator[Chunk]:
        yield chunk(content="Hi")
        raise RuntimeError("engine fell over")


def test_stream_frames_are_named_sse_events_and_a_failure_is_reported() -> None:
    head = {"id": "resp_x", "created_at": 1, "model": "m", "tools": [], "tool_choice": "auto"}
    head["parallel_tool_calls"] = True
    run = ResponseRun(head, FailingGeneration(), [], None)  # type: ignore[arg-type]

    async def collect() -> list[str]:
        return [frame async for frame in run.frames()]

    frames = asyncio.run(collect())
    events = []
    for frame in frames:
        name_line, data_line, *rest = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        assert rest == ["", ""]  # each frame ends with a blank line
        payload = json.loads(data_line[len("data: ") :])
        assert payload["type"] == name_line[len("event: ") :]
        events.append(EVENT.validate_python(payload))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.failed",
    ]
    assert [e.sequence_number for e in events] == list(range(6))
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert "engine fell over" in failed.error.message
