"""Anthropic usage through the anthropic SDK on a live server: a repeated prompt is a prefix
cache hit, and its `message_start` and `message_delta` report the same input numbers
(input_tokens without the cache reads, cache_read_input_tokens with them), as the
non-streaming response does; output tokens are in message_delta."""

import time
from typing import Any

import anthropic
import httpx
import pytest

MODEL = "default_model"


@pytest.fixture(scope="module")
def client(qwen3_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=qwen3_server.url, api_key="x", max_retries=0)


def streamed(client: anthropic.Anthropic, **kwargs: Any) -> tuple[Any, Any]:
    """The usage of message_start and of message_delta."""
    start = delta = None
    with client.messages.create(stream=True, **kwargs) as stream:
        for event in stream:
            if event.type == "message_start":
                start = event.message.usage
            elif event.type == "message_delta":
                delta = event.usage
    assert start is not None and delta is not None
    return start, delta


def numbers(usage: Any) -> tuple[int, int, int]:
    return usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens


@pytest.mark.parametrize("first", ["stream", "whole"])
def test_a_cache_hit_is_reported_alike_in_both_events(client, first: str) -> None:
    text = f"{first.title()} first: tell me a story about the cache, in many words please."
    kwargs = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": text}]}
    total = client.messages.count_tokens(model=MODEL, messages=kwargs["messages"]).input_tokens
    if first == "stream":
        cold_start, cold_delta = streamed(client, **kwargs)
        assert numbers(cold_start) == numbers(cold_delta)
        cold = cold_start
    else:
        cold = client.messages.create(**kwargs).usage
    assert cold.input_tokens + cold.cache_read_input_tokens == total

    start, delta = streamed(client, **kwargs)  # the same prompt again: the store has it
    hit = start.cache_read_input_tokens
    assert hit > cold.cache_read_input_tokens
    assert numbers(start) == numbers(delta) == (total - hit, hit, 0)
    assert start.output_tokens == 0 and 1 <= delta.output_tokens <= 3

    whole = client.messages.create(**kwargs)
    assert numbers(whole.usage) == (total - hit, hit, 0)
    assert whole.usage.output_tokens == delta.output_tokens


def test_the_sdks_accumulated_message_agrees(client) -> None:
    messages = [{"role": "user", "content": "Once more, the same words twice."}]
    kwargs = {"model": MODEL, "max_tokens": 2, "messages": messages}
    client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        first = None
        for event in stream:
            if event.type == "message_start":
                first = numbers(event.message.usage)
        final = stream.get_final_message()
    assert first is not None and first[1] > 0
    assert numbers(final.usage) == first


def test_a_client_leaving_before_admission_cancels_its_row(qwen3_server, monkeypatch) -> None:
    from mlxd.engine.request import RequestHandle

    cancelled: list[RequestHandle] = []
    real = RequestHandle.cancel
    monkeypatch.setattr(RequestHandle, "cancel", lambda h: (cancelled.append(h), real(h))[1])
    engine = qwen3_server.state.provider.default.engine
    body = {"model": MODEL, "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "Waiting in the queue."}]}  # fmt: skip
    with engine.driver.lock:  # no engine turn: the request is not admitted
        with httpx.stream("POST", qwen3_server.url + "/v1/messages", json=body) as r:
            assert r.status_code == 200
        deadline = time.time() + 10
        while not cancelled and time.time() < deadline:
            time.sleep(0.05)
        assert len(cancelled) == 1 and not cancelled[0].admitted
