"""Cheap limits before costly work: a prompt whose text cannot fit the context is a 400 before
any template runs or any token is counted, on every route that builds a prompt; the bound it
uses never refuses a text that fits; the memory a large body took is handed back."""

import sys
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxd.serve import anthropic_api, limits, openai_api, responses_api


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def test_the_longest_entry_of_qwen3_is_counted_in_bytes(qwen3_tokenizer) -> None:
    # the longest byte-level entry spells 128 bytes (its UTF-8 spelling is twice that)
    assert limits.longest_token_bytes(qwen3_tokenizer) == max(
        len(qwen3_tokenizer.decode([i]).encode()) for i in range(len(qwen3_tokenizer.vocab))
        if not qwen3_tokenizer.decode([i]).count("\ufffd")
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=400) | st.text(alphabet=" \n\t-=_#", max_size=2000))
def test_the_bound_never_refuses_a_text_that_fits(qwen3_tokenizer, text) -> None:
    """n bytes are at least n / longest tokens, for any text (the precheck's promise)."""
    longest = limits.longest_token_bytes(qwen3_tokenizer)
    tokens = len(qwen3_tokenizer.encode(text, add_special_tokens=False))
    assert tokens >= len(text.encode("utf-8")) / longest


def _never(*_args, **_kwargs):
    raise AssertionError("the prompt was built for a text that cannot fit")


@pytest.fixture
def no_templating(monkeypatch):
    for module in (openai_api, responses_api):
        monkeypatch.setattr(module, "chat_prompt", _never)
    monkeypatch.setattr(openai_api, "text_prompt", _never)
    monkeypatch.setattr(anthropic_api, "render", _never)


def _too_long(server) -> str:
    served = server.state.provider.default
    n = served.context_length * limits.longest_token_bytes(served.tokenizer) + 1
    return "x" * n


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", lambda t: {"messages": [{"role": "user", "content": t}]},
         "messages"),
        ("/v1/completions", lambda t: {"prompt": t}, "prompt"),
        ("/v1/responses", lambda t: {"input": t}, "input"),
    ],
    ids=["chat", "completions", "responses"],
)  # fmt: skip
def test_openai_routes_refuse_before_templating(
    qwen3_server, no_templating, path, body, param
) -> None:
    r = httpx.post(qwen3_server.url + path, json=body(_too_long(qwen3_server)), timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and "context length is 40960" in err["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_routes_refuse_before_templating(qwen3_server, no_templating, path) -> None:
    body = {"model": "m", "max_tokens": 2,
            "messages": [{"role": "user", "content": _too_long(qwen3_server)}]}  # fmt: skip
    r = httpx.post(qwen3_server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["type"] == "error" and "context length" in r.json()["error"]["message"]


def test_a_text_near_the_bound_is_still_answered(qwen3_server) -> None:
    """Half the bound in bytes is far fewer tokens than that: templated, then the exact check."""
    text = "hello " * (len(_too_long(qwen3_server)) // 12)
    r = httpx.post(qwen3_server.url + "/v1/messages/count_tokens",
                   json={"model": "m", "messages": [{"role": "user", "content": text}]},
                   timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text[:300]
    assert r.json()["input_tokens"] > len(text) // 6


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_a_large_request_took_is_handed_back(make_server) -> None:
    """A ~5 MB prompt within the bound is templated and tokenized (hundreds of MB in the
    tokenizer), then refused by the exact check; afterwards the process is back near where
    it started (glibc keeps freed memory until trimmed)."""
    server = make_server()
    warm = [{"role": "user", "content": "hello"}]
    assert httpx.post(server.v1 + "/chat/completions", json={"messages": warm, "max_tokens": 2},
                      timeout=60).status_code == 200  # fmt: skip
    before = _rss_mib()
    messages = [{"role": "user", "content": "hello " * 800_000}]
    r = httpx.post(server.v1 + "/chat/completions", json={"messages": messages}, timeout=120)
    assert r.status_code == 400 and "800009 tokens" in r.text, r.text[:200]
    deadline = time.monotonic() + 10
    while _rss_mib() > before + 150 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rss_mib() <= before + 150, (before, _rss_mib())
