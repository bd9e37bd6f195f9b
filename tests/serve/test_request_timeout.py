"""--request-timeout: a request still running at its deadline ends there with the tokens it
has (finish_reason length / stop_reason max_tokens / status incomplete), or, before its first
token, with a 429 and Retry-After; its row is freed and the server keeps serving."""

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from serve.test_admission import data_frames, wait_for

NO_EOS = {"151643": -100, "151645": -100}  # Qwen3's end tokens: rows run to max_tokens
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
TIMEOUT = 0.9  # seconds: rows that sleep 0.2 s a token still get a few out first


@pytest.fixture
def slow_rows(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """`slow_rows(s)`: every row built from now on sleeps `s` before each generated token."""
    from mlxd.serve import generation

    real = generation.build_request

    def slow(seconds: float) -> None:
        def build(served, prompt, params, *rest):
            req = real(served, prompt, params, *rest)

            def wait(tokens, logits):
                time.sleep(seconds)
                return logits

            req.logits_processors = [wait]
            return req

        monkeypatch.setattr(generation, "build_request", build)

    return slow


def engine_idle(live) -> bool:
    stats = live.state.provider.default.engine.stats()
    return stats["active"] == 0 and stats["waiting"] == 0


def test_a_running_request_ends_at_its_deadline_with_what_it_has(make_server, slow_rows) -> None:
    live = make_server(request_timeout=TIMEOUT)
    slow_rows(0.2)
    body = {"messages": MESSAGES, "max_tokens": 200, "logit_bias": NO_EOS}
    t0 = time.monotonic()
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    tokens = r.json()["usage"]["completion_tokens"]
    assert 0 < tokens < 200
    assert TIMEOUT <= took < TIMEOUT + 2
    with httpx.stream("POST", live.v1 + "/chat/completions", json={**body, "stream": True},
                      timeout=60) as s:  # fmt: skip
        frames = data_frames(s.iter_lines())
    finishes = [c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    wait_for(lambda: engine_idle(live), 30, "the timed-out rows were not freed")


def test_each_api_says_it_ran_out(make_server, slow_rows) -> None:
    live = make_server(request_timeout=TIMEOUT)
    slow_rows(0.2)
    body = {"model": "default_model", "max_tokens": 200, "messages": MESSAGES}
    r = httpx.post(live.v1 + "/messages", json={**body, "metadata": {}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "max_tokens"
    r = httpx.post(live.v1 + "/responses", json={"input": "Tell me a story.",
                   "max_output_tokens": 200}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "incomplete"
    r = httpx.post(live.v1 + "/completions", json={"prompt": "Once", "max_tokens": 200,
                   "logit_bias": NO_EOS}, timeout=60)  # fmt: skip
    assert r.json()["choices"][0]["finish_reason"] == "length"


@contextmanager
def busy(url: str) -> Iterator[None]:
    """The only row runs a slow stream (its first frame is out) while the block runs."""
    hog = {"messages": MESSAGES, "max_tokens": 200, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream("POST", url + "/chat/completions", json=hog, timeout=60) as held:
        lines = held.iter_lines()
        next(x for x in lines if x.startswith("data: "))
        yield
        list(lines)  # it ends at its own deadline


def test_no_token_by_the_deadline_is_a_429_with_retry_after(make_server, slow_rows) -> None:
    """One row, busy past the deadline (0.6 s a token: the hog's first token comes 0.3 s before
    its deadline, its row frees at 1.2 s, and the queued request's first token, due by
    0.6 + 0.9 s, could come at 1.2 + 0.6 s at the soonest): the queued request never starts,
    and each API says so in its own shape, streamed or not; afterwards the server still serves."""
    live = make_server(request_timeout=TIMEOUT, batch=1, max_queue=8)
    slow_rows(0.6)
    url = live.v1 + "/chat/completions"
    with busy(live.v1):
        r = httpx.post(url, json={"messages": MESSAGES, "max_tokens": 4}, timeout=60)
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert "--request-timeout" in r.json()["error"]["message"]
    body = {"model": "m", "max_tokens": 4, "messages": MESSAGES, "stream": True}
    with busy(live.v1), httpx.stream("POST", live.v1 + "/messages", json=body, timeout=60) as s:
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["type"] == "rate_limit_error"
    stream = {"messages": MESSAGES, "max_tokens": 4, "stream": True}
    with busy(live.v1), httpx.stream("POST", url, json=stream, timeout=60) as s:
        frames = [x for x in s.iter_lines() if x.startswith("data: ")]
    assert json.loads(frames[-2][6:])["error"]["type"] == "rate_limit_error"
    assert frames[-1] == "data: [DONE]"
    slow_rows(0)
    wait_for(lambda: engine_idle(live), 30, "the timed-out rows were not freed")
    r = httpx.post(url, json={"messages": MESSAGES, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_the_flag_is_checked() -> None:
    from mlxd.config import ConfigError, ServeConfig

    with pytest.raises(ConfigError, match="--request-timeout"):
        ServeConfig(request_timeout=-1)
    assert ServeConfig().request_timeout == 0  # no limit unless asked
