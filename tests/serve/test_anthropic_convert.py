"""Anthropic Messages without a server: request conversion (anthropic_convert) and the reply's
content blocks and events (anthropic_stream), including a Qwen3 tool call parsed by the real
tokenizer's tool parser and fed through the same per-choice text split the server uses."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlxd.serve.anthropic_convert import (
    convert_request,
    convert_tools,
    read_params,
    thinking_args,
    tool_choice_tools,
)
from mlxd.serve.anthropic_messages import convert_messages
from mlxd.serve.anthropic_stream import Blocks, StopWords, events, fold
from mlxd.serve.errors import APIError
from mlxd.serve.generation import Chunk, TokenInfo, Usage, text_machine
from mlxd.serve.params import GenParams
from mlxd.serve.text import ChoiceText, Delta, ToolCall

WEATHER = {"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}


def refused(fn: Any, *args: Any) -> str:
    with pytest.raises(APIError) as e:
        fn(*args)
    assert e.value.status == 400
    return e.value.message


# ----------------------------------------------------------------------------- requests


def test_system_and_text() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert convert_messages(msgs, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a\nb"},
    ]
    blocks = [{"type": "text", "text": "s1", "cache_control": {"type": "ephemeral"}}]
    blocks.append({"type": "text", "text": "s2"})
    out = convert_messages([{"role": "user", "content": "hi"}], blocks)
    assert out[0] == {"role": "system", "content": "s1\ns2"}
    assert convert_messages([{"role": "user", "content": "hi"}], "") == [
        {"role": "user", "content": "hi"}
    ]


def test_tool_use_and_tool_result() -> None:
    msgs = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "call it", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": "P"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    assert convert_messages(msgs) == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "call it",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"c": "P"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]


def test_tool_result_forms() -> None:
    def result(content: Any) -> list[dict]:
        block = {"type": "tool_result", "tool_use_id": "t"}
        if content is not ...:
            block["content"] = content
        return convert_messages([{"role": "user", "content": [block]}])

    assert result(...) == [{"role": "tool", "tool_call_id": "t", "content": ""}]
    assert result([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])[0]["content"] == (
        "a\nb"
    )
    image = {"type": "image", "source": {"type": "url", "url": "http://x"}}
    assert "images are not supported" in refused(result, [image])


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "images are not"),
        ([{"role": "user", "content": [{"type": "document", "source": {}}]}], "documents"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
                }
            ],
            "tool_use",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}],
            "tool_result",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}],
            "input",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "text"),
        ([{"role": "user", "content": [{"text": "x"}]}], "type"),
        ([{"role": "user", "content": 5}], "content"),
        ([{"role": "user"}], "content"),
        ([{"role": "tool", "content": "x"}], "role"),
        ([], "non-empty"),
        ("hi", "non-empty"),
    ],
)
def test_refused_messages(messages: Any, words: str) -> None:
    assert words in refused(convert_messages, messages)


def test_tools_and_tool_choice() -> None:
    tools = convert_tools([WEATHER, {"name": "f", "input_schema": {}, "type": "custom"}])
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "d",
                "parameters": {"type": "object"},
            },
        },
        {"type": "function", "function": {"name": "f", "parameters": {}}},
    ]
    assert convert_tools(None) is None and convert_tools([]) is None
    assert "server tools" in refused(convert_tools, [{"type": "bash_20250124", "name": "bash"}])
    assert "input_schema" in refused(convert_tools, [{"name": "f"}])
    assert tool_choice_tools(tools, None) is tools
    assert tool_choice_tools(tools, {"type": "auto", "disable_parallel_tool_use": True}) is tools
    assert tool_choice_tools(tools, {"type": "none"}) is None
    for choice in ({"type": "any"}, {"type": "tool", "name": "f"}):
        assert tool_choice_tools(tools, choice) is tools  # shown; the server forces a call
    assert "tool_choice" in refused(tool_choice_tools, tools, "auto")


def test_thinking_and_template_args() -> None:
    assert thinking_args(None) == {}
    assert thinking_args({"type": "enabled", "budget_tokens": 2048}) == {"enable_thinking": True}
    assert thinking_args({"type": "adaptive"}) == {"enable_thinking": True}
    assert thinking_args({"type": "disabled"}) == {"enable_thinking": False}
    assert "thinking" in refused(thinking_args, {"type": "sometimes"})
    for kind in ("enabled", "disabled"):  # a bad budget is a 400 whatever the type
        assert "budget_tokens" in refused(thinking_args, {"type": kind, "budget_tokens": False})
    body = {"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}}
    conv = convert_request(body, {"enable_thinking": True, "other": 1})
    assert conv.template_args == {"enable_thinking": False, "other": 1}
    assert not conv.prefill
    body["messages"].append({"role": "assistant", "content": "The answer is"})
    assert convert_request(body, {}).prefill
    body["messages"][-1]["content"] = [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]
    assert "tool_result" in refused(convert_request, body, {})
    body = {"messages": [{"role": "user", "content": "x"}]}
    body["output_config"] = {"effort": "high"}
    convert_request(body, {})
    body["output_config"] = {"format": {"type": "json_schema", "schema": {}}}
    convert_request(body, {})  # the format is the server's constraint, not the template's


def test_params() -> None:
    defaults = SimpleNamespace(temp=0.0, top_p=1.0, top_k=0, min_p=0.05)
    p = read_params({"max_tokens": 7, "top_k": 5, "stop_sequences": ["a", ""]}, defaults)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (7, 0.0, 1.0, 5, 0.05)
    assert p.stop == ["a"]
    p = read_params({"max_tokens": 1, "temperature": 0.7, "top_p": 0.9}, defaults)
    assert (p.temperature, p.top_p) == (0.7, 0.9)
    for body in ({}, {"max_tokens": None}, {"max_tokens": 0}, {"max_tokens": 1.5}):
        assert "max_tokens" in refused(read_params, body, defaults)
    assert "stop_sequences" in refused(
        read_params, {"max_tokens": 1, "stop_sequences": "a"}, defaults
    )
    assert "temperature" in refused(read_params, {"max_tokens": 1, "temperature": -0.1}, defaults)


# ----------------------------------------------------------------------------- replies


def kinds(evs: list[dict]) -> list[str]:
    return [e["type"] for e in evs]


def test_blocks_in_order_without_edge_whitespace() -> None:
    b = Blocks()
    evs = b.feed(Delta(reasoning="\nLet me "))
    evs += b.feed(Delta(reasoning="think.\n"))
    evs += b.feed(Delta(content="\n\n"))  # only whitespace: no block
    evs += b.feed(Delta(tool_calls=[ToolCall("id1", "f", '{"x": 1}')]))
    evs += b.feed(Delta(content="\n"))
    evs += b.feed(Delta(content="Done  "))
    evs += b.feed(Delta(content=" now.\n"))
    evs += b.close()
    assert kinds(evs) == [
        "content_block_start",  # 0 thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 1 tool_use
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 2 text
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    assert [e["index"] for e in evs] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert evs[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [evs[1]["delta"], evs[2]["delta"]] == [
        {"type": "thinking_delta", "thinking": "Let me"},
        {"type": "thinking_delta", "thinking": " think."},
    ]
    assert evs[4]["content_block"] == {"type": "tool_use", "id": "id1", "name": "f", "input": {}}
    assert evs[5]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert evs[8]["delta"]["text"] + evs[9]["delta"]["text"] == "Done   now."


def test_prefill_keeps_leading_whitespace() -> None:
    b = Blocks(keep_leading_text=True)
    evs = b.feed(Delta(content=" B)")) + b.close()
    assert evs[1]["delta"] == {"type": "text_delta", "text": " B)"}


class FakeTokenizer:
    """Enough of a tokenizer for StopWords: one piece of text per id, EOS 0."""

    eos_token_ids = {0}
    pieces = {1: "a", 2: "b", 3: "END.", 4: "ab", 5: "x", 7: "tok"}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        by_text = {v: k for k, v in self.pieces.items()}
        return [by_text[text]] if text in by_text else [9] * len(text)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces.get(i, "?") for i in ids)


def test_stop_words() -> None:
    stops = StopWords(FakeTokenizer(), ["ab", "b", "END", "zz"])
    assert stops.matched([5, 4]) == "ab"  # the engine's match: the word's own ids
    assert stops.matched([5, 2]) == "b"
    assert stops.matched([5, 3]) == "END"  # in the text: the token "END." holds it
    assert stops.matched([5, 3, 0]) is None  # EOS ended it
    assert stops.matched([5, 7]) is None and stops.matched([]) is None
    assert StopWords(FakeTokenizer(), []).matched([4]) is None


class FakeGeneration:
    """What `events` reads of a Generation: chunks(), usage, params, its (no) rows and
    deadline."""

    def __init__(self, chunks: list[Chunk], max_tokens: int = 100, prompt_tokens: int = 9):
        self._chunks = chunks
        self.params = GenParams(max_tokens=max_tokens)
        self.usage = Usage(prompt_tokens=prompt_tokens)
        self.handles: list[Any] = []  # admitted at once: nothing to wait for
        self.deadline = None
        self.timed_out = False

    def cancel(self) -> None:
        pass

    async def chunks(self) -> AsyncIterator[Chunk]:
        for chunk in self._chunks:
            self.usage.completion_tokens += len(chunk.tokens)
            yield chunk


def reply(chunks: list[Chunk], **kw: Any) -> tuple[list[dict], dict]:
    async def run() -> tuple[list[dict], dict]:
        stops = StopWords(kw.pop("tokenizer", FakeTokenizer()), kw.pop("stops", []))
        evs = [e async for e in events(FakeGeneration(chunks, **kw), "m", stops)]
        whole = await fold(events(FakeGeneration(chunks, **kw), "m", stops))
        return evs, whole

    return asyncio.run(run())


def chunk(content: str = "", finish: str | None = None, token: int = 7, **kw: Any) -> Chunk:
    return Chunk(0, Delta(content=content, **kw), [TokenInfo(token)], False, finish)


def test_event_sequence_and_fold() -> None:
    evs, msg = reply([chunk("Hello"), chunk(" there"), chunk("", "stop", token=0)])
    assert kinds(evs) == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = evs[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["id"].startswith("msg_") and start["model"] == "m"
    assert start["usage"] == {
        "input_tokens": 9,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    assert evs[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert evs[-2]["usage"]["output_tokens"] == 3
    assert msg["content"] == [{"type": "text", "text": "Hello there"}]
    assert msg["stop_reason"] == "end_turn" and msg["usage"]["output_tokens"] == 3
    assert set(msg) == {
        "id",
        "type",
        "role",
        "model",
        "content",
        "stop_reason",
        "stop_sequence",
        "usage",
    }


def test_stop_reasons() -> None:
    # the last ids are a stop sequence's, not EOS (0)
    _, msg = reply([chunk("a", token=1), chunk("", "stop", token=2)], stops=["zz", "ab"])
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "ab")
    _, msg = reply([chunk("a", token=1), chunk("", "length", token=2)], max_tokens=2)
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("max_tokens", None)
    # max_tokens was cut to the context window
    _, msg = reply([chunk("a", token=1), chunk("", "length", token=2)], max_tokens=50)
    assert msg["stop_reason"] == "model_context_window_exceeded"
    _, msg = reply([chunk("", "tool_calls", token=0, tool_calls=[ToolCall("i", "f", "{}")])])
    assert msg["stop_reason"] == "tool_use"
    assert msg["content"] == [{"type": "tool_use", "id": "i", "name": "f", "input": {}}]
    _, msg = reply([chunk("", "stop", token=0)])  # nothing said
    assert msg["content"] == [] and msg["stop_reason"] == "end_turn"


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(qwen3_tokenizer_dir)


def test_qwen3_tool_call_text_to_tool_use(qwen3_tokenizer: Any) -> None:
    """The model's text, token by token, through the server's text split and Qwen3 tool
    parser, then the Anthropic blocks: thinking, text, tool_use with an input object."""
    tok = qwen3_tokenizer
    text = (
        "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    tools = convert_tools([WEATHER])
    choice = ChoiceText(text_machine(tok, []), "normal", tok.tool_parser, tools)
    detok = tok.detokenizer
    detok.reset()
    chunks = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        if not last:
            detok.add_token(t)
        delta = choice.feed("" if last else detok.last_segment, "stop" if last else None)
        finish = choice.finish_reason("stop") if last else None
        chunks.append(Chunk(0, delta, [TokenInfo(t)], choice.in_tool, finish))
    evs, msg = reply(chunks, tokenizer=tok)
    assert msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][0]["thinking"] == "The user wants the weather."
    assert msg["content"][1]["text"] == "Let me check."
    call = msg["content"][2]
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"} and call["id"]
    deltas = [e["delta"] for e in evs if e["type"] == "content_block_delta"]
    assert json.loads(deltas[-1]["partial_json"]) == {"city": "Paris"}
