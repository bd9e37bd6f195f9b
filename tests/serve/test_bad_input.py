"""Bad input is a 4xx in OpenAI's error shape naming the problem, never a 5xx or a hung
server; after the whole barrage a normal request still succeeds."""

import socket
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]
EOS = "151645"  # Qwen3's <|im_end|>: a large bias ends generation at once


def chat(url: str, timeout: float = 30, **fields: Any) -> httpx.Response:
    body = {"messages": MESSAGES, "max_tokens": 2, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def raw(url: str, content: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(url + path, content=content, headers=headers, timeout=30)


def assert_error(r: httpx.Response, status: int, *words: str, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    for word in words:
        assert word in err["message"], (word, err["message"])
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"messages": [', ["Invalid JSON"]),
        (b"", ["Invalid JSON"]),
        (b"{'messages': []}", ["Invalid JSON"]),
        (b"[1, 2]", ["JSON object"]),
        (b'"a string"', ["JSON object"]),
        (b"42", ["JSON object"]),
        (b"null", ["JSON object"]),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', ["UTF-8"]),
    ],
    ids=["truncated", "empty", "single-quotes", "list", "string", "number", "null", "bad-utf8"],
)
def test_unreadable_bodies(qwen3_server, content: bytes, words: list[str]) -> None:
    assert_error(raw(qwen3_server.url, content), 400, *words)


def test_deeply_nested_json_is_a_400(qwen3_server) -> None:
    """json.loads raises RecursionError (not a JSONDecodeError) past ~1000 levels."""
    nested = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_error(raw(qwen3_server.url, nested), 400)


WRONG = [
    ("max_tokens", "5"), ("max_tokens", 1.5), ("max_tokens", True), ("max_tokens", 0),
    ("max_completion_tokens", "5"), ("temperature", "hot"), ("temperature", -1),
    ("temperature", True), ("top_p", "x"), ("top_p", 1.5), ("top_k", 1.5), ("top_k", -1),
    ("min_p", "x"), ("min_p", 2), ("xtc_probability", 0), ("xtc_threshold", 1),
    ("xtc_threshold", 0.7), ("xtc_probability", 1.5),
    ("repetition_penalty", "x"), ("repetition_penalty", -0.5),
    ("repetition_context_size", 1.5), ("presence_penalty", "x"), ("presence_penalty", 1e7),
    ("presence_context_size", "x"), ("frequency_penalty", []), ("frequency_context_size", 2.5),
    ("logit_bias", []), ("logit_bias", {"abc": 1}), ("logit_bias", {"5": "x"}),
    ("logit_bias", {"999999999": 1}), ("logit_bias", {"-1": 1}), ("logprobs", 1),
    ("top_logprobs", "3"), ("top_logprobs", 12), ("seed", "1"), ("seed", 1.5),
    ("seed", 2**70), ("stop", 5), ("stop", [1]), ("n", "2"), ("n", 0), ("n", 129),
    ("stream", "yes"), ("model", 5), ("adapters", 5), ("messages", "hi"), ("messages", {}),
    ("messages", []), ("messages", [5]), ("messages", [{"content": "no role"}]),
    ("tools", "x"), ("tool_choice", 5), ("tool_choice", "required"),
    ("chat_template_kwargs", "x"), ("response_format", "x"),
]  # fmt: skip


@pytest.mark.parametrize("field, bad", WRONG, ids=[f"{f}={v!r}"[:40] for f, v in WRONG])
def test_chat_field_refused(qwen3_server, field: str, bad: Any) -> None:
    r = chat(qwen3_server.url, **{field: bad})
    # mlx-lm validates max_completion_tokens under the name max_tokens; so does mlxd.
    named = "max_tokens" if field == "max_completion_tokens" else field
    assert_error(r, 400, named, param=named)


COMPLETIONS_WRONG = [
    ("prompt", 5, "prompt"), ("prompt", [], "prompt"), ("prompt", [1.5], "prompt"),
    ("prompt", [[1, 2], "x"], "prompt"), ("prompt", [-1], "vocabulary"),
    ("prompt", [10**30], "out of range"), ("prompt", "", "empty"), ("logprobs", 12, "logprobs"),
    ("max_tokens", "5", "max_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(
    "field, bad, word", COMPLETIONS_WRONG, ids=[repr(c[:2]) for c in COMPLETIONS_WRONG]
)
def test_completions_field_refused(qwen3_server, field: str, bad: Any, word: str) -> None:
    body = {"prompt": "hi", "max_tokens": 2, field: bad}
    r = httpx.post(qwen3_server.v1 + "/completions", json=body, timeout=30)
    assert_error(r, 400, word, param=field)


def test_missing_messages_and_prompt(qwen3_server) -> None:
    r = httpx.post(qwen3_server.v1 + "/chat/completions", json={"max_tokens": 2}, timeout=30)
    assert_error(r, 400, "messages")
    r = httpx.post(qwen3_server.v1 + "/completions", json={"max_tokens": 2}, timeout=30)
    assert_error(r, 400, "prompt")


@pytest.mark.parametrize("field", ["top_p", "temperature", "min_p"])
def test_nan_does_not_slip_past_the_bounds(qwen3_server, field: str) -> None:
    """Python's json accepts NaN, and NaN fails every comparison: `0 <= NaN <= 1` is no check."""
    content = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "%s": NaN}'
    assert_error(raw(qwen3_server.url, content % field.encode()), 400, field)


@pytest.mark.parametrize(
    "field", ["repetition_context_size", "presence_context_size", "frequency_context_size"]
)
def test_huge_context_sizes_do_not_crash(qwen3_server, field: str) -> None:
    penalty = field.replace("context_size", "penalty")
    r = chat(qwen3_server.url, **{field: 10**12, penalty: 0.5})
    assert r.status_code < 500, r.text  # a 400 naming the field or a clamp; never a 500
    if r.status_code != 200:
        assert_error(r, 400, field, param=field)


def test_absurd_but_valid_numbers_are_served(qwen3_server) -> None:
    """mlx-lm accepts these; the server clamps (max_tokens to the context, top_k to the
    vocabulary) instead of crashing. Floats past float32 (inf in MLX's sampler) are a 400."""
    url = qwen3_server.url
    r = chat(url, max_tokens=10**12, logit_bias={EOS: 100})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] == 1
    for fields in ({"temperature": 1e38}, {"top_k": 10**9}, {"logit_bias": {"5": 1e38}}):
        r = chat(url, **fields)
        assert r.status_code == 200, (fields, r.text)
        assert r.json()["usage"]["completion_tokens"] == 2
    for fields in ({"temperature": 1e300}, {"logit_bias": {"5": 1e300}}):  # inf as float32
        assert chat(url, **fields).status_code == 400, fields


def test_n_above_the_batch_is_refused_not_queued_forever(make_server) -> None:
    """n rows must fit in --batch at once; a request that can never be admitted would sit at
    the head of the FIFO and block every later request."""
    live = make_server(batch=2)
    try:
        r = chat(live.url, timeout=10, n=3)
    except httpx.TimeoutException:
        # Close the engine while its event loop runs: closing it after uvicorn's loop has
        # closed kills a pooled worker thread (see the report on engine/overlap.py).
        live.state.provider.close()
        pytest.fail("n=3 with --batch 2 hung instead of being refused")
    assert_error(r, 400, "2", param="n")  # names the limit
    assert chat(live.url).status_code == 200


def test_unknown_route_and_wrong_method(qwen3_server) -> None:
    url = qwen3_server.url
    assert_error(httpx.get(url + "/v1/nope", timeout=30), 404, "Not Found")
    assert_error(httpx.post(url + "/v1/chat/completion", json={}, timeout=30), 404)
    assert_error(httpx.get(url + "/v1/chat/completions", timeout=30), 405, "Method Not Allowed")
    assert_error(httpx.delete(url + "/v1/completions", timeout=30), 405)
    assert_error(httpx.put(url + "/v1/models", timeout=30), 405)


def declared_length_request(url: str, length: int) -> tuple[int, bytes]:
    """Send only the headers of a POST that declares `length` bytes; the status and body."""
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as s:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
        header, _, rest = data.partition(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in header.split(b"\r\n")[1:])
        size = int(fields.get(b"content-length", b"0"))
        while len(rest) < size and (chunk := s.recv(65536)):
            rest += chunk
    return int(header.split()[1]), rest


def test_declared_body_over_the_default_8mib_is_413(qwen3_server) -> None:
    status, body = declared_length_request(qwen3_server.url, (8 << 20) + 1)
    assert status == 413
    err = httpx.Response(413, content=body, headers={"content-type": "application/json"})
    assert_error(err, 413, str(8 << 20))


def test_streamed_body_over_the_limit_is_413(make_server) -> None:
    """A chunked body (no Content-Length) is counted as it arrives (--max-request-bytes)."""
    server = make_server(max_request_bytes=4096)

    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}]}'

    r = httpx.post(server.v1 + "/chat/completions", content=chunks(), timeout=30)
    assert_error(r, 413, "4096")


def test_still_serving_after_the_barrage(qwen3_server) -> None:
    r = chat(qwen3_server.url, max_tokens=3)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert qwen3_server.state.provider.default.engine.alive
