"""The official `openai` SDK against a live mlxd server: chat and completions, streaming and
not, `n` as rows, logprobs, models; a scripted model drives tool calls, think blocks and stop
words through the real Qwen3 template and mlx-lm's tool parser."""

import json

import openai
import pytest
from scripted import chat_prompt_len, script_server
from transformers import AutoTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(qwen3_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")


@pytest.fixture
def scripted(make_server, qwen3_model_dir):
    live = make_server()
    model = script_server(live)
    tok = AutoTokenizer.from_pretrained(str(qwen3_model_dir))
    sdk = openai.OpenAI(base_url=live.v1, api_key="unused")

    def say(text: str, messages: list[dict], tools: list[dict] | None = None) -> None:
        ids = tok.encode(text, add_special_tokens=False)
        model.say(ids, chat_prompt_len(tok, messages, tools))

    return sdk, say


def test_chat_non_streaming_shape(client) -> None:
    r = client.chat.completions.create(
        model="default_model", messages=[{"role": "user", "content": "hi"}], max_tokens=6
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_streaming_matches_non_streaming(client) -> None:
    """Greedy: the streamed deltas join to the non-streamed content; role in every delta."""
    msgs = [{"role": "user", "content": "count"}]
    whole = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=12)
    stream = client.chat.completions.create(
        model="default_model",
        messages=msgs,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert all(c.choices[0].delta.role == "assistant" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completions_and_n_rows(client) -> None:
    r = client.completions.create(model="default_model", prompt="Once upon", max_tokens=5)
    assert r.object == "text_completion" and len(r.choices) == 1
    r2 = client.completions.create(
        model="default_model", prompt="Once upon", max_tokens=5, n=3, temperature=1.0, seed=7
    )
    assert [c.index for c in r2.choices] == [0, 1, 2]
    assert r2.usage.completion_tokens == 15
    assert r2.choices[0].text != r2.choices[1].text  # three rows, three random streams
    greedy = client.completions.create(model="default_model", prompt="Once upon", max_tokens=5)
    assert greedy.choices[0].text == r.choices[0].text


def test_logprobs_parse_in_the_sdk(client) -> None:
    r = client.chat.completions.create(
        model="default_model",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        best = max(t.logprob for t in entry.top_logprobs)
        assert entry.logprob == best  # greedy picks the most likely token


def test_models_lists_the_served_model(client) -> None:
    ids = [m.id for m in client.models.list()]
    assert len(ids) >= 1
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="no/such-model", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )


def test_unsupported_fields_are_refused_not_ignored(client) -> None:
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(
            model="default_model", messages=msgs, response_format={"type": "xml"}
        )
    with pytest.raises(openai.BadRequestError, match="no tool named 'nope'"):
        client.chat.completions.create(
            model="default_model", messages=msgs, tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tool_call_round_trip(scripted, stream: bool) -> None:
    sdk, say = scripted
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    say(call, msgs, [WEATHER])
    if stream:
        chunks = list(
            sdk.chat.completions.create(
                model="default_model", messages=msgs, tools=[WEATHER], stream=True
            )
        )
        calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        finish = chunks[-1].choices[0].finish_reason
        assert calls[0].index == 0
    else:
        r = sdk.chat.completions.create(model="default_model", messages=msgs, tools=[WEATHER])
        calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        assert r.choices[0].message.content is None
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    # The client sends the call and its result back: the template renders both.
    history = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "18 C, clear"},
    ]
    # mlx_lm.server renders a null content as "" (the Qwen3 template needs a string).
    reference = [dict(m, content=m["content"] or "") for m in history]
    say("It is 18 C and clear in Paris.", reference, [WEATHER])
    r2 = sdk.chat.completions.create(model="default_model", messages=history, tools=[WEATHER])
    assert r2.choices[0].message.content == "It is 18 C and clear in Paris."
    assert r2.choices[0].finish_reason == "stop"


def test_reasoning_is_split_from_content(scripted) -> None:
    sdk, say = scripted
    msgs = [{"role": "user", "content": "2+2?"}]
    say("<think>\nadd them\n</think>\n\nFour.", msgs)
    r = sdk.chat.completions.create(model="default_model", messages=msgs)
    message = r.choices[0].message
    extra = message.model_extra
    assert extra["reasoning"] == extra["reasoning_content"] == "\nadd them\n"
    assert message.content == "\n\nFour."


def test_stop_words_stop_and_are_stripped(scripted) -> None:
    sdk, say = scripted
    msgs = [{"role": "user", "content": "go"}]
    say("alpha beta STOP gamma", msgs)
    r = sdk.chat.completions.create(model="default_model", messages=msgs, stop=["STOP"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "alpha beta "


def test_failure_mid_stream_is_an_error_frame_the_sdk_raises(
    qwen3_server, client, rows_fail_mid_stream, caplog
):
    """A row that fails after the status line went out ends with OpenAI's error object in a
    frame, then [DONE] (vLLM's form), not a cut connection; the engine serves on."""
    import httpx

    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "default_model", "messages": msgs, "max_tokens": 20, "stream": True}
    r = httpx.post(qwen3_server.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200
    frames = [f.removeprefix("data: ") for f in r.text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    error = json.loads(frames[-2])
    assert set(error) == {"error"} and error["error"]["type"] == "server_error"
    assert "boom in the row" in error["error"]["message"]
    logged = [r for r in caplog.records if "error frame sent" in r.getMessage()]
    assert logged and "boom in the row" in str(logged[0].exc_info[1])  # the server says why
    assert json.loads(frames[0])["choices"][0]["delta"]["content"] is not None  # tokens first
    with pytest.raises(openai.APIError, match="boom in the row"):
        list(client.chat.completions.create(model="default_model", messages=msgs, stream=True))
    rows_fail_mid_stream()  # undo
    r = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=3)
    assert r.usage.completion_tokens == 3  # the engine goes on
