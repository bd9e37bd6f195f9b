"""Hostile values an outside fuzzer sent, each once a 500: integers past 64 bits, lone
surrogates, model and adapter names the file system cannot look up, a non-list `tool_calls`.
Each is now a 4xx in the API's own shape naming the field, and the server keeps serving."""

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

M = [{"role": "user", "content": "hi"}]
BIG = 2**63  # one past int64: MLX raised std::bad_cast
MAX_DOUBLE = 1.7976931348623157e308  # finite in JSON, inf as MLX's float32


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \ud800, as a hostile client would send it
    content = json.dumps(body)
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60)  # fmt: skip


def openai_error(r: httpx.Response, status: int, param: str, *words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err


@pytest.mark.parametrize(
    "fields, status, param, words",
    [
        ({"temperature": BIG}, 400, "temperature", ["out of range"]),
        ({"repetition_penalty": BIG}, 400, "repetition_penalty", ["out of range"]),
        ({"top_k": -BIG - 1}, 400, "top_k", ["out of range"]),
        ({"max_tokens": BIG}, 400, "max_tokens", ["out of range"]),
        ({"seed": BIG}, 400, "seed", ["out of range"]),
        ({"top_p": float("nan")}, 400, "top_p", ["not a finite number"]),
        ({"presence_penalty": float("inf")}, 400, "presence_penalty", ["not a finite number"]),
        # float32's inf in the sampler: two sampled rows with top_p crashed the process
        ({"temperature": MAX_DOUBLE, "top_p": 0.9, "n": 2}, 400, "temperature", ["32-bit"]),
        ({"repetition_penalty": 1e39}, 400, "repetition_penalty", ["32-bit"]),
        ({"logit_bias": {"1": 1e39}}, 400, "logit_bias", ["32-bit"]),
        ({"model": "~nosuchuser"}, 404, "model", ["not served here"]),
        ({"model": "a" * 300}, 404, "model", ["not served here"]),
        ({"model": "\ud800"}, 400, "model", ["lone surrogate"]),
        ({"adapters": "\ud800"}, 400, "adapters", ["lone surrogate"]),
        ({"stop": ["ok", "\ud800"]}, 400, "stop", ["stop[1]", "lone surrogate"]),
        ({"messages": [{"role": "user", "content": "hi \ud800"}]}, 400, "messages",
         ["messages[0].content", "lone surrogate"]),
        ({"messages": [{"role": "user", "content": "hi"}], "lo\ud800": 1}, 400, "body",
         ["lone surrogate"]),
        ({"messages": [*M, {"role": "assistant", "content": "x", "tool_calls": 5}]}, 400,
         "messages", ["tool_calls must be a list"]),
    ],
    ids=["temperature", "repetition_penalty", "top_k", "max_tokens", "seed", "nan", "inf",
         "temperature-f32", "repetition-f32", "logit-bias-f32",
         "model-tilde",
         "model-long", "model-surrogate", "adapters", "stop", "content", "key", "tool_calls"],
)  # fmt: skip
def test_chat_fields(qwen3_server, fields, status, param, words) -> None:
    body = {"messages": M, "max_tokens": 2, **fields}
    openai_error(post(qwen3_server.url, "/v1/chat/completions", body), status, param, *words)


@pytest.mark.parametrize(
    "fields, words",
    [({"model": "~nosuchuser"}, "not a model reference"),
     ({"adapters": "a" * 300}, "adapter path not found")],
    ids=["model-tilde", "adapter-long"],
)  # fmt: skip
def test_names_the_file_system_cannot_look_up_when_paths_are_allowed(
    make_server, fields, words
) -> None:
    """--allow-model-paths: the names reach the resolver, which answers 404, not 500."""
    server = make_server(allow_model_paths=True)
    r = post(server.url, "/v1/chat/completions", {"messages": M, "max_tokens": 2, **fields})
    openai_error(r, 404, "model", words)


@pytest.mark.parametrize(
    "prompt, place",
    [([BIG], "prompt[0]"), ([1, 10**30], "prompt[1]"), ("hi \ud800", "prompt:")],
    ids=["int64", "huge", "surrogate"],
)
def test_completion_prompts(qwen3_server, prompt, place) -> None:
    r = post(qwen3_server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    openai_error(r, 400, "prompt", place)  # the field as param; the message names the place


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"model": "\ud800"}, "lone surrogate"),
        ({"temperature": BIG}, "out of range"),
        ({"max_tokens": 1e19}, "max_tokens must be of type int"),
    ],
    ids=["model", "temperature", "float-max-tokens-past-64-bits"],
)
def test_messages_in_anthropics_shape(qwen3_server, fields, words) -> None:
    body = {"model": "x", "max_tokens": 2, "messages": M, **fields}
    r = post(qwen3_server.url, "/v1/messages", body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and words in r.json()["error"]["message"]


def test_a_name_anthropic_falls_back_from_is_served(qwen3_server) -> None:
    """Anthropic clients send their own model ids: one the file system cannot look up still
    falls back to the served model."""
    body = {"model": "~nosuchuser", "max_tokens": 2, "messages": M}
    assert post(qwen3_server.url, "/v1/messages", body).status_code == 200


def test_the_server_still_serves(qwen3_server) -> None:
    r = post(qwen3_server.url, "/v1/chat/completions", {"messages": M, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "path, body, param",
    [("/v1/chat/completions", {"messages": [{"role": "user", "content": _nested(900)}]},
      "messages"),
     ("/v1/responses", {"input": [{"role": "user", "content": _nested(900)}]}, "input")],
    ids=["chat", "responses"],
)  # fmt: skip
def test_nesting_no_field_needs_is_400_not_a_recursion_error(qwen3_server, path, body, param):
    openai_error(post(qwen3_server.url, path, body), 400, param, "nested deeper than 100")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    prefill=st.text(max_size=12) | st.sampled_from(["END", " ", "Sure", "a\n", "\u00e9"]),
    stops=st.lists(st.text(min_size=1, max_size=4) | st.just("END"), min_size=1, max_size=3),
)
def test_an_anthropic_prefill_streams_with_stop_sequences(qwen3_server, prefill, stops) -> None:
    """Once a 500: an assistant prefill, streamed, with stop sequences. Every such request is
    a 200 whose events end with message_stop (or a 400 naming the field), never an error."""
    body = {"model": "m", "max_tokens": 3, "stream": True, "stop_sequences": stops,
            "messages": [*M, {"role": "assistant", "content": prefill}]}  # fmt: skip
    r = post(qwen3_server.url, "/v1/messages", body)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        assert "event: error" not in r.text and "event: message_stop" in r.text, r.text
    else:
        assert r.json()["type"] == "error", r.text
