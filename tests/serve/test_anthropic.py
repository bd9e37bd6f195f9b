"""Anthropic Messages over HTTP with the official `anthropic` SDK against a live server.

The tiny qwen3 model writes random text, so replies whose content matters (a tool call, a
thinking block, a stop sequence) are forced: `forced` wraps the server's request builder
(the server runs in this process) to add a logits processor that allows exactly one scripted
token per step, then EOS. The prompt side is checked against the chat template rendered here,
independently, with transformers' AutoTokenizer on the model folder."""

import json
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

MODEL = "claude-local-test"  # any id: unknown names mean the served model
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
WEATHER_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER["input_schema"],
    },
}
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def client(qwen3_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=qwen3_server.url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


def rendered(tokenizer: Any, messages: list[dict], **kwargs: Any) -> list[int]:
    """The template applied independently of the server."""
    kwargs.setdefault("add_generation_prompt", True)
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """`forced(text)` or `forced(ids=[...])`: the next generations emit exactly those tokens,
    then the tokenizer's EOS (a test-only logits processor on the engine request)."""
    import mlx.core as mx

    from mlxd.serve import generation

    script: dict[str, list[int]] = {}
    real = generation.build_request

    def build(served, prompt, params, *rest):
        req = real(served, prompt, params, *rest)
        if "ids" not in script:
            return req
        tok = served.tokenizer
        ids = script["ids"]
        if ids is None:
            ids = tok.encode(script["text"], add_special_tokens=False)
        ids = list(ids) + [next(iter(tok.eos_token_ids))]
        start = len(prompt.tokens)

        def force(tokens: mx.array, logits: mx.array) -> mx.array:
            step = tokens.shape[-1] - start
            allowed = mx.arange(logits.shape[-1]) == ids[min(step, len(ids) - 1)]
            return mx.where(allowed, logits, float("-inf"))

        req.logits_processors = [force]
        return req

    def set_script(text: str = "", ids: list[int] | None = None) -> None:
        script["ids"], script["text"] = ids, text  # type: ignore[assignment]

    monkeypatch.setattr(generation, "build_request", build)
    yield set_script


def ask(client: anthropic.Anthropic, **kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_tokens", 16)
    kwargs.setdefault("messages", [{"role": "user", "content": "Hello"}])
    return client.messages.create(**kwargs)


# ----------------------------------------------------------------------------- replies


def test_non_streaming_shape(client: anthropic.Anthropic) -> None:
    # this SDK has no sampling arguments any more; clients that send them use extra_body
    msg = ask(client, max_tokens=8, metadata={"user_id": "u1"}, extra_body={"temperature": 0.0})
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == MODEL
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.stop_sequence is None
    assert all(b.type == "text" for b in msg.content)
    n_in = client.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}]
    ).input_tokens
    # Anthropic counts prompt tokens served from the cache apart from input_tokens.
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == n_in
    assert msg.usage.cache_creation_input_tokens == 0
    assert 1 <= msg.usage.output_tokens <= 8
    if msg.stop_reason == "max_tokens":
        assert msg.usage.output_tokens == 8


def test_claude_model_names_mean_the_served_model(client: anthropic.Anthropic) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK's note on old model ids
        msg = ask(client, model="claude-sonnet-4-5", max_tokens=2)
    assert msg.model == "claude-sonnet-4-5"


def test_stream_helper_matches_final_message(client: anthropic.Anthropic) -> None:
    kinds, text = [], ""
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = stream.get_final_message()
    raw = [k for k in kinds if k not in ("text", "thinking", "input_json")]  # SDK-made events
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens >= 1


def test_create_stream_event_order(client: anthropic.Anthropic) -> None:
    events = list(ask(client, max_tokens=10, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.usage.input_tokens > 0
    blocks, i = [], 1
    while kinds[i] == "content_block_start":  # start, deltas, stop, for each block in order
        assert events[i].index == len(blocks)
        blocks.append(events[i].content_block.type)
        i += 1
        while kinds[i] == "content_block_delta":
            assert events[i].index == len(blocks) - 1
            i += 1
        assert kinds[i] == "content_block_stop" and events[i].index == len(blocks) - 1
        i += 1
    assert i == len(kinds) - 2
    delta = events[-2]
    assert delta.delta.stop_reason in ("end_turn", "max_tokens")
    assert delta.usage.output_tokens >= 1


def test_sse_frames(qwen3_server) -> None:
    """Each frame is `event: NAME` then `data: JSON` whose type is NAME; ping follows start."""
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    r = httpx.post(qwen3_server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f]
    names = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        name = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
        names.append(name)
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]


def test_system_prompt(client: anthropic.Anthropic, hf_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    expected = rendered(hf_tokenizer, [{"role": "system", "content": "Be brief."}, *messages])
    for system in ("Be brief.", [{"type": "text", "text": "Be brief."}]):
        n = client.messages.count_tokens(model=MODEL, system=system, messages=messages)
        assert n.input_tokens == len(expected)
        msg = ask(client, system=system, messages=messages, max_tokens=2)
        assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == len(expected)


def test_count_tokens_matches_the_template(client: anthropic.Anthropic, hf_tokenizer) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "?"}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    openai = [
        {"role": "user", "content": "Hi\n?"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    n = client.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER])
    assert n.input_tokens == len(rendered(hf_tokenizer, openai, tools=[WEATHER_OPENAI]))
    # tool_choice none hides the tools; thinking maps to enable_thinking
    n = client.messages.count_tokens(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        thinking={"type": "disabled"},
    )
    assert n.input_tokens == len(rendered(hf_tokenizer, openai, enable_thinking=False))
    n = client.messages.count_tokens(
        model=MODEL, messages=messages, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert n.input_tokens == len(rendered(hf_tokenizer, openai, enable_thinking=True))


def test_prefill_continues_the_assistant_turn(client, hf_tokenizer, forced) -> None:
    messages = [
        {"role": "user", "content": "Say hello"},
        {"role": "assistant", "content": "Hello"},
    ]
    expected = rendered(
        hf_tokenizer, messages, add_generation_prompt=False, continue_final_message=True
    )
    assert client.messages.count_tokens(model=MODEL, messages=messages).input_tokens == len(
        expected
    )
    # Leading whitespace continues the client's text, so it is kept (a leading *space* is
    # trimmed by mlx-lm's BPE detokenizer on any first token, as in mlx_lm.server).
    forced("\n world")
    msg = ask(client, messages=messages)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == len(expected)
    assert [(b.type, b.text) for b in msg.content] == [("text", "\n world")]


# ----------------------------------------------------------------------------- forced output


def test_thinking_and_text_blocks(client: anthropic.Anthropic, forced) -> None:
    forced("<think>\nThe user greets me.\n</think>\n\nHello there!")
    msg = ask(client, max_tokens=40)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "The user greets me."
    assert msg.content[1].text == "Hello there!"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None

    with client.messages.stream(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and "text_delta" in deltas
    assert deltas.index("thinking_delta") < deltas.index("text_delta")
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "The user greets me."
    assert final.content[1].text == "Hello there!"


def test_stop_sequences(client: anthropic.Anthropic, qwen3_server, forced) -> None:
    tok = qwen3_server.state.provider.default.tokenizer
    ids = tok.encode("Hello world") + tok.encode("END") + tok.encode(" and more")
    forced(ids=ids)
    msg = ask(client, max_tokens=30, stop_sequences=["NEVER", "END"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "END"
    assert [b.text for b in msg.content] == ["Hello world"]
    assert msg.usage.output_tokens == len(tok.encode("Hello world")) + 1

    events = list(ask(client, max_tokens=30, stop_sequences=["END"], stream=True))
    assert events[-2].delta.stop_reason == "stop_sequence"
    assert events[-2].delta.stop_sequence == "END"

    msg = ask(client, max_tokens=30)  # no stop sequence: the whole text, then EOS
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.content[0].text == "Hello worldEND and more"

    msg = ask(client, max_tokens=2, stop_sequences=["END"])
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 2

    # a stop sequence inside a token's text ends the reply there too
    msg = ask(client, max_tokens=30, stop_sequences=["orl"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "orl"
    assert [b.text for b in msg.content] == ["Hello w"]
    assert msg.usage.output_tokens == 2


def test_tool_use_round_trip(client: anthropic.Anthropic, hf_tokenizer: Any, forced) -> None:
    forced("<think>\nI need the weather.\n</think>\n\n" + TOOL_CALL)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    msg = ask(client, max_tokens=60, tools=[WEATHER], messages=[question])
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    call = msg.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id

    # streaming: the tool_use block starts with an empty input, then one input_json_delta
    events = list(ask(client, max_tokens=60, tools=[WEATHER], messages=[question], stream=True))
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["thinking", "tool_use"]
    assert starts[1].content_block.name == "get_weather" and starts[1].content_block.input == {}
    parts = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    assert events[-2].delta.stop_reason == "tool_use"
    with client.messages.stream(
        model=MODEL, max_tokens=60, tools=[WEATHER], messages=[question]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"

    # the next turn: the assistant's tool_use (and thinking) back, the user's tool_result
    history = [
        question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"},
            ],
        },
    ]
    openai = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I need the weather.",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    expected = rendered(hf_tokenizer, openai, tools=[WEATHER_OPENAI])
    text = hf_tokenizer.decode(expected)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nSunny, 24 C\n</tool_response>" in text
    assert "I need the weather." in text
    n = client.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert n.input_tokens == len(expected)

    forced("It is sunny in Paris.")
    reply = ask(client, max_tokens=30, tools=[WEATHER], messages=history)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == len(expected)
    assert reply.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in reply.content] == [("text", "It is sunny in Paris.")]


def test_tool_result_with_text_blocks(client: anthropic.Anthropic, hf_tokenizer: Any) -> None:
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "A"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "B"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "snow"}],
                    "is_error": False,
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    calls = [
        {
            "id": f"toolu_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": a},
        }
        for i, a in ((1, {"city": "A"}), (2, {"city": "B"}))
    ]
    openai = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "snow"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    n = client.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert n.input_tokens == len(rendered(hf_tokenizer, openai, tools=[WEATHER_OPENAI]))


def test_client_going_away_frees_the_row(qwen3_server, forced) -> None:
    tok = qwen3_server.state.provider.default.tokenizer
    forced(ids=tok.encode(" word", add_special_tokens=False) * 3000)
    engine = qwen3_server.state.provider.default.engine
    body = {"model": MODEL, "max_tokens": 3000, "stream": True, "messages": HI}
    with httpx.stream("POST", qwen3_server.url + "/v1/messages", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and "text_delta" in line:
                break
        assert engine.stats()["active"] == 1
    deadline = time.time() + 10
    while engine.stats()["active"] and time.time() < deadline:
        time.sleep(0.05)
    assert engine.stats()["active"] == 0


def test_failure_mid_stream_is_an_error_event(
    qwen3_server, client: anthropic.Anthropic, rows_fail_mid_stream, caplog
) -> None:
    body = {"model": MODEL, "max_tokens": 20, "stream": True, "messages": HI}
    r = httpx.post(qwen3_server.url + "/v1/messages", json=body, timeout=60)
    frames = [f for f in r.text.split("\n\n") if f]
    assert frames[0].startswith("event: message_start")
    assert frames[-1].startswith("event: error\n")
    error = json.loads(frames[-1].split("\n")[1].removeprefix("data: "))
    assert error == {
        "type": "error",
        "error": {"type": "api_error", "message": error["error"]["message"]},
    }
    assert "boom in the row" in error["error"]["message"]
    logged = [r for r in caplog.records if "error event sent" in r.getMessage()]
    assert logged and "boom in the row" in str(logged[0].exc_info[1])  # the server says why
    with pytest.raises(anthropic.APIStatusError, match="boom in the row"):
        list(ask(client, max_tokens=20, stream=True))
    rows_fail_mid_stream()  # undo
    assert ask(client, max_tokens=3).usage.output_tokens >= 1  # the engine goes on


# ----------------------------------------------------------------------------- errors


def _post(server, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _is_anthropic_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request_error"
    for word in words:
        assert word in body["error"]["message"], body


HI = [{"role": "user", "content": "Hi"}]
PROMPT_ERRORS = ("model", "messages", "images are not supported", "tool_choice", "role")
PROMPT_ERRORS += ("thinking", "server tools", "input_schema", "system", "output_config.format")
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": MODEL, "messages": HI}, ["max_tokens"]),
        ({"model": MODEL, "messages": HI, "max_tokens": 0}, ["max_tokens"]),
        ({"model": MODEL, "messages": HI, "max_tokens": "5"}, ["max_tokens"]),
        ({"model": MODEL, "messages": HI, "max_tokens": True}, ["max_tokens"]),
        ({"messages": HI, "max_tokens": 5}, ["model"]),
        ({"model": MODEL, "messages": [], "max_tokens": 5}, ["messages"]),
        (
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "?"}]}],
            },
            ["images are not supported"],
        ),
        (
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}
                        ],
                    }
                ],
            },
            ["images are not supported"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI} | {"tool_choice": {"type": "any"}},
            ["tool_choice", "needs tools"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "tools": [WEATHER]}
            | {"tool_choice": {"type": "tool", "name": "nope"}},
            ["tool_choice", "no tool named 'nope'"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            ["role"],
        ),
        ({"model": MODEL, "max_tokens": 5, "messages": HI, "temperature": -1}, ["temperature"]),
        ({"model": MODEL, "max_tokens": 5, "messages": HI, "top_p": 2}, ["top_p"]),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "stop_sequences": "END"},
            ["stop_sequences"],
        ),
        ({"model": MODEL, "max_tokens": 5, "messages": HI, "stream": "yes"}, ["stream"]),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "thinking": {"type": "x"}},
            ["thinking"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI}
            | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            ["server tools"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "tools": [{"name": "f"}]},
            ["input_schema"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "system": [{"type": "image"}]},
            ["system"],
        ),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI}
            | {"output_config": {"format": {"type": "json_schema"}}},
            ["output_config.format", "needs a schema"],
        ),
    ],
)
def test_errors_in_anthropic_shape(qwen3_server, body: dict, words: list[str]) -> None:
    _is_anthropic_error(_post(qwen3_server, body), 400, *words)
    if words[0] in PROMPT_ERRORS:  # count_tokens refuses the same prompts
        count = {k: v for k, v in body.items() if k != "max_tokens"}
        _is_anthropic_error(_post(qwen3_server, count, "/v1/messages/count_tokens"), 400, *words)


def test_bad_json_and_sdk_errors(qwen3_server, client: anthropic.Anthropic) -> None:
    r = httpx.post(
        qwen3_server.url + "/v1/messages",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    _is_anthropic_error(r, 400, "JSON")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": [IMAGE]}],  # type: ignore[list-item]
        )
    assert e.value.status_code == 400 and "images are not supported" in str(e.value)
    with pytest.raises(anthropic.BadRequestError, match="no tool named"):
        ask(client, tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"})
    # and the server keeps serving
    assert ask(client, max_tokens=3).usage.output_tokens >= 1
    assert httpx.get(qwen3_server.url + "/health").json()["status"] == "ok"


# ----------------------------------------------------------------------------- real text


@pytest.mark.slow
def test_real_model_answers(smollm2_server) -> None:
    """The embedded SmolLM2-135M-Instruct (the session's shared server) answers in English."""
    client = anthropic.Anthropic(base_url=smollm2_server.url, api_key="x", max_retries=0)
    msg = client.messages.create(
        model=MODEL,
        max_tokens=20,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(
        model=MODEL,
        max_tokens=20,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == msg.content[0].text
