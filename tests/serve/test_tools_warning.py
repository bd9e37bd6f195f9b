"""Tools on a model whose chat template drops them (the embedded SmolLM2's): the response says
so in an `X-Mlxd-Warning` header on chat, Responses and Messages, streamed or not, and the log
says it once per model; a template that renders tools (Qwen3's) gets no header."""

import logging

import anthropic
import httpx
import openai
import pytest

HEADER = "x-mlxd-warning"
M = [{"role": "user", "content": "What is the weather in Paris?"}]
FN = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_TOOL = {"type": "function", "function": FN}


def _bodies() -> dict[str, dict]:
    return {
        "/v1/chat/completions": {"messages": M, "tools": [CHAT_TOOL], "max_tokens": 2},
        "/v1/responses": {
            "input": M,
            "tools": [{"type": "function", **FN}],
            "max_output_tokens": 2,
        },  # fmt: skip
        "/v1/messages": {
            "messages": M,
            "max_tokens": 2,
            "tools": [
                {
                    "name": FN["name"],
                    "description": FN["description"],
                    "input_schema": FN["parameters"],
                }
            ],  # fmt: skip
        },
    }


def _post(url: str, path: str, body: dict, stream: bool) -> httpx.Response:
    body = {"model": "default_model", **body, "stream": stream}
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        r.read()
        return r


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_template_that_drops_tools_gets_the_header(smollm2_server, stream) -> None:
    name = smollm2_server.state.provider.default.name
    for path, body in _bodies().items():
        r = _post(smollm2_server.url, path, body, stream)
        assert r.status_code == 200, (path, r.text)
        assert r.headers.get(HEADER) == f"tools not in prompt: {name}'s chat template drops them"


def test_without_tools_or_with_tool_choice_none_no_header(smollm2_server) -> None:
    r = httpx.post(smollm2_server.v1 + "/chat/completions",
                   json={"messages": M, "max_tokens": 2}, timeout=120)  # fmt: skip
    assert r.status_code == 200 and HEADER not in r.headers
    body = {"messages": M, "max_tokens": 2, "tools": [CHAT_TOOL], "tool_choice": "none"}
    r = httpx.post(smollm2_server.v1 + "/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and HEADER not in r.headers


def test_a_template_that_renders_tools_gets_none(qwen3_server) -> None:
    for path, body in _bodies().items():
        r = _post(qwen3_server.url, path, body, False)
        assert r.status_code == 200, (path, r.text)
        assert HEADER not in r.headers, path


def test_the_sdks_see_it_and_the_log_says_it_once(smollm2_server, caplog) -> None:
    from mlxd.serve import tools_warning

    tools_warning._warned.clear()
    caplog.set_level(logging.WARNING, logger="mlxd.serve")
    oa = openai.OpenAI(base_url=smollm2_server.v1, api_key="unused")
    for _ in range(2):
        raw = oa.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=M, tools=[CHAT_TOOL], max_tokens=2
        )
        assert "drops them" in raw.headers[HEADER]
    claude = anthropic.Anthropic(base_url=smollm2_server.url, api_key="unused")
    raw = claude.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=2, messages=M,
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
    )  # fmt: skip
    assert "drops them" in raw.headers[HEADER]
    said = [r for r in caplog.records if "tools not in prompt" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
