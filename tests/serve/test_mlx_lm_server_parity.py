"""Drop-in check: mlx_lm.server (a subprocess) and mlxd serve on the same tiny model answer the
same requests with the same tokens, logprobs, text, finish reasons and usage.

Both servers keep their prompt caches (mlx-lm's default --prompt-cache-size 10) and get the same
requests in the same order, so their caches must serve the same prefixes: `cached_tokens` is
compared too, and every hit changes how the rest is chunked, so the bits as well."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve.conftest import LiveServer, free_port, start_server, wait_healthy

# Fields that legitimately differ: ids, timestamps, the fingerprint, mlxd's additions.
VOLATILE = {"id", "created", "system_fingerprint"}


def run_mlx_lm_server(model_dir: Path, *flags: str) -> Iterator[str]:
    """mlx_lm.server as a subprocess on `model_dir` with `flags`; yields its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir)]
    cmd += ["--port", str(port), *flags]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    if not wait_healthy(url, proc):
        proc.kill()
        raise RuntimeError(f"mlx_lm.server did not start: {proc.stderr.read().decode()}")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def mlx_lm_server(qwen3_model_dir: Path) -> Iterator[str]:
    yield from run_mlx_lm_server(qwen3_model_dir)


@pytest.fixture(scope="module")
def ours(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """mlxd with an empty prompt cache, seeing exactly the requests mlx_lm.server sees."""
    live = start_server(model=str(qwen3_model_dir), data_dir=str(tmp_path_factory.mktemp("d")))
    yield live
    live.stop()


def _post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(url: str, path: str, body: dict) -> list[dict]:
    frames = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                frames.append(json.loads(line[6:]))
    return frames


def _comparable(resp: dict) -> dict:
    out = {k: v for k, v in resp.items() if k not in VOLATILE}
    for choice in out.get("choices", []):
        for key in ("message", "delta"):
            choice.get(key, {}).pop("reasoning_content", None)  # mlxd adds it beside reasoning
        for entry in (choice.get("logprobs") or {}).get("content", []):
            entry.pop("token", None)  # mlxd adds the OpenAI fields to mlx-lm's entries
            entry.pop("top_logprobs", None)
    return out


CHAT = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24}
CASES = {
    "greedy": {**CHAT, "logprobs": True},
    "seeded": {**CHAT, "temperature": 1.0, "top_k": 40, "seed": 5, "logprobs": True},
    "penalties": {**CHAT, "repetition_penalty": 1.3, "presence_penalty": 0.5, "logprobs": True},
    "logit_bias": {**CHAT, "logit_bias": {"9707": 5.0, "151645": -100}, "logprobs": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_chat_equals_mlx_lm_server(ours, mlx_lm_server: str, case: str) -> None:
    body = CASES[case]
    theirs = _post(mlx_lm_server, "/v1/chat/completions", body)
    ours = _post(ours.url, "/v1/chat/completions", body)
    assert _comparable(ours) == _comparable(theirs)


def test_text_completion_equals_mlx_lm_server(ours, mlx_lm_server: str) -> None:
    body = {"prompt": "The weather today", "max_tokens": 16, "logprobs": True}
    theirs = _post(mlx_lm_server, "/v1/completions", body)
    ours = _post(ours.url, "/v1/completions", body)
    assert _comparable(ours) == _comparable(theirs)


def test_stream_equals_mlx_lm_server(ours, mlx_lm_server: str) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    theirs = [_comparable(f) for f in _stream(mlx_lm_server, "/v1/chat/completions", body)]
    ours = [_comparable(f) for f in _stream(ours.url, "/v1/chat/completions", body)]
    assert ours == theirs


def test_stop_word_at_token_level_equals_mlx_lm_server(
    ours, mlx_lm_server: str, qwen3_model_dir: Path
) -> None:
    """A stop word taken from the greedy output itself, one whose standalone encoding is the
    token it came from, so both servers stop on it at token level and discard held text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_model_dir))
    body = {"prompt": "Hello", "max_tokens": 16, "logprobs": True}
    first = _post(mlx_lm_server, "/v1/completions", body)
    ids = [e["id"] for e in first["choices"][0]["logprobs"]["content"]]
    word = next(
        w
        for t in ids[3:]
        if (w := tok.decode([t])).strip() and tok.encode(w, add_special_tokens=False) == [t]
    )
    body = {"prompt": "Hello", "max_tokens": 16, "stop": [word]}
    theirs = _post(mlx_lm_server, "/v1/completions", body)
    ours = _post(ours.url, "/v1/completions", body)
    assert theirs["choices"][0]["finish_reason"] == "stop"
    assert _comparable(ours) == _comparable(theirs)


SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 12}


def _both(ours: LiveServer, theirs: str, body: dict) -> dict:
    mine = _post(ours.url, "/v1/chat/completions", body)
    other = _post(theirs, "/v1/chat/completions", body)
    assert _comparable(mine) == _comparable(other)
    return mine


def test_conversation_hits_like_mlx_lm_server(ours: LiveServer, mlx_lm_server: str) -> None:
    """Two agents sharing a system prompt, each for two turns: every turn reuses the same prefix
    in both servers (system snapshot, prompt-boundary snapshot, the whole last turn) and
    produces the same tokens and logprobs from there."""
    cached = []
    for task in ("Sort a list.", "Parse a date."):
        messages = [SYSTEM, {"role": "user", "content": task}]
        body = {"messages": messages, "max_tokens": 12, "logprobs": True}
        first = _both(ours, mlx_lm_server, body)
        reply = first["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "More"}]
        second = _both(ours, mlx_lm_server, {**body, "messages": messages})
        cached += [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, second)]
    assert cached[1] > cached[0] and cached[2] > 0 and cached[3] > cached[2], cached
