"""Schema-driven fuzzing (schemathesis, from the live server's /openapi.json) of
`/v1/messages` and `/v1/messages/count_tokens`, with bodies that fit the schema and bodies that
do not: never a 5xx, every answer in time, every 4xx in Anthropic's error shape, every stream
ending with message_stop, and bodies outside the schema refused."""

import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation.modes import GenerationMode

TIMEOUT_S = 30.0
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 10}
ENDPOINTS = ["/v1/messages", "/v1/messages/count_tokens"]
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


def shrink_work(body: Any) -> None:
    """Short generations, and a model name that never means loading one from disk (bodies
    that are invalid stay invalid: a number > 4 is still a number, a string still a string)."""
    if not isinstance(body, dict):
        return
    v = body.get("max_tokens")
    if isinstance(v, int | float) and not isinstance(v, bool) and v > 4:
        body["max_tokens"] = 4
    if isinstance(body.get("model"), str):
        body["model"] = "claude-fuzz"


def header(r: Any, name: str) -> str:
    """schemathesis' Response keeps headers as {name: [values]}."""
    return next((",".join(v) for k, v in r.headers.items() if k.lower() == name), "")


def check_response(r: Any, mode: GenerationMode) -> None:
    sent = (r.request.body or b"")[:300]
    where = f"{r.request.method} {r.request.url} {sent!r} -> {r.status_code}: {r.text[:300]}"
    assert r.status_code < 500, f"5xx: {where}"
    assert r.elapsed < TIMEOUT_S, where
    if r.status_code >= 400:
        assert header(r, "content-type").startswith("application/json"), where
        body = r.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, where
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], where
    elif header(r, "content-type").startswith("text/event-stream"):
        frames = [f for f in r.text.split("\n\n") if f]
        assert frames[0].startswith("event: message_start\n"), where
        assert frames[-1].startswith("event: message_stop\n"), where
        for frame in frames:
            name, data = frame.split("\n")
            assert json.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
    else:
        body = r.json()
        assert r.status_code == 200 and ("input_tokens" in body or body["type"] == "message")
    if mode == GenerationMode.NEGATIVE:
        assert r.status_code == 400, f"a body outside the schema was accepted: {where}"


def fuzz(base_url: str, path: str, mode: GenerationMode, examples: int) -> int:
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operation = schema[path]["POST"]
    sent = [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a failure in CI reproduces locally
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        shrink_work(case.body)
        sent[0] += 1
        check_response(case.call(base_url=base_url, timeout=TIMEOUT_S), mode)

    run()
    return sent[0]


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("path", ENDPOINTS)
def test_fuzz_messages(qwen3_server, path: str, mode: GenerationMode) -> None:
    assert fuzz(qwen3_server.url, path, mode, EXAMPLES[mode]) >= EXAMPLES[mode] // 2
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(qwen3_server.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 200, "the server stopped serving after the fuzzing"
