"""The request log against a live server: one INFO line per request with its id (the one the
SDKs expose as `_request_id`), model, API, token counts, TTFT, tokens/s and finish reason; a
client that leaves mid-stream is logged cancelled, a 400 with its message; long prompts log
their prefill progress."""

import logging
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

LOGGER = "mlxd.requests"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.INFO, logger=LOGGER)

    def get(path: str | None = None, wait: float = 10.0) -> list[dict[str, Any]]:
        """The request lines' fields (for `path`), waiting up to `wait` s for a first one."""
        deadline = time.time() + wait
        while True:
            got = [
                r.fields
                for r in caplog.records
                if r.name == LOGGER and "method" in getattr(r, "fields", {})
                if path is None or r.fields["path"] == path
            ]
            if got or time.time() > deadline:
                return got
            time.sleep(0.05)

    return get


def test_completed_request_line(qwen3_server, lines) -> None:
    sdk = openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")
    r = sdk.chat.completions.create(model="default_model", messages=MSGS, max_tokens=5)
    [line] = lines("/v1/chat/completions")
    assert line["request_id"] == r._request_id and line["request_id"].startswith("req_")
    assert line["status"] == 200 and line["method"] == "POST"
    assert line["model"] == qwen3_server.state.provider.default.name
    assert line["api"] == "chat"
    assert line["prompt_tokens"] == r.usage.prompt_tokens
    assert line["cached_tokens"] == r.usage.prompt_tokens_details.cached_tokens
    assert line["completion_tokens"] == r.usage.completion_tokens == 5
    assert line["finish"] == r.choices[0].finish_reason == "length"
    assert 0 < line["ttft_s"] <= line["duration_s"]
    assert line["tokens_per_s"] > 0
    assert "error" not in line


def test_streamed_request_line_and_text_form(qwen3_server, lines, caplog) -> None:
    sdk = openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")
    stream = sdk.completions.create(
        model="default_model", prompt="once", max_tokens=7, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    usage = [c.usage for c in stream if c.usage is not None][-1]
    [line] = lines("/v1/completions")
    assert line["status"] == 200 and line["api"] == "completions"
    assert line["completion_tokens"] == usage.completion_tokens == 7
    assert line["prompt_tokens"] == usage.prompt_tokens
    assert line["finish"] == "length"
    [record] = [r for r in caplog.records if getattr(r, "fields", None) is line]
    assert record.levelno == logging.INFO
    text = record.getMessage()
    assert text.startswith("POST /v1/completions 200 request_id=req_")
    assert "api=completions" in text and "completion_tokens=7" in text and "finish=length" in text


def test_cancelled_stream_says_cancelled(qwen3_server, lines) -> None:
    body = {"model": "default_model", "messages": MSGS, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", qwen3_server.v1 + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        frames = r.iter_lines()
        [next(frames) for _ in range(4)]  # a few tokens in, the client leaves
    [line] = lines("/v1/chat/completions", wait=30)
    assert line["finish"] == "cancelled"
    assert 0 < line["completion_tokens"] < 2000
    assert line["request_id"] == r.headers["x-request-id"]


def test_bad_request_line_names_the_reason(qwen3_server, lines) -> None:
    body = {"model": "default_model", "messages": MSGS, "max_tokens": -1}
    r = httpx.post(qwen3_server.v1 + "/chat/completions", json=body)
    assert r.status_code == 400
    [line] = lines("/v1/chat/completions")
    assert line["status"] == 400
    assert line["error"] == r.json()["error"]["message"] and line["error"]
    assert line["request_id"] == r.headers["x-request-id"]
    assert "completion_tokens" not in line  # nothing was generated


def test_client_request_id_is_kept(qwen3_server, lines) -> None:
    r = httpx.get(qwen3_server.v1 + "/models", headers={"X-Request-Id": "agent-7.turn-3"})
    assert r.headers["x-request-id"] == "agent-7.turn-3"
    [line] = lines("/v1/models")
    assert line["request_id"] == "agent-7.turn-3" and line["status"] == 200
    bad = httpx.get(qwen3_server.v1 + "/models", headers={"X-Request-Id": "a b\tc"})
    assert bad.headers["x-request-id"].startswith("req_")  # not a tame id: a new one


def test_anthropic_request_id_and_line(qwen3_server, lines) -> None:
    sdk = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused")
    m = sdk.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=MSGS)
    [line] = lines("/v1/messages")
    assert line["request_id"] == m._request_id
    assert line["api"] == "messages" and line["completion_tokens"] == m.usage.output_tokens


def test_health_polls_log_at_debug(qwen3_server, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert httpx.get(qwen3_server.url + "/health").status_code == 200
    deadline = time.time() + 5
    while not [r for r in caplog.records if r.name == LOGGER] and time.time() < deadline:
        time.sleep(0.05)
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.DEBUG and record.fields["path"] == "/health"


def progress(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    return [
        (r.fields["prompt_done"], r.fields["prompt_total"])
        for r in caplog.records
        if r.name == LOGGER and "prompt_done" in getattr(r, "fields", {})
    ]


def test_long_prompt_logs_prefill_progress(make_server, lines, caplog) -> None:
    live = make_server(prefill_step_size=16)
    prompt = " ".join(["word"] * 60)
    r = httpx.post(live.v1 + "/completions", json={"prompt": prompt, "max_tokens": 2})
    n = r.json()["usage"]["prompt_tokens"]
    assert n > 48
    rid = r.headers["x-request-id"]
    steps = progress(caplog)
    assert steps == [*((d, n) for d in range(16, n - 1, 16)), (n - 1, n), (n, n)]
    texts = [r.getMessage() for r in caplog.records if "prompt_done" in getattr(r, "fields", {})]
    assert texts[0] == f"Prompt processing progress: 16/{n} request_id={rid}"
    caplog.clear()  # a prompt that fits one chunk logs no progress
    httpx.post(live.v1 + "/completions", json={"prompt": "word " * 5, "max_tokens": 2})
    assert lines("/v1/completions") and progress(caplog) == []


def test_client_gone_before_the_answer_is_cancelled(qwen3_server, lines) -> None:
    body = {"model": "default_model", "messages": MSGS, "max_tokens": 5000}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(qwen3_server.v1 + "/chat/completions", json=body, timeout=1.0)
    [line] = lines("/v1/chat/completions", wait=30)
    assert line["status"] == 499 and line["finish"] == "cancelled"
